"""The learning-rate schedule: linear warm-up to the peak, then cosine decay to a floor.

Step convention (the same as the weight files' ``step-<t>``): ``t`` counts optimizer
updates already completed, so ``lr_at(t)`` is the rate of the update that turns
``step-t`` weights into ``step-(t+1)`` weights, i.e. the update that consumes the
batch of step ``t``.

- ``t < warmup``: ``peak_lr * t / warmup`` — 0 at step 0, ``peak_lr / warmup`` at step 1;
- ``t == warmup``: exactly ``peak_lr``;
- ``warmup <= t <= total``: cosine from ``peak_lr`` down to ``min_lr``, reached at ``t == total``;
- ``t > total``: ``min_lr``.

The paper injects at step 200 "at peak LR" but does not state the warm-up length;
the default (:func:`default_warmup`) ends the warm-up exactly at the injection step,
so the injected batch is the one update that runs at exactly ``peak_lr``.

- :func:`lr_at` — the rate at a step from the schedule's four numbers;
- :func:`lr_of` — the same from a config (the trainer's, a fork design's): the one place a
  config's rate at a step is computed (``Trainer.lr``, the attribution estimators' ``lr_s``);
- :func:`midpoint` — the "mid" checkpoint of a design: half-way from the injection step to the
  end unless the config names it.
"""

from __future__ import annotations

import math
from typing import Protocol

from seedlab.errors import SeedlabError


class Schedule(Protocol):
    """What :func:`lr_of` reads from a config (the trainer's ``Settings`` have all of it)."""

    steps: int  # the schedule's end: the cosine reaches min_lr here
    peak_lr: float
    min_lr: float

    @property
    def warmup_steps(self) -> int: ...  # linear warm-up length (updates)


def lr_at(step: int, *, peak_lr: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Learning rate of the update consuming step ``step``'s batch (see the module doc)."""
    if step < 0:
        raise SeedlabError(f"step: must be >= 0, got {step!r}")
    if warmup < 0:
        raise SeedlabError(f"warmup: must be >= 0, got {warmup!r}")
    if total < warmup:
        raise SeedlabError(f"total: must be >= warmup={warmup}, got {total!r}")
    if not 0 <= min_lr <= peak_lr:
        raise SeedlabError(f"min_lr: must be in [0, peak_lr={peak_lr}], got {min_lr!r}")
    if step < warmup:
        return peak_lr * step / warmup
    if step == warmup:
        return peak_lr
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak_lr - min_lr)


def lr_of(cfg: Schedule, step: int) -> float:
    """The rate of the update that consumes step ``step``'s batch under ``cfg``'s schedule
    (:func:`lr_at` with its ``peak_lr``, ``warmup_steps``, ``steps`` and ``min_lr``)."""
    return lr_at(step, peak_lr=cfg.peak_lr, warmup=cfg.warmup_steps, total=cfg.steps, min_lr=cfg.min_lr)


def midpoint(start: int, end: int, named: int | None = None) -> int:
    """The "mid" checkpoint (updates completed) between ``start`` (the injection step) and ``end``:
    ``named`` when the config gives one, else half-way, ``(start + end) // 2`` (rounded down)."""
    return named if named is not None else (start + end) // 2


def default_warmup(injection_step: int) -> int:
    """Warm-up length that puts the injection update at exactly the peak rate: ``injection_step``.

    (``lr_at(injection_step, warmup=default_warmup(injection_step), ...) == peak_lr``.)"""
    if injection_step < 0:
        raise SeedlabError(f"injection_step: must be >= 0, got {injection_step!r}")
    return injection_step
