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
   manifest, and the loss of its own text and of every query (:func:`seedlab.measures.text.text_ce`)
   at every horizon to ``queries.parquet`` (attribution/bank/measure.py turns those into Δ L_query);
5. the **own-row control** (``candidates.own_row``): a candidate equal to the replaced row must be
   bitwise the twin at every horizon (measured 0), or the bank stops;
6. the **replicates** (``candidates.replicate_row`` r′): every candidate once more, its tokens in
   row r′ of the same batch instead of row r (arm ``replicate.<name>``, recorded as a candidate:
   hashes, and its text's and the queries' losses). To first order Δ differs between the two rows
   by a term shared by all candidates (the ordinary row each replaces), so corr(Δ at r, Δ at r′)
   over candidates is the target's own test–retest reliability (measure.py ``measured_replicate``);
7. the **pairs** (``candidates.pairs``): a few arms carrying two candidates at once, the first in
   row r and the second in row r′ (arm ``pair.<first>..<second>``, recorded as a candidate: hashes,
   both texts' and the queries' losses). Δ(pair) against Δ(first at r) + Δ(second at r′) — the
   candidate run and the replicate that replace the same two rows — is the additivity that group
   benchmarks assume (attribution/analyses/additivity.py). A pair whose first is the own-row control
   leaves row r as it was: it must be bitwise the second's replicate, or the bank stops;
8. the **removals** (``loo``, ``groups``; attribution/bank/removals.py): rows of the twin's own batches left out of the
   loss (their loss weight 0, no text: forks/arms.py) — one row at a time at a few steps t, a leave-one-out of the
   row at its age (a step before s forks from the prefix's own state at t, kept as ``prefix-<t>.safetensors``), and
   random α-fractions of the rows of steps s .. end − 1 at once, the LDS's subsets. Hashes and the queries' losses
   at every horizon (loo.parquet, groups.parquet: attribution/bank/measure.py);
9. the **retests** (``ceiling``): the leave-one-out rows and the first group subsets removed again from a run nudged by
   one ulp at s, each measured against the nudged twin (retest.parquet), and **TRAK's subsets** (``trak``): random
   fractions of the rows of steps s .. end − 1 kept, the rest removed, each retrained a few times (the first plain,
   the others nudged at s) (trak.parquet): removals.py says which rows; their runs are recorded as the removals'.

The twin records every text's loss (all candidates' and the queries) at every horizon.
``integrity.json`` records what was shown. **Resume**: a finished run (its done marker) is skipped;
an unfinished one restarts from the kept prefix; the prefix itself is read back if it was saved.

The twin and every candidate are arms of the fork design (forks/arms.py), trained by its one loop
(forks/loop.py ``run_design``) and started as every fork command starts (forks/start.py ``begin``:
the folder claimed and locked, the inputs and environment checked); this module says what a bank
records (:class:`QueryLosses`) and checks (:class:`OwnRow`). Where each file lives:
attribution/bank/rundir.py. On ``device``, no torchrun; the seeds one after another here, or (``jobs``
> 1, ``executor="ray"``) each in a process of its own on one thread (:func:`bank_seed`: the same
loop, so the same bits), then integrity.json once every seed is done.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pandas as pd

from seedlab.attribution.bank.arms import arms
from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.measure import write_additivity, write_measured, write_removals, write_weighted
from seedlab.attribution.bank import removals
from seedlab.attribution.bank.rundir import BankDir, open_bank
from seedlab.attribution.bank.texts import (NUDGE, OWN_ROW, REPLICATE, WEIGHTED, Inputs, candidate_of, load_inputs, replicate)
from seedlab.errors import SeedlabError, in_seed
from seedlab.forks.arms import Arm
from seedlab.forks.distances import Distances
from seedlab.forks.folders import RunFolder
from seedlab.forks.loop import (Design, Manifest, Observer, Observers, ProgressBar, Recording, Reported, SeedResult,
                                run_design, run_seed, seed_updates)
from seedlab.forks.prefix import first_difference
from seedlab.forks.start import begin, settled
from seedlab.lm.determinism import nondeterminism_is_an_error
from seedlab.lm.distributed import World
from seedlab.lm.trainer import Trainer
from seedlab.measures.text import text_ce
from seedlab.progress import Bar
from seedlab.store import write_json, write_parquet


def config_record(cfg: AttributionConfig) -> dict:
    """What config.json holds: the resolved config (what makes a folder hold the same design)."""
    return cfg.model_dump(mode="json")


def run_bank(cfg: AttributionConfig, out: str | Path, *, base: Path = Path("."), force: bool = False,
             progress: bool = True, allow_env_change: bool = False, executor: str = "local", jobs: int = 1,
             ray_address: str | None = None) -> pd.DataFrame:
    """Train (or finish) the bank in ``out`` and write its measured effects; returns measured.parquet's frame.

    Every input is checked before the folder is touched (corpus hashes, every text's length, the
    folder's design and environment; a folder another bank is using is refused): bad input writes
    nothing. ``base``: the config file's folder. ``executor``/``jobs``: the seeds one after another
    here (local, 1), or each in a process of its own on one thread, ``jobs`` at once (local) or as
    Ray tasks (``ray_address``; module doc)."""
    from seedlab.executors import preflight_ray

    if executor not in ("local", "ray"):
        raise SeedlabError(f"--executor: must be local or ray, got {executor!r}")
    if jobs < 1:
        raise SeedlabError(f"--jobs: at least 1, got {jobs}")
    if executor == "ray":
        preflight_ray(ray_address)
    parallel = executor == "ray" or jobs > 1
    inputs = load_inputs(cfg, base)
    rd = BankDir(Path(out))
    # another design refused (one line; the same one resumes), the same texts, the environment, the lock
    with begin(rd, config_record(cfg), inputs.record(), device=World().device(cfg.device), precision=cfg.precision,
               threads=1 if parallel else cfg.threads, force=force, allow_env_change=allow_env_change) as started, \
            Bar("bank", 0, "steps", enabled=progress) as bar:
        apart = partial(seeds_apart, env=started.env, bar=bar, executor=executor, jobs=jobs, ray_address=ray_address)
        # apart, each seed's process keeps its own clock (bank_seed); here, one clock for the seeds in turn
        observer = (Observers(ProgressBar(bar)) if parallel
                    else Observers(ProgressBar(bar), recorders(inputs, rd), SeedClock(rd)))
        run_design(design(inputs, rd, observer, start=started.first_files), apart if parallel else None)
        write_training(rd, cfg, started.env)
    write_additivity(rd.root)  # with candidates.pairs
    write_weighted(rd.root)  # every bank's distances; with candidates.weights, the weighted effects
    write_removals(rd.root)  # with loo / groups: loo.parquet, groups.parquet, group_rows.parquet
    return write_measured(rd.root)


def design(inputs: Inputs, rd: BankDir, observer: Observer, start=lambda: None) -> Design:
    """The bank as a fork design (forks/loop.py): its arms, what it records, who watches."""
    return Design(cfg=inputs.cfg, gcfg=inputs.gcfg, tokens=inputs.corpus.train, pad_id=inputs.pad_id, folder=rd,
                  arms=lambda seed: arms(inputs, seed), recording=recording(inputs), observer=observer, start=start)


def seeds_apart(d: Design, *, env: dict, bar: Bar, executor: str, jobs: int,
                ray_address: str | None) -> dict[int, SeedResult]:
    """Every seed of ``d`` in a process of its own (:func:`bank_seed`): ``jobs`` at once here, or as
    Ray tasks (on CUDA, 1/``jobs`` of a GPU each); the bar advances as the seeds train (here: forks/loop.py
    ``Reported``) or as each finishes (Ray), and settles each seed's total when it ends."""
    from seedlab.executors import run_ray, run_tallied

    specs = [(str(d.folder.root.resolve()), seed, env) for seed in d.cfg.seeds]
    updates = lambda seed: seed_updates(d, seed)
    if executor == "ray":
        gpus = 1 / jobs if env["device"] == "cuda" else 0.0
        out = run_ray(bank_seed, specs, lambda spec: bar.advance(updates(spec[1])), address=ray_address,
                      gpus_per_job=gpus)
    else:
        out = run_tallied(bank_seed, specs, bar.advance, updates, jobs)
    return dict(zip(d.cfg.seeds, out))


def bank_seed(spec: tuple[str, int, dict]) -> SeedResult:
    """One seed of a started bank (``spec``: its folder, the seed, the bank's environment), in a
    process of its own: the bank's config and inputs read back (rundir.py ``open_bank``), one thread,
    then forks/loop.py ``run_seed`` as the bank's own process runs it. Another environment than the
    bank's (forks/start.py ``settled``, as the bank's own process settles), or any failure, is a
    one-line error naming the seed."""
    root, seed, env = spec
    try:
        bank = open_bank(root)
        settled(World().device(bank.cfg.device), 1, bank.cfg.precision, like=env, of="the bank's")
        with nondeterminism_is_an_error():
            observer = Observers(recorders(bank.inputs, bank.dir), Reported(seed), SeedClock(bank.dir))
            return run_seed(design(bank.inputs, bank.dir, observer), seed)
    except Exception as err:  # one line, whatever it was
        raise in_seed(seed, err) from None


class SeedClock(Observer):
    """A seed's training clock, in the process that trains it: the wall seconds from its first run started to its
    last finished run and the updates trained (one run's update each: prefixes, arms and replica controls; runs in a
    stack count one each; the queries' losses, hashes and distances between them included), added to
    ``seed-<k>/training.json`` as each run finishes. The record sums every command that trained the seed, so a bank
    stopped and resumed keeps what each part timed (the updates of a run cut short are not counted, nor its seconds).
    What was trained since the last finished run is counted on the finishing run's seed: exact where a process trains
    one seed (``--jobs``, Ray) or the seeds in turn; where one stack holds runs of several seeds, on the seed of the
    first to finish. The bank's sum (:func:`write_training`) is exact either way."""

    def __init__(self, rd: BankDir):
        self.rd, self.mark, self.updates = rd, None, 0

    def run(self, label: str, steps: int, done: int = 0) -> None:
        if self.mark is None:
            self.mark = time.perf_counter()

    def step(self, label: str) -> None:
        self.updates += 1

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> dict | None:
        now = time.perf_counter()
        if self.updates and self.mark is not None:
            path = self.rd.seed_training(seed)
            old = json.loads(path.read_text()) if path.is_file() else {"seconds": 0.0, "run_updates": 0}
            write_json(path, {"seconds": old["seconds"] + (now - self.mark),
                              "run_updates": old["run_updates"] + self.updates})
        self.mark, self.updates = now, 0
        return None


def write_training(rd: BankDir, cfg: AttributionConfig, env: dict) -> None:
    """training.json (rundir.py ``BankDir.training``): the bank's training as its seeds' clocks timed it
    (:class:`SeedClock`) — ``seconds`` (the process-seconds: each seed's wall seconds in the process that trained it,
    summed over seeds and commands), ``run_updates`` (the updates those seconds trained: prefixes, arms, replica
    controls, the stacked loop's solo check), ``clocks`` (the seeds' records summed) and ``seconds_per_run`` =
    seconds / run_updates × end: one run of the bank's ``end`` updates at the rate one process trained the bank's
    runs (queries' losses, hashes and distances included; runs in a stack share one set of tensors, so a run alone
    costs more), whether its seeds trained one after another, side by side or in parts across a stop. What estimators' costs are set beside (the leaderboard's "× one training run").
    Nothing is written when no seed has a clock (a bank trained before seeds kept one)."""
    records = [json.loads(p.read_text()) for p in map(rd.seed_training, cfg.seeds) if p.is_file()]
    seconds, updates = sum(r["seconds"] for r in records), sum(r["run_updates"] for r in records)
    if not updates:
        return
    write_json(rd.training, {"seconds": seconds, "run_updates": updates, "clocks": len(records), "end": cfg.end,
                             "seconds_per_run": seconds / updates * cfg.end,
                             "device": env.get("device"), "threads": env.get("threads")})


def recorders(inputs: Inputs, rd: BankDir) -> Observer:
    """What the bank's runs record beside their hashes: the texts' losses, the own-row controls, the distances."""
    cfg = inputs.cfg
    watched = lambda seed: len(arms(inputs, seed)) - 1
    return Observers(QueryLosses(inputs), OwnRow(inputs),
                     Distances(cfg.distance_steps(), lambda arm: not arm.is_twin, rd.twin, watched))


def recording(inputs: Inputs) -> Recording:
    """What the bank keeps: every run's weight hashes at s and every horizon (the twin's also at
    TracIn's cadence, where its weights are saved), and the losses of every update from s."""
    cfg, s = inputs.cfg, inputs.cfg.injection_step
    every = frozenset({s, *cfg.horizon_steps()})
    names = {a.name for seed in cfg.seeds for a in arms(inputs, seed)[1:]}
    return Recording(hashed={"twin": every | set(cfg.twin_steps()), **{n: every for n in names}},
                     saved={"twin": frozenset(cfg.twin_steps())}, losses_from=s)


class QueryLosses(Observer):
    """At every horizon, the loss of every text a run is measured on — the twin: every candidate's
    and every query; a candidate and its replicate: the candidate's own and every query; a pair:
    both its candidates' and every query; a removal arm (leave-one-out, group, retest, TRAK): every query — into its
    ``queries.parquet``."""

    def __init__(self, inputs: Inputs):
        self.inputs, self.rows = inputs, {}
        self.horizons = set(inputs.cfg.horizon_steps())

    def texts(self, seed: int, arm: Arm) -> dict[str, Sequence[int]]:
        queries = {n: t.tokens for n, t in self.inputs.queries.items()}
        candidates = {n: t.tokens for n, t in self.inputs.candidates_of(seed).items()}
        if arm.is_twin or arm.name.startswith(NUDGE):  # a nudge: every text (the floor chaos alone makes)
            return candidates | queries
        if removals.is_removal(arm.name):  # no text of its own
            return queries
        own = self.inputs.pairs.get(arm.name) or (candidate_of(arm.name),)
        return {n: candidates[n] for n in own} | queries

    def stops(self, seed: int, arm: Arm) -> set[int]:
        return self.horizons

    def visit(self, seed: int, arm: Arm, trainer: Trainer) -> None:
        rows = self.rows.setdefault((seed, arm.name), [])
        rows.extend({"step": trainer.step, "text": n, "loss": text_ce(trainer.model, ids)}
                    for n, ids in self.texts(seed, arm).items())

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> None:
        rows = self.rows.pop((seed, arm.name), None)
        if rows is not None:  # trained here (not read back)
            write_parquet(where.queries, pd.DataFrame(rows, columns=["step", "text", "loss"]))


class OwnRow(Observer):
    """The own-row control: the candidate equal to the replaced row must be the twin, bit for bit,
    at every step it hashed (else the injection is not exact), or the bank stops; so must it at every
    loss weight w < 1 (else the weighted step is not exact). Likewise a pair
    whose first is the own-row control (row r left as it was) must be its second's replicate, bit
    for bit (else two injections in one batch are not each exact)."""

    def __init__(self, inputs: Inputs):
        self.pairs = {name: second for name, (first, second) in inputs.pairs.items() if first == OWN_ROW}
        self.twin: Manifest = {}
        self.replicates: dict[str, Manifest] = {}  # the seed's, by arm (replicates run before pairs)
        self.shown: dict[str, dict] = {}  # the seed's pairs checked so far (the seed's record keeps the last)
        self.weighted: dict[str, dict] = {}  # the seed's weighted own-row controls checked so far, by weight

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> dict | None:
        if arm.is_twin:
            self.twin, self.replicates, self.shown, self.weighted = manifest, {}, {}, {}  # a new seed
            return None
        if arm.name.startswith(REPLICATE):
            self.replicates[arm.name] = manifest
        if arm.name in self.pairs:
            again = replicate(self.pairs[arm.name])
            self._same(seed, manifest, self.replicates[again], f"the pair {arm.name} differs from {again}",
                       "row r replaced by itself beside another row changed the run")
            self.shown[arm.name] = {"bitwise_equal_to": again, "steps_compared": sorted(int(t) for t in manifest)}
            return {"own_row_pairs": dict(self.shown)}
        if arm.name.startswith(WEIGHTED) and candidate_of(arm.name) == OWN_ROW:
            w = float(arm.weights[next(iter(arm.weights))])
            self._same(seed, manifest, self.twin, f"the own-row control at loss weight {w:g} differs from the twin",
                       "weighing a row against itself changed the run: the weighted step is not exact")
            self.weighted[f"{w:g}"] = {"bitwise_equal_to_twin": True, "steps_compared": sorted(int(t) for t in manifest)}
            return {"own_row_weighted": dict(self.weighted)}
        if arm.name != OWN_ROW:  # its replicate (another row replaced) is not the twin
            return None
        self._same(seed, manifest, self.twin, "the own-row control differs from the twin",
                   "replacing a row by itself changed the run: the injection is not exact")
        return {"own_row": {"bitwise_equal_to_twin": True, "steps_compared": sorted(int(t) for t in manifest)}}

    @staticmethod
    def _same(seed: int, manifest: Manifest, reference: Manifest, what: str, why: str) -> None:
        for t, hashes in manifest.items():
            bad = first_difference(reference[t], hashes)
            if bad is not None:
                raise SeedlabError(f"seed {seed}: {what} at step {t} in tensor {bad!r} ({why})")
