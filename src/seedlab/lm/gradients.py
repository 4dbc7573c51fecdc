"""Per-row gradients: how much replacing one row of a batch changes the full-batch gradient.

With the trainer's loss (masked CE *sum* over the batch divided by its ``N`` target tokens),

    g_base = ∇ L(ordinary batch)              L = Σ_rows CE / N,             N  = B·T
    g_p    = ∇ L(batch with passage p)        L = (Σ_rest CE + Σ_p CE) / N', N' = (B-1)·T + len(p) - 1
    Δ_p    = g_p - g_base = G_rest·(1/N' - 1/N) + G_p/N' - G_row/N

where ``G_rest``, ``G_row`` and ``G_p`` are gradients of CE *sums* (the other rows, the
ordinary row, the passage row). So the other B-1 rows are differentiated once per batch
(:class:`BatchGradients`) and every candidate costs one row; the combination is done in
float64, which keeps ``Δ`` (about 1/B of ``g``) free of the cancellation that ``g_p - g_base``
in float32 would suffer. The gradients are the raw ones, before the trainer's gradient
clipping and AdamW; the model runs in float32 in eval mode (dropout off).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import inject
from seedlab.lm.model import GPT, masked_ce_sum


@dataclass
class Delta:
    """One passage's gradient delta: ``vec`` (float64, flattened over ``model.parameters()``) and norms."""

    vec: torch.Tensor
    norm: float  # ‖Δ‖₂
    grad_norm: float  # ‖g_p‖₂ (the trainer clips the gradient to grad_clip before AdamW)
    base_grad_norm: float  # ‖g_base‖₂
    n_targets: int  # N', the injected batch's target tokens


@contextlib.contextmanager
def _deterministic(device: torch.device):
    """Deterministic kernels on CUDA (the trainer's setting), restored afterwards."""
    if device.type != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _flat_grad(model: GPT, loss: torch.Tensor) -> torch.Tensor:
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double() for p, g in zip(params, grads)])


def _ce_sum_grad(model: GPT, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, micro: int) -> tuple[torch.Tensor, float]:
    """∇ of the masked CE *sum* over the rows of (x, y, mask), ``micro`` rows per forward; and the sum."""
    device = next(model.parameters()).device
    total, value = None, 0.0
    for i in range(0, x.shape[0], micro):
        xs, ys, ms = (t[i : i + micro].to(device) for t in (x, y, mask))
        logits, _ = model(xs)
        s = masked_ce_sum(logits, ys, ms)
        g = _flat_grad(model, s)
        total = g if total is None else total + g
        value += float(s.detach().double())
    assert total is not None
    return total, value


class BatchGradients:
    """The ordinary batch's gradients at one model state, reused by every candidate passage.

    ``x, y`` [B, T]: the batch; ``row``: the row a passage replaces; ``micro_batch``: rows
    per forward/backward for the other rows (memory only)."""

    def __init__(self, model: GPT, x: torch.Tensor, y: torch.Tensor, row: int, *, micro_batch: int | None = None):
        B, T = x.shape
        if not 0 <= row < B:
            raise SeedlabError(f"row: must be in 0 .. {B - 1}, got {row!r}")
        self.model, self.x, self.y, self.row = model, x, y, row
        self.device = next(model.parameters()).device
        self.n = B * T
        ones = torch.ones(B, T, dtype=torch.bool)
        rest = [i for i in range(B) if i != row]
        with _deterministic(self.device):
            if rest:
                self.g_rest, self.loss_rest = _ce_sum_grad(model, x[rest], y[rest], ones[rest], micro_batch or len(rest))
            else:
                self.g_rest, self.loss_rest = None, 0.0
            self.g_row, self.loss_row = _ce_sum_grad(model, x[row : row + 1], y[row : row + 1], ones[:1], 1)
        base = self.g_row if self.g_rest is None else self.g_rest + self.g_row
        self.base_norm = float(torch.linalg.vector_norm(base)) / self.n  # ‖g_base‖

    @property
    def loss(self) -> float:
        """The ordinary batch's mean loss (what the trainer records for this step)."""
        return (self.loss_rest + self.loss_row) / self.n

    def delta(self, passage: Sequence[int], pad_id: int) -> Delta:
        """``Δ_p = g_p - g_base`` for ``passage`` (token ids, at most block_size + 1) in the row."""
        xp, yp, mp = inject(self.x, self.y, self.row, passage, pad_id)
        i = self.row
        with _deterministic(self.device):
            g_p, _ = _ce_sum_grad(self.model, xp[i : i + 1], yp[i : i + 1], mp[i : i + 1], 1)
        n_p = int(mp.sum())
        vec = g_p / n_p - self.g_row / self.n
        if self.g_rest is not None:
            vec = vec + self.g_rest * (1.0 / n_p - 1.0 / self.n)
        g = g_p if self.g_rest is None else self.g_rest + g_p  # n_p·g_p
        grad_norm = float(torch.linalg.vector_norm(g)) / n_p
        return Delta(vec, float(torch.linalg.vector_norm(vec)), grad_norm, self.base_norm, n_p)


def gradient_delta(
    model: GPT, x: torch.Tensor, y: torch.Tensor, row: int, passage: Sequence[int], pad_id: int, *, micro_batch: int | None = None
) -> Delta:
    """``Δ = ∇L(batch with passage in row) - ∇L(batch)``, the trainer's mean loss (see the module docstring).

    For several passages on one batch build :class:`BatchGradients` once and call ``delta``."""
    return BatchGradients(model, x, y, row, micro_batch=micro_batch).delta(passage, pad_id)


def pair_stats(a: Delta, b: Delta) -> dict[str, float]:
    """rel_norm_diff, rel_vec_diff (both relative to the mean norm) and cosine of two deltas."""
    mean = (a.norm + b.norm) / 2
    diff = 0.0 if a.vec is b.vec else float(torch.linalg.vector_norm(a.vec - b.vec))
    dot = float(torch.dot(a.vec, b.vec))
    return {
        "rel_norm_diff": abs(a.norm - b.norm) / mean if mean > 0 else math.nan,
        "rel_vec_diff": diff / mean if mean > 0 else math.nan,
        "cosine": dot / (a.norm * b.norm) if a.norm > 0 and b.norm > 0 else math.nan,
    }
