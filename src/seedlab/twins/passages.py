"""The injected texts: every data variant's token ids, and the attestation check.

Each data condition's text comes from its variant's ``text`` function (twins/variants.py), in the registry's
order, so a later text can take its length from an earlier one:

- ``fluent-fabricated`` and ``fluent-attested`` are text files named in the config
  (``passages``, relative to the config file), encoded with the corpus's tokenizer.
- ``random-chars`` is random keyboard text (``random.Random(random_chars_seed)``) grown until
  it has ``random_chars_tokens`` tokens (default: as many as the fabricated, else the attested, passage).
- ``ordinary-row`` (a null) is ``nulls.ordinary_rows`` arms, ``ordinary-row.0`` .. ``ordinary-row.<K-1>``: each a
  different stretch of the held-out split's reserved slice (twins/heldout.py, which no evaluation or probe row
  touches) as long as the fabricated passage; with ``nulls.ordinary_rows_per_seed`` each training seed draws its
  own (:func:`seed_passages`).
- Each fluent passage must mention its subject (``subjects``), as a whole word. A fabricated
  subject must not occur in the training split; an attested one should (whole-word token spans,
  corpus.occurrences). ``attestation`` reports, per subject, its occurrences and each seed's
  **exposure**: how many times the seed's ordinary batches held a whole occurrence, before,
  at and after the injection step (from the pure batch function, lm/batches.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from seedlab.corpus import occurrences
from seedlab.errors import SeedlabError
from seedlab.lm.batches import batch_indices
from seedlab.twins.config import TwinsConfig
from seedlab.twins.variants import ATT, FAB, VARIANTS, TextInputs


def load_passages(cfg: TwinsConfig, base: Path, corpus, seed: int | None = None) -> dict[str, list[int]]:
    """Token ids of every text the design injects, ``{arm name: ids}``: each data condition's variant's ``text``
    (twins/variants.py), in the registry's order; ``seed``: as training seed ``seed`` injects them (None: the texts
    every seed shares, which leave out those drawn per seed)."""
    out: dict[str, list[int]] = {}
    for v in VARIANTS.values():
        if v.text is not None and v.name in cfg.conditions:
            out |= v.text(TextInputs(cfg, base, corpus, dict(out), seed), v)
    return out


def seed_passages(cfg: TwinsConfig, base: Path, corpus, shared: dict[str, list[int]]) -> dict[int, dict[str, list[int]]]:
    """``{seed: {arm name: ids}}``: the texts each training seed draws for itself (the ordinary rows with
    ``nulls.ordinary_rows_per_seed``), beside ``shared`` (:func:`load_passages`); empty when every seed injects the
    same texts. A draw that cannot be made (more rows than the reserved slice holds) is a one-line error."""
    if not cfg.nulls.ordinary_rows_per_seed:
        return {}
    out = {k: {n: ids for n, ids in load_passages(cfg, base, corpus, seed=k).items() if n not in shared} for k in cfg.seeds}
    return {k: texts for k, texts in out.items() if texts}


def attestation(cfg: TwinsConfig, corpus, block_size: int, warn: bool = True) -> dict[str, dict]:
    """Check every subject against the training split and measure each seed's exposure to it.

    A fabricated subject that occurs is an error; an attested one that does not, a warning.
    Returns ``{condition: {"subject", "occurrences", "exposure": [{seed, before, at_injection, after}]}}``,
    where exposure counts (row, occurrence) pairs: a row of step t's ordinary batch holding the
    whole occurrence (its ``block_size + 1`` tokens include the span)."""
    out = {}
    for cond, subject in cfg.subjects.items():
        spans = occurrences(corpus, subject)
        n = len(spans)
        if cond == FAB and n > 0:
            raise SeedlabError(f"subjects.fluent-fabricated: {subject!r} occurs {n} times in the training split (not fabricated)")
        if cond == ATT and n == 0 and warn:
            print(f"warning: subjects.fluent-attested: {subject!r} does not occur in the training split", file=sys.stderr)
        out[cond] = {"subject": subject, "occurrences": n, "exposure": [exposure(cfg, len(corpus.train), spans, block_size, k)
                                                                         for k in cfg.seeds]}
    return out


def exposure(cfg: TwinsConfig, n_tokens: int, spans: np.ndarray, block_size: int, seed: int) -> dict[str, int]:
    """How many times seed ``seed``'s ordinary batches held one of ``spans`` whole: summed over
    the steps before the injection step, at it (every row, the one an injected passage replaces
    included) and after it."""
    counts = {"seed": seed, "before": 0, "at_injection": 0, "after": 0}
    if len(spans) == 0:
        return counts
    s = cfg.injection_step
    for t in range(cfg.steps):
        o = batch_indices(seed, t, n_tokens=n_tokens, batch_size=cfg.batch_size, block_size=block_size)[:, None]
        n = int(((spans[None, :, 0] >= o) & (spans[None, :, 1] <= o + block_size + 1)).sum())
        counts["before" if t < s else "at_injection" if t == s else "after"] += n
    return counts
