"""The influence estimators (kronfluence): the library against an exact Hessian where EK-FAC and
K-FAC are exact, and the GPT glue (tracked modules, masks, sign, scale) against autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedlab.attribution.estimators.builtin import Case, Gradients
from seedlab.attribution.estimators.registry import run
from seedlab.errors import SeedlabError

pytest.importorskip("kronfluence")

from seedlab.attribution.estimators.influence import (  # after the skip: kronfluence is optional
    InfluenceOptions,
    _Rows,
    influence,
    kronfluence_scores,
    tracked_modules,
)

pytestmark = pytest.mark.usefixtures("one_thread")


class _Linear(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc = torch.nn.Linear(d, 1, dtype=torch.float64)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return self.fc(a)


def _regression_task(seed: int):
    """Per-example loss ½(f(a) − y)². For the Fisher, kronfluence's ``sample=True`` loss uses
    the label f.detach() + s with s = ±1 (Rademacher): then each example's gradient is
    ∓[a, 1] and its outer product is [a, 1][a, 1]ᵀ *exactly*, so the Fisher equals the exact
    Hessian of the mean loss, E[[a, 1][a, 1]ᵀ], and is a Kronecker product (one output):
    K-FAC and EK-FAC are exact, and only the library's arithmetic is tested."""
    from kronfluence.task import Task

    g = torch.Generator().manual_seed(seed)

    class Regression(Task):
        def compute_train_loss(self, batch, model, sample=False):
            f = model(batch["a"])
            if sample:
                s = torch.where(torch.rand(f.shape, generator=g, dtype=f.dtype) < 0.5, -1.0, 1.0).to(f.dtype)
                return (0.5 * (f - (f.detach() + s)) ** 2).sum()
            return (0.5 * (f - batch["y"]) ** 2).sum()

        def compute_measurement(self, batch, model):
            return (0.5 * (model(batch["a"]) - batch["y"]) ** 2).sum()

    return Regression()


@pytest.mark.parametrize("strategy", ["ekfac", "kfac"])
def test_kronfluence_equals_the_exact_damped_inverse_hessian(strategy):
    # compared: kronfluence's pairwise score S[q, j] = ∇f_qᵀ (H + λI)⁻¹ ∇ℓ_j (fitted on 40
    # examples, 5 batches) and the same bilinear form with H the exact Hessian of the mean
    # training loss (torch.autograd.functional.hessian over weight and bias), λ = 1e-3, float64
    torch.manual_seed(0)
    d, n, lam = 5, 40, 1e-3
    A, Y = torch.randn(n, d, dtype=torch.float64), torch.randn(n, 1, dtype=torch.float64)
    QA, QY = torch.randn(3, d, dtype=torch.float64), torch.randn(3, 1, dtype=torch.float64)
    model = _Linear(d)

    def rows(a: torch.Tensor, y: torch.Tensor) -> _Rows:
        return _Rows([{"a": a[i], "y": y[i]} for i in range(len(a))])

    S = kronfluence_scores(model, _regression_task(0), rows(A, Y), rows(QA, QY), rows(A[:4], Y[:4]),
                           strategy=strategy, damping=lam, dtype=torch.float64, fit_batch=8)

    w0, b0 = model.fc.weight.detach().reshape(-1), model.fc.bias.detach()
    theta = torch.cat([w0, b0])

    def loss(th: torch.Tensor, a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (0.5 * (a @ th[:d] + th[d] - y[:, 0]) ** 2).mean()

    H = torch.autograd.functional.hessian(lambda th: loss(th, A, Y), theta)

    def grad(a: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.autograd.functional.jacobian(lambda th: loss(th, a[None], y[None]), theta)

    gq = torch.stack([grad(QA[i], QY[i]) for i in range(3)])
    gt = torch.stack([grad(A[i], Y[i]) for i in range(4)])
    exact = gq @ torch.linalg.solve(H + lam * torch.eye(d + 1, dtype=H.dtype), gt.T)
    assert S.shape == (3, 4)
    np.testing.assert_allclose(S, exact.numpy(), rtol=1e-9, atol=1e-12)  # observed 1e-15


def _tracked_mask(model, modules="all") -> torch.Tensor:
    names = tracked_modules(model, modules)
    return torch.cat([torch.full((p.numel(),), any(n.startswith(m + ".") for m in names), dtype=torch.bool)
                      for n, p in model.named_parameters()])


def test_identity_curvature_is_the_plain_inner_product_over_the_tracked_modules(fork):
    # no curvature: −⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩ / D over the blocks' Linear weights and biases (not
    # the embeddings, tied head or LayerNorms), with the short candidate padded and masked
    case = Case.of(fork.x, fork.y, fork.row, fork.candidates, fork.queries, 0)
    grads = Gradients(fork.model, case)
    for modules, D in (("all", None), ("mlp", 1000)):
        mask = _tracked_mask(fork.model, modules)
        ref = np.array([[-float(grads.query(q)[mask] @ grads.swap(c)[mask]) / (D or fork.B) for q in case.queries]
                        for c in case.candidates])
        got = influence(fork.model, case, strategy="identity", options=InfluenceOptions(modules=modules, train_rows=D))
        np.testing.assert_allclose(got, ref, rtol=1e-5)  # float32 kronfluence vs float64 autograd
    assert 0 < int(_tracked_mask(fork.model, "mlp").sum()) < int(mask.numel())


@pytest.mark.parametrize("strategy", ["ekfac", "kfac"])
def test_large_damping_reaches_the_identity_limit(fork, strategy):
    # (F + λI)⁻¹ → I/λ: the estimate·λ tends to the identity one (kfac: ·T too, its per-token scale)
    case = Case.of(fork.x, fork.y, fork.row, fork.candidates, fork.queries, 0)
    ident = influence(fork.model, case, strategy="identity")
    lam = 1e4
    got = influence(fork.model, case, strategy=strategy, options=InfluenceOptions(damping=lam))
    got = got * lam * (fork.T if strategy == "kfac" else 1)
    assert np.abs(got - ident).max() < 1e-3 * np.abs(ident).max()  # observed 1.5e-4 (ekfac), 1.3e-5 (kfac)


def test_ekfac_estimate_through_the_registry(fork):
    case = Case.of(fork.x, fork.y, fork.row, fork.candidates, fork.queries, 0)
    a = run("ekfac", fork.model, case)
    assert a.shape == (2, 2) and np.isfinite(a).all()
    assert a[0, 0] < 0  # the candidate as its own query: learning it lowers its loss
    b = run("ekfac", fork.model, case, influence=InfluenceOptions(seed=0))
    assert np.array_equal(a, b)  # the Fisher's label sampling is seeded
    moved = {k: v + 0.01 * torch.randn_like(v) for k, v in fork.model.state_dict().items()}
    other = run("ekfac", fork.model, case, influence=InfluenceOptions(weights=moved))
    assert not np.allclose(a, other)


def test_tracked_module_errors(fork):
    assert tracked_modules(fork.model, "mlp") == ["blocks.0.mlp.c_fc", "blocks.0.mlp.c_proj"]
    assert tracked_modules(fork.model, ["blocks.0.attn.c_attn"]) == ["blocks.0.attn.c_attn"]
    with pytest.raises(SeedlabError, match="modules"):
        tracked_modules(fork.model, "attention")
    with pytest.raises(SeedlabError, match="nn.Linear"):
        tracked_modules(fork.model, ["wte"])  # the tied table/head is no Linear module
