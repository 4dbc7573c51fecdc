"""seedlab.measures, the measures shared by the studies: interpolation, loss barrier, linear CKA,
weight distance (raw and aligned), a text's CE (bitwise the twins' and the attribution study's), paired rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.model import GPT, PRESETS
from seedlab.lm.align import aligned
from seedlab.measures.cka import linear_cka
from seedlab.measures.paired import paired_row
from seedlab.measures.text import text_ce
from seedlab.measures.weights import (
    aligned_distance,
    barrier,
    barrier_curve,
    identical,
    interpolate,
    layer_groups,
    loss_path,
    weight_distance,
)
from seedlab.stats import mde_paired, paired, sign_flip_floor

MINI = PRESETS["mini"]
ALPHAS = np.linspace(0, 1, 11)


def _sd(seed: int) -> dict[str, torch.Tensor]:
    return GPT(MINI, seed=seed).state_dict()


def _gpt_loss_fn(seed: int = 0):
    """loss_fn(state_dict) -> mean cross-entropy (nats/token) of the mini GPT on a fixed random-token batch."""
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, MINI.vocab_size, (4, MINI.block_size + 1), generator=g)
    x, y = tok[:, :-1], tok[:, 1:]
    model = GPT(MINI).eval()

    @torch.no_grad()
    def loss_fn(sd):
        model.load_state_dict(sd)
        return model(x, y)[1].item()

    return loss_fn


# --------------------------------------------------------------------------- interpolate


def test_interpolate_endpoints_bitwise_and_midpoint():
    a, b = _sd(0), _sd(1)
    for k, v in interpolate(a, b, 0.0).items():
        assert torch.equal(v, a[k]), k
    for k, v in interpolate(a, b, 1.0).items():
        assert torch.equal(v, b[k]), k
    mid = interpolate(a, b, 0.5)
    assert list(mid) == list(a)
    for k in a:
        torch.testing.assert_close(mid[k], 0.5 * (a[k] + b[k]), rtol=0, atol=1e-7)


def test_mismatched_models_raise_with_tensor_name():
    a = _sd(0)
    b = dict(a, **{"blocks.0.attn.c_attn.weight": torch.zeros(96, 32)})
    for fn in (lambda: interpolate(a, b, 0.5), lambda: weight_distance(a, b)):
        with pytest.raises(SeedlabError) as e:
            fn()
        assert str(e.value) == "models differ in shape at 'blocks.0.attn.c_attn.weight': (192, 64) vs (96, 32)"
    missing = {k: v for k, v in a.items() if k != "ln_f.bias"}
    with pytest.raises(SeedlabError, match="'ln_f.bias'"):
        interpolate(a, missing, 0.5)
    with pytest.raises(SeedlabError, match="'ln_f.bias'"):
        weight_distance(missing, a)


# --------------------------------------------------------------------------- barrier


def test_barrier_of_gpt_with_itself_is_zero():
    a, loss_fn = _sd(0), _gpt_loss_fn()
    L = loss_path(loss_fn, a, a, ALPHAS)
    assert L.dtype == np.float64 and L.shape == ALPHAS.shape
    assert np.all(L == L[0]) and 4.0 < L[0] < 7.0  # ~ ln(257) = 5.55 nats at init
    assert barrier(ALPHAS, L) == 0.0
    # the ends of a path between twins are the twins' own losses
    b = _sd(1)
    L = loss_path(loss_fn, a, b, [0.0, 1.0])
    assert L.tolist() == [loss_fn(a), loss_fn(b)]


def test_loss_path_with_known_ends_is_the_same_path_for_fewer_evaluations():
    a, b, loss_fn = _sd(0), _sd(1), _gpt_loss_fn()
    calls = []

    def counted(sd):
        calls.append(1)
        return loss_fn(sd)

    full = loss_path(counted, a, b, ALPHAS)
    assert len(calls) == len(ALPHAS)
    calls.clear()
    reused = loss_path(counted, a, b, ALPHAS, ends=(loss_fn(a), loss_fn(b)))
    assert len(calls) == len(ALPHAS) - 2  # the ends are not evaluated again
    assert reused.tolist() == full.tolist()  # bitwise: interpolate returns a and b themselves at α = 0 and 1


def test_identical_is_bitwise():
    a = _sd(0)
    assert identical(a, {k: v.clone() for k, v in a.items()})
    nudged = {k: v.clone() for k, v in a.items()}
    nudged["ln_f.bias"][0] = 1e-30
    assert not identical(a, nudged) and not identical(a, _sd(1))
    assert not identical(a, {k: v for k, v in a.items() if k != "ln_f.bias"})


def test_barrier_zero_on_convex_loss():
    a, b, c = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), torch.tensor([-3.0, 4.0, 2.0]).double(), 0.3
    loss = lambda sd: float(((sd["theta"] - c) ** 2).sum())
    alphas = np.linspace(0, 1, 21)
    L = loss_path(loss, {"theta": a}, {"theta": b}, alphas)
    assert np.all(barrier_curve(alphas, L) <= 1e-12)
    assert 0.0 <= barrier(alphas, L) <= 1e-12


def test_barrier_known_bump_above_a_sloped_chord():
    # θ from -1 to 1; L(θ) = exp(-θ²) + θ. The chord is exp(-1) + θ, so the rise is exp(-θ²) - exp(-1),
    # largest at θ = 0 (α = 0.5, on the grid): 1 - 1/e. A flat baseline (min or mean of the end losses)
    # would give a different number.
    a, b = {"theta": torch.tensor(-1.0, dtype=torch.float64)}, {"theta": torch.tensor(1.0, dtype=torch.float64)}
    loss = lambda sd: math.exp(-float(sd["theta"]) ** 2) + float(sd["theta"])
    alphas = np.linspace(0, 1, 9)
    L = loss_path(loss, a, b, alphas)
    assert barrier(alphas, L) == pytest.approx(1 - math.exp(-1), abs=1e-12)
    curve = barrier_curve(alphas, L)
    assert curve[0] == 0.0 and curve[-1] == 0.0 and int(np.argmax(curve)) == 4
    # a hand-made path: the rise above the chord 1 -> 3 at α = 0.25 is 2.5 - 1.5 = 1
    assert barrier([0, 0.25, 0.5, 1], [1.0, 2.5, 2.0, 3.0]) == 1.0


@pytest.mark.parametrize("alphas", [[0.1, 0.5, 1.0], [0.0, 0.5, 0.9], [0.0, 0.6, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0]])
def test_barrier_rejects_bad_grids(alphas):
    with pytest.raises(SeedlabError, match="alphas"):
        barrier(alphas, np.zeros(len(alphas)))


# --------------------------------------------------------------------------- CKA


def test_cka_invariances_and_symmetry():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 16, generator=g)
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=g))  # random orthogonal
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, 3.7 * x) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, x + torch.randn(16, generator=g) * 5) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, 0.2 * x @ q - 1.5) == pytest.approx(1.0, abs=1e-10)
    y = torch.tanh(x @ torch.randn(16, 24, generator=g))
    assert linear_cka(x, y) == pytest.approx(linear_cka(y, x), abs=1e-12)
    assert 0.0 < linear_cka(x, y) < 1.0


def test_cka_unrelated_is_low_and_leading_dims_flatten():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(500, 32, generator=g), torch.randn(500, 32, generator=g)
    assert linear_cka(x, y) < 0.2
    # [B, T, d] residual streams: B*T examples
    model, idx = GPT(MINI, seed=0).eval(), torch.randint(0, MINI.vocab_size, (2, 16), generator=g)
    with torch.no_grad():
        r = model.residuals(idx)
    assert linear_cka(r[0], r[1]) == pytest.approx(linear_cka(r[0].reshape(32, -1), r[1].reshape(32, -1)), abs=1e-12)
    with pytest.raises(SeedlabError, match="500 vs 499"):
        linear_cka(x, y[:-1])


# --------------------------------------------------------------------------- weight distance


def test_layer_groups_of_mini_gpt():
    assert layer_groups(_sd(0)) == ["wte", "wpe", "blocks.0", "blocks.1", "ln_f"]


def test_weight_distance_overall_and_per_group():
    a, b = _sd(0), _sd(1)
    dist = weight_distance(a, b)
    assert list(dist) == ["all", "wte", "wpe", "blocks.0", "blocks.1", "ln_f"]
    groups = [v for k, v in dist.items() if k != "all"]
    assert dist["all"] == pytest.approx(math.sqrt(sum(v * v for v in groups)), rel=1e-12)
    flat = torch.cat([(a[k].double() - b[k].double()).flatten() for k in a])
    assert dist["all"] == pytest.approx(float(torch.linalg.vector_norm(flat)), rel=1e-12)
    assert dist["wte"] == pytest.approx(float(torch.linalg.vector_norm(a["wte.weight"].double() - b["wte.weight"])))
    assert dist["ln_f"] == 0.0  # LN gains 1 / biases 0 for every seed
    assert all(v > 0 for k, v in dist.items() if k != "ln_f")
    assert all(v == 0.0 for v in weight_distance(a, a).values())


def test_aligned_distance_is_the_distance_to_the_matched_model_and_never_larger():
    a, b = _sd(0), _sd(1)
    assert aligned_distance(a, b, MINI) == weight_distance(a, aligned(a, b, MINI))["all"] <= weight_distance(a, b)["all"]
    assert aligned_distance(a, a, MINI) == 0.0


def test_text_ce_is_bitwise_the_models_own_loss_and_the_float64_ce_of_its_logits():
    """float32: what GPT.forward returns with targets (twins measure's passage CE); float64 (the default, the
    attribution study's L_query): the cross-entropy of the model's logits cast to float64. Eval mode either way,
    the model's mode restored, no gradient taken."""
    model = GPT(MINI, seed=3)
    ids = torch.randint(0, MINI.vocab_size, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    p = torch.tensor(ids)[None]
    with torch.no_grad():
        model.eval()
        own = float(model(p[:, :-1], p[:, 1:])[1])
        logits, _ = model(p[:, :-1])
        double = float(torch.nn.functional.cross_entropy(logits[0].double(), p[0, 1:]))
        model.train()
    assert text_ce(model, ids, dtype=torch.float32) == own
    assert text_ce(model, ids) == double and model.training
    assert all(q.grad is None for q in model.parameters())


def test_paired_row_is_paired_with_the_floor_and_the_mde():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1, 1, 6), rng.normal(0, 1, 6)
    row, res = paired_row(a, b), paired(a, b)
    assert {k: row[k] for k in res} == res
    assert row["p_perm_min"] == sign_flip_floor(6) and row["mde"] == mde_paired(6, res["sd_diff"])
    assert row["diff_over_mde"] == res["diff"] / row["mde"]
    flat = paired_row([1.0, 2.0], [0.0, 1.0])  # sd of the differences 0: the t-test, its power and the MDE undefined
    assert np.isnan(flat["p_t"]) and np.isnan(flat["mde"]) and np.isnan(flat["diff_over_mde"])