"""QK/OV fingerprints on hand-built weights (known answers)."""

import numpy as np
import pytest
import torch

from seedlab.shortcut import fingerprints

pytestmark = pytest.mark.usefixtures("one_thread")


def test_spearman_basics():
    a = np.array([[1.0, 2, 3, 4], [1, 1, 1, 1]])
    np.testing.assert_allclose(fingerprints.spearman(a[0], [10, 20, 30, 40]), 1.0)
    np.testing.assert_allclose(fingerprints.spearman(a[0], [4, 3, 2, 1]), -1.0)
    assert np.isnan(fingerprints.spearman(a, [1, 2, 3, 4])[1])


@pytest.mark.parametrize("q_scale", [1.0, 20.0])  # soft and sharp attention to large values
def test_qk_max_head_has_high_value_rho_and_position_head_attends_to_pos0(hand, q_scale):
    m = hand.model(q_scale)
    fp = fingerprints.qk_fingerprint(m, hand.x())
    assert fp["qk_rho_value"].shape == fp["attn_pos0"].shape == (hand.S, 1, 2)
    assert (fp["qk_rho_value"][:, 0, 0] > 0.8).all(), fp["qk_rho_value"]
    assert (fp["attn_pos0"][:, 0, 1] > 0.9).all(), fp["attn_pos0"]
    # the max head does not focus on position 0; the position head ignores magnitude
    assert (fp["attn_pos0"][:, 0, 0] < 0.5).all()
    assert (np.abs(fp["qk_rho_value"][:, 0, 1]) < 0.5).all()


def test_qk_sharp_max_head_puts_its_mass_on_the_max(hand):
    m = hand.model(q_scale=20.0)
    x = hand.x()
    _, cache = m.run_with_cache(x, ["blocks.0.attn.hook_pattern"])
    p = cache["blocks.0.attn.hook_pattern"][:, :, 0, -1, : hand.LENGTH]
    on_max = (p * (x == x.max(-1, keepdim=True).values)).sum(-1) / p.sum(-1)
    assert (on_max > 0.99).all()
    assert (fingerprints.qk_fingerprint(m, x)["qk_rho_value"][:, 0, 0] > 0.8).all()


def test_ov_parity_head_has_rho_one(hand):
    m = hand.model()
    rho = fingerprints.ov_fingerprint(m, hand.x(), 2)
    assert rho.shape == (hand.S, 1, 2)
    assert (rho[:, 0, 0] > 0.8).all(), rho
    np.testing.assert_allclose(rho[:, 0, 0], 1.0)
    assert np.isnan(rho[:, 0, 1]).all()  # W_O = 0: a constant output has no rank correlation
    with pytest.raises(ValueError, match="modulus"):
        fingerprints.ov_fingerprint(m, hand.x(), 3)


def test_ov_ternary_residue_head(hand):
    m = hand.zero(n_classes=3)
    a = m.blocks[0].attn
    with torch.no_grad():
        r = torch.arange(hand.VOCAB) % 3
        for c in range(3):  # one-hot residue in dims 0..2, copied by head 0 to dims 4..6 = class c
            m.embed.W_E[:, : hand.VOCAB, c] = (r == c).float()
            a.W_V[:, 0, c, c] = 1.0
            a.W_O[:, 0, c, 4 + c] = 1.0
            m.unembed.W_U[:, 4 + c, c] = 1.0
            a.W_V[:, 1, c, c] = 1.0  # head 1 writes the residue's NEXT class: anti-correlated
            a.W_O[:, 1, c, 4 + (c + 1) % 3] = 1.0
    rho = fingerprints.ov_fingerprint(m, hand.x())
    np.testing.assert_allclose(rho[:, 0, 0], 1.0)
    assert (rho[:, 0, 1] < 0).all()


# --------------------------------------------------------------------------- weight-based QK fingerprint
def test_qk_weight_fingerprint_of_the_max_head_and_the_position_head(hand):
    fp = fingerprints.qk_weight_fingerprint(hand.model(q_scale=1.0))
    assert fp["qk_w_rho_value"].shape == fp["qk_w_pos0"].shape == (hand.S, 1, 2)
    np.testing.assert_allclose(fp["qk_w_rho_value"][:, 0, 0], 1.0)  # score = value / 2: prefers larger tokens
    np.testing.assert_allclose(fp["qk_w_pos0"][:, 0, 0], 1 / hand.LENGTH)  # and is blind to position
    assert np.isnan(fp["qk_w_rho_value"][:, 0, 1]).all()  # the position head's score does not depend on the value
    assert (fp["qk_w_pos0"][:, 0, 1] > 0.99).all()  # it attends to position 0: the positional term is in the key


def test_qk_weight_fingerprint_sign_follows_the_query(hand):
    m = hand.model()
    with torch.no_grad():
        m.blocks[0].attn.W_Q[:, 0, hand.READ, 0] = -1.0  # a query that prefers small tokens
    np.testing.assert_allclose(fingerprints.qk_weight_fingerprint(m)["qk_w_rho_value"][:, 0, 0], -1.0)


def test_qk_weight_pos0_is_the_models_own_attention_on_constant_sequences():
    """Layer 0 with layer norm, random weights: the formula equals the forward pass on sequences v, v, ..., v."""
    from seedlab.shortcut.config import ModelConfig
    from seedlab.shortcut.model import EnsembleTransformer

    m = EnsembleTransformer(ModelConfig(layers=1, heads=2, d_model=16, d_ff=8, init_std=0.5), 2, 7, 4, 3)
    m.init_members([3, 4])
    x = torch.arange(7).view(1, 7, 1).expand(2, 7, 4)  # row v: four copies of v
    _, cache = m.run_with_cache(x, ["blocks.0.attn.hook_attn_scores"])
    scores = cache["blocks.0.attn.hook_attn_scores"][:, :, :, -1, :4].double()  # [S, v, H, key]
    want = scores.softmax(-1)[..., 0].mean(1).numpy()
    np.testing.assert_allclose(fingerprints.qk_weight_fingerprint(m)["qk_w_pos0"][:, 0], want, rtol=1e-5)
    rho = fingerprints.spearman(scores.mean(-1).permute(0, 2, 1).numpy(), np.arange(7))
    np.testing.assert_allclose(fingerprints.qk_weight_fingerprint(m)["qk_w_rho_value"][:, 0], rho)


# --------------------------------------------------------------------------- linear-probe OV fingerprint
def test_probe_accuracy_basics():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (2, 300), generator=g)
    onehot = torch.nn.functional.one_hot(y, 3).double() + 0.01 * torch.randn(2, 300, 3, generator=g, dtype=torch.float64)
    np.testing.assert_allclose(fingerprints.probe_accuracy(onehot, y, 3), 1.0)
    noise = torch.randn(2, 300, 5, generator=g)
    assert (fingerprints.probe_accuracy(noise, y, 3) < 0.5).all()
    zeros = torch.zeros(2, 300, 4)  # nothing written: the probe predicts the (training folds') majority class
    skewed = (torch.arange(300) % 5 == 0).long().expand(2, 300)  # 80% class 0
    np.testing.assert_allclose(fingerprints.probe_accuracy(zeros, skewed, 3), 0.8)
    with pytest.raises(ValueError, match="labels"):
        fingerprints.probe_accuracy(zeros, y[:, :10], 3)


def _mlp_model(hand, d_ff: int):
    from seedlab.shortcut.config import ModelConfig
    from seedlab.shortcut.model import EnsembleTransformer

    cfg = ModelConfig(layers=1, heads=2, d_model=8, d_ff=d_ff, layer_norm=False)
    m = EnsembleTransformer(cfg, hand.S, hand.VOCAB, hand.LENGTH, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        v = torch.arange(hand.VOCAB, dtype=torch.float32)
        m.embed.W_E[:, : hand.VOCAB, hand.VAL] = v
        m.embed.W_E[:, : hand.VOCAB, hand.PAR] = v % 2
        m.embed.W_E[:, hand.VOCAB, hand.READ] = 1.0
        m.unembed.W_U[:, hand.OUT, 1], m.unembed.W_U[:, hand.OUT, 0] = 1.0, -1.0
        m.unembed.b_U[:, 1], m.unembed.b_U[:, 0] = -0.5, 0.5
    return m


HIDDEN = 5  # a residual direction that W_U does not read


def test_probe_finds_a_parity_writer_that_only_the_mlp_reads(hand):
    """Head 0 attends to the max and writes its parity to HIDDEN; the MLP copies HIDDEN to the readout."""
    m = _mlp_model(hand, d_ff=4)
    a, mlp = m.blocks[0].attn, m.blocks[0].mlp
    with torch.no_grad():
        a.W_K[:, 0, hand.VAL, 0], a.W_Q[:, 0, hand.READ, 0] = 1.0, 20.0
        a.W_V[:, 0, hand.PAR, 0], a.W_O[:, 0, 0, HIDDEN] = 1.0, 1.0
        mlp.W_in[:, HIDDEN, 0], mlp.W_out[:, 0, hand.OUT] = 1.0, 1.0
    x = hand.x(400)
    y, shortcut = x.sum(-1) % 2, x.max(-1).values % 2
    assert (m(x).argmax(-1) == shortcut).all()  # the model follows the max shortcut through the MLP
    assert np.isnan(fingerprints.ov_fingerprint(m, x, 2)[:, 0, 0]).all()  # no direct path to W_U: blind
    p = fingerprints.probe_fingerprint(m, x, {"sum": y, "shortcut": shortcut})
    assert p["probe_shortcut"].shape == (hand.S, 1, 3)
    assert (p["probe_shortcut"][:, 0, 0] > 0.97).all() and (p["probe_shortcut"][:, 0, 2] > 0.97).all()
    assert (p["probe_sum"][:, 0, 0] < 0.7).all()  # it writes the max's parity, not the sum's


def test_probe_finds_sum_parity_where_the_mlp_computes_it(hand):
    """Head 0 attends uniformly and writes the share of odd tokens; the MLP turns the count into its parity."""
    m = _mlp_model(hand, d_ff=8)
    a, mlp = m.blocks[0].attn, m.blocks[0].mlp
    P = hand.LENGTH + 1  # keys, the readout included (its parity feature is 0)
    with torch.no_grad():
        a.W_V[:, 0, hand.PAR, 0], a.W_O[:, 0, 0, HIDDEN] = 1.0, 1.0  # HIDDEN = (number of odd tokens) / P
        for i, c in enumerate([1.0, -2.0, 2.0, -2.0, 2.0, -2.0]):  # parity(n) = sum_i c_i relu(n - i) for n in 0..5
            mlp.W_in[:, HIDDEN, i], mlp.b_in[:, i], mlp.W_out[:, i, hand.OUT] = float(P), -float(i), c
    x = hand.x(400, seed=1)
    y, shortcut = x.sum(-1) % 2, x.max(-1).values % 2
    assert (m(x).argmax(-1) == y).all()  # the model computes the true rule
    p = fingerprints.probe_fingerprint(m, x, {"sum": y, "shortcut": shortcut})
    assert (p["probe_sum"][:, 0, 2] > 0.97).all()  # the MLP's write carries the sum's parity
    assert (p["probe_sum"][:, 0, 0] < 0.7).all()  # the count itself does not, linearly
    assert (p["probe_sum"][:, 0, 1] < 0.7).all()  # head 1 writes nothing


def test_ternary_probe_chance_is_what_the_shortcut_alone_reaches_not_one_third(hand):
    """sum3-max on val+adv rows: a head that copies the maximum's residue (one-hot) reads the label on the val half
    only. Its sum probe sits at the chance level best_from gives, 1/2, far above 1/3."""
    from seedlab.shortcut.tasks import make_splits

    s = make_splits("sum3-max", 0.5, 100, n_val=300, n_adv=300, length=hand.LENGTH, vocab=hand.VOCAB, seed=0)
    x = torch.from_numpy(np.concatenate([s["val"].x, s["adv"].x])).expand(hand.S, -1, -1).contiguous()
    y, shortcut = (torch.from_numpy(np.concatenate([getattr(s[v], k) for v in ("val", "adv")])).expand(hand.S, -1)
                   for k in ("y", "shortcut"))
    m = hand.zero(n_classes=3)
    a = m.blocks[0].attn
    with torch.no_grad():  # head 0 attends to the maximum (as the hand-built max head) and copies its residue one-hot
        v = torch.arange(hand.VOCAB)
        m.embed.W_E[:, : hand.VOCAB, hand.VAL] = v.float()
        m.embed.W_E[:, hand.VOCAB, hand.READ] = 1.0
        a.W_K[:, 0, hand.VAL, 0], a.W_Q[:, 0, hand.READ, 0] = 1.0, 20.0
        for c in range(3):
            m.embed.W_E[:, : hand.VOCAB, 5 + c] = (v % 3 == c).float()
            a.W_V[:, 0, 5 + c, 1 + c], a.W_O[:, 0, 1 + c, 5 + c] = 1.0, 1.0
    chance = fingerprints.best_from(shortcut, y, 3)
    np.testing.assert_allclose(chance, 0.5)  # the val half: label = shortcut; the adv half: one of two other labels
    # by brute force: the best of the 3^3 maps from the shortcut residue to a label
    import itertools

    best = max(((torch.tensor(f)[shortcut] == y).double().mean(1).numpy() for f in itertools.product(range(3), repeat=3)),
               key=lambda acc: acc.sum())
    np.testing.assert_allclose(chance, best)
    p = fingerprints.probe_fingerprint(m, x, {"sum": y, "shortcut": shortcut})
    np.testing.assert_allclose(p["probe_sum_chance"], 0.5)
    np.testing.assert_allclose(p["probe_shortcut_chance"][:, 0, 0], fingerprints.best_from(y, shortcut, 3))
    assert (p["probe_shortcut"][:, 0, 0] > 0.99).all()  # it writes the shortcut...
    assert (np.abs(p["probe_sum"][:, 0, 0] - 0.5) < 0.03).all()  # ...and reads the label exactly at chance, not 1/3 + 17
