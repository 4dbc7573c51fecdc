"""seedlab.lm.align: permuting MLP units and heads keeps the function; weight matching undoes a permutation
exactly and never increases the distance."""

from __future__ import annotations

import pytest
import torch

from seedlab.lm.align import LayerPerm, aligned, identity, match, permute, unit_vectors
from seedlab.lm.model import GPT, GPTConfig
from seedlab.measures.weights import identical, weight_distance

CFG = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64)


def _random(cfg: GPTConfig, seed: int) -> GPT:
    """A GPT whose every tensor (biases and LN parameters too) is random, so no two units are alike."""
    g = torch.Generator().manual_seed(seed)
    m = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g) + (1.0 if "ln" in name and name.endswith("weight") else 0.0))
    return m


def _random_perms(cfg: GPTConfig, seed: int) -> list[LayerPerm]:
    g = torch.Generator().manual_seed(seed)
    return [LayerPerm(torch.randperm(4 * cfg.n_embd, generator=g), torch.randperm(cfg.n_head, generator=g))
            for _ in range(cfg.n_layer)]


def _logits(cfg: GPTConfig, state: dict, x: torch.Tensor) -> torch.Tensor:
    m = GPT(cfg).eval()
    m.load_state_dict(state)
    with torch.no_grad():
        return m(x)[0]


@pytest.mark.parametrize("bias", [True, False])
def test_permuted_copy_same_function_and_aligned_distance_zero(bias):
    cfg = CFG.model_copy(update={"bias": bias})
    ref = _random(cfg, 0).state_dict()
    perms = _random_perms(cfg, 1)
    assert all(not torch.equal(p.mlp, torch.arange(len(p.mlp))) and not torch.equal(p.heads, torch.arange(cfg.n_head))
               for p in perms)
    other = permute(ref, perms, cfg)
    x = torch.randint(0, cfg.vocab_size, (3, cfg.block_size), generator=torch.Generator().manual_seed(2))
    a, b = _logits(cfg, ref, x), _logits(cfg, other, x)
    # the same function, but not bitwise: c_proj sums its inputs (hidden units, heads' features) in another order
    assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()
    assert weight_distance(ref, other)["all"] > 0
    back = aligned(ref, other, cfg)
    assert identical(back, ref)  # bitwise the reference's tensors: the permutation is undone exactly
    assert weight_distance(ref, back)["all"] == 0.0
    assert torch.equal(_logits(cfg, back, x), a)


def test_permute_is_exact_and_inverts():
    ref = _random(CFG, 3).state_dict()
    perms = _random_perms(CFG, 4)
    inv = [LayerPerm(torch.argsort(p.mlp), torch.argsort(p.heads)) for p in perms]
    assert identical(permute(permute(ref, perms, CFG), inv, CFG), ref)
    assert identical(permute(ref, identity(CFG), CFG), ref)
    moved = permute(ref, perms, CFG)
    untouched = [k for k in ref if not any(s in k for s in ("c_attn", "attn.c_proj.weight", "c_fc", "mlp.c_proj.weight"))]
    assert untouched and all(moved[k] is ref[k] for k in untouched)  # residual basis, embeddings, LNs, output biases
    # head h of the permuted model is head perms[0].heads[h] of the original: its q, k and v rows and c_proj columns
    C, d, h = CFG.n_embd, CFG.n_embd // CFG.n_head, 1
    src = int(perms[0].heads[h])
    w, w0 = moved["blocks.0.attn.c_attn.weight"], ref["blocks.0.attn.c_attn.weight"]
    for part in range(3):
        assert torch.equal(w[part * C + h * d: part * C + (h + 1) * d], w0[part * C + src * d: part * C + (src + 1) * d])
    assert torch.equal(moved["blocks.0.attn.c_proj.weight"][:, h * d:(h + 1) * d],
                       ref["blocks.0.attn.c_proj.weight"][:, src * d:(src + 1) * d])


def test_unit_vectors_carry_exactly_the_moved_tensors():
    """Σ over units of the squared difference of the unit vectors = the squared distance of the tensors they come from."""
    a, b = _random(CFG, 5).state_dict(), _random(CFG, 6).state_dict()
    for l in range(CFG.n_layer):
        moved = [k for k in a if k.startswith(f"blocks.{l}.") and ("c_attn" in k or "c_fc" in k or k.endswith("c_proj.weight"))]
        want = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in moved)
        (am, ah), (bm, bh) = unit_vectors(a, l, CFG), unit_vectors(b, l, CFG)
        got = float(((am - bm) ** 2).sum() + ((ah - bh) ** 2).sum())
        assert got == pytest.approx(want, rel=1e-12)


def test_independent_models_aligned_distance_not_larger():
    """The identity is a candidate permutation, so the assignment's objective is no worse than the identity's
    and, as the objective is ‖a‖² + ‖b‖² − squared distance, the aligned L2 distance is no larger (here: smaller)."""
    cfg = CFG
    a, b = GPT(cfg, seed=0).state_dict(), GPT(cfg, seed=1).state_dict()
    raw = weight_distance(a, b)
    b2 = aligned(a, b, cfg)
    al = weight_distance(a, b2)
    assert al["all"] < raw["all"]
    for g in raw:  # per block too; the groups no permutation touches are unchanged
        assert al[g] <= raw[g]
        if g != "all" and not g.startswith("blocks."):
            assert al[g] == raw[g]
    assert not identical(b2, b)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size), generator=torch.Generator().manual_seed(7))
    assert torch.allclose(_logits(cfg, b, x), _logits(cfg, b2, x), rtol=0, atol=1e-5)  # the same function as b
    # a model aligned to itself is left alone
    assert all(torch.equal(p.mlp, q.mlp) and torch.equal(p.heads, q.heads) for p, q in zip(match(a, a, cfg), identity(cfg)))
