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
    got = measure(ens, x, y, cons, [0.5, 0.8, 0.3], epoch=7, chunk=10, sample=0).members  # uneven chunks
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
    assert full.loss_anti.isna().all() and full.logit_grad_ratio.isna().all() and (full.loss_consistent > 0).all()
    assert (g[g.member < 2][["loss_consistent", "loss_anti", "logit_grad_ratio"]] > 0).all().all()
    assert g[g.member < 2].cosine.between(-1, 1).all()
    heads = pd.read_parquet(tmp_path / "gradients_heads.parquet")  # one row per member, epoch, layer and head
    assert list(heads.columns) == ["member", "epoch", "layer", "head", "cosine", "pair_cosine"]
    L, H = cfg.model.layers, cfg.model.heads
    assert len(heads) == 4 * 3 * L * H and sorted(heads.epoch.unique()) == [0, 4, 8, 10]
    assert heads[heads.member == 2][["cosine", "pair_cosine"]].isna().all().all()
    assert heads[heads.member < 2][["cosine", "pair_cosine"]].stack().between(-1, 1).all()


def test_no_gradient_tables_when_not_measured(tmp_path):
    cfg = EnsembleConfig.model_validate({"data": {"n_train": 64, "n_val": 16, "n_adv": 16, "vocab": 10},
                                         "train": {"epochs": 2, "eval_every": 1}, "members": {"seed": [0]}})
    assert train_ensemble(cfg, tmp_path, progress=False).gradients_heads is None
    assert not (tmp_path / "gradients.parquet").exists() and not (tmp_path / "gradients_heads.parquet").exists()


def test_pair_cosine_is_the_mean_over_pairs_of_examples():
    """pair_cosine = mean over (consistent i, anti j) of cos(grad l_i, grad l_j), against a double loop."""
    from seedlab.shortcut.gradients import _sample

    torch.manual_seed(1)
    S, n, k = 2, 40, 5
    ens = EnsembleTransformer(ModelConfig(layers=1, heads=2), S, 10, 5, 2)
    ens.init_members([3, 4])
    x, y = torch.randint(0, 10, (S, n, 5)), torch.randint(0, 2, (S, n))
    cons = torch.rand(S, n) < 0.6
    got = measure(ens, x, y, cons, [0.6, 0.6], epoch=0, chunk=16, sample=k, seed=9).members
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


def test_head_measures_on_a_hand_built_model(hand):
    """Zero weights but for the embeddings, the value maps and W_U: every attention pattern is uniform over
    the P = length + 1 positions and the logits are 0, so only W_O receives gradient inside the heads, and
    example j's gradient there is s_j z_h(x_j) (times a fixed unit vector), with s = 1 - 2y and z_h the head's
    mean value vector. Head 0 reads (value, parity), head 1 parity alone; the anti group holds even tokens
    only, so it moves head 1 not at all."""
    from seedlab.shortcut.gradients import _sample

    m = hand.zero()
    P, n, k = hand.LENGTH + 1, 24, 6
    with torch.no_grad():
        v = torch.arange(hand.VOCAB, dtype=torch.float32)
        m.embed.W_E[:, : hand.VOCAB, hand.VAL] = v
        m.embed.W_E[:, : hand.VOCAB, hand.PAR] = v % 2
        a = m.blocks[0].attn
        a.W_V[:, 0, hand.VAL, 0] = 1.0
        a.W_V[:, 0, hand.PAR, 1] = 1.0
        a.W_V[:, 1, hand.PAR, 0] = 1.0
        m.unembed.W_U[:, hand.OUT, 1] = 1.0
        m.unembed.W_U[:, hand.OUT, 0] = -1.0
    g = torch.Generator().manual_seed(2)
    cons = torch.arange(n).repeat(hand.S, 1) % 3 != 0  # 16 consistent, 8 anti rows per member
    x = torch.randint(0, hand.VOCAB, (hand.S, n, hand.LENGTH), generator=g)
    x[~cons] = 2 * torch.randint(1, 5, (int((~cons).sum()), hand.LENGTH), generator=g)  # anti: even tokens 2..8
    y = torch.randint(0, 2, (hand.S, n), generator=g)
    heads = measure(m, x, y, cons, [2 / 3] * hand.S, epoch=3, chunk=10, sample=k, seed=5).heads
    assert list(heads.columns) == ["member", "epoch", "layer", "head", "cosine", "pair_cosine"]
    assert len(heads) == hand.S * 2 and (heads.epoch == 3).all()

    xs, s = x.double(), (1 - 2 * y).double()
    z = {0: torch.stack([xs.sum(-1), (xs % 2).sum(-1)], -1) / P, 1: ((xs % 2).sum(-1) / P)[..., None]}  # [S, n, .]
    ic, ia = _sample(cons, True, k, 5), _sample(cons, False, k, 6)
    for i in range(hand.S):
        for h in (0, 1):
            d = s[i, :, None] * z[h][i]  # each example's head-h gradient, up to the fixed factor
            mc, ma = d[cons[i]].mean(0), d[~cons[i]].mean(0)
            # pairs with a zero-gradient example have no cosine and are left out
            pairs = [F.cosine_similarity(d[p], d[q], dim=0).item() for p in ic[i].tolist() for q in ia[i].tolist()
                     if d[p].norm() > 0 and d[q].norm() > 0]
            row = heads[(heads.member == i) & (heads.layer == 0) & (heads["head"] == h)].iloc[0]
            if h == 0:
                assert row.cosine == pytest.approx(F.cosine_similarity(mc, ma, dim=0).item(), rel=1e-4)
                assert row.pair_cosine == pytest.approx(np.mean(pairs), rel=1e-4, abs=1e-6)
            else:  # the anti group's gradient is 0 on head 1: no direction, so no cosine of either kind
                assert ma.abs().max() == 0 and not pairs and np.isnan(row.cosine) and np.isnan(row.pair_cosine)


def test_head_slices_match_a_brute_force_flat_computation():
    """Per (layer, head): cosine of the group means and pair cosine within the head's own parameters, against
    plain autograd on a solo model and the slices [0, h] of W_Q, W_K, W_V, b_Q, b_K, b_V and W_O taken by name."""
    from seedlab.shortcut.gradients import HEAD_PARAMS, _sample

    torch.manual_seed(3)
    S, n, k = 2, 30, 4
    ens = EnsembleTransformer(ModelConfig(layers=2, heads=2, d_model=16, d_ff=32), S, 10, 5, 2)
    ens.init_members([8, 9])
    x, y = torch.randint(0, 10, (S, n, 5)), torch.randint(0, 2, (S, n))
    cons = torch.rand(S, n) < 0.6
    heads = measure(ens, x, y, cons, [0.6, 0.6], epoch=0, chunk=7, sample=k, seed=4).heads

    def head_grad(model, xb, yb, layer, h):
        names = [f"blocks.{layer}.attn.{p}" for p in HEAD_PARAMS]
        params = dict(model.named_parameters())
        loss = F.cross_entropy(model(xb[None])[0], yb)
        return torch.cat([g[0, h].flatten() for g in torch.autograd.grad(loss, [params[p] for p in names])])

    ic, ia = _sample(cons, True, k, 4), _sample(cons, False, k, 5)
    for i in range(S):
        solo = _solo(ens, i)
        for layer in range(2):
            for h in range(2):
                gc = head_grad(solo, x[i][cons[i]], y[i][cons[i]], layer, h)
                ga = head_grad(solo, x[i][~cons[i]], y[i][~cons[i]], layer, h)
                one = lambda j: head_grad(solo, x[i, j : j + 1], y[i, j : j + 1], layer, h)  # noqa: B023
                pairs = [F.cosine_similarity(one(p), one(q), dim=0).item() for p in ic[i].tolist() for q in ia[i].tolist()]
                row = heads[(heads.member == i) & (heads.layer == layer) & (heads["head"] == h)].iloc[0]
                assert row.cosine == pytest.approx(F.cosine_similarity(gc, ga, dim=0).item(), rel=1e-4, abs=1e-6)
                assert row.pair_cosine == pytest.approx(np.mean(pairs), rel=1e-4, abs=1e-6)


def test_pair_cosine_leaves_out_examples_without_a_gradient():
    """A zero per-example gradient (a saturated prediction) has no direction: adding such examples to
    a group leaves the mean pairwise cosine unchanged instead of pulling it toward 0."""
    from seedlab.shortcut.gradients import pair_cosine_parts

    mean_pair_cosine = lambda a, b: pair_cosine_parts([a], [b])  # whole vectors: one piece each
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 4, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    want = torch.tensor([np.mean([F.cosine_similarity(a[s, i], b[s, j], dim=0).item() for i in range(4) for j in range(3)])
                         for s in range(2)], dtype=torch.float32)
    padded = torch.cat([a, torch.zeros(2, 5, 7)], 1)
    assert torch.allclose(mean_pair_cosine(a, b), want, atol=1e-6)
    assert torch.allclose(mean_pair_cosine(padded, b), want, atol=1e-6)
    assert torch.isnan(mean_pair_cosine(torch.zeros(2, 3, 7), b)).all()


def test_pair_cosine_of_vectors_in_pieces_equals_the_concatenation():
    """Pieces of any shape, a one-entry piece ([S, K]) included, give the cosines of the concatenated vectors."""
    from seedlab.shortcut.gradients import pair_cosine_parts

    g = torch.Generator().manual_seed(1)
    shapes = [(), (3,), (2, 2)]  # trailing shapes of three pieces: 1 + 3 + 4 = 8 entries per example
    a = [torch.randn(2, 4, *sh, generator=g) for sh in shapes]
    b = [torch.randn(2, 5, *sh, generator=g) for sh in shapes]
    flat = lambda parts: torch.cat([t.reshape(*t.shape[:2], -1) for t in parts], -1)
    assert torch.allclose(pair_cosine_parts(a, b), pair_cosine_parts([flat(a)], [flat(b)]), atol=1e-6)


def test_group_losses_and_logit_gradient_ratio_against_direct_computation():
    """loss_consistent / loss_anti: each group's mean cross-entropy computed with a solo model; logit_grad_ratio: the
    anti/consistent ratio of the mean |dl_j/dz_j|, the per-example gradients with respect to the logits taken by
    autograd; a member without anti-shortcut rows has no anti loss and no ratio."""
    torch.manual_seed(4)
    S, n = 3, 40
    ens = EnsembleTransformer(ModelConfig(layers=1, heads=2, d_model=16, d_ff=32, init_std=0.5), S, 10, 5, 3)
    ens.init_members([1, 2, 3])
    x, y = torch.randint(0, 10, (S, n, 5)), torch.randint(0, 3, (S, n))
    cons = torch.rand(S, n) < 0.7
    cons[2] = True
    got = measure(ens, x, y, cons, [0.7, 0.7, 1.0], epoch=0, chunk=7, sample=0, classes=[3] * S).members
    for i in range(2):
        solo = _solo(ens, i)
        logits = solo(x[i][None])[0].detach().requires_grad_()
        ce = F.cross_entropy(logits, y[i], reduction="none")
        (dz,) = torch.autograd.grad(ce.sum(), logits)  # row j holds dl_j/dz_j: each loss reads its own logits
        norms = dz.norm(dim=-1)
        row = got.iloc[i]
        assert row.loss_consistent == pytest.approx(ce[cons[i]].mean().item(), rel=1e-5)
        assert row.loss_anti == pytest.approx(ce[~cons[i]].mean().item(), rel=1e-5)
        assert row.logit_grad_ratio == pytest.approx((norms[~cons[i]].mean() / norms[cons[i]].mean()).item(), rel=1e-5)
    full = got.iloc[2]
    assert full.loss_consistent > 0 and np.isnan(full.loss_anti) and np.isnan(full.logit_grad_ratio)


def test_logit_gradient_norm_of_a_saturated_row_is_not_zero():
    """|softmax - onehot| from the other classes' probabilities: p_y rounds to 1 in float32, the norm does not to 0."""
    from seedlab.shortcut.gradients import logit_grad_norms

    z = torch.tensor([[30.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    p = torch.softmax(z.double(), -1)
    want = (p - F.one_hot(torch.tensor([0, 1]), 3).double()).norm(dim=-1)
    assert torch.softmax(z, -1)[0, 0] == 1.0
    assert torch.allclose(logit_grad_norms(z, torch.tensor([0, 1])).double(), want, rtol=1e-3, atol=0)  # float32's exp


@pytest.mark.parametrize(("command", "value"), [("train", "0"), ("train", "1"), ("sweep", "1.5")])
def test_a_saturated_loss_outside_0_1_is_a_one_line_error(tmp_path, seedlab_main, command, value):
    (tmp_path / "c.yaml").write_text("train: {epochs: 1}\n")
    rc, _, err = seedlab_main("shortcut", command, "c.yaml", "--out", "out", "--set", f"train.gradients.saturated_loss={value}")
    assert rc == 2 and err.startswith("error: train.gradients.saturated_loss: Input should be ") and err.count("\n") == 1
    assert f"got {value}" in err and not (tmp_path / "out").exists()


