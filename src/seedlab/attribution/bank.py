"""The counterfactual bank: per seed, one shared prefix and a single-row fork for every candidate.

Per seed k (the batch of step t is a pure function of (k, t), lm/batches.py):

1. the **shared prefix** — updates 0 .. s-1 — is trained once and its complete state (weights
   and AdamW moments) kept in ``seed-<k>/prefix.safetensors``: every fork starts from it, and
   the estimators read θ_s and the optimizer's preconditioner from it;
2. the **twin** is forked from it and trained on the ordinary batches to the end; its weights are
   saved at s, at every horizon and at TracIn's cadence (``AttributionConfig.twin_steps``);
3. the **replica control** (seeds of ``replicas``; null: the first) trains the twin a second time
   from the prefix: its weights must hash the same at every saved step, or the bank stops with a
   one-line error — the evidence that training after s is deterministic, so every difference
   between a candidate's run and the twin is caused by the row;
4. every **candidate** is forked from the prefix; at step s its tokens replace row
   ``injection_row`` (lm/batches.py ``inject``: the passage, then padding the loss masks; the
   loss keeps the denominator N = B·T, so the batch differs from the twin's by the row alone).
   No weights are stored: the SHA-256 of every tensor at s and every horizon goes to its
   manifest, and the loss of its own text and of every query (:func:`seedlab.attribution.query_loss`)
   at every horizon to ``queries.parquet`` (attribution/measure.py turns those into Δ L_query);
5. the **own-row control** (``candidates.own_row``): a candidate equal to the replaced row must be
   bitwise the twin at every horizon (measured 0), or the bank stops.

The twin records every text's loss (all candidates' and the queries) at every horizon.
``integrity.json`` records what was shown. **Resume**: a finished run (its done marker) is skipped;
an unfinished one restarts from the kept prefix; the prefix itself is read back if it was saved.

The twin and every candidate are arms of the fork design (forks/arms.py), trained by its one loop
(forks/loop.py ``run_design``); this module says what a bank records (:class:`QueryLosses`) and
checks (:class:`OwnRow`). Where each file lives: attribution/rundir.py. Single process, on
``device`` (no torchrun).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from seedlab.attribution.config import AttributionConfig
from seedlab.attribution.estimators import query_loss
from seedlab.attribution.measure import write_measured
from seedlab.attribution.rundir import BankDir
from seedlab.attribution.texts import Inputs, load_inputs
from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, injection
from seedlab.forks.folders import RunFolder, environment
from seedlab.forks.loop import Design, Manifest, Observer, Observers, ProgressBar, Recording, run_design
from seedlab.forks.prefix import first_difference
from seedlab.lm.determinism import settle
from seedlab.lm.distributed import World
from seedlab.lm.trainer import Trainer
from seedlab.progress import Bar
from seedlab.store import folder_lock, write_parquet


def config_record(cfg: AttributionConfig) -> dict:
    """What config.json holds: the resolved config (what makes a folder hold the same design)."""
    return cfg.model_dump(mode="json")


def run_bank(cfg: AttributionConfig, out: str | Path, *, base: Path = Path("."), force: bool = False,
             progress: bool = True, allow_env_change: bool = False) -> pd.DataFrame:
    """Train (or finish) the bank in ``out`` and write its measured effects; returns measured.parquet's frame.

    Every input is checked before the folder is touched (corpus hashes, every text's length, the
    folder's design and environment): bad input writes nothing. ``base``: the config file's folder."""
    inputs = load_inputs(cfg, base)
    rd, record = BankDir(Path(out)), config_record(cfg)
    rd.claim(record, force=force)  # another design refused (one line); the same one resumes
    rd.check_inputs(inputs.record())
    device = World().device(cfg.device)
    settle(device, cfg.threads, cfg.precision)
    env = environment(device, cfg.precision)
    rd.check_environment(env, allow_change=allow_env_change)
    with folder_lock(rd.root, "{folder} is in use by another bank (pid {pid})"), \
            Bar("bank", 0, "steps", enabled=progress) as bar:
        observer = Observers(ProgressBar(bar), QueryLosses(inputs), OwnRow(inputs))
        run_design(Design(cfg, inputs.gcfg, inputs.corpus.train, inputs.pad_id, rd, lambda seed: arms(inputs, seed),
                          recording(inputs), observer, start=lambda: rd.start(record, inputs.record(), env)))
    return write_measured(rd.root)


def arms(inputs: Inputs, seed: int) -> list[Arm]:
    """The seed's arms: the twin, then every candidate's text in row ``injection_row`` of the batch of s."""
    s, row = inputs.cfg.injection_step, inputs.cfg.injection_row
    return [TWIN, *(injection(name, t.tokens, s, row) for name, t in inputs.candidates_of(seed).items())]


def recording(inputs: Inputs) -> Recording:
    """What the bank keeps: every run's weight hashes at s and every horizon (the twin's also at
    TracIn's cadence, where its weights are saved), and the losses of every update from s."""
    cfg, s = inputs.cfg, inputs.cfg.injection_step
    every = frozenset({s, *cfg.horizon_steps()})
    names = {n for seed in cfg.seeds for n in inputs.candidates_of(seed)}
    return Recording(hashed={"twin": every | set(cfg.twin_steps()), **{n: every for n in names}},
                     saved={"twin": frozenset(cfg.twin_steps())}, losses_from=s)


class QueryLosses(Observer):
    """At every horizon, the loss of every text a run is measured on — the twin: every candidate's
    and every query; a candidate: its own and every query — into its ``queries.parquet``."""

    def __init__(self, inputs: Inputs):
        self.inputs, self.rows = inputs, {}
        self.horizons = set(inputs.cfg.horizon_steps())

    def texts(self, seed: int, arm: Arm) -> dict[str, Sequence[int]]:
        queries = {n: t.tokens for n, t in self.inputs.queries.items()}
        candidates = {n: t.tokens for n, t in self.inputs.candidates_of(seed).items()}
        return (candidates if arm.is_twin else {arm.name: candidates[arm.name]}) | queries

    def stops(self, seed: int, arm: Arm) -> set[int]:
        return self.horizons

    def visit(self, seed: int, arm: Arm, trainer: Trainer) -> None:
        rows = self.rows.setdefault((seed, arm.name), [])
        rows.extend({"step": trainer.step, "text": n, "loss": query_loss(trainer.model, ids)}
                    for n, ids in self.texts(seed, arm).items())

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> None:
        rows = self.rows.pop((seed, arm.name), None)
        if rows is not None:  # trained here (not read back)
            write_parquet(where.queries, pd.DataFrame(rows, columns=["step", "text", "loss"]))


class OwnRow(Observer):
    """The own-row control: the candidate equal to the replaced row must be the twin, bit for bit,
    at every step it hashed (else the injection is not exact), or the bank stops."""

    def __init__(self, inputs: Inputs):
        self.inputs, self.twin = inputs, {}

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> dict | None:
        if arm.is_twin:
            self.twin = manifest
            return None
        if self.inputs.candidates_of(seed)[arm.name].kind != "control":
            return None
        for t, hashes in manifest.items():
            bad = first_difference(self.twin[t], hashes)
            if bad is not None:
                raise SeedlabError(f"seed {seed}: the own-row control differs from the twin at step {t} in tensor "
                                   f"{bad!r} (replacing a row by itself changed the run: the injection is not exact)")
        return {"own_row": {"bitwise_equal_to_twin": True, "steps_compared": sorted(int(t) for t in manifest)}}
