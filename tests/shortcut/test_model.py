"""The seed-vectorized transformer: hook points, the readout fast path, member independence."""

import pytest
import torch

from seedlab.shortcut.config import ModelConfig
from seedlab.shortcut.model import EnsembleTransformer


def _model(S=3, **kw):
    m = EnsembleTransformer(ModelConfig(**kw), S, vocab=10, length=5, n_classes=2)
    m.init_members(list(range(100, 100 + S)))
    return m


@pytest.mark.parametrize("layers,heads,causal,act", [(1, 1, False, "relu"), (2, 2, False, "gelu"), (2, 2, True, "relu")])
def test_fast_path_equals_full_path(layers, heads, causal, act):
    """With no hooks the last block works at the readout token only: same logits as the full model."""
    m = _model(layers=layers, heads=heads, causal=causal, act=act)
    x = torch.randint(0, 10, (3, 32, 5))
    fast = m(x)
    full, cache = m.run_with_cache(x)
    torch.testing.assert_close(fast, full, atol=1e-6, rtol=1e-5)
    assert set(cache) == set(m.hook_names)


def test_hook_shapes_follow_transformerlens_layout():
    m = _model(S=2, layers=2, heads=2)
    _, c = m.run_with_cache(torch.randint(0, 10, (2, 7, 5)))
    assert c["hook_embed"].shape == (2, 7, 6, 64)
    assert c["blocks.1.attn.hook_pattern"].shape == (2, 7, 2, 6, 6)  # [S, batch, head, q, k]
    assert c["blocks.1.attn.hook_z"].shape == (2, 7, 6, 2, 32)  # [S, batch, pos, head, d_head]
    assert c["blocks.0.attn.hook_result"].shape == (2, 7, 6, 2, 64)
    torch.testing.assert_close(c["blocks.0.attn.hook_pattern"].sum(-1), torch.ones(2, 7, 2, 6))
    # per-head results add up to the attention output (plus b_O, zero at init)
    torch.testing.assert_close(c["blocks.0.attn.hook_result"].sum(-2), c["blocks.0.hook_attn_out"], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        c["blocks.0.hook_resid_pre"] + c["blocks.0.hook_attn_out"], c["blocks.0.hook_resid_mid"], atol=1e-6, rtol=1e-5
    )


def test_hooks_can_replace_activations():
    m = _model()
    x = torch.randint(0, 10, (3, 16, 5))
    base = m(x)
    same = m.run_with_hooks(x, [("blocks.0.hook_mlp_out", lambda t, n: None)])
    torch.testing.assert_close(base, same, atol=1e-6, rtol=1e-5)
    # zero-ablating every attention output changes the function
    zeroed = m.run_with_hooks(x, [(f"blocks.{l}.hook_attn_out", lambda t, n: torch.zeros_like(t)) for l in range(2)])
    assert not torch.allclose(base, zeroed)
    with pytest.raises(KeyError):
        m.run_with_hooks(x, [("blocks.9.hook_nothing", lambda t, n: t)])


def test_members_are_independent():
    """Member 1's output depends on neither member 0's weights nor member 0's inputs."""
    m = _model(S=2)
    x = torch.randint(0, 10, (2, 16, 5))
    before = m(x)[1]
    with torch.no_grad():
        for p in m.parameters():
            p[0].normal_()
    x2 = x.clone()
    x2[0] = torch.randint(0, 10, (16, 5))
    torch.testing.assert_close(m(x2)[1], before, atol=0, rtol=0)


def test_init_depends_only_on_seed():
    a = EnsembleTransformer(ModelConfig(), 3, 10, 5, 2)
    a.init_members([7, 8, 9])
    b = EnsembleTransformer(ModelConfig(), 1, 10, 5, 2)
    b.init_members([8])
    for k, v in b.member_state(0).items():
        assert torch.equal(a.member_state(1)[k], v), k


def test_gradients_do_not_cross_members():
    m = _model(S=2)
    x, y = torch.randint(0, 10, (2, 16, 5)), torch.randint(0, 2, (2, 16))
    loss, _ = m.losses(x, y)
    loss[0].backward()
    for name, p in m.named_parameters():
        assert p.grad[1].abs().max() == 0, name
