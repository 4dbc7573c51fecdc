"""Per-row gradients: how much replacing one row of a batch changes the full-batch gradient.

With the trainer's loss (masked CE *sum* over the batch divided by ``N = B·T``, the same
denominator for every condition: lm/trainer.py),

    g_base = ∇ L(ordinary batch)              L = (Σ_rest CE + Σ_row CE) / N
    g_p    = ∇ L(batch with passage p)        L = (Σ_rest CE + Σ_p CE) / N
    Δ_p    = g_p - g_base = (G_p - G_row) / N

where ``G_row`` and ``G_p`` are gradients of CE *sums* over one row (the ordinary row, the
passage row) and ``G_rest`` that of the other B-1 rows, which cancels: the two batches differ
by the row alone. The other rows are still differentiated once per batch (:class:`BatchGradients`)
for ``g`` itself (its norm decides the trainer's gradient clipping, and AdamW's update is not
linear in it: :class:`AdamStep`); every candidate then costs one row. Sums are kept in float64.
The gradients are the raw ones, before the trainer's gradient clipping and AdamW; the model runs
in float32 in eval mode (dropout off).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import inject
from seedlab.lm.determinism import deterministic
from seedlab.lm.model import GPT, masked_ce_sum


@dataclass
class Delta:
    """One passage's gradient delta (float64 vectors flattened over ``model.parameters()``) and norms."""

    vec: torch.Tensor  # Δ = (G_p - G_row) / N
    row_grad: torch.Tensor  # G_p / N: the passage row's own term of the injected batch's gradient
    norm: float  # ‖Δ‖₂
    row_norm: float  # ‖G_p‖₂ / N
    grad_norm: float  # ‖g_p‖₂, the injected batch's gradient (the trainer clips it to grad_clip before AdamW)
    base_grad_norm: float  # ‖g_base‖₂
    passage_targets: int  # the passage's next-token targets, len(p) - 1 (≤ T)


def flat_grad(model: GPT, loss: torch.Tensor) -> torch.Tensor:
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).double() for p, g in zip(params, grads)])


def ce_sum_grad(model: GPT, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, micro: int) -> tuple[torch.Tensor, float]:
    """∇ of the masked CE *sum* over the rows of (x, y, mask), ``micro`` rows per forward; and the sum."""
    device = next(model.parameters()).device
    total, value = None, 0.0
    for i in range(0, x.shape[0], micro):
        xs, ys, ms = (t[i : i + micro].to(device) for t in (x, y, mask))
        logits, _ = model(xs)
        s = masked_ce_sum(logits, ys, ms)
        g = flat_grad(model, s)
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
        self.n = B * T  # N, the denominator of every condition's loss
        ones = torch.ones(B, T, dtype=torch.bool)
        rest = [i for i in range(B) if i != row]
        with deterministic(self.device):
            if rest:
                self.g_rest, self.loss_rest = ce_sum_grad(model, x[rest], y[rest], ones[rest], micro_batch or len(rest))
            else:
                self.g_rest, self.loss_rest = None, 0.0
            self.g_row, self.loss_row = ce_sum_grad(model, x[row : row + 1], y[row : row + 1], ones[:1], 1)
        self.grad = (self.g_row if self.g_rest is None else self.g_rest + self.g_row) / self.n  # g_base
        self.base_norm = float(torch.linalg.vector_norm(self.grad))  # ‖g_base‖

    @property
    def loss(self) -> float:
        """The ordinary batch's mean loss (what the trainer records for this step)."""
        return (self.loss_rest + self.loss_row) / self.n

    def delta(self, passage: Sequence[int], pad_id: int) -> Delta:
        """``Δ_p = g_p - g_base`` for ``passage`` (token ids, at most block_size + 1) in the row."""
        xp, yp, mp = inject(self.x, self.y, self.row, passage, pad_id)
        i = self.row
        with deterministic(self.device):
            g_p, _ = ce_sum_grad(self.model, xp[i : i + 1], yp[i : i + 1], mp[i : i + 1], 1)
        vec = (g_p - self.g_row) / self.n
        row_grad = g_p / self.n
        return Delta(vec, row_grad, float(torch.linalg.vector_norm(vec)), float(torch.linalg.vector_norm(row_grad)),
                     float(torch.linalg.vector_norm(self.grad + vec)), self.base_norm, int(mp[i].sum()))


def gradient_delta(
    model: GPT, x: torch.Tensor, y: torch.Tensor, row: int, passage: Sequence[int], pad_id: int, *, micro_batch: int | None = None
) -> Delta:
    """``Δ = ∇L(batch with passage in row) - ∇L(batch)``, the trainer's mean loss (see the module docstring).

    For several passages on one batch build :class:`BatchGradients` once and call ``delta``."""
    return BatchGradients(model, x, y, row, micro_batch=micro_batch).delta(passage, pad_id)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    return float(torch.dot(a, b)) / (na * nb) if na > 0 and nb > 0 else math.nan


def _rel(a: float, b: float) -> float:
    """|a - b| relative to their mean."""
    mean = (a + b) / 2
    return abs(a - b) / mean if mean > 0 else math.nan


def pair_stats(a: Delta, b: Delta) -> dict[str, float]:
    """Two passages' deltas compared: ``rel_norm_diff`` = |‖Δa‖ − ‖Δb‖| / mean (the size of the
    change to the batch gradient), ``rel_vec_diff`` = ‖Δa − Δb‖ / mean, ``cosine`` of Δa and Δb;
    and the passages' own row gradients: ``row_rel_norm_diff`` and ``row_cosine`` of G_a and G_b."""
    diff = 0.0 if a.vec is b.vec else float(torch.linalg.vector_norm(a.vec - b.vec))
    mean = (a.norm + b.norm) / 2
    return {
        "rel_norm_diff": _rel(a.norm, b.norm),
        "rel_vec_diff": diff / mean if mean > 0 else math.nan,
        "cosine": _cos(a.vec, b.vec),
        "row_rel_norm_diff": _rel(a.row_norm, b.row_norm),
        "row_cosine": _cos(a.row_grad, b.row_grad),
    }


def clip_by_norm(g: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch's ``clip_grad_norm_`` on one flat gradient: ``g · min(1, max_norm / (‖g‖ + 1e-6))``."""
    return g * min(1.0, max_norm / (float(torch.linalg.vector_norm(g)) + 1e-6))


class AdamStep:
    """The update the trainer's AdamW makes from one state for a given raw gradient (float64).

    For a raw gradient ``g`` (flattened over ``model.parameters()``) at the optimizer state
    *before* the step (moments ``m, v`` and step count ``t - 1``), the trainer clips ``g`` to
    ``c = g · min(1, clip / (‖g‖ + 1e-6))`` (torch's clip_grad_norm_: :func:`clip_by_norm`) and AdamW moves the
    weights by

        u(g) = −lr · m̂ / (√v̂ + ε) − lr · wd · θ,   m̂ = (β₁m + (1−β₁)c) / (1−β₁ᵗ),   v̂ = (β₂v + (1−β₂)c²) / (1−β₂ᵗ).

    The decay term is the same for every gradient, so :meth:`delta` (``u(g_a) − u(g_b)``, the
    difference of two conditions' updates at the injection step) leaves it out; it is exact, not
    a linearization. ``opt`` is a ``torch.optim.AdamW`` over exactly ``params``."""

    def __init__(self, opt: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter], *, lr: float, grad_clip: float):
        self.lr, self.clip = lr, grad_clip
        m, v, eps, b1, b2, t = [], [], [], [], [], []
        group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
        for p in params:
            st, g = opt.state.get(p, {}), group_of[id(p)]
            n = p.numel()
            m.append(st["exp_avg"].reshape(-1).double().cpu() if st else torch.zeros(n, dtype=torch.float64))
            v.append(st["exp_avg_sq"].reshape(-1).double().cpu() if st else torch.zeros(n, dtype=torch.float64))
            step = int(st["step"]) if st else 0
            beta1, beta2 = g["betas"]
            for lst, val in ((eps, g["eps"]), (b1, beta1), (b2, beta2), (t, step + 1)):
                lst.append(torch.full((n,), float(val), dtype=torch.float64))
        self.m, self.v, self.eps, self.b1, self.b2, self.t = (torch.cat(z) for z in (m, v, eps, b1, b2, t))

    def update(self, g: torch.Tensor) -> torch.Tensor:
        """``u(g)`` without the weight-decay term (float64, flattened)."""
        c = clip_by_norm(g.double().cpu(), self.clip)
        m = (self.b1 * self.m + (1 - self.b1) * c) / (1 - self.b1**self.t)
        v = (self.b2 * self.v + (1 - self.b2) * c * c) / (1 - self.b2**self.t)
        return -self.lr * m / (v.sqrt() + self.eps)

    def delta(self, g_a: torch.Tensor, g_b: torch.Tensor) -> torch.Tensor:
        """``u(g_a) − u(g_b)``: how much two gradients' updates differ."""
        return self.update(g_a) - self.update(g_b)
