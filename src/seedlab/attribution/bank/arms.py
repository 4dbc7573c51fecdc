"""The bank's arms, per seed: the twin, every candidate (and its replicate, pairs and row weights), the nudges
and the removals: what differs in each of the seed's runs, as forks/arms.py arms.

The one list both the loop (attribution/bank/run.py) and the measured effects (attribution/bank/measure.py) read.
"""

from __future__ import annotations

from seedlab.attribution.bank import removals
from seedlab.attribution.bank.texts import Inputs, nudged, replicate, weighted
from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, injection, nudge


def arms(inputs: Inputs, seed: int) -> list[Arm]:
    """The seed's arms: the twin, every candidate's text in row ``injection_row`` of the batch of s,
    then (``candidates.replicate_row``) every candidate's replicate: its text in that row instead,
    then (``candidates.pairs``) every pair: its first in row ``injection_row`` and its second in
    row ``replicate_row``, both in the one batch of s; then (``candidates.weights``) every candidate at
    each loss weight w < 1, largest first, in row ``injection_row``; then (``chaos.nudges``) one arm per
    nudged tensor; then (``loo``, ``groups``) the removal arms (attribution/bank/removals.py ``arms``). A pair whose two texts are the same in this seed (the own-row control and a
    candidate equal to the replaced row) is a one-line error."""
    cfg, texts = inputs.cfg, inputs.candidates_of(seed)
    s, row, again = cfg.injection_step, cfg.injection_row, cfg.candidates.replicate_row
    out = [TWIN, *(injection(name, t.tokens, s, row) for name, t in texts.items()),
           *(injection(replicate(name), t.tokens, s, again) for name, t in texts.items() if again is not None)]
    for name, (first, second) in inputs.pairs.items():
        a, b = texts[first].tokens, texts[second].tokens
        if a == b:
            raise SeedlabError(f"candidates.pairs: a pair of identical candidates ({first!r} and {second!r} have the "
                               f"same text in seed {seed})")
        out.append(Arm(name, {(s, row): list(a), (s, again): list(b)}))
    for w in sorted((w for w in cfg.candidates.weights if w != 1.0), reverse=True):
        out += [injection(weighted(w, name), t.tokens, s, row, weight=w) for name, t in texts.items()]
    out += [nudge(nudged(tensor), s, tensor, cfg.chaos.index) for tensor in cfg.chaos.nudges]
    out += removals.arms(cfg, seed)
    return out
