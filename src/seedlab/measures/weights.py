"""Measures that compare two models of the same architecture (seed-matched runs).

Models are state dicts ``{name: tensor}`` with the same names and shapes. The measures:

- ``interpolate`` -- the straight line between two weight vectors,
  ``θ(α) = (1 - α)·θ_a + α·θ_b`` per tensor; ``θ(0) = θ_a`` and ``θ(1) = θ_b`` bitwise.
- ``barrier`` / ``barrier_curve`` -- the linear-interpolation loss barrier. With ``L(α)`` the loss
  of ``θ(α)`` on a fixed batch, the rise above the chord between the end losses is
  ``r(α) = L(α) - ((1 - α)·L(0) + α·L(1))``, and the barrier is ``max_α r(α)`` over a grid
  ``0 = α_0 < ... < α_K = 1``. It is ≥ 0 because ``r(0) = r(1) = 0``, and it is 0 when the loss is
  convex along the line (the runs sit in one linearly connected basin). Units: those of the loss
  (nats/token for the GPT).
- ``loss_path`` -- ``L(α)`` on a grid, from a caller-supplied ``loss_fn(state_dict) -> float``
  (optionally with the end losses ``L(0), L(1)`` supplied, so they are not evaluated again).
  A positive barrier means the loss rises above the chord somewhere along the line, i.e. the path
  is not convex there (negative curvature along it); it says nothing about a quadratic basin.
- ``weight_distance`` -- Euclidean distance ``||θ_a - θ_b||_2`` per layer group (``wte``, ``wpe``,
  ``blocks.{l}``, ``ln_f``: see ``layer_groups``) and overall, ``all = sqrt(Σ_g dist_g²)``;
  same units as the weights. ``aligned_distance``: the same after ``b``'s residual features, heads and
  MLP units are permuted to match ``a`` (lm/align.py, Git Re-Basin's weight matching by coordinate
  descent), which removes the permutation part of the gauge freedom between two seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from seedlab.errors import SeedlabError
from seedlab.lm.align import aligned
from seedlab.lm.gptconfig import GPTConfig

StateDict = dict[str, Tensor]


def _check_same(a: StateDict, b: StateDict) -> None:
    """Raise SeedlabError naming the first tensor whose name or shape differs between a and b."""
    for k in a:
        if k not in b:
            raise SeedlabError(f"models differ in tensors at {k!r}: in the first model only")
        if a[k].shape != b[k].shape:
            raise SeedlabError(f"models differ in shape at {k!r}: {tuple(a[k].shape)} vs {tuple(b[k].shape)}")
    for k in b:
        if k not in a:
            raise SeedlabError(f"models differ in tensors at {k!r}: in the second model only")


@torch.no_grad()
def interpolate(a: StateDict, b: StateDict, alpha: float) -> StateDict:
    """``(1 - alpha)·a + alpha·b`` per tensor (float tensors of equal dtype), in a's key order.

    ``torch.lerp`` computes ``a + α(b - a)`` for α < 0.5 and ``b - (1 - α)(b - a)`` otherwise, so
    alpha = 0 returns a's values and alpha = 1 b's values bitwise."""
    _check_same(a, b)
    for k in a:
        if not a[k].is_floating_point() or a[k].dtype != b[k].dtype:
            raise SeedlabError(f"models differ in dtype at {k!r} (need equal floats): {a[k].dtype} vs {b[k].dtype}")
    return {k: torch.lerp(a[k], b[k], float(alpha)) for k in a}


def barrier_curve(alphas: Sequence[float], losses: Sequence[float]) -> np.ndarray:
    """Rise of the loss above the chord between the end losses, ``L(α) - ((1-α)·L(0) + α·L(1))``, per α."""
    al, L = np.asarray(alphas, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    if al.ndim != 1 or al.shape != L.shape or len(al) < 2:
        raise SeedlabError(f"barrier: need 1-D alphas and losses of equal length >= 2, got {al.shape} and {L.shape}")
    if al[0] != 0.0 or al[-1] != 1.0 or not np.all(np.diff(al) > 0):
        raise SeedlabError(f"barrier: alphas must increase strictly from 0 to 1, got {al.tolist()}")
    return L - ((1 - al) * L[0] + al * L[-1])


def barrier(alphas: Sequence[float], losses: Sequence[float]) -> float:
    """Interpolation loss barrier: ``max_α [L(α) - ((1-α)·L(0) + α·L(1))]`` (≥ 0: the ends give 0)."""
    return float(barrier_curve(alphas, losses).max())


def loss_path(loss_fn: Callable[[StateDict], float], a: StateDict, b: StateDict, alphas: Iterable[float],
              ends: tuple[float, float] | None = None) -> np.ndarray:
    """``[loss_fn(interpolate(a, b, α)) for α in alphas]`` as float64.

    ``ends``: the losses of ``a`` and ``b`` themselves when the caller already has them; they are
    used at α = 0 and α = 1 (where ``interpolate`` returns a and b bitwise) instead of evaluating
    the models again, so a K-point grid costs K - 2 evaluations."""
    known = {} if ends is None else {0.0: float(ends[0]), 1.0: float(ends[1])}
    return np.array([known[al] if al in known else float(loss_fn(interpolate(a, b, al))) for al in map(float, alphas)],
                    dtype=np.float64)


def identical(a: StateDict, b: StateDict) -> bool:
    """True when a and b hold the same tensor names with bitwise-equal values (``torch.equal``)."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _group(key: str) -> str:
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def layer_groups(keys: Iterable[str]) -> list[str]:
    """Layer groups of state-dict keys in first-seen order: the first name component, or the first
    two for ``blocks.{l}.*``. For seedlab's GPT: ``wte, wpe, blocks.0, ..., blocks.{L-1}, ln_f``."""
    return list(dict.fromkeys(_group(k) for k in keys))


@torch.no_grad()
def weight_distance(a: StateDict, b: StateDict) -> dict[str, float]:
    """Euclidean distance between the weights: ``{"all": ..., group: ...}`` (float64 sums of squares)."""
    _check_same(a, b)
    sq = dict.fromkeys(layer_groups(a), 0.0)  # squared distance per group
    for k in a:
        sq[_group(k)] += float(((a[k].double() - b[k].double()) ** 2).sum())
    return {"all": math.sqrt(sum(sq.values())), **{g: math.sqrt(s) for g, s in sq.items()}}


def aligned_distance(a: StateDict, b: StateDict, gcfg: GPTConfig) -> float:
    """The overall weight distance from ``a`` to ``b`` permuted to match it (``lm.align.aligned``: the
    residual stream's features, and per layer the heads and MLP units; the same function as ``b``): never larger than the raw distance."""
    return weight_distance(a, aligned(a, b, gcfg))["all"]
