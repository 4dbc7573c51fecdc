"""The arm axis: a fork design's runs trained together in stacks (lm/stack.py); the folder contract unchanged.

    every seed's prefix not saved yet             one stack of fresh runs, 0 .. s-1, each saved as the serial loop saves it
    runs = the design's (seed, arm) in order      a replica seed's twin opens a stack; its replica closes it (another position)
    for each stack of arm_batch runs:             every run forked from its seed's prefix (or resumed where it stopped)
        at every step, for each run:              its records (hashes, checkpoint, state, the observer's visit,
                                                  at s + 1 its dose: forks/dose.py, the seed's twin visited first),
                                                  its perturbation (of the weights, or of the gradient: added
                                                  inside the stack's update), then one update of the whole stack
        the replica                               bitwise its twin at every recorded step, or a one-line error
        each run finished, in the design's order  losses, manifest, the observer's record, the done marker
    the solo check                                the first twin trained here, again alone, to its first recorded step after s:
                                                  bitwise the stacked twin (fp32 on CPU), or how far apart (recorded)

A run in a stack is, bit for bit, the run the serial loop (forks/loop.py) trains on CPU in fp32: every
file and record is the serial loop's, and integrity.json gains a ``stack`` entry per seed saying how it
was trained. Runs that resumed from different steps catch up first, the laggards stacked among themselves.
The serial loop stays for ``--independent``, torchrun, dropout and ``arm_batch: 1``
(:func:`serial_because`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.forks.arms import Arm
from seedlab.forks.dose import Doses, State
from seedlab.forks.folders import RunFolder
from seedlab.forks.prefix import SharedPrefix, advance_to, check_identical, first_difference
from seedlab.forks.records import (earlier_states, early_record, early_starts, extra, finish, finish_replica, losses_frame,
                                   merge, remove_prefix, save)
from seedlab.lm.gptconfig import param_count
from seedlab.lm.stack import Stack, groups
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes, write_json

#: runs per stack when ``arm_batch`` is null on a CPU: what a kill can lose of a design that saves no resumable
#: state (the bank) stays a stack's worth (benchmarks/arm_axis.py compares stack sizes); on CUDA only
#: ``stack_memory`` bounds it
CPU_CAP = 64
GiB = 2 ** 30


def serial_because(d) -> str | None:
    """Why design ``d`` (forks/loop.py ``Design``) trains its arms one after another (None: it stacks them)."""
    if d.cfg.arm_batch == 1:
        return "arm_batch: 1"
    if d.independent:
        return "--independent: every arm trains its own prefix, one after another"
    if d.world.size != 1:
        return "torchrun: each rank holds a slice of every batch"
    if d.gcfg.dropout:
        return "dropout draws from the global generator"
    return None


def solo_step(d) -> int | None:
    """Where the solo check (:meth:`_Loop._solo_check`) stops: the twin's first recorded step after s (None: none)."""
    return min((t for t in d.recording.hashed.get("twin", frozenset()) if t > d.cfg.injection_step), default=None)


def solo_updates(d) -> int:
    """Updates the solo check trains: the first unfinished twin again alone, from s to :func:`solo_step`; 0 when
    every twin finished before or the twin records no step after s."""
    step = solo_step(d)
    if step is None or all(d.folder.run(seed, d.arms(seed)[0].name).finished for seed in d.cfg.seeds):
        return 0
    return step - d.cfg.injection_step


def arm_batch(d, runs: int) -> int:
    """Runs per stack: ``arm_batch``, else as many as fit ``stack_memory`` (capped at :data:`CPU_CAP` on a CPU)."""
    if d.cfg.arm_batch is not None:
        return d.cfg.arm_batch
    device = d.world.device(d.cfg.device)
    if device.type == "cpu":  # one group's activations at a time, beside every run's tensors
        group, head = groups(device, d.cfg, d.gcfg, runs)
        fit = int(d.cfg.stack_memory * GiB - activation_bytes(d, group, head)) // run_bytes(d)
        return max(1, min(fit, CPU_CAP, runs))
    fit = int(d.cfg.stack_memory * GiB) // (run_bytes(d) + activation_bytes(d, 1, 1))  # every run's at once
    return max(1, min(fit, runs))


def run_bytes(d) -> int:
    """What one run holds in a stack: weights, gradient, two AdamW moments (fp32), and its solo copy's share."""
    return 5 * 4 * param_count(d.gcfg)


def activation_bytes(d, group: int, head: int) -> int:
    """A rough bound on the activations of ``group`` runs' forward and backward (lm/stack.py ``Stack._group``):
    their rows through every block (~20 d-wide tensors a layer) and ``head`` runs' logits (fp32 and their
    gradient, ~3 vocabulary-wide tensors)."""
    g, rows = d.gcfg, d.cfg.micro_batch or d.cfg.batch_size
    tokens = rows * g.block_size
    return 4 * tokens * (group * g.n_layer * 20 * g.n_embd + head * 3 * g.vocab_size)


@dataclass
class _Run:
    """One run of the design in the stacked loop: an arm of a seed, or a seed's replica control."""

    seed: int
    arm: Arm
    where: RunFolder
    replica: bool = False
    manifest: dict = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    before: set = field(default_factory=set)  # steps recorded before an interruption
    trainer: Trainer | None = None
    done: bool = False  # trained here or before; emitted (:meth:`_Loop.emit`) in the design's order
    compared: list[int] = field(default_factory=list)  # the replica's steps checked against the twin
    position: str = ""  # the replica's place in its stack
    dosed: bool = False  # writes its dose when it passes s + 1 (forks/dose.py ``Doses.wants``)

    @property
    def label(self) -> str:
        return f"seed {self.seed} {'replica control' if self.replica else self.arm.name}"


class _Loop:
    """The stacked loop of one design over some of its seeds (module doc)."""

    def __init__(self, d, seeds: Sequence[int]):
        self.d, self.seeds, self.s, self.end = d, list(seeds), d.cfg.injection_step, d.cfg.end
        self.arms = {seed: list(d.arms(seed)) for seed in self.seeds}
        self.runs: list[_Run] = []
        for seed in self.seeds:
            arms = self.arms[seed]
            self.runs += [_Run(seed, a, d.folder.run(seed, a.name)) for a in arms]
            if seed in d.cfg.replica_seeds:  # right after its twin (it trains at the far end of the twin's stack)
                self.runs.insert(len(self.runs) - len(arms) + 1, _Run(seed, arms[0], d.folder.replica(seed), replica=True))
        self.twins = {r.seed: r for r in self.runs if r.arm.is_twin and not r.replica}  # what each replica repeats
        self.batch = arm_batch(d, len(self.runs))
        # runs computed together in every arm stack of the design (lm/stack.py pads the last group to it), so no
        # run's kernels depend on its position or its stack's size; on a GPU each stack is one group
        device = d.world.device(d.cfg.device)
        self.group = min(groups(device, d.cfg, d.gcfg, self.batch)[0], self.batch) if device.type == "cpu" else None
        word = d.folder.arm_word
        self.records = {seed: {"identical_at_injection": f"by construction: every {word} forked from one copy of the prefix",
                               "arms": {a.name: a.record() for a in self.arms[seed][1:]},
                               "stack": {"arm_batch": self.batch}} for seed in self.seeds}
        self.frames: dict[int, list[pd.DataFrame]] = {seed: [] for seed in self.seeds}
        self.at_s: dict[int, dict] = {seed: {} for seed in self.seeds}
        self.emitted = 0
        self.early = {seed: early_starts(d, seed) for seed in self.seeds}  # arms that leave the prefix before s
        self.solo: dict | None = None  # the solo check's twin at its step: {"seed", "step", "hashes", "weights"}
        # each seed's twin passes s + 1 before its arms (an earlier stack or position); else from its prefix
        self.doses = Doses(d, lambda seed: self.prefixes[seed].fork()[0])
        self.last = {r.seed: i for i, r in enumerate(self.runs)}  # each seed's last run in the design's order

    # ---------------------------------------------------------------- the whole loop
    def run(self) -> dict:
        d = self.d
        for r in self.runs:
            r.done = r.where.finished
            if not r.replica and (r.done or (d.recording.resume and r.where.state.is_file())):
                r.manifest = r.where.read_manifest()
            if r.done:
                d.observer.skip(self.end - self._first(r))  # finished before an interruption
        self.prefixes = self._prefixes([r.seed for r in self.runs if not r.done])
        self._solo_check()
        pending = [r for r in self.runs if not r.done]
        for stack in self._stacks(pending):
            self._train(stack)
            self.emit()
        self.emit()
        out = {}
        for seed in self.seeds:
            check_identical(self.at_s[seed], f"seed {seed}", self.s)
            if self.early[seed]:
                self.records[seed]["early_starts"] = early_record(self.early[seed])
            if not d.recording.keep_prefix and d.world.main:
                remove_prefix(d, seed)  # every fork of it is done
            out[seed] = (self.records[seed], self.frames[seed])
        return out

    def _first(self, r: _Run) -> int:
        """The step run ``r`` starts from: the fork step, or (an arm that leaves the prefix before it) an earlier one."""
        return self.s if r.replica else r.arm.leaves(self.s)

    def _stacks(self, pending: list[_Run]) -> list[list[_Run]]:
        """The pending runs in stacks of ``batch``, in the design's order; a replica seed's twin opens a
        stack and its replica closes it (the twin at position 0, the replica at the far end). In stacks of
        one run the replica trains in the stack after its twin's (the design's order), so it always has
        the twin's hashes to compare with at every step."""
        stacks: list[list[_Run]] = []
        rest = list(pending)
        while rest:
            head = rest[0]
            twin = head.arm.is_twin and not head.replica and self.batch > 1
            mate = next((r for r in rest if r.replica and r.seed == head.seed), None) if twin else None
            take = [r for r in rest if r is not mate][: self.batch - (mate is not None)] + ([mate] if mate else [])
            stacks.append(take)
            rest = [r for r in rest if all(r is not t for t in take)]
        return stacks

    # ---------------------------------------------------------------- prefixes
    def _prefixes(self, seeds: list[int]) -> dict[int, SharedPrefix]:
        """Every seed's shared prefix; those not saved yet trained in one stack (each bitwise its solo run)."""
        d, obs, out = self.d, self.d.observer, {}
        for seed in self.seeds:
            out[seed] = SharedPrefix(d.folder.prefix(seed), lambda seed=seed: self._new(seed), self.s, world=d.world,
                                     earlier=earlier_states(d, seed))
        todo = [seed for seed in dict.fromkeys(seeds) if not out[seed].saved]
        for seed in self.seeds:
            if seed not in todo:
                obs.skip(self.s)  # trained before an interruption (or not needed: every run of the seed is done)
        if not todo:
            return out
        stack = Stack([self._new(seed) for seed in todo])
        losses: list[list[float]] = [[] for _ in todo]
        obs.run(f"{self._what(len(todo), 'shared prefix')}", self.s * len(todo))
        while stack.step < self.s:
            for i, seed in enumerate(todo):  # a state an early arm starts from (SharedPrefix.keep_early)
                if stack.step in out[seed].earlier:
                    out[seed].keep_early(stack.member(i), losses[i])
            for i, loss in enumerate(stack.advance([None] * len(todo))):
                losses[i].append(loss)
                obs.step("shared prefix")
        for i, seed in enumerate(todo):
            trainer = stack.member(i)
            if d.world.main:
                trainer.save_state(d.folder.prefix(seed), losses[i])
            out[seed]._kept = (trainer, losses[i])
        return out

    def _new(self, seed: int) -> Trainer:
        return Trainer(self.d.cfg, self.d.gcfg, seed, self.d.tokens, self.d.world)

    @staticmethod
    def _what(n: int, label: str) -> str:
        return label if n == 1 else f"{label} (+{n - 1} stacked)"

    # ---------------------------------------------------------------- the solo check
    def _solo_check(self) -> None:
        """The first twin trained here (not finished before) trained again alone (lm/trainer.py) from its
        prefix to its first recorded step after s; compared with the stacked twin there (:meth:`_compare_solo`).
        Nothing when every twin finished before (its record then says no solo check ran here)."""
        twin = next((r for r in self.runs if r.arm.is_twin and not r.replica and not r.done), None)
        step = solo_step(self.d)
        if twin is None or step is None:
            return
        trainer, _ = self.prefixes[twin.seed].fork()
        self.d.observer.run(f"seed {twin.seed} solo check", step - self.s)
        advance_to(trainer, step, on_step=lambda: self.d.observer.step("solo check"))
        self.solo = {"seed": twin.seed, "step": step, "hashes": tensor_hashes(trainer.weights()),
                     "weights": {k: v.detach().clone() for k, v in trainer.weights().items()}}
        if str(step) in twin.manifest:  # recorded before an interruption
            self._compare_solo(twin.seed, twin.manifest[str(step)], None)

    def _compare_solo(self, seed: int, hashes: dict, weights: dict | None) -> None:
        solo, record = self.solo, {"step": self.solo["step"]}
        if first_difference(solo["hashes"], hashes) is None:
            record["bitwise_equal_to_solo"] = True
        else:
            record["bitwise_equal_to_solo"] = False
            if weights is not None:
                diff = max(float((weights[k].double() - w.double()).abs().max()) for k, w in solo["weights"].items())
                record["max_abs_difference"] = diff
        self.records[seed].setdefault("stack", {})["solo_check"] = record
        self.solo = None

    # ---------------------------------------------------------------- training one stack
    def _start(self, r: _Run) -> None:
        """``r``'s trainer where it starts: resumed from its state file, or a fork of its seed's prefix."""
        d = self.d
        resumable = d.recording.resume and not r.replica and r.where.state.is_file()
        r.dosed = not r.replica and self.doses.wants(r.arm, r.where, fresh=not resumable)
        if resumable:
            r.trainer = self._new(r.seed)
            r.losses = r.trainer.load_state(r.where.state, r.manifest)
            r.before = set(r.manifest)
        else:
            if d.world.main:
                r.where.clear()  # what an interruption left before the first resume point
            r.manifest, r.before = {}, set()
            r.trainer, r.losses = self.prefixes[r.seed].fork(None if r.replica else r.arm.start)

    def _train(self, runs: list[_Run]) -> None:
        """Train ``runs`` to the end: the laggards (resumed from earlier steps) first catch up, stacked
        among themselves, then every run in one stack."""
        d = self.d
        for r in runs:
            self._start(r)
        steps = sorted({r.trainer.step for r in runs})
        for target in [*steps[1:], self.end]:
            behind = [r for r in runs if r.trainer.step < target]
            if not behind:
                continue
            stack = Stack([r.trainer for r in behind], group_runs=self.group)
            for seed in {r.seed for r in behind}:
                self.records[seed]["stack"].update(stack.guarantee())
            done = sum(stack.step - self._first(r) for r in behind)
            d.observer.run(self._what(len(behind), behind[0].label), sum(self.end - self._first(r) for r in behind), done)
            self._advance(stack, behind, target)
            for i, r in enumerate(behind):
                r.trainer = stack.member(i) if target < self.end else None
        for r in runs:
            r.done = True

    def _advance(self, stack: Stack, runs: list[_Run], end: int) -> None:
        """The stack from where it stands to ``end`` updates: as forks/prefix.py ``advance_to`` does for
        each run — its visit at a recorded step (at ``end`` too), its perturbation, one stacked update."""
        d = self.d
        while True:
            t = stack.step
            if t >= end and end < self.end:
                return  # a catch-up: the stack the laggards join visits this step
            for i, r in enumerate(runs):
                self._visit(stack, i, r, t)
            if t >= end:
                return
            kicks: list = [None] * len(runs)  # gradient-channel perturbations due now, per run
            for i, r in enumerate(runs):
                if not r.replica and r.arm.perturbation is not None and r.arm.perturbation.step == t:
                    solo = stack.member(i)  # the solo trainer the serial loop perturbs, at this θ
                    if r.arm.perturbation.channel == "gradient":
                        kick = r.arm.gradient_delta(solo, t)
                        kicks[i], done = (None, None) if kick is None else kick
                    else:
                        done = r.arm.perturb(solo, t)
                        stack.put(i, solo)
                    if done is not None and d.world.main:
                        write_json(r.where.perturbation, done)
            gone = [None if r.replica else r.arm.removed_at(t) for r in runs]
            losses = stack.advance([None if r.replica else r.arm.rows_at(t) for r in runs], pad_id=d.pad_id,
                                   weights=[None if r.replica else r.arm.weights_at(t) for r in runs],
                                   grad_deltas=kicks if any(k is not None for k in kicks) else None,
                                   removed=gone if any(g is not None for g in gone) else None)
            for r, loss in zip(runs, losses):
                r.losses.append(loss)
                d.observer.step(r.label)

    def _visit(self, stack: Stack, i: int, r: _Run, t: int) -> None:
        """Run ``r`` (position ``i``) after ``t`` updates: what the serial loop records there."""
        d, rec = self.d, self.d.recording
        if r.replica:
            twin = self.twins[r.seed]
            if str(t) in twin.manifest:
                r.position = f"{i} of a stack of {stack.size}"
                mine = tensor_hashes(stack.weights(i))
                bad = first_difference(twin.manifest[str(t)], mine)
                if bad is not None:
                    raise SeedlabError(f"seed {r.seed}: the replica control (position {i} of a stack of {stack.size}) "
                                       f"differs from the twin at step {t} in tensor {bad!r} (training is not deterministic "
                                       "here, or the stack mixes its runs; differences between forks are not the row's alone)")
                if t not in r.compared:
                    r.compared.append(t)
            return
        hashed = rec.hashed.get(r.arm.name, frozenset()) | {self.s, self._first(r)}
        saved = rec.saved.get(r.arm.name, frozenset())
        watched = d.observer.stops(r.seed, r.arm)
        solo = None
        if str(t) not in r.before:
            if t in hashed or t in saved:
                r.manifest[str(t)] = tensor_hashes(stack.weights(i))
            if t in saved:
                solo = stack.member(i)
                save(d, r.where, solo, r.losses, r.manifest)
        if t == self.s + 1 and self.doses.watches(r.arm, r.dosed):
            self.doses.record(r.seed, r.arm, r.where, State(stack.weights(i), stack.moments(i)), write=r.dosed)
        if t in d.observer.looks(r.seed, r.arm):
            d.observer.look(r.seed, r.arm, t, stack.weights(i))
        if t in watched:
            d.observer.visit(r.seed, r.arm, solo or stack.member(i))
        if self.solo is not None and r.arm.is_twin and r.seed == self.solo["seed"] and t == self.solo["step"]:
            self._compare_solo(r.seed, r.manifest[str(t)], stack.weights(i))

    # ---------------------------------------------------------------- finishing, in the design's order
    def emit(self) -> None:
        """Every run done whose predecessors are all emitted: its observer's record, its files, its done
        marker, its seed's integrity record — in the design's order, as the serial loop finishes them."""
        d, s = self.d, self.s
        while self.emitted < len(self.runs) and self.runs[self.emitted].done:
            r = self.runs[self.emitted]
            self.emitted += 1
            if self.emitted - 1 == self.last[r.seed]:
                self.doses.drop(r.seed)  # every run of the seed is done
            record = self.records[r.seed]
            if r.replica:
                if r.where.finished:
                    record["replica"] = r.where.read_manifest()["record"]
                else:
                    mine = {"bitwise_equal_to_twin": True, "steps_compared": sorted(r.compared)}  # the serial loop's record
                    finish_replica(d, r.where, mine)
                    record["replica"] = mine | {"position": r.position}  # where it sat: integrity.json only
                continue
            trained = not r.where.finished
            if trained:
                frame = losses_frame(d, r.losses)
            else:
                r.manifest = r.where.read_manifest()
                frame = pd.read_parquet(r.where.losses)
            added = extra(d, r.seed, r.arm, r.where, r.manifest)
            if trained:
                finish(d, r.where, frame, r.manifest)
            if r.arm.name not in self.early[r.seed]:  # an arm that left the prefix before s is not the twin there
                self.at_s[r.seed][r.arm.name] = r.manifest[str(s)]
            self.frames[r.seed].append(frame.assign(seed=r.seed, arm=r.arm.name))
            merge(record, added)


def run_seeds(d, seeds: Sequence[int]) -> dict:
    """Train (or finish) ``seeds`` of design ``d`` in stacks; returns ``{seed: (integrity record, losses frames)}``
    as forks/loop.py ``run_seed`` returns for each."""
    return _Loop(d, seeds).run()


