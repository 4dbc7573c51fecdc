"""Ablation and activation patching on hand-built weights (known answers)."""

import numpy as np
import pytest
import torch

from seedlab.shortcut import interventions

pytestmark = pytest.mark.usefixtures("one_thread")


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


# --------------------------------------------------------------------------- QK / OV path ablations
def _centered(m):
    """logits = +-(OUT - 1/2): a parity of 1 written to OUT predicts class 1, of 0 class 0, with no ties."""
    with torch.no_grad():
        m.unembed.b_U[:, 1], m.unembed.b_U[:, 0] = -0.5, 0.5
    return m


def _first_token_model(hand):
    """Head 1 attends to position 0 whatever the input (key = POS0) and writes that token's parity to the
    readout; head 0 writes nothing. The model predicts the first token's parity (the positional shortcut)."""
    m = _centered(hand.model())
    a = m.blocks[0].attn
    with torch.no_grad():
        a.W_O[:, 0] = 0.0
        a.W_V[:, 1, hand.PAR, 0] = 1.0
        a.W_O[:, 1, 0, hand.OUT] = 1.0
    return m


def _acc(pred, y):
    return (pred == y).double().mean(1).numpy()


def test_qk_ablation_to_uniform_averages_what_the_head_reads(hand):
    m = _first_token_model(hand)
    x = hand.x(128)
    y = x.sum(-1) % 2
    base = _acc(m(x).argmax(-1), y)
    np.testing.assert_array_equal(base, _acc(x[..., 0] % 2, y))  # it reads the first token
    d = interventions.path_ablate(m, x, y, "qk_uniform")
    assert d.shape == (hand.S, 1, 2)
    # uniform over the 6 keys: OUT = (number of odd tokens) / 6 -> class 1 iff more than 3 are odd
    np.testing.assert_allclose(d[:, 0, 1], _acc((x % 2).sum(-1) > 3, y) - base)
    assert (d[:, 0, 0] == 0).all()  # head 0 writes nothing, whatever it attends to


def test_qk_mean_ablation_of_an_input_independent_pattern_changes_nothing(hand):
    m = _first_token_model(hand)
    x = hand.x(64)
    y = x.sum(-1) % 2
    assert (interventions.path_ablate(m, x, y, "qk_mean") == 0).all()
    _, cache = interventions.cached_run(m, x)
    mean = cache["blocks.0.attn.hook_pattern"][:, :, 1].mean(1, keepdim=True)
    edit = {"blocks.0.attn.hook_pattern": interventions.set_slice((slice(None), slice(None), 1), mean)}
    np.testing.assert_allclose(interventions.hooked_run(m, x, edit).numpy(), interventions.hooked_run(m, x).numpy(), atol=1e-6)


def test_ov_mean_ablation_keeps_the_pattern_and_forgets_the_input(hand):
    m = _first_token_model(hand)
    x = hand.x(128)
    y = x.sum(-1) % 2
    base = _acc(m(x).argmax(-1), y)
    d = interventions.path_ablate(m, x, y, "ov_mean")
    # head 1 still reads position 0, but what it reads there is the batch's mean parity: one class for all rows
    one_class = ((x[..., 0] % 2).double().mean(1, keepdim=True) > 0.5).expand_as(y)
    np.testing.assert_allclose(d[:, 0, 1], _acc(one_class, y) - base)
    # the max head of the hand-built model: uniform attention reads the share of odd tokens, not the max's parity
    h = _centered(hand.model(q_scale=20.0))
    base_h = _acc(h(x).argmax(-1), y)
    np.testing.assert_array_equal(base_h, _acc(x.max(-1).values % 2, y))
    np.testing.assert_allclose(interventions.path_ablate(h, x, y, "qk_uniform")[:, 0, 0], _acc((x % 2).sum(-1) > 3, y) - base_h)
    with pytest.raises(ValueError, match="kind"):
        interventions.path_ablate(m, x, y, "qk_zero")


def test_uniform_pattern_respects_the_causal_mask(hand):
    m = hand.zero()
    np.testing.assert_allclose(interventions.uniform_pattern(m, 3).numpy(), np.full((3, 3), 1 / 3))
    m.cfg = m.cfg.model_copy(update={"causal": True})
    np.testing.assert_allclose(interventions.uniform_pattern(m, 3).numpy(), [[1, 0, 0], [1 / 2, 1 / 2, 0], [1 / 3, 1 / 3, 1 / 3]])


# --------------------------------------------------------------------------- matched-pair patching
def _pairs(hand, task="sum2-max", n=64):
    from seedlab.shortcut.pairs import make_pairs

    p = make_pairs(task, n, length=hand.LENGTH, vocab=hand.VOCAB, seed=0)
    rep = lambda a: torch.from_numpy(a).expand(hand.S, *a.shape).clone()
    return rep(p.clean), rep(p.corrupt), rep(p.y)


def test_pair_patching_moves_each_head_by_its_share_per_pair(hand):
    m = _uniform_two_writer_model(hand)  # logits are linear in the two heads' writes, 3 : 1
    clean, corrupt, y = _pairs(hand)
    r = interventions.pair_patching(m, clean, corrupt, y)
    assert r.ld_clean.shape == (hand.S, 64) and r.patched["clean_to_corrupt"].shape == (hand.S, 1, 3, 64)
    # OUT = 4 * (sum of values) / 6 keys, ld = +-2 OUT: the gap is 8/6 * (sum difference) * sign
    dsum = (clean.sum(-1) - corrupt.sum(-1)).numpy()
    sign = np.where(y.numpy() == 1, 1.0, -1.0)
    np.testing.assert_allclose(r.gap, 8 / 6 * dsum * sign, atol=1e-4)
    flagged = r.small_gap()
    np.testing.assert_array_equal(flagged, dsum == 0)  # |gap| >= 8/6 > MIN_GAP unless the sums agree
    assert flagged.any() and not flagged.all()
    for d in interventions.DIRECTIONS:
        f = r.fractions(d)
        assert np.isnan(f[:, 0, 0][flagged]).all()
        np.testing.assert_allclose(f[:, 0, 0][~flagged], 0.75, atol=1e-4)
        np.testing.assert_allclose(f[:, 0, 1][~flagged], 0.25, atol=1e-4)
        np.testing.assert_allclose(f[:, 0, 2][~flagged], 0.0, atol=1e-9)  # the MLP carries nothing
        s = r.summary()[d]
        assert (s["n_pairs"] == 64).all() and (s["n_small_gap"] == flagged.sum(1)[:, None, None]).all()
        for q in ("frac_q10", "frac_q50", "frac_q90", "frac_mean"):
            np.testing.assert_allclose(s[q][:, 0, 0], 0.75, atol=1e-4)
        # the ratio of means needs a mean gap to divide by; gaps of both signs can cancel
        ratio, small = s["frac_ratio_of_means"][:, 0, 0], np.abs(r.gap.mean(1)) < interventions.MIN_GAP
        assert np.isnan(ratio[small]).all()
        np.testing.assert_allclose(ratio[~small], 0.75, atol=1e-4)


def test_pair_patching_a_pair_with_itself_is_flagged_and_moves_nothing(hand):
    m = hand.model()
    clean, _, y = _pairs(hand, "sum2-first", 16)
    r = interventions.pair_patching(m, clean, clean, y)
    assert r.small_gap().all()
    for d in interventions.DIRECTIONS:
        assert (r.dld(d) == 0).all()
        assert np.isnan(r.fractions(d)).all()
        s = r.summary()[d]
        assert np.isnan(s["frac_q50"]).all() and np.isnan(s["frac_ratio_of_means"]).all()
        assert (s["dld_q50"] == 0).all()


def test_the_max_head_carries_the_shortcut_difference_of_max_pairs(hand):
    """On sum2-max pairs the max head reads the maximum's parity, which the pair flips: it restores it all."""
    m = _centered(hand.model(q_scale=20.0))
    clean, corrupt, y = _pairs(hand)
    r = interventions.pair_patching(m, clean, corrupt, y)
    assert (r.ld_clean > 0.9).all() and (r.ld_corrupt < -0.9).all()  # the model follows the shortcut
    for d in interventions.DIRECTIONS:
        np.testing.assert_allclose(r.fractions(d)[:, 0, 0], 1.0, atol=1e-3)
        np.testing.assert_allclose(r.fractions(d)[:, 0, 1:], 0.0, atol=1e-9)  # head 1 and the MLP write nothing


# --------------------------------------------------------------------------- label-changing pairs, path patching
def _kind_pairs(hand, kind, n=48, task="sum2-max"):
    from seedlab.shortcut.pairs import make_pairs

    p = make_pairs(task, n, length=hand.LENGTH, vocab=hand.VOCAB, seed=0, kind=kind)
    rep = lambda a: torch.from_numpy(a).expand(hand.S, *a.shape).clone()
    return rep(p.clean), rep(p.corrupt), rep(p.y), rep(p.y_corrupt)


def test_logit_diff_against_a_given_class_or_the_best_other():
    logits = torch.tensor([[[3.0, 1.0, 2.0], [0.0, 5.0, 1.0]]])
    y, other = torch.tensor([[0, 0]]), torch.tensor([[1, 0]])
    np.testing.assert_allclose(interventions.logit_diff(logits, y).numpy(), [[1.0, -5.0]])
    np.testing.assert_allclose(interventions.logit_diff(logits, y, other).numpy(), [[2.0, -5.0]])  # other == y: best other


def test_label_changing_pairs_see_the_rule_head_and_not_the_shortcut_head(hand):
    """The max head reads the maximum's parity, which a label-changing pair keeps: no gap, every pair flagged.
    A head that copies every token's parity (the rule, linearly for one changed token) carries the whole gap."""
    clean, corrupt, y, y_corrupt = _kind_pairs(hand, "label_changing")
    shortcut = _centered(hand.model(q_scale=20.0))
    r = interventions.pair_patching(shortcut, clean, corrupt, y, y_corrupt=y_corrupt)
    assert r.small_gap().all() and (np.abs(r.dld("clean_to_corrupt")) < 1e-3).all()  # softmax leaks ~1e-4
    rule = _uniform_two_writer_model(hand)
    with torch.no_grad():  # head 0 copies PARITY (not the value), head 1 writes nothing
        rule.embed.W_E[:, : hand.VOCAB, hand.VAL] = torch.arange(hand.VOCAB, dtype=torch.float32) % 2
        rule.blocks[0].attn.W_O[:, 1] = 0.0
    r = interventions.pair_patching(rule, clean, corrupt, y, y_corrupt=y_corrupt)
    # one token's parity flips: OUT moves by 3/6, ld = +-2 OUT (class y against class y_corrupt) moves by 1 > MIN_GAP
    np.testing.assert_allclose(np.abs(r.gap), 1.0, atol=1e-5)
    for d in interventions.DIRECTIONS:
        np.testing.assert_allclose(r.fractions(d)[:, 0, 0], 1.0, atol=1e-4)
        np.testing.assert_allclose(r.fractions(d)[:, 0, 1:], 0.0, atol=1e-6)


def _random_model(hand, layers, layer_norm, act):
    from seedlab.shortcut.config import ModelConfig
    from seedlab.shortcut.model import EnsembleTransformer

    cfg = ModelConfig(layers=layers, heads=2, d_model=16, d_ff=8, layer_norm=layer_norm, act=act, init_std=0.4)
    m = EnsembleTransformer(cfg, hand.S, hand.VOCAB, hand.LENGTH, 2)
    m.init_members([5, 6])
    return m


@pytest.mark.parametrize("kind", ["same_label", "label_changing"])
def test_direct_and_via_mlp_paths_add_up_to_the_total_in_a_linear_readout(hand, kind):
    """2 layers, no layer norm, MLPs in ReLU's linear range, layer 1's heads write nothing: everything downstream of
    a layer-0 head is linear and reaches the logits directly or through MLP 0 / MLP 1, so the two path effects
    sum to the total effect, for every component, pair and direction."""
    m = _random_model(hand, 2, layer_norm=False, act="relu")
    with torch.no_grad():
        m.blocks[1].attn.W_V.zero_()
        for blk in m.blocks:  # a large input bias, cancelled at the output: x -> x W_in W_out
            blk.mlp.b_in.fill_(20.0)
            blk.mlp.b_out.copy_(-(blk.mlp.b_in[:, :, None] * blk.mlp.W_out).sum(1))
    clean, corrupt, y, y_corrupt = _kind_pairs(hand, kind)
    _, cache = m.run_with_cache(torch.cat([clean, corrupt], 1), [f"blocks.{l}.mlp.hook_pre" for l in range(2)])
    assert all((a > 0).all() for a in cache.values())  # ReLU is the identity here
    runs = interventions.cached_run(m, clean), interventions.cached_run(m, corrupt)
    r = {p: interventions.pair_patching(m, clean, corrupt, y, *runs, y_corrupt=y_corrupt, path=p) for p in interventions.PATHS}
    for d in interventions.DIRECTIONS:
        total, direct, via = (r[p].dld(d) for p in interventions.PATHS)
        np.testing.assert_allclose(direct + via, total, atol=1e-4)
        assert (np.abs(direct[:, 0, :2]) > 1e-3).any() and (np.abs(via[:, 0, :2]) > 1e-3).any()  # both paths matter
        assert (via[:, 1, 2] == 0).all()  # the last MLP feeds no MLP...
        np.testing.assert_allclose(direct[:, 1, 2], total[:, 1, 2], atol=1e-5)  # ...its whole effect is direct
        np.testing.assert_allclose(total[:, 1, :2], 0.0, atol=1e-6)  # layer 1's heads write nothing


def test_path_patching_matches_a_manual_forward(hand):
    """1 layer with layer norm and GELU: each path's patched logits computed by hand from the cached residuals."""
    import torch.nn.functional as F

    m = _random_model(hand, 1, layer_norm=True, act="gelu")
    clean, corrupt, y, y_corrupt = _kind_pairs(hand, "label_changing")
    (_, c_clean), (_, c_corrupt) = runs = interventions.cached_run(m, clean), interventions.cached_run(m, corrupt)
    blk, P = m.blocks[0], lambda t: t.detach().double()
    ln = lambda x, w: F.layer_norm(x, x.shape[-1:]) * P(w.w)[:, None] + P(w.b)[:, None]
    unembed = lambda final: torch.einsum("sbd,sdc->sbc", ln(final, m.ln_final), P(m.unembed.W_U)) + P(m.unembed.b_U)[:, None]
    mlp = lambda r: torch.einsum("sbf,sfd->sbd", F.gelu(torch.einsum("sbd,sdf->sbf", ln(r, blk.ln2), P(blk.mlp.W_in))
                                                       + P(blk.mlp.b_in)[:, None]), P(blk.mlp.W_out)) + P(blk.mlp.b_out)[:, None]
    ld = lambda logits: interventions.logit_diff(logits, y, y_corrupt)
    mid, post = (P(c_corrupt[f"blocks.0.hook_{n}"][:, :, -1]) for n in ("resid_mid", "resid_post"))
    for h in range(2):
        delta = P(c_clean["blocks.0.attn.hook_result"][:, :, -1, h] - c_corrupt["blocks.0.attn.hook_result"][:, :, -1, h])
        want = {"direct": ld(unembed(post + delta)), "via_mlp": ld(unembed(mid + mlp(mid + delta)))}
        for path, w in want.items():
            got = interventions.pair_patching(m, clean, corrupt, y, *runs, y_corrupt=y_corrupt, path=path)
            np.testing.assert_allclose(got.patched["clean_to_corrupt"][:, 0, h], w.numpy(), atol=1e-4)
    with pytest.raises(ValueError, match="path"):
        interventions.pair_patching(m, clean, corrupt, y, *runs, path="indirect")
