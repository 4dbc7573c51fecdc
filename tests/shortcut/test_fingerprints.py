"""QK/OV fingerprints on hand-built weights (known answers)."""

import numpy as np
import pytest
import torch

from seedlab.shortcut import fingerprints


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
