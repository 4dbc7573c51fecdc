"""Forks of one training run, and the bitwise checks that make them single-row counterfactuals.

- :class:`SharedPrefix` — steps 0 .. s-1 of a seed, trained once (or read back from its state
  file) and kept; :meth:`~SharedPrefix.fork` hands out independent copies at step s, or at an earlier
  step t whose state it keeps too (``earlier``: an arm that leaves the prefix before s, forks/arms.py ``start``).
- :func:`read_prefix` — a kept prefix's state file read back into a trainer, at the step it must hold.
- :func:`advance_to` — a run from wherever it stands to a given update, trained as an
  :class:`~seedlab.forks.arms.Arm` says (rows of some batches replaced, the weights or the gradient
  perturbed at one step), and a callback at chosen steps (write a checkpoint, hash the weights, evaluate queries).
- :func:`replica_control` — a run trained again from the same start must be bitwise equal to
  the first at every step whose hashes were recorded, or a one-line error stops everything.
- :func:`first_difference` / :func:`check_identical` — compare ``{tensor: SHA-256}`` records.
- :func:`check_prefix_reuse` — whether a prefix kept for one design is the prefix of another: every field it
  depends on the same, except the learning-rate schedule (:data:`SCHEDULE_FIELDS`), which may differ wherever it
  leaves the rate of every update the prefix trains (t = 0 .. s-1: lm/schedule.py's step convention) bitwise the
  same — a longer or shorter decay, run or floor with the warm-up ending at s — and is refused in one line naming
  the field where it changes one (:func:`schedule_change`).

Nothing here knows a study's folder layout: the prefix's file comes from the caller, and what
happens at a recorded step is the caller's callback. Under torchrun (``world``: the twins) every
rank runs the same calls on its slice of each batch; only rank 0 writes the prefix's state file,
and the replica control checks that every rank holds the same weights (``World.check_same``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm
from seedlab.lm.distributed import World
from seedlab.lm.schedule import default_warmup, lr_of
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes

Hashes = Mapping[str, str]  # {tensor name: SHA-256}


class SharedPrefix:
    """Steps 0 .. ``step``-1 of one seed, trained once when first needed (or read back from
    ``path``, its complete state: weights, optimizer moments, losses) and kept for every fork.

    ``new_trainer()`` makes the seed's trainer at step 0; ``on_step()`` is called after every
    update the prefix trains (a progress bar); ``path=None`` keeps the prefix in memory only.
    Under torchrun (``world``) every rank trains or reads the prefix, and rank 0 alone writes it.

    ``earlier``: ``{t: path}`` (t < ``step``; path None: in memory only) — states of the same run after t
    updates, kept too: saved on the way when the prefix trains here, read back from ``path`` when it is
    there, else trained again from step 0 (the prefix is a pure function of the seed: the same run, bit for
    bit) and saved. :meth:`fork` ``(at=t)`` hands out copies of them."""

    def __init__(self, path: Path | None, new_trainer: Callable[[], Trainer], step: int, *,
                 on_step: Callable[[], None] | None = None, world: World | None = None,
                 earlier: Mapping[int, Path | None] | None = None):
        self.path, self.new_trainer, self.step, self.on_step = path, new_trainer, step, on_step
        self.world = world or World()
        self._kept: tuple[Trainer, list[float]] | None = None
        self.earlier = dict(earlier or {})
        bad = sorted(t for t in self.earlier if not 0 <= t < step)
        if bad:
            raise SeedlabError(f"prefix: an earlier state must be before step {step}, got {bad[0]}")
        self._early: dict[int, tuple[Trainer, list[float]]] = {}

    @property
    def saved(self) -> bool:
        """Its state file exists (trained before, e.g. before an interruption)."""
        return self.path is not None and self.path.is_file()

    def kept(self) -> tuple[Trainer, list[float]]:
        """The prefix's own trainer at ``step`` and its losses (do not advance it: :meth:`fork`)."""
        if self._kept is None:
            trainer = self.new_trainer()
            if self.saved:
                losses = read_prefix(trainer, self.path, self.step)
            else:
                losses = []
                advance_to(trainer, self.step, on_step=self.on_step, stops=set(self.earlier),
                           visit=lambda tr: self.keep_early(tr, losses), losses=losses)
                if self.path is not None and self.world.main:
                    trainer.save_state(self.path, losses)
            self._kept = (trainer, losses)
        return self._kept

    def keep_early(self, trainer: Trainer, losses: list[float]) -> None:
        """Keep a copy of ``trainer`` (the prefix's own run, after ``trainer.step`` updates, one of ``earlier``)
        and its losses so far, and save its complete state where ``earlier`` gives a file (rank 0)."""
        t = trainer.step
        if t not in self.earlier or t in self._early:
            return
        self._early[t] = (trainer.fork(), list(losses))
        path = self.earlier[t]
        if path is not None and self.world.main and not path.is_file():
            trainer.save_state(path, losses)

    def fork(self, at: int | None = None) -> tuple[Trainer, list[float]]:
        """An independent copy of the prefix's trainer at ``step`` (model and optimizer state
        deep-copied together), and a copy of its losses; ``at``: at that earlier step instead (one of
        ``earlier``: the class doc)."""
        if at is None or at == self.step:
            trainer, losses = self.kept()
            return trainer.fork(), list(losses)
        if at not in self.earlier:
            raise SeedlabError(f"prefix: no kept state at step {at} (kept: {sorted(self.earlier)} and {self.step})")
        if at not in self._early:
            path = self.earlier[at]
            trainer = self.new_trainer()
            if path is not None and path.is_file():
                losses = read_prefix(trainer, path, at)
            else:  # the prefix's own run again, to step at (the same bits: a pure function of the seed)
                losses = advance_to(trainer, at, on_step=self.on_step)
                if path is not None and self.world.main:
                    trainer.save_state(path, losses)
            self._early[at] = (trainer, losses)
        trainer, losses = self._early[at]
        return trainer.fork(), list(losses)


def read_prefix(trainer: Trainer, path: Path, step: int, manifest: Mapping[str, Hashes] | None = None) -> list[float]:
    """Load a kept prefix's state file into ``trainer`` (every tensor's hash checked; its weights also
    against ``manifest``, ``{str(step): hashes}``, when given) and return its losses; a file holding the
    state after another number of updates than ``step`` (the fork step) is a one-line error."""
    losses = trainer.load_state(path, None if manifest is None else dict(manifest))
    if trainer.step != step:
        raise SeedlabError(f"{path}: holds the state after {trainer.step} updates, not {step}")
    return losses


def advance_to(trainer: Trainer, end: int, *, arm: Arm = TWIN, pad_id: int = 0, stops: Collection[int] = (),
               visit: Callable[[Trainer], None] | None = None, on_step: Callable[[], None] | None = None,
               losses: list[float] | None = None, perturbed: Callable[[dict], None] | None = None) -> list[float]:
    """Advance ``trainer`` until ``end`` updates are completed; returns the losses (appended to
    ``losses`` when given).

    The batch of step t carries ``arm``'s rows for t (padded with ``pad_id``) and leaves its removed rows
    out of the loss, every other batch is the ordinary one; ``arm``'s perturbation moves the weights just before the update of its step, or
    (its gradient channel) is added to that update's raw gradient before clipping.
    ``visit(trainer)`` is called whenever ``trainer.step`` is in ``stops`` — at the start too,
    before any update (and before a perturbation at that step) — with the weights after that many
    updates; ``on_step()`` after every update; ``perturbed(record)`` after the arm's perturbation."""
    losses = [] if losses is None else losses
    while True:
        if visit is not None and trainer.step in stops:
            visit(trainer)
        if trainer.step >= end:
            return losses
        done = arm.perturb(trainer, trainer.step)
        kick = arm.gradient_delta(trainer, trainer.step)
        if kick is not None:
            done = kick[1]
        if done is not None and perturbed is not None:
            perturbed(done)
        losses.append(trainer.advance(arm.rows_at(trainer.step), pad_id=pad_id, weights=arm.weights_at(trainer.step),
                                      grad_delta=None if kick is None else kick[0], removed=arm.removed_at(trainer.step)))
        if on_step is not None:
            on_step()


def first_difference(expected: Hashes, got: Hashes) -> str | None:
    """The first tensor (in ``expected``'s order) whose hash differs or is missing from ``got``; None: equal."""
    return next((k for k, h in expected.items() if got.get(k) != h), None)


def check_identical(records: Mapping[str, Hashes], what: str, step: int | None = None) -> None:
    """Every record (run name -> hashes, at ``step`` if given) equals the first; else a one-line
    error naming the tensor."""
    names, at = list(records), "" if step is None else f" at step {step}"
    for name in names[1:]:
        bad = first_difference(records[names[0]], records[name])
        if bad is not None:
            raise SeedlabError(f"{what}: {name} differs from {names[0]}{at} in tensor {bad!r} (the runs are not identical)")


def replica_control(trainer: Trainer, reference: Mapping[str, Hashes], end: int, *, what: str,
                    repeats: str = "the run it repeats", on_step: Callable[[], None] | None = None,
                    world: World | None = None) -> list[int]:
    """Train ``trainer`` (a second copy of a run's start) on ordinary batches to ``end``; at every
    step of ``reference`` (``{str(step): hashes}``, the first run's record) its weights must hash
    the same, else a one-line :class:`SeedlabError` (``what`` names the run, e.g. "seed 0: the
    replica control"; ``repeats`` the first, e.g. "the twin"). Under torchrun (``world``) every
    rank's hashes are first checked equal. Returns the steps compared."""
    compared: list[int] = []
    world = world or World()

    def compare(tr: Trainer) -> None:
        mine = tensor_hashes(tr.weights())
        world.check_same(mine, f"{what}, step {tr.step}")
        bad = first_difference(reference[str(tr.step)], mine)
        if bad is not None:
            raise SeedlabError(f"{what} differs from {repeats} at step {tr.step} in tensor {bad!r} "
                               "(training is not deterministic on this hardware; differences between forks are "
                               "not the row's alone)")
        compared.append(tr.step)

    advance_to(trainer, end, stops={int(t) for t in reference}, visit=compare, on_step=on_step)
    return compared


# --------------------------------------------------------------------------- reusing a kept prefix

#: a fork design's learning-rate schedule (forks/design.py; lm/schedule.py): a prefix depends on these only through
#: the rates of the updates it trains, so they may differ between two designs that share one where those rates do not
SCHEDULE_FIELDS = ("peak_lr", "warmup", "min_lr", "steps", "decay_steps")


def prefix_rates(record: Mapping, step: int) -> list[float]:
    """The learning rates of the updates a prefix to ``step`` trains (t = 0 .. ``step`` - 1) under the schedule of a
    fork design's config record (its ``config.json``; lm/schedule.py ``lr_of``; a record without ``decay_steps``
    decays to its ``steps``, as every design did before the field existed)."""
    cfg = SimpleNamespace(steps=record["steps"], peak_lr=record["peak_lr"], min_lr=record["min_lr"],
                          decay_steps=record.get("decay_steps"),
                          warmup_steps=record.get("warmup") or default_warmup(record["injection_step"]))
    return [lr_of(cfg, t) for t in range(step)]


def _bits(rates: list[float]) -> list[str]:
    return [r.hex() for r in rates]


def schedule_change(kept: Mapping, new: Mapping, step: int) -> str | None:
    """None when the schedule of config record ``new`` gives every update of a prefix to ``step`` bitwise the rate
    ``kept``'s gave it (:func:`prefix_rates`); else the one-line reason, naming the field whose change alone alters
    a rate (every field that differs when none does alone), the first update it alters and the two rates."""
    before = _bits(prefix_rates(kept, step))
    after = _bits(prefix_rates(new, step))
    if before == after:
        return None
    changed = [f for f in SCHEDULE_FIELDS if kept.get(f) != new.get(f)]

    def alters(field: str) -> bool:
        try:
            return _bits(prefix_rates({**kept, field: new.get(field)}, step)) != before
        except SeedlabError:  # that field alone makes no valid schedule with the others: not the same rates
            return True

    alone = [f for f in changed if alters(f)]
    named = alone[:1] or changed
    t = next(i for i, (a, b) in enumerate(zip(before, after)) if a != b)
    if len(named) == 1:
        head = f"{named[0]}: {kept.get(named[0])!r} -> {new.get(named[0])!r}"
    else:  # none alone (or no schedule field at all: the warm-up follows injection_step)
        head = " and ".join(named) + ": " + ", ".join(f"{f} {kept.get(f)!r} -> {new.get(f)!r}" for f in named) \
            if named else "schedule: the warm-up"
    return (f"{head} changes the rate of update t = {t} ({float.fromhex(before[t])!r} -> "
            f"{float.fromhex(after[t])!r}), before the fork step s = {step}")


def check_prefix_reuse(kept: Mapping, new: Mapping, step: int, fields: Iterable[str], *,
                       what: str = "the kept prefix") -> None:
    """Refuse, in one line naming the field, to reuse a prefix to ``step`` trained under config record ``kept``
    for a design with config record ``new``: every one of ``fields`` (what the prefix depends on) but the schedule's
    must be equal, and the schedule must give the prefix's updates bitwise the same rates (:func:`schedule_change`);
    a schedule that differs only after s passes. ``what`` names the prefix in the message."""
    for f in fields:
        if f not in SCHEDULE_FIELDS and kept.get(f) != new.get(f):
            raise SeedlabError(f"{f}: this design has {new.get(f)!r}, against {kept.get(f)!r} for {what} "
                               "(only the schedule after s may differ)")
    why = schedule_change(kept, new, step)
    if why is not None:
        raise SeedlabError(f"{why}: not the schedule of {what} (only the schedule after s may differ)")
