"""AdamW over an ensemble: torch.optim.AdamW's update, with hyperparameters per member.

torch.optim.AdamW takes one scalar lr / weight decay per parameter group, but our
members share tensors (member axis first), so a group cannot hold one member. This
optimizer repeats torch's single-tensor AdamW step (torch/optim/adam.py,
``_single_tensor_adam`` with decoupled weight decay) with each scalar replaced by an
[S] vector broadcast over the member axis. Scalars are formed in float64 and cast,
as torch does with Python floats, and each fused op is rewritten so its CPU kernel
rounds as torch's does: a member's update is bitwise torch's (tests/test_optim.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor


class EnsembleAdamW:
    def __init__(
        self,
        params: Iterable[Tensor],
        *,
        lr: Sequence[float],
        weight_decay: Sequence[float],
        beta1: Sequence[float],
        beta2: Sequence[float],
        eps: Sequence[float],
    ):
        self.params = [p for p in params if p.requires_grad]
        self.S = self.params[0].shape[0]
        self.hp = {
            k: np.asarray(v, dtype=np.float64)
            for k, v in dict(lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2, eps=eps).items()
        }
        for k, v in self.hp.items():
            if v.shape != (self.S,):
                raise ValueError(f"{k}: need one value per member ({self.S}), got {v.shape}")
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def _vec(self, values: np.ndarray, like: Tensor) -> Tensor:
        """[S] float64 -> a float32 tensor shaped to broadcast over ``like``'s member axis."""
        return torch.as_tensor(values, dtype=like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        t = self.step_count
        hp = self.hp
        lr, b1, b2 = hp["lr"], hp["beta1"], hp["beta2"]
        # the scalars torch forms per step, per member (float64 before the cast)
        decay = 1.0 - lr * hp["weight_decay"]
        one_minus_b1 = 1.0 - b1
        one_minus_b2 = 1.0 - b2
        bias_correction1 = 1.0 - b1**t
        bias_correction2_sqrt = (1.0 - b2**t) ** 0.5
        neg_step_size = -(lr / bias_correction1)
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            vec = lambda a: self._vec(a, p)  # noqa: B023 -- used at once, in this iteration
            p.mul_(vec(decay))
            m.lerp_(g, vec(one_minus_b1))
            v.mul_(vec(b2)).addcmul_(vec(one_minus_b2) * g, g)  # == addcmul_(g, g, value=1-b2)
            denom = (v.sqrt() / vec(bias_correction2_sqrt)).add_(vec(hp["eps"]))
            p.addcdiv_(vec(neg_step_size) * m, denom)  # == addcdiv_(m, denom, value=-step_size)

    def state_dict(self) -> dict[str, Tensor]:
        out = {"step": torch.tensor(self.step_count)}
        for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq, strict=True)):
            out[f"exp_avg.{i}"], out[f"exp_avg_sq.{i}"] = m, v
        return out
