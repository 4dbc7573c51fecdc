"""Hook points (seedlab.hooks) in both models: found by walking, TransformerLens names, no effect unless asked."""

import pytest
import torch

from seedlab.hooks import HookedModule, HookPoint
from seedlab.lm.model import GPT, PRESETS
from seedlab.shortcut.config import ModelConfig
from seedlab.shortcut.model import EnsembleTransformer

MINI = PRESETS["mini"]  # 2 layers, 2 heads, n_embd 64, block_size 64, vocab 257


def _shortcut(S=2, **kw) -> EnsembleTransformer:
    m = EnsembleTransformer(ModelConfig(layers=2, heads=2, **kw), S, vocab=10, length=5, n_classes=3)
    m.init_members(list(range(10, 10 + S)))
    return m


def _gpt() -> GPT:
    return GPT(MINI, seed=0).eval()


def _tokens(B=3, T=16) -> torch.Tensor:
    return torch.randint(0, MINI.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))


class _Tiny(HookedModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.hook_in, self.hook_out = HookPoint(), HookPoint()

    def forward(self, x):
        return self.hook_out(self.lin(self.hook_in(x)))


def test_hook_names_are_found_by_walking_the_modules():
    m = _Tiny()
    assert m.hook_names == ["hook_in", "hook_out"]
    m.lin.hook_new = HookPoint()  # a new hook point anywhere appears without editing a list
    assert m.hook_names == ["lin.hook_new", "hook_in", "hook_out"]  # module order: lin was registered first
    m.run_with_cache(torch.zeros(3))
    assert m.lin.hook_new.name == "lin.hook_new"
    sc = _shortcut()
    sc.blocks[1].attn.hook_extra = HookPoint()
    assert "blocks.1.attn.hook_extra" in sc.hook_names


def test_hook_points_hold_no_state_and_pass_their_input_through():
    x = torch.randn(4)
    assert HookPoint()(x) is x
    for m in (_shortcut(), _gpt()):
        assert not any("hook_" in k for k in m.state_dict())
        assert not any("hook_" in k for k, _ in m.named_parameters())
    assert list(_gpt().state_dict())[-2:] == ["ln_f.weight", "ln_f.bias"]


def test_both_models_use_transformerlens_names():
    per_block = ("hook_resid_pre attn.hook_q attn.hook_k attn.hook_v attn.hook_z hook_attn_out hook_resid_mid "
                 "mlp.hook_pre mlp.hook_post hook_mlp_out hook_resid_post").split()
    common = {"hook_embed", "hook_pos_embed", "ln_final.hook_normalized"}
    common |= {f"blocks.{l}.{n}" for l in range(2) for n in per_block}
    gpt, sc = set(_gpt().hook_names), set(_shortcut().hook_names)
    assert gpt == common  # SDPA never forms the pattern: no hook_attn_scores / hook_pattern / hook_result
    extra = {"ln1.hook_normalized", "ln2.hook_normalized"}
    extra |= {"attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_result"}
    assert sc == common | {f"blocks.{l}.{n}" for l in range(2) for n in extra}


def test_gpt_cache_shapes():
    m, idx = _gpt(), _tokens(B=3, T=16)
    (logits, loss), c = m.run_with_cache(idx)
    assert loss is None and logits.shape == (3, 16, MINI.vocab_size)
    assert set(c) == set(m.hook_names)
    d, H = MINI.n_embd, MINI.n_head
    assert c["hook_embed"].shape == (3, 16, d)
    assert c["hook_pos_embed"].shape == (16, d)
    for n in ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post"):
        assert c[f"blocks.1.{n}"].shape == (3, 16, d), n
    for n in ("hook_q", "hook_k", "hook_v", "hook_z"):
        assert c[f"blocks.0.attn.{n}"].shape == (3, 16, H, d // H), n
    assert c["blocks.0.mlp.hook_pre"].shape == c["blocks.0.mlp.hook_post"].shape == (3, 16, 4 * d)
    assert torch.equal(c["blocks.0.hook_resid_pre"] + c["blocks.0.hook_attn_out"], c["blocks.0.hook_resid_mid"])
    assert torch.equal(c["blocks.0.hook_resid_post"], c["blocks.1.hook_resid_pre"])
    assert torch.equal(c["blocks.0.mlp.hook_post"], torch.nn.functional.gelu(c["blocks.0.mlp.hook_pre"]))
    torch.testing.assert_close(torch.nn.functional.linear(c["ln_final.hook_normalized"], m.wte.weight), logits)


def test_shortcut_cache_shapes():
    m = _shortcut(S=2)
    logits, c = m.run_with_cache(torch.randint(0, 10, (2, 7, 5)))
    assert logits.shape == (2, 7, 3) and set(c) == set(m.hook_names)
    assert c["hook_embed"].shape == (2, 7, 6, 64)  # [S, batch, pos, d_model]; pos = length + the readout token
    assert c["hook_pos_embed"].shape == (2, 1, 6, 64)
    assert c["blocks.0.attn.hook_q"].shape == (2, 7, 6, 2, 32)  # [S, batch, pos, head, d_head]
    assert c["blocks.1.attn.hook_pattern"].shape == (2, 7, 2, 6, 6)  # [S, batch, head, q_pos, k_pos]
    assert c["blocks.1.attn.hook_result"].shape == (2, 7, 6, 2, 64)
    assert c["ln_final.hook_normalized"].shape == (2, 7, 64)  # the readout position only


def test_a_replacement_changes_the_output():
    idx = _tokens()
    m = _gpt()
    base = m(idx)[0]
    zero = lambda t, n: torch.zeros_like(t)
    assert not torch.allclose(base, m.run_with_hooks(idx, [("blocks.0.hook_attn_out", zero)])[0])
    # zeroing every block's attention and MLP output leaves embeddings -> final LN -> head
    ablate = [(f"blocks.{l}.hook_{w}_out", zero) for l in range(2) for w in ("attn", "mlp")]
    x = m.wte(idx) + m.wpe(torch.arange(idx.shape[1]))
    expected = torch.nn.functional.linear(m.ln_f(x), m.wte.weight)
    assert torch.equal(m.run_with_hooks(idx, ablate)[0], expected)
    sc, x = _shortcut(), torch.randint(0, 10, (2, 8, 5))
    assert not torch.allclose(sc(x), sc.run_with_hooks(x, [("blocks.1.attn.hook_pattern", zero)]))


def test_hooks_see_their_name_and_chain_in_order():
    m, seen = _gpt(), []
    double = lambda t, n: seen.append(n) or 2 * t
    plus_one = lambda t, n: seen.append(n) or t + 1
    (logits, _), c = m.run_with_cache(_tokens(), ["blocks.1.hook_resid_pre"])
    hooked = m.run_with_hooks(_tokens(), [("blocks.1.hook_resid_pre", double), ("blocks.1.hook_resid_pre", plus_one)])
    assert seen == ["blocks.1.hook_resid_pre"] * 2
    with m.hooks([("blocks.1.hook_resid_pre", lambda t, n: 2 * c["blocks.1.hook_resid_pre"] + 1)]):
        assert torch.equal(hooked[0], m(_tokens())[0])


def test_unknown_names_raise_and_register_nothing():
    for m, x in ((_gpt(), _tokens()), (_shortcut(), torch.randint(0, 10, (2, 4, 5)))):
        with pytest.raises(KeyError, match="blocks.9.hook_nothing"):
            m.run_with_hooks(x, [("hook_embed", lambda t, n: None), ("blocks.9.hook_nothing", lambda t, n: t)])
        assert m.n_hooks == 0 and not any(p.fns for p in m.hook_points().values())


def test_hooks_are_removed_after_the_context_even_on_error():
    m = _gpt()
    with pytest.raises(RuntimeError):
        with m.hooks([("blocks.0.hook_mlp_out", lambda t, n: None)]):
            assert m.n_hooks == 1 and m.blocks[0].hook_mlp_out.fns
            raise RuntimeError
    assert m.n_hooks == 0 and not any(p.fns for p in m.hook_points().values())
    # nested blocks add to each other and each removes only its own
    with m.hooks([("hook_embed", lambda t, n: None)]):
        with m.hooks([("hook_embed", lambda t, n: None)]):
            assert len(m.hook_embed.fns) == 2
        assert len(m.hook_embed.fns) == 1
    assert not m.hook_embed.fns


def test_gpt_residuals_equal_a_manual_forward():
    m, idx = _gpt(), _tokens()
    with torch.no_grad():
        x = m.wte(idx) + m.wpe(torch.arange(idx.shape[1]))
        manual = []
        for block in m.blocks:
            x = x + block.attn(block.ln_1(x))
            x = x + block.mlp(block.ln_2(x))
            manual.append(x)
        got = m.residuals(idx)
    assert len(got) == MINI.n_layer
    for a, b in zip(got, manual, strict=True):
        assert torch.equal(a, b)


def test_a_noop_hook_leaves_gpt_logits_loss_and_gradients_bitwise_equal():
    idx = _tokens()
    runs = []
    for hooks in ([], [(n, lambda t, n: None) for n in _gpt().hook_names]):
        m = _gpt()
        (logits, loss) = m.run_with_hooks(idx[:, :-1], hooks, targets=idx[:, 1:])
        loss.backward()
        runs.append((logits, loss, [p.grad for p in m.parameters()]))
    (l0, loss0, g0), (l1, loss1, g1) = runs
    assert torch.equal(l0, l1) and torch.equal(loss0, loss1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))


def test_a_noop_hook_leaves_shortcut_logits_bitwise_equal():
    m, x = _shortcut(S=3), torch.randint(0, 10, (3, 16, 5))
    noop = lambda t, n: None
    fast = m(x)  # no hook: the last block works at the readout position only
    full = m.run_with_hooks(x, [("hook_embed", noop)])  # any hook: every position
    names = [n for n in m.hook_names if not n.endswith(("attn_scores", "pattern", "result"))]
    assert torch.equal(m.run_with_hooks(x, [(n, noop) for n in names]), full)
    torch.testing.assert_close(fast, full, atol=1e-6, rtol=1e-5)  # the same function, rounded differently
    assert torch.equal(m(x), fast)  # after the hooks, the fast path again
    # hooking the pattern or per-head results materializes them: again the same function
    for name in ("blocks.0.attn.hook_pattern", "blocks.1.attn.hook_result"):
        torch.testing.assert_close(m.run_with_hooks(x, [(name, noop)]), full, atol=1e-6, rtol=1e-5)
