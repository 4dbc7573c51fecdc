"""The fork design's one run loop: per seed the shared prefix, each arm, the replica control and
the integrity record.

    for seed in design.seeds:
        prefix = SharedPrefix(...)                 # steps 0 .. s-1, trained once, kept (and its state at every
                                                   # earlier step an arm starts from: forks/arms.py Arm.start)
        twin, then a short replica                 # fails fast: the first recorded steps after s, twice
        every other arm                            # forked from the prefix (or resumed, or read back)
        the replica control to the end             # bitwise the twin at every recorded step, or stop
        integrity[seed] = what was shown           # written once every seed is done

Every run that leaves the prefix at s writes its dose there (dose.json: θ and AdamW's moments after the
update of s against the twin's, forks/dose.py); the twin, trained first, is kept at s + 1 for the others.

The seeds are independent: a study may run them in other processes (``run_design(d, run_seeds)``,
each process calling :func:`run_seed` on a design of its own); on the same device and threads
the bits are the same.

What a run keeps on disk is data (:class:`Recording`); what else happens at its steps — a progress
bar, the loss of some texts at some horizons, a check against the twin — is an :class:`Observer`.
Every file goes through the design's folder (forks/folders.py) and store.py. Under torchrun
(``world``) every rank runs the same loop on its rows of each batch; rank 0 writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.forks import stacked
from seedlab.forks.arms import TWIN, Arm, check_arms
from seedlab.forks.design import ForkDesign
from seedlab.forks.dose import Doses, State
from seedlab.forks.folders import DesignFolder, RunFolder
from seedlab.forks.records import (earlier_states, early_record, early_starts, extra, finish, finish_replica, losses_frame,
                                   merge, remove_prefix, save)
from seedlab.forks.prefix import SharedPrefix, advance_to, check_identical, replica_control
from seedlab.lm.determinism import nondeterminism_is_an_error
from seedlab.lm.distributed import World
from seedlab.lm.model import GPT, GPTConfig
from seedlab.lm.trainer import Trainer
from seedlab.progress import Bar
from seedlab.store import tensor_hashes, write_json

Manifest = dict[str, dict[str, str]]  # {str(step): {tensor: SHA-256}}
SeedResult = tuple[dict, list[pd.DataFrame]]  # run_seed's: the seed's integrity record, its runs' losses


@dataclass(frozen=True)
class Recording:
    """What every run of a design keeps on disk (besides losses.parquet and done.json)."""

    hashed: Mapping[str, frozenset[int]]  # arm name -> steps whose weight hashes manifest.json holds (and s; the replica checks the twin's)
    saved: Mapping[str, frozenset[int]] = field(default_factory=dict)  # arm name -> steps whose weights are written
    resume: bool = False  # the complete state at every saved step: an interrupted run resumes there (else: from the prefix)
    losses_from: int = 0  # the first step losses.parquet holds (0: the prefix's losses too)
    keep_final: bool = False  # the complete state at the end stays (final.safetensors)
    keep_prefix: bool = True  # the prefix's complete state stays once every run of its seed is done


class Observer:
    """What happens beside training; every hook does nothing unless a subclass says otherwise."""

    def started(self, total: int) -> None:
        """The design begins: ``total`` updates to train (those done before an interruption included)."""

    def run(self, label: str, steps: int, done: int = 0) -> None:
        """A run (or the prefix) starts: ``steps`` updates, ``done`` of them before an interruption."""

    def step(self, label: str) -> None:
        """One update done."""

    def skip(self, steps: int) -> None:
        """``steps`` updates done before an interruption (a finished run or prefix read back)."""

    def stops(self, seed: int, arm: Arm) -> set[int]:
        """Steps at which :meth:`visit` sees this run's weights."""
        return set()

    def visit(self, seed: int, arm: Arm, trainer: Trainer) -> None:
        """The weights after ``trainer.step`` updates of this run (before a perturbation due then)."""

    def looks(self, seed: int, arm: Arm) -> set[int]:
        """Steps at which :meth:`look` sees this run's weights (and nothing else: cheaper than a visit in a stack)."""
        return set()

    def look(self, seed: int, arm: Arm, step: int, weights: Mapping[str, torch.Tensor]) -> None:
        """The weights after ``step`` updates of this run (before a perturbation due then): views, valid
        during the call only (copy what you keep)."""

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> dict | None:
        """The run is done (before its done marker); returns what the seed's integrity record gains, if anything."""
        return None


class Observers(Observer):
    """Several observers as one, called in order."""

    def __init__(self, *observers: Observer):
        self.observers = observers

    def started(self, total: int) -> None:
        for o in self.observers:
            o.started(total)

    def run(self, label: str, steps: int, done: int = 0) -> None:
        for o in self.observers:
            o.run(label, steps, done)

    def step(self, label: str) -> None:
        for o in self.observers:
            o.step(label)

    def skip(self, steps: int) -> None:
        for o in self.observers:
            o.skip(steps)

    def stops(self, seed: int, arm: Arm) -> set[int]:
        return set().union(*(o.stops(seed, arm) for o in self.observers))

    def visit(self, seed: int, arm: Arm, trainer: Trainer) -> None:
        for o in self.observers:
            o.visit(seed, arm, trainer)

    def looks(self, seed: int, arm: Arm) -> set[int]:
        return set().union(*(o.looks(seed, arm) for o in self.observers))

    def look(self, seed: int, arm: Arm, step: int, weights: Mapping[str, torch.Tensor]) -> None:
        for o in self.observers:
            o.look(seed, arm, step, weights)

    def finished(self, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> dict | None:
        out = {k: v for o in self.observers for k, v in (o.finished(seed, arm, where, manifest) or {}).items()}
        return out or None


class ProgressBar(Observer):
    """The design's progress on a :class:`~seedlab.progress.Bar`: every update, and a line for the run in progress."""

    def __init__(self, bar: Bar):
        self.bar = bar

    def started(self, total: int) -> None:
        self.bar.set_total(total)

    def run(self, label: str, steps: int, done: int = 0) -> None:
        self.bar.start_sub(label, steps, done)

    def step(self, label: str) -> None:
        self.bar.step(label)

    def skip(self, steps: int) -> None:
        self.bar.advance(steps)


class Reported(Observer):
    """A seed trained in a worker process (executors.py ``run_local`` with ``on_progress``): its updates sent to the
    caller as ``(key, n)``, gathered for ``every`` seconds (executors.py ``Reporter``), so the caller's bar moves
    while the seed trains."""

    def __init__(self, key, every: float = 0.5):
        from seedlab.executors import Reporter

        self.report = Reporter(key, every)

    def step(self, label: str) -> None:
        self.report(1)

    def skip(self, steps: int) -> None:
        self.report(steps)


@dataclass(kw_only=True)
class Design:
    """One design's run: what it trains (``cfg``, the GPT config, the corpus's tokens), where
    (``folder``), its arms per seed (the twin first), what it records, and who watches. Its fields
    are given by name: ``Design(cfg=cfg, gcfg=gcfg, tokens=corpus.train, ...)``."""

    cfg: ForkDesign
    gcfg: GPTConfig
    tokens: np.ndarray  # the corpus's training tokens
    pad_id: int
    folder: DesignFolder
    arms: Callable[[int], Sequence[Arm]]  # seed -> its arms (the twin first)
    recording: Recording
    observer: Observer = field(default_factory=Observer)
    world: World = field(default_factory=World)
    independent: bool = False  # the audit: every arm trains its own prefix; hashes compared at s
    start: Callable[[], None] = lambda: None  # writes the folder's first files once the arms are checked (forks/start.py: Started.first_files)


def run_design(d: Design, run_seeds: Callable[[Design], Mapping[int, SeedResult]] | None = None
               ) -> tuple[dict, pd.DataFrame]:
    """Train (or finish) every seed's arms and replica controls; returns (integrity record,
    every run's losses with ``seed`` and ``arm`` columns). Every seed's arms are checked first
    (forks/arms.py ``check_arms``: a one-line error, nothing written), then ``d.start()`` writes
    the folder's first files (rank 0); integrity.json is written at the end, once every seed is done.
    ``run_seeds``: where the seeds run (``{seed: run_seed(d', seed)}``, in other processes, say);
    default: here, one after another."""
    _check(d)
    if d.world.main:
        d.start()
    d.world.barrier()
    stack = stacked.serial_because(d) is None
    d.observer.started(_total(d) + (stacked.solo_updates(d) if stack and not run_seeds else 0))
    with nondeterminism_is_an_error():
        if run_seeds:
            done = run_seeds(d)
        elif stack:  # every seed's runs in stacks together (forks/stacked.py)
            done = stacked.run_seeds(d, d.cfg.seeds)
        else:
            done = {seed: run_seed(d, seed) for seed in d.cfg.seeds}
    integrity = {"mode": "independent" if d.independent else "fork",
                 **({"arms": "stacked (forks/stacked.py)"} if stack else {}),
                 "seeds": {str(seed): done[seed][0] for seed in d.cfg.seeds}}
    frames = [f for seed in d.cfg.seeds for f in done[seed][1]]
    if d.world.main:
        write_json(d.folder.integrity, integrity)
    d.world.barrier()
    return integrity, pd.concat(frames, ignore_index=True)


def run_seed(d: Design, seed: int) -> SeedResult:
    """One seed: the prefix (or each arm's own, independent), the twin, the replica's first stretch,
    every other arm, the rest of the replica — or, where the design stacks its arms (forks/stacked.py
    ``serial_because`` is None), all of them in stacks. Returns the seed's integrity record and its runs' losses."""
    if stacked.serial_because(d) is None:
        return stacked.run_seeds(d, [seed])[seed]
    s, arms, w = d.cfg.injection_step, list(d.arms(seed)), d.folder.arm_word
    start, at_s, plain = _starts(d, seed, arms, lambda: Trainer(d.cfg, d.gcfg, seed, d.tokens, d.world))
    doses = Doses(d, lambda _: plain())  # the twin trains first: its state at s + 1 is kept for the others' doses
    early = early_starts(d, seed)
    record: dict = {"identical_at_injection": f"checked: every tensor's SHA-256 equal across {w}s" if d.independent
                    else f"by construction: every {w} forked from one copy of the prefix",
                    "arms": {a.name: a.record() for a in arms[1:]}}  # what each differs from the twin in
    replica = _Replica(d, seed, start) if seed in d.cfg.replica_seeds else None
    frames = []
    for i, arm in enumerate(arms):
        manifest, losses, added = run_arm(d, seed, arm, start, doses)
        if arm.name not in early:  # an arm that left the prefix before s is not the twin there
            at_s[arm.name] = manifest[str(s)]
        frames.append(losses.assign(seed=seed, arm=arm.name))
        merge(record, added)
        if i == 0 and replica is not None and not replica.done:  # the twin is done: fail fast
            record["replica_early"] = replica.check(manifest, through_first=True)
    check_identical(at_s, f"seed {seed}", s)
    if replica is not None:
        record["replica"] = replica.finish()
    if early:
        record["early_starts"] = early_record(early)
    if not (d.independent or d.recording.keep_prefix) and d.world.main:
        remove_prefix(d, seed)  # every fork of it is done
    return record, frames


def _check(d: Design) -> None:
    """Every seed's arms can run (forks/arms.py ``check_arms``) and start with the twin; else a one-line error."""
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in GPT(d.gcfg).state_dict().items()}
    for seed in d.cfg.seeds:
        arms = d.arms(seed)
        check_arms(arms, fork=d.cfg.injection_step, end=d.cfg.end, batch_size=d.cfg.batch_size,
                   block_size=d.gcfg.block_size, shapes=shapes)
        if not arms or arms[0] != TWIN:
            raise SeedlabError("arms: the first arm must be the twin (forks.arms.TWIN): the replica control's reference")
        if d.independent and any(a.leaves(d.cfg.injection_step) < d.cfg.injection_step for a in arms):
            late = next(a for a in arms if a.leaves(d.cfg.injection_step) < d.cfg.injection_step)
            raise SeedlabError(f"--independent: arm {late.name} leaves the prefix before the fork step; every arm of the "
                               "audit trains its own prefix to s")


def run_arm(d: Design, seed: int, arm: Arm, start: Callable[[str], tuple[Trainer, list[float]]], doses: Doses | None = None):
    """One seed x arm to the end, or read back when finished; returns (manifest, losses frame,
    what the observer adds to the seed's integrity record). ``doses``: where its dose at s is written
    (forks/dose.py; None: not recorded)."""
    cfg, rec, where, label = d.cfg, d.recording, d.folder.run(seed, arm.name), f"seed {seed} {arm.name}"
    finished, resumable = where.finished, rec.resume and where.state.is_file()
    manifest = where.read_manifest() if (finished or resumable) else {}
    first = arm.leaves(cfg.injection_step)  # where it starts: the fork step, or an earlier state of the prefix
    dosed = doses is not None and not finished and doses.wants(arm, where, fresh=not resumable)
    dose_at = {cfg.injection_step + 1} if doses is not None and doses.watches(arm, dosed) else set()
    d.world.barrier()  # every rank has looked at the folder before rank 0 writes to it
    if finished:  # before an interruption
        d.observer.skip(cfg.end - first)
        return manifest, pd.read_parquet(where.losses), extra(d, seed, arm, where, manifest)
    if resumable:
        trainer = Trainer(cfg, d.gcfg, seed, d.tokens, d.world)
        losses = trainer.load_state(where.state, manifest)
        d.observer.run(label, cfg.end - first, trainer.step - first)
    else:
        if d.world.main:
            where.clear()  # what an interruption left before the first resume point
        trainer, losses = start(label) if first == cfg.injection_step else start(label, first)
    # every run is compared at the fork (an early arm's hashes there are its own), and hashed where it starts
    hashed = rec.hashed.get(arm.name, frozenset()) | {cfg.injection_step, first}
    saved = rec.saved.get(arm.name, frozenset())
    recorded = hashed | saved
    watched, before = d.observer.stops(seed, arm), set(manifest)  # recorded before an interruption
    looked = d.observer.looks(seed, arm)

    def visit(tr: Trainer) -> None:
        t = tr.step
        if str(t) not in before:
            if t in recorded:
                manifest[str(t)] = tensor_hashes(tr.weights())
                d.world.check_same(manifest[str(t)], f"seed {seed}, {arm.name}, step {t}")
            if t in saved:
                save(d, where, tr, losses, manifest)
        if t in dose_at:
            doses.record(seed, arm, where, State.of(tr), write=dosed)
        if t in looked:
            d.observer.look(seed, arm, t, tr.weights())
        if t in watched:
            d.observer.visit(seed, arm, tr)

    def perturbed(record: dict) -> None:
        if d.world.main:
            write_json(where.perturbation, record)

    advance_to(trainer, cfg.end, arm=arm, pad_id=d.pad_id, stops=recorded | watched | looked | dose_at, visit=visit,
               on_step=lambda: d.observer.step(label), losses=losses, perturbed=perturbed)
    frame = losses_frame(d, losses)
    added = extra(d, seed, arm, where, manifest)
    finish(d, where, frame, manifest)
    return manifest, frame, added


def _starts(d: Design, seed: int, arms: list[Arm], new_trainer: Callable[[], Trainer]):
    """How a seed's runs start: a copy of the shared prefix at s, or (the independent audit) each
    arm's own prefix — trained here first, for every arm, saved at s and compared as each arrives.
    Returns (start(label) -> (trainer at s, losses), {arm: hashes at s} known so far, plain() -> a
    trainer at s that no observer hears of: the twin's state for the doses, forks/dose.py)."""
    s, obs = d.cfg.injection_step, d.observer
    if d.independent:
        if not d.recording.resume or any(s not in d.recording.saved.get(a.name, ()) for a in arms):
            raise SeedlabError("independent: every arm must save a resumable state at the injection step")

        def own(label: str) -> tuple[Trainer, list[float]]:
            trainer = new_trainer()
            obs.run(label, d.cfg.end)
            return trainer, advance_to(trainer, s, on_step=lambda: obs.step(label))

        at_s: dict[str, dict[str, str]] = {}
        for arm in arms:
            where = d.folder.run(seed, arm.name)
            manifest = where.read_manifest()
            d.world.barrier()
            if str(s) not in manifest:
                trainer, losses = own(f"seed {seed} {arm.name}")
                manifest[str(s)] = tensor_hashes(trainer.weights())
                save(d, where, trainer, losses, manifest)
            else:
                obs.skip(s)  # reached before an interruption
            at_s[arm.name] = manifest[str(s)]
            check_identical(at_s, f"seed {seed}", s)

        def plain() -> Trainer:
            trainer = new_trainer()
            advance_to(trainer, s)
            return trainer

        return own, at_s, plain
    prefix = SharedPrefix(d.folder.prefix(seed), new_trainer, s, world=d.world,
                          on_step=lambda: obs.step(f"seed {seed}: shared prefix"), earlier=earlier_states(d, seed))
    if prefix.saved:
        obs.skip(s)  # trained before an interruption
    else:
        obs.run(f"seed {seed} shared prefix", s)  # trained when the first arm forks it

    def fork(label: str, at: int | None = None) -> tuple[Trainer, list[float]]:
        if at is not None:
            prefix.kept()  # the prefix first: its earlier states are kept on the way
        trainer, losses = prefix.fork(at)
        obs.run(label, d.cfg.end - trainer.step)
        return trainer, losses

    return fork, {}, lambda: prefix.fork()[0]


class _Replica:
    """The replica control of one seed: the twin trained a second time from the same start. It
    runs in two stretches — through the twin's first recorded step after s, right after the twin
    (a non-deterministic kernel is caught in minutes, before any other arm), then to the end — and
    its weights must hash as the twin's at every recorded step, or a one-line error stops the design.
    Writes only its record (``replica/manifest.json``) and done marker."""

    def __init__(self, d: Design, seed: int, start):
        self.d, self.seed, self.start = d, seed, start
        self.where = d.folder.replica(seed)
        self.trainer: Trainer | None = None
        self.twin: Manifest = {}
        self.compared: list[int] = []

    @property
    def done(self) -> bool:
        """It finished before an interruption."""
        return self.where.finished

    def check(self, twin: Manifest, *, through_first: bool = False) -> dict:
        """Train the replica through the twin's first recorded step after s (``through_first``)
        or to the end, comparing on the way; returns the steps compared in this stretch."""
        d, label = self.d, f"seed {self.seed}: replica control"
        if self.trainer is None:
            self.twin = twin
            self.trainer, _ = self.start(f"seed {self.seed} replica control")
        s, end = d.cfg.injection_step, d.cfg.end
        d.observer.run(f"seed {self.seed} replica control", end - s, self.trainer.step - s)
        after = sorted(int(t) for t in twin if int(t) > self.trainer.step)
        stop = after[0] if through_first and after else end
        todo = {t: h for t, h in twin.items() if (self.trainer.step == s and int(t) == s) or self.trainer.step < int(t) <= stop}
        steps = replica_control(self.trainer, todo, stop, what=f"seed {self.seed}: the replica control",
                                repeats="the twin", on_step=lambda: d.observer.step(label), world=d.world)
        self.compared += steps
        return {"bitwise_equal_to_twin": True, "steps_compared": steps}

    def finish(self) -> dict:
        """The rest of the replica, to the end; returns its record (read back when it finished before)."""
        if self.done:
            self.d.observer.skip(self.d.cfg.end - (0 if self.d.independent else self.d.cfg.injection_step))
            return self.where.read_manifest()["record"]
        self.check(self.twin)
        record = {"bitwise_equal_to_twin": True, "steps_compared": self.compared}
        finish_replica(self.d, self.where, record)
        return record


def seed_updates(d: Design, seed: int) -> int:
    """Updates one seed trains: its prefix (or, independent, each arm's own), its arms and its replica control."""
    cfg, s = d.cfg, d.cfg.injection_step
    if d.independent:
        return (len(d.arms(seed)) + (seed in cfg.replica_seeds)) * cfg.end
    return s + sum(cfg.end - a.leaves(s) for a in d.arms(seed)) + (seed in cfg.replica_seeds) * (cfg.end - s)


def _total(d: Design) -> int:
    """Updates the whole design trains."""
    return sum(seed_updates(d, seed) for seed in d.cfg.seeds)
