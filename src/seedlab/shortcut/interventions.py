"""Interventions on every component of an ensemble: ablation and cross-split activation patching.

Computed for all S members of an :class:`EnsembleTransformer` at once and returned as numpy
arrays ``[S, layers, heads + 1]``, where the extra last index is the layer's MLP.

Components:
    head ``(l, h)``  -> ``blocks.l.attn.hook_result[..., h, :]`` (the head's write into the
                        residual stream, before the shared bias b_O), all positions;
    MLP ``l``        -> ``blocks.l.hook_mlp_out``, all positions.

Every forward pass here (the clean reference as well as the ablated/patched ones) runs with
the same hooks registered on all those points (:func:`hooked_run`), so the clean and the
intervened runs take the same code path: a replacement by identical values changes the
logits by exactly 0.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from seedlab.shortcut.fingerprints import check_batch
from seedlab.shortcut.model import EnsembleTransformer


def component_hooks(model: EnsembleTransformer) -> list[str]:
    """The hook points of every component: each layer's ``attn.hook_result`` and ``hook_mlp_out``."""
    names = []
    for l in range(model.cfg.layers):
        names += [f"blocks.{l}.attn.hook_result", f"blocks.{l}.hook_mlp_out"]
    return names


def hooked_run(
    model: EnsembleTransformer, x: Tensor, layer: int | None = None, head: int = 0, value: Tensor | None = None
) -> Tensor:
    """Logits [S, B, C] with every component hook registered; optionally one component replaced.

    ``head`` in ``0..H-1`` replaces ``hook_result[..., head, :]`` of ``layer`` by ``value``
    (broadcastable to [S, B, pos, d]); ``head == H`` replaces the layer's ``hook_mlp_out``.
    """
    H = model.cfg.heads
    target = None
    if layer is not None:
        target = f"blocks.{layer}.attn.hook_result" if head < H else f"blocks.{layer}.hook_mlp_out"

    def fn(act: Tensor, name: str) -> Tensor | None:
        if name != target:
            return None
        if head < H:
            act = act.clone()
            act[..., head, :] = value
            return act
        return value.expand_as(act).clone()

    with torch.no_grad():
        return model.run_with_hooks(x, [(n, fn) for n in component_hooks(model)])


def cached_run(model: EnsembleTransformer, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The clean logits and every component's activation."""
    with torch.no_grad():
        return model.run_with_cache(x, component_hooks(model))


def component(cache: dict[str, Tensor], layer: int, head: int, H: int) -> Tensor:
    """One component's activation [S, B, pos, d] from a cache of :func:`cached_run`."""
    if head < H:
        return cache[f"blocks.{layer}.attn.hook_result"][..., head, :]
    return cache[f"blocks.{layer}.hook_mlp_out"]


def accuracy(logits: Tensor, y: Tensor) -> Tensor:
    """Per member: the fraction of rows whose argmax is the label. [S, B, C], [S, B] -> [S]."""
    return (logits.argmax(-1) == y).double().mean(1)


def logit_diff(logits: Tensor, y: Tensor) -> Tensor:
    """Per row: correct-class logit minus the largest other logit. [S, B, C], [S, B] -> [S, B]."""
    correct = logits.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    other = logits.scatter(-1, y.unsqueeze(-1), float("-inf")).max(-1).values
    return (correct - other).double()


# --------------------------------------------------------------------------- ablation
def ablate(model: EnsembleTransformer, x: Tensor, y: Tensor, kind: str = "zero") -> np.ndarray:
    """Accuracy change from ablating each head's output and each layer's MLP output.

    ``kind="zero"`` replaces the component's activation (all positions) by 0;
    ``kind="mean"`` by its mean over the batch of ``x`` (per member and position) in the
    clean run. Returns ``ablated accuracy - clean accuracy`` on (x, y), shape
    [S, layers, heads + 1] (last index: the MLP). Negative = the component was needed.
    """
    if kind not in ("zero", "mean"):
        raise ValueError(f"kind: must be 'zero' or 'mean', got {kind!r}")
    check_batch(model, x)
    S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
    base_logits, cache = cached_run(model, x)
    base = accuracy(base_logits, y)
    out = np.zeros((S, Ly, H + 1))
    for l in range(Ly):
        for h in range(H + 1):
            act = component(cache, l, h, H)
            value = torch.zeros_like(act) if kind == "zero" else act.mean(1, keepdim=True).expand_as(act)
            out[:, l, h] = (accuracy(hooked_run(model, x, l, h, value), y) - base).cpu().numpy()
    return out


# --------------------------------------------------------------------------- patching
def patch_delta(
    model: EnsembleTransformer, x_src: Tensor, x_dst: Tensor, y_dst: Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of :func:`patch`: (moved [S, layers, heads+1], full [S]).

    ``moved = mean_i ld(patched)_i - mean_i ld(dst)_i`` and ``full = mean_i ld(src)_i - mean_i ld(dst)_i``,
    every logit difference ``ld`` taken against ``y_dst`` (see :func:`patch`).
    """
    check_batch(model, x_src)
    check_batch(model, x_dst)
    if x_src.shape != x_dst.shape or y_dst.shape != x_dst.shape[:2]:
        raise ValueError(
            f"patch: x_src {list(x_src.shape)}, x_dst {list(x_dst.shape)} and y_dst {list(y_dst.shape)}"
            " must pair row i with row i"
        )
    S, Ly, H = model.S, model.cfg.layers, model.cfg.heads
    src_logits, cache = cached_run(model, x_src)
    dst_logits = hooked_run(model, x_dst)
    ld_dst = logit_diff(dst_logits, y_dst).mean(1)
    full = (logit_diff(src_logits, y_dst).mean(1) - ld_dst).cpu().numpy()
    moved = np.zeros((S, Ly, H + 1))
    for l in range(Ly):
        for h in range(H + 1):
            patched = hooked_run(model, x_dst, l, h, component(cache, l, h, H))
            moved[:, l, h] = (logit_diff(patched, y_dst).mean(1) - ld_dst).cpu().numpy()
    return moved, full


def patch(model: EnsembleTransformer, x_src: Tensor, x_dst: Tensor, y_dst: Tensor, eps: float = 1e-9) -> np.ndarray:
    """Cross-split activation patching: the fraction of the logit difference each component moves.

    Row i of ``x_src`` is paired with row i of ``x_dst`` (same shape [S, B, length]).
    ``ld(logits)_i = logits_i[y_dst_i] - max_{c != y_dst_i} logits_i[c]`` (correct-class
    logit minus the best other class, always w.r.t. the DESTINATION labels). Runs:

    - dst:     the model on ``x_dst``;
    - src:     the model on ``x_src`` (its logits scored against ``y_dst``: where a full
               transplant of the source computation would take the destination);
    - patched: the model on ``x_dst`` with one component's activation (all positions)
               replaced by its activation in the src run (row i from row i).

    ``fraction = (mean_i ld(patched) - mean_i ld(dst)) / (mean_i ld(src) - mean_i ld(dst))``,
    per member (a ratio of batch means, not a mean of per-row ratios). 1 = this component
    alone carries the whole src-vs-dst difference, 0 = none of it; it may leave [0, 1]. When
    ``|denominator| <= eps`` the fraction is nan: in particular ``x_src == x_dst`` gives nan
    (and its numerator, see :func:`patch_delta`, is exactly 0). Returns [S, layers, heads + 1].
    """
    moved, full = patch_delta(model, x_src, x_dst, y_dst)
    den = full[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.abs(den) > eps, moved / np.where(np.abs(den) > eps, den, 1.0), np.nan)
