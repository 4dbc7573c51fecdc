"""seedlab.lm.align: permuting the residual stream, MLP units and heads keeps the function; the coordinate descent
of weight matching undoes such a permutation exactly, never lowers its objective and never increases the distance."""

from __future__ import annotations

import pytest
import torch

from seedlab.lm.align import (LayerPerm, Perms, aligned, identity, match, permute, residual_vectors, unit_vectors)
from seedlab.lm.model import GPT, GPTConfig
from seedlab.measures.weights import identical, weight_distance

CFG = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64)
SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32)  # the test model


def _random(cfg: GPTConfig, seed: int) -> GPT:
    """A GPT whose every tensor (biases and LN parameters too) is random, so no two units are alike."""
    g = torch.Generator().manual_seed(seed)
    m = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=g) + (1.0 if "ln" in name and name.endswith("weight") else 0.0))
    return m


def _random_perms(cfg: GPTConfig, seed: int, residual: bool = True, hidden: bool = True) -> Perms:
    """Random permutations (never the identity where ``residual`` / ``hidden`` asks for one), else the identity."""
    g = torch.Generator().manual_seed(seed)

    def rp(n: int, on: bool) -> torch.Tensor:
        p = torch.randperm(n, generator=g) if on else torch.arange(n)
        return p.roll(1) if on and not _moved(p) else p  # 2 heads: randperm is the identity half the time

    return Perms(rp(cfg.n_embd, residual),
                 tuple(LayerPerm(rp(4 * cfg.n_embd, hidden), rp(cfg.n_head, hidden)) for _ in range(cfg.n_layer)))


def _logits(cfg: GPTConfig, state: dict, x: torch.Tensor) -> torch.Tensor:
    m = GPT(cfg).eval()
    m.load_state_dict(state)
    with torch.no_grad():
        return m(x)[0]


def _x(cfg: GPTConfig, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (3, cfg.block_size), generator=torch.Generator().manual_seed(seed))


def _moved(p: torch.Tensor) -> bool:
    return not torch.equal(p, torch.arange(len(p)))


@pytest.mark.parametrize("cfg", [SMALL, CFG], ids=["d16", "d32"])
@pytest.mark.parametrize("bias", [True, False])
def test_permuted_copy_same_function_and_aligned_distance_zero(cfg, bias):
    """Residual, head and neuron features all permuted: the same logits, and matching undoes all of it exactly."""
    cfg = cfg.model_copy(update={"bias": bias})
    ref = _random(cfg, 0).state_dict()
    perms = _random_perms(cfg, 1)
    assert _moved(perms.residual) and all(_moved(p.mlp) and _moved(p.heads) for p in perms.layers)
    other = permute(ref, perms, cfg)
    x = _x(cfg)
    a, b = _logits(cfg, ref, x), _logits(cfg, other, x)
    # the same function, but not bitwise: the layer norms and matrices sum their features in another order
    assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()
    assert weight_distance(ref, other)["all"] > 0
    m = match(ref, other, cfg)
    assert m.converged and 2 <= m.iterations <= 10
    back = permute(other, m.perms, cfg)
    assert identical(back, ref)  # bitwise the reference's tensors: the permutation is undone exactly
    assert identical(aligned(ref, other, cfg), back)
    assert weight_distance(ref, back)["all"] == 0.0
    assert torch.equal(_logits(cfg, back, x), a)
    inv = perms.inverse()  # the permutations found are exactly the inverse of those applied
    assert torch.equal(m.perms.residual, inv.residual)
    assert all(torch.equal(p.mlp, q.mlp) and torch.equal(p.heads, q.heads) for p, q in zip(m.perms.layers, inv.layers))


@pytest.mark.parametrize("bias", [True, False])
def test_residual_permutation_alone_is_a_symmetry_and_is_recovered(bias):
    cfg = SMALL.model_copy(update={"bias": bias})
    ref = _random(cfg, 10).state_dict()
    perms = _random_perms(cfg, 11, hidden=False)
    assert _moved(perms.residual) and not any(_moved(p.mlp) or _moved(p.heads) for p in perms.layers)
    other = permute(ref, perms, cfg)
    x = _x(cfg, 12)
    a, b = _logits(cfg, ref, x), _logits(cfg, other, x)
    assert torch.allclose(a, b, rtol=0, atol=1e-5), (a - b).abs().max()
    # every tensor carries the residual basis: each one moved (the biases of c_attn and c_fc do not carry it)
    carriers = [k for k in ref if not k.endswith(("c_attn.bias", "c_fc.bias"))]
    assert all(not torch.equal(other[k], ref[k]) for k in carriers)
    assert all(torch.equal(other[k], ref[k]) for k in ref if k not in carriers)
    m = match(ref, other, cfg)
    assert torch.equal(m.perms.residual, torch.argsort(perms.residual))
    assert not any(_moved(p.mlp) or _moved(p.heads) for p in m.perms.layers)
    assert identical(permute(other, m.perms, cfg), ref)


def test_permute_is_exact_and_inverts():
    ref = _random(CFG, 3).state_dict()
    perms = _random_perms(CFG, 4)
    assert identical(permute(permute(ref, perms, CFG), perms.inverse(), CFG), ref)
    assert identical(permute(ref, identity(CFG), CFG), ref) and identity(CFG).is_identity() and not perms.is_identity()
    moved = permute(ref, perms, CFG)
    # residual feature i of the permuted model is feature perms.residual[i] of the original, in every carrier
    i, src = 5, int(perms.residual[5])
    assert torch.equal(moved["wte.weight"][:, i], ref["wte.weight"][:, src])
    assert torch.equal(moved["wpe.weight"][:, i], ref["wpe.weight"][:, src])
    for k in ("ln_f.weight", "ln_f.bias", "blocks.1.ln_2.bias", "blocks.0.attn.c_proj.bias", "blocks.1.mlp.c_proj.bias"):
        assert moved[k][i] == ref[k][src]
    # head h of the permuted model is head perms.layers[0].heads[h] of the original: its q, k and v rows and
    # c_proj columns (in the permuted residual basis)
    C, d, h = CFG.n_embd, CFG.n_embd // CFG.n_head, 1
    hs, res = int(perms.layers[0].heads[h]), perms.residual
    w, w0 = moved["blocks.0.attn.c_attn.weight"], ref["blocks.0.attn.c_attn.weight"][:, res]
    for part in range(3):
        assert torch.equal(w[part * C + h * d: part * C + (h + 1) * d], w0[part * C + hs * d: part * C + (hs + 1) * d])
    assert torch.equal(moved["blocks.0.attn.c_proj.weight"][:, h * d:(h + 1) * d],
                       ref["blocks.0.attn.c_proj.weight"][res][:, hs * d:(hs + 1) * d])
    # MLP unit u is unit perms.layers[1].mlp[u]
    u, us = 7, int(perms.layers[1].mlp[7])
    assert torch.equal(moved["blocks.1.mlp.c_fc.weight"][u], ref["blocks.1.mlp.c_fc.weight"][us, res])
    assert torch.equal(moved["blocks.1.mlp.c_proj.weight"][:, u], ref["blocks.1.mlp.c_proj.weight"][res, us])
    with pytest.raises(TypeError):
        permute(ref, list(perms.layers), CFG)  # a list of layer permutations alone is refused, not read as residual-fixed
    with pytest.raises(ValueError):
        permute(ref, Perms(perms.residual, perms.layers[:1]), CFG)


@pytest.mark.parametrize("bias", [True, False])
def test_unit_and_residual_vectors_carry_exactly_the_moved_tensors(bias):
    """Σ over units (features) of the squared difference of their vectors = the squared distance of the tensors
    they come from."""
    cfg = CFG.model_copy(update={"bias": bias})
    a, b = _random(cfg, 5).state_dict(), _random(cfg, 6).state_dict()
    sq = lambda keys: sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in keys)
    for l in range(cfg.n_layer):
        moved = [k for k in a if k.startswith(f"blocks.{l}.") and ("c_attn" in k or "c_fc" in k or k.endswith("c_proj.weight"))]
        (am, ah), (bm, bh) = unit_vectors(a, l, cfg), unit_vectors(b, l, cfg)
        got = float(((am - bm) ** 2).sum() + ((ah - bh) ** 2).sum())
        assert got == pytest.approx(sq(moved), rel=1e-12)
    ra, rb = residual_vectors(a, cfg), residual_vectors(b, cfg)
    assert ra.shape[0] == cfg.n_embd
    carriers = [k for k in a if not k.endswith(("c_attn.bias", "c_fc.bias"))]
    assert float(((ra - rb) ** 2).sum()) == pytest.approx(sq(carriers), rel=1e-12)


def test_independent_models_aligned_distance_below_raw():
    """Two seeds' GPTs: matching brings them closer (the distance is ‖a‖² + ‖b‖² − 2·objective), keeps b's function,
    and leaves a model aligned to itself alone."""
    cfg = CFG
    a, b = GPT(cfg, seed=0).state_dict(), GPT(cfg, seed=1).state_dict()
    raw = weight_distance(a, b)["all"]
    m = match(a, b, cfg)
    b2 = permute(b, m.perms, cfg)
    assert identical(aligned(a, b, cfg), b2)
    al = weight_distance(a, b2)["all"]
    assert al < raw
    assert m.converged and not m.perms.is_identity() and _moved(m.perms.residual)
    n2 = lambda s: sum(float((t.double() ** 2).sum()) for t in s.values())
    assert al ** 2 == pytest.approx(n2(a) + n2(b) - 2 * m.objective[-1], rel=1e-9)
    assert raw ** 2 == pytest.approx(n2(a) + n2(b) - 2 * m.objective[0], rel=1e-9)
    x = _x(cfg, 7)
    assert torch.allclose(_logits(cfg, b, x), _logits(cfg, b2, x), rtol=0, atol=1e-5)  # the same function as b
    same = match(a, a, cfg)
    assert same.perms.is_identity() and same.converged and same.iterations == 1


@pytest.mark.parametrize("pair", [(0, 1), (2, 3), (4, 5)])
@pytest.mark.parametrize("max_iter", [1, 100])
def test_aligned_distance_never_above_raw(pair, max_iter):
    """From the identity, accepting only improving steps, compared with the raw distance at the end: never farther,
    after one sweep as after convergence; random models (every tensor random) and initialised ones alike."""
    for a, b in [(_random(SMALL, pair[0]).state_dict(), _random(SMALL, pair[1]).state_dict()),
                 (GPT(SMALL, seed=pair[0]).state_dict(), GPT(SMALL, seed=pair[1]).state_dict())]:
        assert weight_distance(a, aligned(a, b, SMALL, max_iter=max_iter))["all"] <= weight_distance(a, b)["all"]


def test_objective_never_decreases_and_is_deterministic():
    cfg = SMALL
    a, b = _random(cfg, 20).state_dict(), _random(cfg, 21).state_dict()
    runs = {s: match(a, b, cfg, seed=s) for s in (0, 1, 2)}
    for m in runs.values():
        obj = m.objective
        assert len(obj) == m.iterations + 1 and m.converged
        assert all(y >= x for x, y in zip(obj, obj[1:]))  # each accepted step raises it; a rejected one keeps it
        assert obj[-1] == obj[-2]  # the converged sweep changed nothing
        assert obj[-1] > obj[0]
        got = permute(b, m.perms, cfg)
        assert float(sum((a[k].double() * got[k].double()).sum() for k in a)) == pytest.approx(obj[-1], rel=1e-12)
    again = match(a, b, cfg, seed=0)  # the same seed: the same order of coordinates, the same answer
    assert again.objective == runs[0].objective and again.iterations == runs[0].iterations
    assert torch.equal(again.perms.residual, runs[0].perms.residual)
    assert all(torch.equal(p.mlp, q.mlp) and torch.equal(p.heads, q.heads)
               for p, q in zip(again.perms.layers, runs[0].perms.layers))
    # a permuted copy needs at least two sweeps (one that moves, one that finds nothing to move): one is not converged
    other = permute(a, _random_perms(cfg, 22), cfg)
    one = match(a, other, cfg, max_iter=1)
    assert one.iterations == 1 and not one.converged and one.objective[1] > one.objective[0]
    with pytest.raises(ValueError):
        match(a, b, cfg, max_iter=0)
