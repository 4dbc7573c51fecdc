"""Gradient dynamics: checked against plain torch.autograd on a solo model, one example at a time."""

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from seedlab.shortcut.config import EnsembleConfig, ModelConfig
from seedlab.shortcut.gradients import measure, per_example_norms
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.train import train_ensemble


def _solo(ens: EnsembleTransformer, i: int) -> EnsembleTransformer:
    m = EnsembleTransformer(ens.cfg, 1, ens.vocab, ens.length, ens.n_classes)
    m.load_member(0, ens.member_state(i))
    return m


def _grad(model, x, y):
    """Plain autograd: gradient of the mean loss over (x, y) as one flat vector."""
    loss = F.cross_entropy(model(x[None])[0], y)
    return torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])


def test_against_direct_autograd_on_solo_models():
    torch.manual_seed(0)
    S, n = 3, 48
    ens = EnsembleTransformer(ModelConfig(layers=2, heads=2), S, 10, 5, 2)
    ens.init_members([5, 6, 7])
    x, y = torch.randint(0, 10, (S, n, 5)), torch.randint(0, 2, (S, n))
    cons = torch.rand(S, n) < torch.tensor([0.5, 0.8, 0.3]).view(S, 1)
    got = measure(ens, x, y, cons, [0.5, 0.8, 0.3], epoch=7, chunk=10, sample=0)  # uneven chunks
    for i in range(S):
        solo = _solo(ens, i)
        gc, ga = _grad(solo, x[i][cons[i]], y[i][cons[i]]), _grad(solo, x[i][~cons[i]], y[i][~cons[i]])
        row = got.iloc[i]
        np.testing.assert_allclose(row.cosine, (gc @ ga / (gc.norm() * ga.norm())).item(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(row.norm_consistent, gc.norm().item(), rtol=1e-4)
        np.testing.assert_allclose(row.norm_anti, ga.norm().item(), rtol=1e-4)
        g = _grad(solo, x[i], y[i])
        w = cons[i].float().mean().item()
        np.testing.assert_allclose(row.share_consistent, (w * gc @ g / (g @ g)).item(), rtol=1e-3, atol=1e-6)
        assert row.share_consistent + row.share_anti == pytest.approx(1.0, abs=1e-5)
    assert (got.epoch == 7).all() and got.expected_ratio.tolist() == pytest.approx([1.0, 4.0, 0.3 / 0.7])


def test_per_example_norms_match_a_loop():
    ens = EnsembleTransformer(ModelConfig(layers=1, heads=2), 2, 10, 5, 3)
    ens.init_members([1, 2])
    x, y = torch.randint(0, 10, (2, 6, 5)), torch.randint(0, 3, (2, 6))
    got = per_example_norms(ens, x, y)
    for i in range(2):
        solo = _solo(ens, i)
        for j in range(6):
            want = _grad(solo, x[i, j : j + 1], y[i, j : j + 1]).norm().item()
            assert got[i, j].item() == pytest.approx(want, rel=1e-4)


def test_training_writes_gradients(tmp_path):
    cfg = EnsembleConfig.model_validate(
        {
            "data": {"n_train": 128, "n_val": 32, "n_adv": 32, "vocab": 10},
            "train": {"epochs": 10, "eval_every": 5, "gradients": {"enabled": True, "every": 4, "sample": 8}},
            "members": {"ratio": [0.5, 0.9, 1.0], "seed": [0]},
        }
    )
    train_ensemble(cfg, tmp_path, progress=False)
    g = pd.read_parquet(tmp_path / "gradients.parquet")
    assert sorted(g.epoch.unique()) == [0, 4, 8, 10]
    assert len(g) == 4 * 3
    full = g[g.member == 2]  # r = 1: no anti-shortcut samples, so no conflict to measure
    assert full.cosine.isna().all() and full.per_example_ratio.isna().all()
    assert g[g.member < 2].cosine.between(-1, 1).all()


def test_pair_cosine_is_the_mean_over_pairs_of_examples():
    """pair_cosine = mean over (consistent i, anti j) of cos(grad l_i, grad l_j), against a double loop."""
    from seedlab.shortcut.gradients import _sample

    torch.manual_seed(1)
    S, n, k = 2, 40, 5
    ens = EnsembleTransformer(ModelConfig(layers=1, heads=2), S, 10, 5, 2)
    ens.init_members([3, 4])
    x, y = torch.randint(0, 10, (S, n, 5)), torch.randint(0, 2, (S, n))
    cons = torch.rand(S, n) < 0.6
    got = measure(ens, x, y, cons, [0.6, 0.6], epoch=0, chunk=16, sample=k, seed=9)
    ic, ia = _sample(cons, True, k, 9), _sample(cons, False, k, 10)
    for i in range(S):
        solo = _solo(ens, i)
        gc = [_grad(solo, x[i, j : j + 1], y[i, j : j + 1]) for j in ic[i].tolist()]
        ga = [_grad(solo, x[i, j : j + 1], y[i, j : j + 1]) for j in ia[i].tolist()]
        want = np.mean([F.cosine_similarity(a, b, dim=0).item() for a in gc for b in ga])
        assert got.pair_cosine.iloc[i] == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_expected_ratio_of_a_calibrated_model():
    """r/(1-r) for two classes; for k classes, the logit-gradient norms of a model that predicts the
    shortcut class with probability r and the others with (1-r)/(k-1), computed directly."""
    from seedlab.shortcut.gradients import expected_ratio

    assert expected_ratio(0.9, 2) == pytest.approx(9.0) and expected_ratio(0.5, 2) == pytest.approx(1.0)
    for r, k in ((0.9, 3), (0.333, 3), (0.7, 5)):
        p = np.full(k, (1 - r) / (k - 1))
        p[0] = r
        cons = np.linalg.norm(p - np.eye(k)[0])
        anti = np.linalg.norm(p - np.eye(k)[1])
        assert expected_ratio(r, k) == pytest.approx(anti / cons)
