"""Ablation and activation patching on hand-built weights (known answers)."""

import numpy as np
import pytest
import torch

from seedlab.shortcut import interventions


def test_ablating_a_head_with_zero_W_O_changes_nothing(hand):
    m = hand.model()
    x = hand.x(128)
    y = x.sum(-1) % 2
    for kind in ("zero", "mean"):
        d = interventions.ablate(m, x, y, kind)
        assert d.shape == (hand.S, 1, 3)
        assert (d[:, 0, 1] == 0).all()  # head 1 writes nothing
        assert (d[:, 0, 2] == 0).all()  # the MLP is all zeros
    # zero-ablating the only writing head leaves logits 0 -> argmax 0: accuracy = fraction of y == 0
    base = (m(x).argmax(-1) == y).double().mean(1).numpy()
    np.testing.assert_allclose(interventions.ablate(m, x, y, "zero")[:, 0, 0], (y == 0).double().mean(1).numpy() - base)
    with pytest.raises(ValueError, match="kind"):
        interventions.ablate(m, x, y, "resample")


def _uniform_two_writer_model(hand):
    """Both heads attend uniformly (W_Q = W_K = 0) and copy VAL to OUT, head 0 with weight 3, head 1 with 1."""
    m = hand.zero()
    a = m.blocks[0].attn
    with torch.no_grad():
        m.embed.W_E[:, : hand.VOCAB, hand.VAL] = torch.arange(hand.VOCAB, dtype=torch.float32)
        for h, w in ((0, 3.0), (1, 1.0)):
            a.W_V[:, h, hand.VAL, 0] = 1.0
            a.W_O[:, h, 0, hand.OUT] = w
        m.unembed.W_U[:, hand.OUT, 1] = 1.0
        m.unembed.W_U[:, hand.OUT, 0] = -1.0
    return m


def test_patching_into_itself_moves_nothing(hand):
    m = hand.model()
    x = hand.x(32)
    y = x.sum(-1) % 2
    moved, full = interventions.patch_delta(m, x, x, y)
    assert (moved == 0).all() and (full == 0).all()
    assert np.isnan(interventions.patch(m, x, x, y)).all()


def test_patching_moves_each_head_by_its_share(hand):
    m = _uniform_two_writer_model(hand)
    x_dst = hand.x(32, seed=1)
    x_src = hand.x(32, seed=2)
    y = x_dst.sum(-1) % 2
    frac = interventions.patch(m, x_src, x_dst, y)
    assert frac.shape == (hand.S, 1, 3)
    # the logits are linear in the two heads' writes, which differ only by their weights 3 : 1
    np.testing.assert_allclose(frac[:, 0, 0], 0.75, atol=1e-5)
    np.testing.assert_allclose(frac[:, 0, 1], 0.25, atol=1e-5)
    np.testing.assert_allclose(frac[:, 0, 2], 0.0, atol=1e-12)  # the MLP carries nothing


def test_patch_rejects_unpaired_batches(hand):
    m = hand.model()
    with pytest.raises(ValueError, match="pair"):
        interventions.patch(m, hand.x(16), hand.x(32), hand.x(32).sum(-1) % 2)
