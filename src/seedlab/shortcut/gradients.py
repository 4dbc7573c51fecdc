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
    per_example_ratio = mean_j |grad l_j| over anti / over consistent   amplification, in parameter space
    logit_grad_ratio  = mean_j |dl_j/dz_j| over anti / over consistent   amplification in logit space, the
                        reference's space: dl_j/dz_j = softmax(z_j) - onehot(y_j) for the logits z_j, so no
                        backward pass; on the whole split
    expected_ratio    = logit_grad_ratio of a *calibrated* model that predicts the shortcut's class
                        with probability r and the other k - 1 classes with (1 - r)/(k - 1) each:
                        sqrt((r² + (1 - q)² + (k - 2) q²) / ((1 - r)² k / (k - 1))), q = (1 - r)/(k - 1);
                        r / (1 - r) for k = 2
    loss_consistent/anti = the group's mean cross-entropy (nats) on the whole split: the report's saturated
                        window is where the majority group's is below ``train.gradients.saturated_loss``

The paper says the conflict "starts negative and resolves toward 0" as 2L models generalize.
``cosine`` compares the group means, which align once the rule fits both groups (it tends to +1);
``pair_cosine`` averages over pairs of examples, whose individual gradients stay nearly orthogonal
in a model with many parameters (it tends to 0): the report shows both.

Both are also measured **per attention head**, restricted to the head's own parameters: the
slices ``[:, h]`` (head h of every member) of W_Q, W_K, W_V, b_Q, b_K, b_V and W_O
(:data:`HEAD_PARAMS`; b_O is shared by the heads and left out). ``cosine`` is then the cosine of
the group means' slices, and ``pair_cosine`` normalizes each per-example gradient by its norm
within the slice. A zero vector has no direction: a zero group-mean slice gives ``cosine`` nan,
and in ``pair_cosine`` an example whose gradient (or slice) is exactly 0 is left out of the pairs
(:func:`pair_cosine_parts`), as over the whole parameter vector. The report restricts these
to the shortcut circuit's head, against the member's other heads as a control.

:func:`measure` returns both tables (:class:`Measured`): one row per member (``COLUMNS``,
``gradients.parquet``) and one per member, layer and head (``HEAD_COLUMNS``,
``gradients_heads.parquet``); the per-head measures reuse the same group and per-example
gradients, sliced.

Per-example gradients use ``sample`` examples of each group (vmap); the group gradients use
the whole split, in chunks. All members at once: their losses are independent, so the gradient
of the sum is each member's own.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.func import functional_call, grad, vmap

from seedlab.shortcut.model import EnsembleTransformer

COLUMNS = ["member", "epoch", "cosine", "pair_cosine", "norm_consistent", "norm_anti", "share_consistent", "share_anti",
           "per_example_ratio", "expected_ratio", "loss_consistent", "loss_anti", "logit_grad_ratio"]
HEAD_COLUMNS = ["member", "epoch", "layer", "head", "cosine", "pair_cosine"]
HEAD_PARAMS = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "W_O")  # a head's own parameters: the slice [:, h] of each


class Measured(NamedTuple):
    members: pd.DataFrame  # COLUMNS, one row per member: gradients.parquet
    heads: pd.DataFrame  # HEAD_COLUMNS, one row per member, layer and head: gradients_heads.parquet


def expected_ratio(r: float, k: int) -> float:
    """Amplification a calibrated model would show (module docstring): anti / consistent gradient norm."""
    if r >= 1:
        return float("inf")
    q = (1 - r) / (k - 1)
    return float(np.sqrt((r**2 + (1 - q) ** 2 + (k - 2) * q**2) / ((1 - r) ** 2 * k / (k - 1))))


def _flat_dot(a: dict[str, Tensor], b: dict[str, Tensor]) -> Tensor:
    """Per-member inner product of two gradients (name -> [S, ...]) over all parameters -> [S]."""
    return sum((x * b[k]).flatten(1).sum(1) for k, x in a.items())


def cosine_last(a: Tensor, b: Tensor) -> Tensor:
    """Cosine along the last axis (nan where either vector is 0)."""
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def head_slices(grads: dict[str, Tensor], layers: int) -> Tensor:
    """Each attention head's own entries of a gradient, flattened: ``grads`` named as the model's
    parameters, each [S, H, ...] -> [S, layers, H, P_head] (:data:`HEAD_PARAMS`, in that order)."""
    per_layer = [torch.cat([grads[f"blocks.{l}.attn.{n}"].flatten(2) for n in HEAD_PARAMS], -1) for l in range(layers)]
    return torch.stack(per_layer, 1)


class Groups(NamedTuple):
    """The two groups of each member's split, from one pass over it (:func:`group_gradients`)."""

    g_c: dict[str, Tensor]  # gradient of the consistent group's mean loss, name -> [S, ...]
    g_a: dict[str, Tensor]  # the same for the anti group
    n_c: Tensor  # [S] group sizes (at least 1)
    n_a: Tensor
    loss_c: Tensor  # [S] the group's mean cross-entropy
    loss_a: Tensor
    logit_c: Tensor  # [S] the group's mean |dl_j/dz_j| (:func:`logit_grad_norms`)
    logit_a: Tensor


def logit_grad_norms(logits: Tensor, y: Tensor) -> Tensor:
    """|dl_j/dz_j| = |softmax(z_j) - onehot(y_j)| per row: logits [..., C], y [...] -> [...]. Formed from the other
    classes' probabilities, whose sum is 1 - p_y, so a saturated row (p_y = 1 in float32) keeps its tiny norm."""
    other = logits.softmax(-1).masked_fill(torch.nn.functional.one_hot(y, logits.shape[-1]).bool(), 0)
    return (other.pow(2).sum(-1) + other.sum(-1).pow(2)).sqrt()


def group_gradients(model: EnsembleTransformer, x: Tensor, y: Tensor, consistent: Tensor, chunk: int) -> Groups:
    """Mean-loss gradients (name -> [S, ...]) over the consistent and anti groups of each member's split, and
    each group's mean loss and mean logit-gradient norm."""
    names, params = zip(*model.named_parameters(), strict=True)
    n_c = consistent.sum(1).clamp(min=1).to(x.device)
    n_a = (~consistent).sum(1).clamp(min=1).to(x.device)
    g_c = {k: torch.zeros_like(p) for k, p in zip(names, params, strict=True)}
    g_a = {k: torch.zeros_like(p) for k, p in zip(names, params, strict=True)}
    sums = torch.zeros(4, x.shape[0], dtype=torch.float64, device=x.device)  # loss_c, loss_a, logit_c, logit_a
    for i in range(0, x.shape[1], chunk):
        logits = model(x[:, i : i + chunk])
        S, B, C = logits.shape
        yb = y[:, i : i + chunk]
        ce = torch.nn.functional.cross_entropy(logits.reshape(S * B, C), yb.reshape(S * B), reduction="none").view(S, B)
        m = consistent[:, i : i + chunk].to(ce.dtype)
        loss_c = ((ce * m).sum(1) / n_c).sum()
        loss_a = ((ce * (1 - m)).sum(1) / n_a).sum()
        zn = logit_grad_norms(logits.detach(), yb)
        sums += torch.stack([(v * w).sum(1) for v in (ce.detach(), zn) for w in (m, 1 - m)]).double()
        for acc, loss, keep in ((g_c, loss_c, True), (g_a, loss_a, False)):
            for a, g in zip(acc.values(), torch.autograd.grad(loss, params, retain_graph=keep, allow_unused=True), strict=True):
                if g is not None:
                    a += g
    means = (sums / torch.stack([n_c, n_a, n_c, n_a])).float()
    return Groups(g_c, g_a, n_c, n_a, *means)


def per_example_param_grads(model: EnsembleTransformer, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """grad l_j per member and example, by parameter: x [S, K, L], y [S, K] -> name -> [S, K, ...]."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_one(p: dict[str, Tensor], xj: Tensor, yj: Tensor) -> Tensor:
        logits = functional_call(model, p, (xj.unsqueeze(1),))  # [S, 1, C]
        return torch.nn.functional.cross_entropy(logits[:, 0], yj, reduction="sum")  # members add up

    grads = vmap(grad(loss_one), in_dims=(None, 1, 1))(params, x, y)  # each [K, S, ...]
    return {k: g.transpose(0, 1) for k, g in grads.items()}


def _sum_from(t: Tensor, axis: int) -> Tensor:
    """Sum over the axes from ``axis`` on (none left: ``t`` itself; torch's ``sum(())`` would sum them all)."""
    return t.sum(tuple(range(axis, t.dim()))) if t.dim() > axis else t


def _norms(parts: list[Tensor], keep: int = 0) -> Tensor:
    """Per-example norms of vectors stored in pieces, each [S, K, *keep axes, ...] (the vector is the
    concatenation of every piece's trailing entries) -> [S, K, *keep axes]; no piece is copied."""
    return sum(_sum_from(t.pow(2), 2 + keep) for t in parts).sqrt()


def per_example_norms(model: EnsembleTransformer, x: Tensor, y: Tensor) -> Tensor:
    """|grad l_j| for each member and example: x [S, K, L], y [S, K] -> [S, K]."""
    return _norms(list(per_example_param_grads(model, x, y).values()))


def pair_cosine_parts(a: list[Tensor], b: list[Tensor], keep: int = 0,
                      norms: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Mean over the pairs (i, j) of cos(a_i, b_j) that have one, per member, for vectors stored in pieces:
    a's pieces [S, K, *keep axes, ...], b's [S, M, *keep axes, ...] -> [S, *keep axes] (one cosine per
    index of the ``keep`` axes, e.g. per attention head).

    Mean of the pairs' cosines = <mean_i a_i/|a_i|, mean_j b_j/|b_j|>, so each group's mean unit vector
    is formed piece by piece: the [S, K, P] concatenation (hundreds of MB for a 2L ensemble) is never
    built. An example whose gradient is exactly 0 (a saturated prediction: p = 1 in float32) has no
    direction, so its pairs are left out rather than counted as 0; counting them would pull the mean
    toward 0 as the shortcut saturates, whatever the other pairs do. nan when a group has no nonzero
    gradient. ``norms``: the examples' norms (:func:`_norms` of a and of b), when the caller has them."""
    def mean_unit(parts: list[Tensor], norm: Tensor) -> tuple[list[Tensor], Tensor]:
        n = (norm > 0).sum(1)  # [S, *keep]: examples with a direction
        inv = 1 / norm.clamp_min(1e-30)
        lead = lambda v, t: v.view(*v.shape, *[1] * (t.dim() - v.dim()))
        return [(t * lead(inv, t)).sum(1) / lead(n.clamp_min(1), t[:, 0]) for t in parts], n

    norm_a, norm_b = norms or (_norms(a, keep), _norms(b, keep))  # [S, K, *keep], [S, M, *keep]
    ua, na = mean_unit(a, norm_a)
    ub, nb = mean_unit(b, norm_b)
    dot = sum(_sum_from(u * v, 1 + keep) for u, v in zip(ua, ub, strict=True))
    return torch.where((na > 0) & (nb > 0), dot, torch.nan)


def head_parts(grads: dict[str, Tensor], layer: int) -> list[Tensor]:
    """The pieces of every head's own parameter vector in one layer (:data:`HEAD_PARAMS`), [S, K, H, ...] each."""
    return [grads[f"blocks.{layer}.attn.{n}"] for n in HEAD_PARAMS]


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
) -> Measured:
    """One measurement of every member: a frame with ``COLUMNS`` and one with ``HEAD_COLUMNS``;
    ``classes``: each member's number of classes k (default 2), for ``expected_ratio``."""
    grp = group_gradients(model, x, y, consistent, chunk)
    g_c, g_a, n_c, n_a = grp.g_c, grp.g_a, grp.n_c, grp.n_a
    norm_c, norm_a = _flat_dot(g_c, g_c).sqrt(), _flat_dot(g_a, g_a).sqrt()
    cosine = _flat_dot(g_c, g_a) / (norm_c * norm_a)
    layers = model.cfg.layers
    head_cosine = cosine_last(head_slices(g_c, layers), head_slices(g_a, layers))  # [S, layers, H]
    n = n_c + n_a
    w_c, w_a = (n_c / n).view(-1), (n_a / n).view(-1)
    total = {k: w_c.view(-1, *[1] * (a.dim() - 1)) * a + w_a.view(-1, *[1] * (a.dim() - 1)) * g_a[k] for k, a in g_c.items()}
    tt = _flat_dot(total, total)
    share_c = w_c * _flat_dot(g_c, total) / tt
    share_a = w_a * _flat_dot(g_a, total) / tt
    per_example_ratio = torch.full_like(cosine, float("nan"))
    pair_cosine = torch.full_like(cosine, float("nan"))
    head_pair_cosine = torch.full_like(head_cosine, float("nan"))
    if sample > 0:
        dev = x.device
        ic, ia = _sample(consistent.cpu(), True, sample, seed).to(dev), _sample(consistent.cpu(), False, sample, seed + 1).to(dev)
        take = lambda idx: (torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[2])), torch.gather(y, 1, idx))
        pc, pa = per_example_param_grads(model, *take(ic)), per_example_param_grads(model, *take(ia))
        ex_c, ex_a = _norms(list(pc.values())), _norms(list(pa.values()))  # |grad l_j|: [S, sample] each
        per_example_ratio = ex_a.mean(1) / ex_c.mean(1)
        pair_cosine = pair_cosine_parts(list(pc.values()), list(pa.values()), norms=(ex_c, ex_a))
        head_pair_cosine = torch.stack([pair_cosine_parts(head_parts(pc, l), head_parts(pa, l), keep=1)
                                        for l in range(layers)], 1)  # [S, layers, H]
    has_c, has_a = consistent.any(1).to(cosine.device), (~consistent).any(1).to(cosine.device)
    has_both = has_c & has_a
    nan = torch.tensor(float("nan"), device=cosine.device)
    both = {"cosine": cosine, "pair_cosine": pair_cosine, "per_example_ratio": per_example_ratio,
            "logit_grad_ratio": grp.logit_a / grp.logit_c}
    keep = lambda v: torch.where(has_both.view(-1, *[1] * (v.dim() - 1)), v, nan)
    cols = {k: keep(v) for k, v in both.items()}
    per_head = {"cosine": keep(head_cosine), "pair_cosine": keep(head_pair_cosine)}
    classes = classes or [2] * len(ratios)
    expected = np.array([expected_ratio(r, k) for r, k in zip(ratios, classes, strict=True)])
    members = pd.DataFrame(
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
            "loss_consistent": torch.where(has_c, grp.loss_c, nan).cpu().numpy(),
            "loss_anti": torch.where(has_a, grp.loss_a, nan).cpu().numpy(),
            "logit_grad_ratio": cols["logit_grad_ratio"].cpu().numpy(),
        },
        columns=COLUMNS,
    )
    return Measured(members, _per_head_frame(per_head, epoch))


def _per_head_frame(per_head: dict[str, Tensor], epoch: int) -> pd.DataFrame:
    """{column: [S, layers, H]} -> one row per (member, layer, head), ``HEAD_COLUMNS``."""
    S, L, H = per_head["cosine"].shape
    s_, l_, h_ = np.meshgrid(np.arange(S), np.arange(L), np.arange(H), indexing="ij")
    keys = {"member": s_.ravel(), "epoch": epoch, "layer": l_.ravel(), "head": h_.ravel()}
    return pd.DataFrame({**keys, **{k: v.detach().cpu().numpy().ravel() for k, v in per_head.items()}}, columns=HEAD_COLUMNS)
