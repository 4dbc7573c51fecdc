"""Train a repeats design: its arms handed to the fork design's loop (forks/loop.py ``run_design``),
inside the one start of every fork command (forks/start.py ``begin``: the folder claimed, the
inputs and the environment checked, the process settled, the folder locked). Nothing else starts here.

Every run keeps the weight hashes of every step from s to the end (manifest.json: where two arms first
differ is visible) and the weights at the end (what repeats/measure.py reads); an interrupted design
starts its unfinished runs over from the kept prefix.
"""

from __future__ import annotations

import random
from pathlib import Path

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, injection
from seedlab.forks.folders import corpus_record
from seedlab.forks.loop import Design, ProgressBar, Recording, run_design
from seedlab.forks.start import begin
from seedlab.lm.batches import check_passage
from seedlab.lm.distributed import check_divisible, init_world
from seedlab.progress import Bar

from repeats.config import ARMS, RepeatsConfig, RepeatsFolder, config_record


def arms(cfg: RepeatsConfig, passage: list[int], ordinary: list[int]) -> list[Arm]:
    """The twin, once, thrice and ordinary (repeats/config.py), as arms of the fork design."""
    s, row = cfg.injection_step, cfg.injection_row
    return [TWIN, injection("once", passage, s, row), Arm("thrice", {(t, row): passage for t in cfg.schedule}),
            injection("ordinary", ordinary, s, row)]


def ordinary_stretch(cfg: RepeatsConfig, corpus, n: int) -> list[int]:
    """``n`` consecutive tokens of the held-out split (never trained on), from ``random.Random(ordinary_seed)``."""
    held = corpus.heldout
    if len(held) <= n:
        raise SeedlabError(f"corpus: its held-out split has {len(held)} tokens, too few for an ordinary row of {n}")
    start = random.Random(cfg.ordinary_seed).randrange(len(held) - n)
    return [int(t) for t in held[start : start + n]]


def recording(cfg: RepeatsConfig) -> Recording:
    """Every arm hashes every step from s to the end and saves its weights at the end."""
    every, end = frozenset(range(cfg.injection_step, cfg.end + 1)), frozenset({cfg.end})
    return Recording(hashed=dict.fromkeys(ARMS, every), saved=dict.fromkeys(ARMS, end), keep_prefix=False)


def run(cfg: RepeatsConfig, out: str | Path, *, force: bool = False, progress: bool = True,
        allow_env_change: bool = False) -> dict:
    """Train (or finish) every seed's arms and replica control in ``out``; returns the integrity record."""
    from seedlab.corpus import load

    world = init_world()
    corpus = load(Path(cfg.corpus), verify=True)
    gcfg = cfg.gpt_config(corpus.vocab_size)
    passage = corpus.encode(cfg.passage)
    check_passage(len(passage), gcfg.block_size, "passage")
    check_divisible(cfg.batch_size, cfg.micro_batch, world)
    ordinary = ordinary_stretch(cfg, corpus, len(passage))
    folder = RepeatsFolder(Path(out))
    inputs = {**corpus_record(corpus), "passage": passage, "ordinary": ordinary}
    with begin(folder, config_record(cfg, world.size), inputs, device=world.device(cfg.device), precision=cfg.precision,
               threads=cfg.threads, force=force, allow_env_change=allow_env_change, world=world) as started, \
            Bar("repeats", 0, "steps", enabled=progress and world.main) as bar:
        integrity, _ = run_design(Design(cfg=cfg, gcfg=gcfg, tokens=corpus.train, pad_id=corpus.eot_id, folder=folder,
                                         arms=lambda seed: arms(cfg, passage, ordinary), recording=recording(cfg),
                                         observer=ProgressBar(bar), world=world, start=started.first_files))
    return integrity
