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

Nothing here knows a study's folder layout: the prefix's file comes from the caller, and what
happens at a recorded step is the caller's callback. Under torchrun (``world``: the twins) every
rank runs the same calls on its slice of each batch; only rank 0 writes the prefix's state file,
and the replica control checks that every rank holds the same weights (``World.check_same``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm
from seedlab.lm.distributed import World
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
