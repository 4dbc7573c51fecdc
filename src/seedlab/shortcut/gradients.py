"""Gradient dynamics during training: the paper's gradient conflict and amplification.

Per member, on its training split, with the current weights:

    g_c = grad of the mean loss over shortcut-consistent samples
    g_a = grad of the mean loss over anti-shortcut samples
    cosine       = <g_c, g_a> / (|g_c| |g_a|)        conflict of the two groups' *mean* gradients
    pair_cosine  = mean over i in c, j in a of cos(grad l_i, grad l_j)
                 = <mean_i u_i, mean_j v_j>           (u, v the unit per-example gradients): how much a
                                                      typical consistent and a typical anti example pull
                                                      together; on the ``sample`` examples of each group
    share_c/a    = <(n_g/n) g_g, g> / |g|^2           each group's share of the full-batch gradient
                                                      g = (n_c g_c + n_a g_a) / n; the shares sum to 1
    per_example_ratio = mean_j |grad l_j| over anti / over consistent   amplification
    expected_ratio    = the same ratio for a *calibrated* model that predicts the shortcut's class
                        with probability r and the other k - 1 classes with (1 - r)/(k - 1) each,
                        measured on the logits' gradient (p - onehot):
                        sqrt((r² + (1 - q)² + (k - 2) q²) / ((1 - r)² k / (k - 1))), q = (1 - r)/(k - 1);
                        r / (1 - r) for k = 2

The paper says the conflict "starts negative and resolves toward 0" as 2L models generalize.
``cosine`` compares the group means, which align once the rule fits both groups (it tends to +1);
``pair_cosine`` averages over pairs of examples, whose individual gradients stay nearly orthogonal
in a model with many parameters (it tends to 0): the report shows both.

Per-example gradients use ``sample`` examples of each group (vmap); the group gradients use
the whole split, in chunks. All members at once: their losses are independent, so the gradient
of the sum is each member's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from seedlab.shortcut.model import EnsembleTransformer

COLUMNS = ["member", "epoch", "cosine", "pair_cosine", "norm_consistent", "norm_anti", "share_consistent", "share_anti",
           "per_example_ratio", "expected_ratio"]


def expected_ratio(r: float, k: int) -> float:
    """Amplification a calibrated model would show (module docstring): anti / consistent gradient norm."""
    if r >= 1:
        return float("inf")
    q = (1 - r) / (k - 1)
    return float(np.sqrt((r**2 + (1 - q) ** 2 + (k - 2) * q**2) / ((1 - r) ** 2 * k / (k - 1))))


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


def per_example_grads(model: EnsembleTransformer, x: Tensor, y: Tensor) -> Tensor:
    """grad l_j flattened over the parameters, per member and example: x [S, K, L], y [S, K] -> [S, K, P]."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p: dict[str, Tensor], xj: Tensor, yj: Tensor) -> Tensor:
        logits = functional_call(model, p, (xj.unsqueeze(1),))  # [S, 1, C]
        return torch.nn.functional.cross_entropy(logits[:, 0], yj, reduction="sum")  # members add up

    grads = vmap(grad(loss_one), in_dims=(None, 1, 1))(params, x, y)  # each [K, S, ...]
    return torch.cat([g.flatten(2) for g in grads.values()], dim=2).transpose(0, 1)  # [S, K, P]


def per_example_norms(model: EnsembleTransformer, x: Tensor, y: Tensor) -> Tensor:
    """|grad l_j| for each member and example: x [S, K, L], y [S, K] -> [S, K]."""
    return per_example_grads(model, x, y).norm(dim=2)


def mean_pair_cosine(a: Tensor, b: Tensor) -> Tensor:
    """Mean over all pairs (i, j) of cos(a_i, b_j), per member: a [S, K, P], b [S, M, P] -> [S]."""
    unit = lambda t: t / t.norm(dim=2, keepdim=True).clamp_min(1e-30)  # noqa: E731
    return (unit(a).mean(1) * unit(b).mean(1)).sum(1)


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
    model: EnsembleTransformer, x: Tensor, y: Tensor, consistent: Tensor, ratios: list[float], epoch: int, *, chunk: int, sample: int,
    seed: int = 0, classes: list[int] | None = None,
) -> pd.DataFrame:
    """One measurement of every member: a frame with ``COLUMNS``; ``classes``: each member's
    number of classes k (default 2), for ``expected_ratio``."""
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
    pair_cosine = torch.full_like(cosine, float("nan"))
    if sample > 0:
        dev = x.device
        ic, ia = _sample(consistent.cpu(), True, sample, seed).to(dev), _sample(consistent.cpu(), False, sample, seed + 1).to(dev)
        take = lambda idx: (torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[2])), torch.gather(y, 1, idx))
        gc, ga = per_example_grads(model, *take(ic)), per_example_grads(model, *take(ia))
        per_example_ratio = ga.norm(dim=2).mean(1) / gc.norm(dim=2).mean(1)
        pair_cosine = mean_pair_cosine(gc, ga)
    has_both = (consistent.any(1) & (~consistent).any(1)).to(cosine.device)
    nan = torch.tensor(float("nan"), device=cosine.device)
    both = dict(cosine=cosine, pair_cosine=pair_cosine, per_example_ratio=per_example_ratio)
    cols = {k: torch.where(has_both, v, nan) for k, v in both.items()}
    classes = classes or [2] * len(ratios)
    expected = np.array([expected_ratio(r, k) for r, k in zip(ratios, classes, strict=True)])
    return pd.DataFrame(
        {
            "member": np.arange(len(ratios)),
            "epoch": epoch,
            "cosine": cols["cosine"].detach().cpu().numpy(),
            "pair_cosine": cols["pair_cosine"].detach().cpu().numpy(),
            "norm_consistent": norm_c.detach().cpu().numpy(),
            "norm_anti": norm_a.detach().cpu().numpy(),
            "share_consistent": share_c.detach().cpu().numpy(),
            "share_anti": share_a.detach().cpu().numpy(),
            "per_example_ratio": cols["per_example_ratio"].detach().cpu().numpy(),
            "expected_ratio": expected,
        },
        columns=COLUMNS,
    )
