"""Twins: seed-matched pre-training runs that differ in one row of one batch.

Per seed: the shared prefix (steps 0 .. s-1) is trained once, its complete state (model,
optimizer, step) kept, and every condition forked from it at the injection step s. At
step s the injected conditions replace one row of the batch with their passage; the twin
trains on the ordinary batch. The batch of (seed, step) is a pure function of the two, so
forks need no replay. Forked conditions are identical at step s *by construction* (copies of
one state); ``independent=True`` (the audit) trains each condition's prefix from scratch
instead, and compares every weight tensor's SHA-256 as soon as each condition reaches step s
(a mismatch stops the run at once).

The evidence that training *after* s is deterministic is the **replica control**: for the
seeds of ``cfg.replica_seeds`` the twin is trained a second time from the same start, and its
weights must be bitwise equal to the twin's at every checkpoint, or the run fails.
``integrity.json`` records what was shown.

A killed run resumes: a finished condition (``done.json``) is read back, an unfinished one
restarts from its last checkpoint's complete state, a missing one forks the kept prefix.

Every condition is an arm of the fork design (forks/arms.py: the twin, or its passage in row
``injection_row`` of the batch of s), and the loop that trains them is the fork design's
(forks/loop.py ``run_design``), started as every fork command starts (forks/start.py ``begin``:
the folder claimed and locked, the environment checked); this module says what a twins design
records and checks first.
Where each file lives: twins/rundir.py. Under torchrun every rank runs this same code on
its slice of each batch (lm/distributed.py); rank 0 writes the files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm
from seedlab.forks.loop import Design, ProgressBar, Recording, run_design
from seedlab.forks.start import begin
from seedlab.lm.batches import check_passage
from seedlab.lm.distributed import World, check_divisible
from seedlab.progress import Bar
from seedlab.twins.config import TwinsConfig
from seedlab.twins.passages import attestation, load_passages, seed_passages
from seedlab.twins.rundir import RunDir, config_record, inputs_record, run_record
from seedlab.twins.variants import VARIANTS, ArmInputs, weighted_arms


def run_twins(cfg: TwinsConfig, out: str | Path, *, base: Path = Path("."), independent: bool = False,
              force: bool = False, progress: bool = True, world: World | None = None, allow_env_change: bool = False,
              preregistration: str | Path | None = None) -> pd.DataFrame:
    """Train every seed x condition and the replica controls (resuming what an interrupted run
    left); returns all per-step losses (seed, condition, step, loss).

    Every input is checked before the folder is touched, then the fork command's start
    (forks/start.py ``begin``): the folder policy (a folder holding another run is refused unless
    ``force``, which removes it), the same passages and corpus as a run started before, the
    environment it was started in (torch, device, threads...: refused unless ``allow_env_change``),
    the pre-registration and the disk plan, and the folder's lock (another process training in it
    is refused); ``config.json`` (the resolved config) is written before any training: a folder is
    only created for a run that can start. ``base``: the config's folder (passage files are
    relative to it). ``preregistration``: a text file of hypotheses and decision rules, kept in
    the folder before the first step (the report quotes it)."""
    world = world or World()
    corpus, gcfg, passages, attested = load_inputs(cfg, base, world)  # everything checked before the folder is touched
    per_seed = seed_passages(cfg, base, corpus, passages)  # the texts each seed draws for itself (its ordinary rows)
    for k, texts in per_seed.items():
        for name, ids in texts.items():
            check_passage(len(ids), gcfg.block_size, f"seed {k} {name}")
    text = _read_preregistration(preregistration)
    rd, inputs = RunDir(Path(out)), inputs_record(corpus, passages, attested, per_seed)
    arms = {k: conditions(cfg, passages | per_seed.get(k, {}), corpus.eot_id) for k in cfg.seeds}

    def check_disk() -> None:  # refused when it cannot fit
        line = rd.check_disk(rd.disk_plan(cfg, gcfg, independent=independent))
        if world.main and progress:
            print(line, file=sys.stderr)

    first_files = lambda env: rd.start(config_record(cfg, independent=independent, world=world), inputs, env,
                                       cfg.preregistration(), text)
    with begin(rd, run_record(cfg, independent=independent, world=world), inputs, device=world.device(cfg.device),
               precision=cfg.precision, threads=cfg.threads, force=force, allow_env_change=allow_env_change,
               world=world, checks=(lambda: rd.check_preregistration(text), check_disk), first_files=first_files) as started, \
            Bar("twins", 0, "steps", enabled=progress and world.main) as bar:
        _, losses = run_design(Design(cfg=cfg, gcfg=gcfg, tokens=corpus.train, pad_id=corpus.eot_id, folder=rd,
                                      arms=lambda seed: arms[seed], recording=recording(cfg, arms[cfg.seeds[0]]),
                                      observer=ProgressBar(bar),
                                      world=world, independent=independent, start=started.first_files))
    return losses.rename(columns={"arm": "condition"})


def conditions(cfg: TwinsConfig, passages: dict[str, list[int]], pad_id: int) -> list[Arm]:
    """Every condition as its arms, each built by its variant (twins/variants.py ``build``: what it injects or
    perturbs at s, and through which channel): the twin first (the replica control's reference), then in the
    config's order, then the row-weight arms (``row_weights``: twins/variants.py ``weighted_arms``), as
    ``cfg.arm_names`` lists them. ``passages``: the texts of one seed (its own ordinary rows, if drawn per seed)."""
    inputs = ArmInputs(cfg, passages, pad_id)
    plain = [a for c in cfg.conditions if c != "twin" for a in VARIANTS[c].build(inputs, VARIANTS[c])]
    return [TWIN, *plain, *(a for c in cfg.conditions for a in weighted_arms(inputs, VARIANTS[c]))]


def recording(cfg: TwinsConfig, arms: list[Arm]) -> Recording:
    """What every condition keeps: the weights at every checkpoint from s on (hashed in its
    manifest; the complete state there is the resume point), every update's loss from step 0,
    and the complete states ``keep`` names."""
    steps = frozenset(t for t in cfg.checkpoint_steps() if t >= cfg.injection_step)
    every = {a.name: steps for a in arms}
    return Recording(hashed=every, saved=every, resume=True, losses_from=0,
                     keep_final="final" in cfg.keep, keep_prefix="prefix" in cfg.keep)


def _read_preregistration(path: str | Path | None) -> str | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise SeedlabError(f"--preregistration: no such file {str(path)!r}")
    return Path(path).read_text()


def load_inputs(cfg: TwinsConfig, base: Path, world: World):
    """Everything checked before a run folder is touched: corpus (hashes), passages, attestation, ranks.
    Returns (corpus, the GPT's config, {condition: passage token ids}, the attestation record)."""
    from seedlab.corpus import load

    corpus_dir = Path(cfg.corpus)  # like --out: relative to the current folder
    corpus = load(corpus_dir, verify=True)
    gcfg = cfg.gpt_config(corpus.vocab_size)
    passages = load_passages(cfg, base, corpus)
    attested = attestation(cfg, corpus, gcfg.block_size, warn=world.main)
    for cond, ids in passages.items():  # inject() checks the same, too late to write nothing
        check_passage(len(ids), gcfg.block_size, f"passages.{cond}")
    check_divisible(cfg.batch_size, cfg.micro_batch, world)
    return corpus, gcfg, passages, attested
