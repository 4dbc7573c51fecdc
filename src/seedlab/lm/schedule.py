"""The learning-rate schedule: linear warm-up to the peak, then cosine decay to a floor.

Step convention (the same as the weight files' ``step-<t>``): ``t`` counts optimizer
updates already completed, so ``lr_at(t)`` is the rate of the update that turns
``step-t`` weights into ``step-(t+1)`` weights, i.e. the update that consumes the
batch of step ``t``.

- ``t < warmup``: ``peak_lr * t / warmup`` — 0 at step 0, ``peak_lr / warmup`` at step 1;
- ``t == warmup``: exactly ``peak_lr``;
- ``warmup <= t <= decay``: cosine from ``peak_lr`` down to ``min_lr``, reached at ``t == decay``;
- ``t > decay``: ``min_lr`` (the floor).

``decay`` is the update count at which the cosine reaches the floor: a config's ``decay_steps``, or the run's
``steps`` when that is null (the default, and every schedule before the field existed: the decay ends where the
run ends, computed by exactly the same arithmetic). Apart from the run's length it separates how long the rate is
high from how many updates follow: ``decay_steps < steps`` leaves the run at the floor after the decay,
``decay_steps > steps`` ends the run part-way down a longer decay (at the rates that decay has there).

The paper injects at step 200 "at peak LR" but does not state the warm-up length;
the default (:func:`default_warmup`) ends the warm-up exactly at the injection step,
so the injected batch is the one update that runs at exactly ``peak_lr``.

- :func:`lr_at` — the rate at a step from the schedule's four numbers;
- :func:`lr_of` — the same from a config (the trainer's, a fork design's): the one place a
  config's rate at a step is computed (``Trainer.lr``, the attribution estimators' ``lr_s``);
- :func:`decay_end` — a config's ``decay_steps``, else its ``steps``;
- :func:`midpoint` — the "mid" checkpoint of a design: half-way from the injection step to the
  end unless the config names it.
"""

from __future__ import annotations

import math
from typing import Protocol

from seedlab.errors import SeedlabError


class Schedule(Protocol):
    """What :func:`lr_of` reads from a config (the trainer's ``Settings`` have all of it)."""

    steps: int  # the run's length; the cosine reaches min_lr here unless decay_steps says otherwise
    peak_lr: float
    min_lr: float
    # optional: ``decay_steps`` (int | None): where the cosine reaches min_lr; absent or None: ``steps``

    @property
    def warmup_steps(self) -> int: ...  # linear warm-up length (updates)


def lr_at(step: int, *, peak_lr: float, warmup: int, total: int, min_lr: float = 0.0,
          decay: int | None = None) -> float:
    """Learning rate of the update consuming step ``step``'s batch (see the module doc): the cosine reaches
    ``min_lr`` at ``decay`` (None: at ``total``, the run's length)."""
    if step < 0:
        raise SeedlabError(f"step: must be >= 0, got {step!r}")
    if warmup < 0:
        raise SeedlabError(f"warmup: must be >= 0, got {warmup!r}")
    if total < warmup:
        raise SeedlabError(f"total: must be >= warmup={warmup}, got {total!r}")
    if decay is not None and decay < warmup:
        raise SeedlabError(f"decay: must be >= warmup={warmup}, got {decay!r}")
    if not 0 <= min_lr <= peak_lr:
        raise SeedlabError(f"min_lr: must be in [0, peak_lr={peak_lr}], got {min_lr!r}")
    end = total if decay is None else decay
    if step < warmup:
        return peak_lr * step / warmup
    if step == warmup:
        return peak_lr
    if step >= end:
        return min_lr
    progress = (step - warmup) / (end - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak_lr - min_lr)


def decay_end(cfg: Schedule) -> int:
    """Where ``cfg``'s cosine reaches ``min_lr``: its ``decay_steps``, else (absent or None) its ``steps``."""
    d = getattr(cfg, "decay_steps", None)
    return cfg.steps if d is None else d


def lr_of(cfg: Schedule, step: int) -> float:
    """The rate of the update that consumes step ``step``'s batch under ``cfg``'s schedule
    (:func:`lr_at` with its ``peak_lr``, ``warmup_steps``, ``steps``, ``min_lr`` and ``decay_steps``, None
    where the config has none)."""
    return lr_at(step, peak_lr=cfg.peak_lr, warmup=cfg.warmup_steps, total=cfg.steps, min_lr=cfg.min_lr,
                 decay=getattr(cfg, "decay_steps", None))


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
