"""Gradient dynamics during training: the paper's gradient conflict and amplification.

Per member, on its training split, with the current weights:

    g_c = grad of the mean loss over shortcut-consistent samples
    g_a = grad of the mean loss over anti-shortcut samples
    cosine       = <g_c, g_a> / (|g_c| |g_a|)        conflict: negative early, -> 0 as 2L generalizes
    share_c/a    = <(n_g/n) g_g, g> / |g|^2           each group's share of the full-batch gradient
                                                      g = (n_c g_c + n_a g_a) / n; the shares sum to 1
    per_example_ratio = mean_j |grad l_j| over anti / over consistent   amplification; compare r/(1-r)

Per-example norms use ``sample`` examples of each group (vmap of per-example gradients);
the group gradients use the whole split, in chunks. All members at once: their losses are
independent, so the gradient of the sum is each member's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from seedlab.shortcut.model import EnsembleTransformer

COLUMNS = ["member", "epoch", "cosine", "norm_consistent", "norm_anti", "share_consistent", "share_anti", "per_example_ratio", "expected_ratio"]


def _flat_dot(a: list[Tensor], b: list[Tensor]) -> Tensor:
    """Per-member inner product of two gradient lists (each tensor [S, ...]) -> [S]."""
    return sum((x * y).flatten(1).sum(1) for x, y in zip(a, b, strict=True))


def group_gradients(model: EnsembleTransformer, x: Tensor, y: Tensor, consistent: Tensor, chunk: int) -> tuple[list[Tensor], list[Tensor], Tensor, Tensor]:
    """Mean-loss gradients over the consistent and anti groups of each member's split."""
    params = [p for p in model.parameters()]
    n_c = consistent.sum(1).clamp(min=1).to(x.device)
    n_a = (~consistent).sum(1).clamp(min=1).to(x.device)
    g_c = [torch.zeros_like(p) for p in params]
    g_a = [torch.zeros_like(p) for p in params]
    for i in range(0, x.shape[1], chunk):
        logits = model(x[:, i : i + chunk])
        S, B, C = logits.shape
        ce = torch.nn.functional.cross_entropy(logits.reshape(S * B, C), y[:, i : i + chunk].reshape(S * B), reduction="none").view(S, B)
        m = consistent[:, i : i + chunk].to(ce.dtype)
        loss_c = ((ce * m).sum(1) / n_c).sum()
        loss_a = ((ce * (1 - m)).sum(1) / n_a).sum()
        for acc, loss, keep in ((g_c, loss_c, True), (g_a, loss_a, False)):
            for a, g in zip(acc, torch.autograd.grad(loss, params, retain_graph=keep, allow_unused=True), strict=True):
                if g is not None:
                    a += g
    return g_c, g_a, n_c, n_a


def per_example_norms(model: EnsembleTransformer, x: Tensor, y: Tensor) -> Tensor:
    """|grad l_j| for each member and example: x [S, K, L], y [S, K] -> [S, K]."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p: dict[str, Tensor], xj: Tensor, yj: Tensor) -> Tensor:
        logits = functional_call(model, p, (xj.unsqueeze(1),))  # [S, 1, C]
        return torch.nn.functional.cross_entropy(logits[:, 0], yj, reduction="sum")  # members add up

    grads = vmap(grad(loss_one), in_dims=(None, 1, 1))(params, x, y)  # each [K, S, ...]
    sq = sum(g.flatten(2).pow(2).sum(2) for g in grads.values())  # [K, S]
    return sq.sqrt().T


def _sample(consistent: Tensor, group: bool, k: int, seed: int) -> Tensor:
    """Per member, k indices of the group (with replacement when the group is smaller): [S, k]."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for row in consistent:
        idx = torch.nonzero(row == group).flatten()
        if idx.numel() == 0:
            rows.append(torch.zeros(k, dtype=torch.long))
        else:
            rows.append(idx[torch.randint(idx.numel(), (k,), generator=g)])
    return torch.stack(rows)


def measure(
    model: EnsembleTransformer, x: Tensor, y: Tensor, consistent: Tensor, ratios: list[float], epoch: int, *, chunk: int, sample: int, seed: int = 0
) -> pd.DataFrame:
    """One measurement of every member: a frame with ``COLUMNS``."""
    g_c, g_a, n_c, n_a = group_gradients(model, x, y, consistent, chunk)
    norm_c, norm_a = _flat_dot(g_c, g_c).sqrt(), _flat_dot(g_a, g_a).sqrt()
    cosine = _flat_dot(g_c, g_a) / (norm_c * norm_a)
    n = n_c + n_a
    w_c, w_a = (n_c / n).view(-1), (n_a / n).view(-1)
    total = [w_c.view(-1, *[1] * (a.dim() - 1)) * a + w_a.view(-1, *[1] * (b.dim() - 1)) * b for a, b in zip(g_c, g_a, strict=True)]
    tt = _flat_dot(total, total)
    share_c = w_c * _flat_dot(g_c, total) / tt
    share_a = w_a * _flat_dot(g_a, total) / tt
    per_example_ratio = torch.full_like(cosine, float("nan"))
    if sample > 0:
        dev = x.device
        ic, ia = _sample(consistent.cpu(), True, sample, seed).to(dev), _sample(consistent.cpu(), False, sample, seed + 1).to(dev)
        take = lambda idx: (torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[2])), torch.gather(y, 1, idx))
        pc, pa = per_example_norms(model, *take(ic)), per_example_norms(model, *take(ia))
        per_example_ratio = pa.mean(1) / pc.mean(1)
    has_both = (consistent.any(1) & (~consistent).any(1)).to(cosine.device)
    nan = torch.tensor(float("nan"), device=cosine.device)
    cols = {k: torch.where(has_both, v, nan) for k, v in dict(cosine=cosine, per_example_ratio=per_example_ratio).items()}
    r = np.asarray(ratios, dtype=float)
    with np.errstate(divide="ignore"):
        expected = np.where(r < 1, r / (1 - r), np.inf)
    return pd.DataFrame(
        {
            "member": np.arange(len(ratios)),
            "epoch": epoch,
            "cosine": cols["cosine"].detach().cpu().numpy(),
            "norm_consistent": norm_c.detach().cpu().numpy(),
            "norm_anti": norm_a.detach().cpu().numpy(),
            "share_consistent": share_c.detach().cpu().numpy(),
            "share_anti": share_a.detach().cpu().numpy(),
            "per_example_ratio": cols["per_example_ratio"].detach().cpu().numpy(),
            "expected_ratio": expected,
        },
        columns=COLUMNS,
    )
