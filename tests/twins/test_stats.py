"""twins.stats on hand-made tables: the time course's peak and trough (under two windows), the
per-seed "lost" test of the end rows (end − frac × s + 50 effect), the verdicts, and which test
gives each p."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scipy import stats as sps
from statsmodels.stats.power import TTestPower

from seedlab.stats import sign_flip_floor, tost_paired
from seedlab.twins import report_data, stats

S = 10  # injection step of the hand-made time course


def _timecourse(curve: dict[int, float], seeds=(0, 1)) -> pd.DataFrame:
    """Every seed has the same |diff| per step (alternating sign, which |·| removes)."""
    rows = [{"seed": k, "condition": "c", "step": t, "diff": v * (-1) ** t} for k in seeds for t, v in curve.items()]
    return pd.DataFrame(rows)


def _checkpoints(**cols) -> pd.DataFrame:
    base = {"seed": [0, 0, 0, 1, 1, 1], "condition": ["c"] * 6, "step": [S, 20, 40] * 2,
            "distance": [0.0, 0.5, 1.0, 0.0, 0.7, 1.0]}
    return pd.DataFrame(base | cols)


def test_time_course_trough_is_the_smoothed_minimum_between_injection_and_peak():
    # the injected batch's own loss (step S) is large and left out; then a dip, a rise to a peak at
    # step 30 and a slow decay that ends below the dip
    curve = {t: 0.0 for t in range(S)} | {S: 5.0}
    curve |= {t: 0.01 for t in range(S + 1, S + 6)}  # the trough: right after the injection
    curve |= {t: 0.01 * 1.3 ** (t - S - 5) for t in range(S + 6, 31)}  # growth to ~0.51 at step 30
    curve |= {t: 0.5 * 0.9 ** (t - 30) for t in range(31, 81)}  # decay to ~0.003 at the end
    course = stats.time_course(_timecourse(curve), _checkpoints(), {"injection": S, "mid": 20, "final": 40},
                               smooth=1, just_after=3)
    r = course.iloc[0]
    assert r.peak_step == 30 and r.peak == pytest.approx(0.01 * 1.3**15)
    assert S < r.trough_step <= S + 5 and r.trough == pytest.approx(0.01)
    assert r.peak_over_trough == pytest.approx(1.3**15)
    assert r.just_after == pytest.approx(0.01) and r.final < r.trough  # the end is not "before the peak"
    assert r.distance_mid_frac == pytest.approx(0.6)  # (0.5 + 0.7) / 2
    assert math.isnan(r.barrier_mid) and math.isnan(r.barrier_max)  # no barrier column: an older checkpoints.parquet


def test_time_course_smoothing_moves_the_trough_inside_the_window():
    # a single-step dip is averaged away by a 5-step window; the trough is then where the
    # window is lowest, still between the injection and the peak
    curve = {S: 5.0} | {t: 1.0 for t in range(S + 1, S + 40)} | {S + 3: 0.001} | {S + 30: 50.0}
    course = stats.time_course(_timecourse(curve), _checkpoints(), {"injection": S, "mid": 20, "final": 40},
                               smooth=5, just_after=5)
    r = course.iloc[0]
    assert r.peak_step in range(S + 28, S + 33)
    assert S < r.trough_step < r.peak_step and r.trough > 0.1  # the dip alone would be 0.001
    assert r.peak_over_trough == pytest.approx(r.peak / r.trough)
    assert r.just_after == pytest.approx((1 + 1 + 0.001 + 1 + 1) / 5)


def test_time_course_barrier_over_checkpoints():
    curve = {S: 1.0} | {t: float(t) for t in range(S + 1, S + 30)}
    ck = _checkpoints(barrier=[0.0, 0.002, 0.001, 0.0, 0.004, 0.003], rise_mid=[0.0, 0.001, -0.001, 0.0, 0.002, 0.0])
    r = stats.time_course(_timecourse(curve), ck, {"injection": S, "mid": 20, "final": 40}, smooth=1, just_after=1).iloc[0]
    assert r.barrier_mid == pytest.approx(0.003) and r.barrier_max == pytest.approx(0.003) and r.barrier_max_step == 20
    # a monotone rise: the peak is the last step, the trough the first after the injection
    assert r.peak_step == S + 29 and r.trough_step == S + 1 and r.peak_over_trough == pytest.approx((S + 29) / (S + 1))
    course = stats.checkpoint_course(ck)
    assert course.set_index("step").loc[20, ["n", "distance", "barrier", "rise_mid"]].tolist() == pytest.approx([2, 0.6, 0.003, 0.0015])


def test_peak_over_trough_under_two_windows():
    """The same curve under two window widths: the wide window averages the dip away and flattens the
    peak, the narrow one keeps more of both, so the ratio depends on the width and each is reported."""
    curve = {S: 5.0} | {t: 1.0 for t in range(S + 1, S + 100)} | {S + 4: 0.01, S + 5: 0.01} | {S + 40: 100.0}
    tc = _timecourse(curve)
    w = stats.peak_trough_windows(tc, S, [25, 1, 25]).set_index("window")
    assert list(w.index) == [25, 1] and (w.condition == "c").all()  # in the order given, repeats dropped
    raw = w.loc[1]  # window 1: the unsmoothed curve itself
    assert (raw.peak_step, raw.peak, raw.trough_step, raw.trough) == (S + 40, 100.0, S + 4, 0.01)
    assert raw.peak_over_trough == pytest.approx(1e4)
    wide = w.loc[25]
    assert wide.peak == pytest.approx((24 + 100) / 25) and wide.peak_step == S + 28  # the first step whose window holds it
    assert S < wide.trough_step < wide.peak_step and wide.trough > 0.5  # the two-step dip alone would be 0.01
    assert wide.peak_over_trough == pytest.approx(wide.peak / wide.trough) and wide.peak_over_trough < 10
    # time_course's own columns are the same computation at its window
    r = stats.time_course(tc, _checkpoints(), {"injection": S, "mid": 20, "final": 40}, smooth=25, just_after=2).iloc[0]
    assert (r.peak_step, r.peak, r.trough_step, r.trough, r.peak_over_trough) == tuple(wide[["peak_step", "peak", "trough_step", "trough", "peak_over_trough"]])
    curves = stats.abs_diff_curves(tc, S)
    assert list(curves) == ["c"] and curves["c"].index.min() == S + 1  # the injected batch's own step is left out
    assert stats.peak_trough_windows(tc.iloc[:0], S, [25, 5]).empty


def _measures(gain_s50, gain_final, seed_noise, s50_noise=None) -> pd.DataFrame:
    """Injected rows of one condition: twin's passage CE 3.0, the injected run's lower by the gains
    (each seed off by ``seed_noise``, at s + 50 by ``s50_noise`` when given)."""
    n = len(seed_noise)
    return pd.DataFrame({
        "kind": "injected", "seed": range(n), "condition": "fluent-fabricated",
        "passage_ce_s50": 3.0 - gain_s50 + (seed_noise if s50_noise is None else s50_noise), "twin_passage_ce_s50": 3.0,
        "passage_ce_final": 3.0 - gain_final + seed_noise, "twin_passage_ce_final": 3.0,
        "heldout_ce": 4.0 + seed_noise, "heldout_ce_b": 4.0,
    })


NOISE = np.array([0.004, -0.004, 0.002, -0.002, 0.003, -0.003, 0.001, -0.001])


def _reference_lost(end_effect, s50_effect, frac):
    """The "lost" test computed independently: d = end − frac × s50 per seed; scipy's one-sided one-sample
    t-test and exact sign-flip permutation test (H1: mean d < 0); statsmodels' one-sided MDE × sd(d)."""
    d = np.asarray(end_effect) - frac * np.asarray(s50_effect)
    t = sps.ttest_1samp(d, 0.0, alternative="less")
    perm = sps.permutation_test((d,), np.mean, permutation_type="samples", alternative="less", n_resamples=np.inf)
    mde = TTestPower().solve_power(nobs=len(d), alpha=0.05, power=0.8, alternative="larger") * d.std(ddof=1)
    upper = d.mean() + sps.t.ppf(0.95, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    return d, t, perm.pvalue, float(mde), upper


@pytest.mark.parametrize(("gain_final", "verdict"), [
    (0.0, "lost (less than 0.5 × the s + 50 effect left)"),
    (0.01, "lost below 0.5 × the s + 50 effect, but not zero"),
    (0.04, "not shown lost (an end effect is still there, two-sided paired t; not shown below 0.5 × the s + 50 effect)"),
    (-0.01, "lost and reversed (the twin predicts the passage better at the end)"),
])
def test_end_rows_test_end_minus_a_fraction_of_the_s50_effect_seed_by_seed(gain_final, verdict):
    comp = stats.comparisons(_measures(0.04, gain_final, NOISE), {"passage_ce": "exploratory"})
    end = comp[comp.measure == "passage_ce_final"].iloc[0]
    s50 = comp[comp.measure == "passage_ce_s50"].iloc[0]
    assert end.lost_frac == stats.DEFAULT_LOST_FRAC == 0.5
    assert (end.lost_n, end.lost_s50, end.lost_end) == (8, pytest.approx(0.04), pytest.approx(gain_final))
    d, t, p_perm, mde, upper = _reference_lost(gain_final - NOISE, 0.04 - NOISE, 0.5)
    assert end.lost_d == pytest.approx(d.mean()) and end.lost_sd == pytest.approx(d.std(ddof=1))
    assert (end.lost_t, end.lost_df, end.lost_p_t) == (pytest.approx(t.statistic), 7, pytest.approx(t.pvalue))
    assert end.lost_p_perm == pytest.approx(p_perm) and end.lost_perm_exact and end.lost_p_perm_min == 1 / 2**8
    assert end.lost_mde == pytest.approx(mde) and end.lost_mde > 0 and end.lost_ci_high == pytest.approx(upper)
    assert end.lost == (t.pvalue < 0.05) and stats.verdict(end) == verdict
    assert end.mde > 0  # the two-sided row keeps its own MDE
    assert pd.isna(s50.lost_p_t) and pd.isna(s50.lost)  # the s + 50 row is an effect, not a "lost" claim
    # the fraction is a setting: a tenth of the s + 50 effect makes "lost" harder to show
    tight = stats.comparisons(_measures(0.04, gain_final, NOISE), {}, lost_frac=0.1)
    t_end = tight[tight.measure == "passage_ce_final"].iloc[0]
    assert t_end.lost_frac == 0.1 and t_end.lost_d == pytest.approx(gain_final - 0.004)
    assert t_end.lost_p_t == pytest.approx(_reference_lost(gain_final - NOISE, 0.04 - NOISE, 0.1)[1].pvalue)
    if gain_final == 0.01:  # 0.01 is below half of 0.04, not below a tenth of it
        assert stats.verdict(t_end) == ("not shown lost (an end effect is still there, two-sided paired t; not shown below "
                                        "0.1 × the s + 50 effect)")


def test_the_s50_effects_own_uncertainty_enters_the_lost_test():
    """The end effect is small and precise, the s + 50 effect as large on average but noisy from seed to seed.
    A margin of half the MEAN s + 50 effect, taken as known, would call it lost (the old TOST); per seed,
    end − 0.5 × s50 carries the s + 50 noise and the test cannot tell."""
    s50_noise = 20 * np.array([0.003, -0.004, -0.001, 0.004, 0.002, -0.003, -0.002, 0.001])
    comp = stats.comparisons(_measures(0.04, 0.01, NOISE / 4, s50_noise=s50_noise), {})
    end = comp[comp.measure == "passage_ce_final"].iloc[0]
    assert end.lost_end == pytest.approx(0.01) and end.lost_s50 == pytest.approx(0.04)  # 0.01 < 0.5 × 0.04 on average
    old = tost_paired(3.0 - 0.01 + NOISE / 4, np.full(8, 3.0), 0.5 * end.lost_s50)
    assert old["equivalent"]  # the old claim: the end effect is inside ±0.02
    d, t, p_perm, mde, _ = _reference_lost(0.01 - NOISE / 4, 0.04 - s50_noise, 0.5)
    assert end.lost_p_t == pytest.approx(t.pvalue) and end.lost_p_t > 0.05 and not end.lost
    assert end.lost_sd == pytest.approx(d.std(ddof=1)) and end.lost_sd > 5 * (NOISE / 4).std(ddof=1)
    assert end.lost_mde == pytest.approx(mde) and end.lost_mde > abs(end.lost_d)  # and the MDE says why
    assert end.p_t < 0.05 and stats.verdict(end) == "not shown lost (an end effect is still there, two-sided paired t; not shown below 0.5 × the s + 50 effect)"


def test_not_significant_is_not_lost_when_the_design_cannot_tell():
    # a noisy end effect of half the s + 50 one: p_t > 0.05, and not shown below half of it either
    noise = 10 * NOISE
    comp = stats.comparisons(_measures(0.04, 0.02, noise), {})
    end = comp[comp.measure == "passage_ce_final"].iloc[0]
    assert end.p_t > 0.05 and end.lost_p_t > 0.05 and not end.lost
    assert stats.verdict(end) == "inconclusive (neither an effect nor a loss below 0.5 × the s + 50 effect shown)"
    assert end.mde > abs(end["diff"]) and end.lost_mde > abs(end.lost_d)  # and the MDEs say why


def test_lost_test_edges():
    # one-sided: an end effect above frac × s50 is never "lost", however precise
    r = stats.lost_test([0.03, 0.031, 0.029], [0.04, 0.041, 0.039], 0.5)
    assert r["lost_d"] > 0 and r["lost_p_t"] > 0.99 and r["lost_p_perm"] == 1.0 and r["lost"] is False
    # with 4 seeds the exact sign-flip test cannot reach 0.05 (floor 1/16): the t-test alone decides
    r = stats.lost_test([0.0, 0.002, -0.001, 0.0005], [0.04, 0.041, 0.038, 0.042], 0.5)
    assert r["lost"] and r["lost_p_t"] < 1e-4 and r["lost_p_perm"] == r["lost_p_perm_min"] == 1 / 16
    # every d_i equal: the t-test is undefined (nan), "lost" says whether that d is below 0
    r = stats.lost_test([0.0, 0.001, -0.001], [0.04, 0.042, 0.038], 0.5)
    assert r["lost_d"] == pytest.approx(-0.02) and math.isnan(r["lost_p_t"]) and r["lost"] is True
    # NaN seeds are dropped; fewer than 2 left: no test
    r = stats.lost_test([0.0, np.nan, 0.001], [0.04, 0.04, np.nan], 0.5)
    assert r["lost_n"] == 1 and r["lost"] is None and math.isnan(r["lost_p_t"])
    assert stats.verdict(pd.Series(r | {"p_t": np.nan, "diff": 0.0})).startswith("no test")
    # nothing learned at s + 50: nothing to lose, whatever the test says
    r = stats.lost_test([0.0, 0.001, -0.001], [-0.01, -0.012, -0.011], 0.5)
    assert stats.verdict(pd.Series(r | {"p_t": 0.5, "diff": 0.0})) == "nothing to lose (the mean effect at s + 50 is not above 0)"


def test_every_row_names_the_floor_of_its_sign_flip_p():
    comp = stats.comparisons(_measures(0.04, 0.0, NOISE), {})
    assert (comp.p_perm_min == sign_flip_floor(8)).all() and (comp.p_perm >= comp.p_perm_min).all()
    s50 = comp[comp.measure == "passage_ce_s50"].iloc[0]
    assert s50.p_t < 1e-4 and s50.p_perm == sign_flip_floor(8)  # 'p < 1e-4' with 8 seeds: the t-test's


def test_percent_is_nan_without_a_positive_base():
    assert stats.percent(1.0, 4.0) == 25.0 and (stats.percent(pd.Series([1.0, 2.0]), 4.0) == [25.0, 50.0]).all()
    for base in (0.0, -1.0, np.nan, np.inf):
        assert np.isnan(stats.percent(1.0, base))


# --------------------------------------------------------------------------- is it the passage?

EIGHT = np.array([0.03, -0.02, 0.01, -0.04, 0.02, -0.01, 0.04, -0.03])  # per-seed noise, mean 0


def test_holm_on_a_known_vector():
    """Holm's step-down: sorted p × (m, m − 1, ...), made monotone, capped at 1, back in the given order; a NaN
    p counts in the family (as 1) and stays NaN."""
    p = [0.01, 0.04, 0.03, 0.005]  # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 → 0.06 (monotone)
    assert stats.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.6, 0.01]) == pytest.approx([0.6, 0.02])
    out = stats.holm([0.01, np.nan, 0.02])  # m = 3
    assert out[0] == pytest.approx(0.03) and np.isnan(out[1]) and out[2] == pytest.approx(0.04)


def test_a_passage_within_the_margin_of_the_ordinary_rows_is_equivalent():
    """Passage = the ordinary rows' mean ± 1% seed by seed, margin 25% of their effect: the TOST shows it; with a
    constant scale it is statsmodels-style paired TOST against a fixed bound (seedlab.stats.tost_paired)."""
    ordinary = 1.0 + EIGHT
    passage = ordinary * (1 + EIGHT[::-1] / 3)
    r = stats.ordinary_tost(passage, ordinary, np.abs(ordinary), 0.25)
    assert r["tost_equivalent"] is True and r["tost_p"] < 1e-4 and r["tost_n"] == 8
    assert r["tost_bound"] == pytest.approx(0.25 * ordinary.mean())
    fixed = stats.ordinary_tost(passage, ordinary, np.ones(8), 0.25)
    ref = tost_paired(passage, ordinary, 0.25)
    assert fixed["tost_p"] == pytest.approx(ref["p"]) and fixed["tost_p_low"] == pytest.approx(ref["p_low"])
    assert fixed["tost_p_high"] == pytest.approx(ref["p_high"])


def test_a_real_difference_is_not_equivalent_and_no_margin_is_no_test():
    ordinary = 1.0 + EIGHT
    r = stats.ordinary_tost(1.6 * ordinary, ordinary, np.abs(ordinary), 0.25)  # 60% above: outside ±25%
    assert r["tost_equivalent"] is False and r["tost_p"] > 0.5
    none = stats.ordinary_tost(ordinary, ordinary, np.abs(ordinary), None)
    assert none["tost_equivalent"] is None and np.isnan(none["tost_p"])  # nothing tested: "not shown"


def test_the_rank_among_the_ordinary_rows():
    o = pd.DataFrame({"ordinary-row.0": [1.0, 1.0, 1.0], "ordinary-row.1": [2.0, 2.0, 2.0], "ordinary-row.2": [3.0, 3.0, 3.0]})
    r = stats.ordinary_rank(pd.Series([4.0, 0.0, 2.0]), o)  # above all, below all, tied with the middle one
    assert r["rank_k"] == 3 and r["rank_expected"] == 2.5 and r["above_all"] == 1 and r["below_all"] == 1
    assert r["rank_mean"] == pytest.approx((4 + 1 + 2.5) / 3)


def _null_frames(effect: float, k: int = 4, seeds: int = 8, nulls=("matched-gradient", "weight-kick", "nudge")):
    """measures, checkpoints and time course of one passage, ``k`` ordinary rows and ``nulls``: every ordinary row's
    measures 1 ± noise (the CKA 0.9), the passage's × ``effect``; one checkpoint between s = 10 and the end, 30."""
    rng = np.random.default_rng(0)
    rows, cks, tcs = [], [], []
    conds = [("fluent-fabricated", effect)] + [(f"ordinary-row.{i}", 1.0) for i in range(k)] + [(n, 0.5) for n in nulls]
    for seed in range(seeds):
        for c, e in conds:
            v = lambda e=e: e * (1 + 0.05 * rng.normal())
            rows.append({"kind": "injected", "seed": seed, "condition": c, "step": 30, "barrier": v(), "rise_mid": v(),
                         "heldout_ce_diff": v(), "distance": v(), "cka.blocks.0": 1 - 0.1 * v()})
            cks.append({"seed": seed, "condition": c, "step": 20, "barrier": v(), "distance": v()})
            tcs += [{"seed": seed, "condition": c, "step": t, "diff": v()} for t in (11, 12)]
    return pd.DataFrame(rows), pd.DataFrame(cks), pd.DataFrame(tcs)


@pytest.mark.parametrize("margin", [0.25, None])
def test_the_table_counts_and_corrects_every_p_value_it_tests(margin):
    """One passage against the ordinary rows (their mean: one null), gradient noise, a weight kick and a nudge:
    6 measures at the end and 2 at the one checkpoint per null, plus one TOST per end measure against the
    ordinary rows when a margin is given; the family is every one of them and Holm runs over exactly it."""
    m, ck, tc = _null_frames(effect=1.0)
    nulls = stats.null_contrasts(m, ck, tc, {}, 10, margin=margin)
    f = stats.null_family(nulls)
    assert (f.end, f.checkpoint) == (4 * 6, 4 * 2) and f.perm == 32
    assert f.equivalence == (6 if margin else 0) and f.tests == 32 + f.equivalence
    assert set(nulls.null) == {stats.ORDINARY_ROWS, "matched-gradient", "weight-kick", "nudge"}  # the frames' nulls
    assert (nulls.kind == "end").sum() == 24
    tested = nulls.tost_equivalent.notna()
    family = np.concatenate([nulls.p_t.to_numpy(), nulls.tost_p[tested].to_numpy()])
    assert len(family) == f.tests
    assert nulls.p_t_holm.to_numpy() == pytest.approx(stats.holm(family)[: len(nulls)])
    assert nulls.p_perm_holm.to_numpy() == pytest.approx(stats.holm(nulls.p_perm.to_numpy()))
    assert (nulls.p_t_holm >= nulls.p_t).all()
    o = nulls[(nulls.null == stats.ORDINARY_ROWS) & (nulls.kind == "end")]
    assert (o.rank_k == 4).all() and (o.n == 8).all()
    if margin:  # the passage is one more ordinary row: equal within ±25% on every end measure, after Holm
        assert o.equivalent.map(lambda v: v is True).all() and not o.differs.any()
    else:
        assert o.equivalent.isna().all() and o.tost_p.isna().all()


def test_a_passage_unlike_the_ordinary_rows_differs_and_is_not_equivalent():
    m, ck, tc = _null_frames(effect=2.0)
    nulls = stats.null_contrasts(m, ck, tc, {}, 10, margin=0.25)
    o = nulls[(nulls.null == stats.ORDINARY_ROWS) & (nulls.kind == "end")].set_index("measure")
    assert o.loc["distance", "differs"] and o.loc["distance", "equivalent"] is False
    assert o.loc["distance", "above_all"] == 8 and o.loc["distance", "rank_mean"] == 5.0  # above all 4 rows, every seed
    verdicts, seeds, family = report_data.null_answer(nulls)
    assert seeds == 8 and family == stats.null_family(nulls)
    vo = next(v for v in verdicts if v.null == stats.ORDINARY_ROWS)
    assert vo.tests == 6 and len(vo.equivalent) == 0 and "distance" in set(vo.differ.measure)


def test_runs_measured_under_former_names_read_under_todays_names():
    m = pd.DataFrame({"condition": ["matched-noise", "ordinary-row", "nudge"], "text": ["ordinary-row", "x", "y"]})
    out = stats.with_current_names(m)
    assert out.condition.tolist() == ["weight-kick", "ordinary-row.0", "nudge"] and out.text.tolist()[0] == "ordinary-row.0"
    assert report_data.ordinary_margin(None) is None and report_data.ordinary_margin({"measure": {}}) is None  # not pre-registered
    assert report_data.ordinary_margin({"measure": {"ordinary_margin": 0.1}}) == 0.1
