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
"""

from __future__ import annotations

import math

from seedlab.errors import SeedlabError


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


def default_warmup(injection_step: int) -> int:
    """Warm-up length that puts the injection update at exactly the peak rate: ``injection_step``.

    (``lr_at(injection_step, warmup=default_warmup(injection_step), ...) == peak_lr``.)"""
    if injection_step < 0:
        raise SeedlabError(f"injection_step: must be >= 0, got {injection_step!r}")
    return injection_step
