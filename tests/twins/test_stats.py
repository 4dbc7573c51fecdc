"""twins.stats on hand-made tables: the time course's peak and trough, the equivalence columns of
the "lost" rows, the verdicts, and which test gives each p."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from seedlab.stats import sign_flip_floor, tost_paired
from seedlab.twins import stats

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


def _measures(gain_s50, gain_final, seed_noise) -> pd.DataFrame:
    """Injected rows of one condition: twin's passage CE 3.0, the injected run's lower by the gains."""
    n = len(seed_noise)
    return pd.DataFrame({
        "kind": "injected", "seed": range(n), "condition": "fluent-fabricated",
        "passage_ce_s50": 3.0 - gain_s50 + seed_noise, "twin_passage_ce_s50": 3.0,
        "passage_ce_final": 3.0 - gain_final + seed_noise, "twin_passage_ce_final": 3.0,
        "heldout_ce": 4.0 + seed_noise, "heldout_ce_b": 4.0,
    })


NOISE = np.array([0.004, -0.004, 0.002, -0.002, 0.003, -0.003, 0.001, -0.001])


@pytest.mark.parametrize(("gain_final", "verdict"), [
    (0.0, "lost (equivalent to 0 within the margin)"),
    (0.01, "smaller than the margin, but not zero"),
    (0.04, "kept (not shown below the margin)"),
])
def test_end_rows_carry_tost_against_a_fraction_of_the_s50_effect(gain_final, verdict):
    comp = stats.comparisons(_measures(0.04, gain_final, NOISE), {"passage_ce": "exploratory"})
    end = comp[comp.measure == "passage_ce_final"].iloc[0]
    s50 = comp[comp.measure == "passage_ce_s50"].iloc[0]
    assert end.margin == pytest.approx(stats.DEFAULT_MARGIN_FRAC * abs(s50["diff"])) == pytest.approx(0.02)
    ref = tost_paired(3.0 - gain_final + NOISE, np.full(8, 3.0), end.margin)
    assert (end.p_tost, end.ci90_low, end.ci90_high, end.equivalent) == (ref["p"], ref["ci_low"], ref["ci_high"], ref["equivalent"])
    assert end.mde > 0 and stats.verdict(end) == verdict
    assert pd.isna(s50.margin) and pd.isna(s50.p_tost)  # the s + 50 row is an effect, not an equivalence claim
    # the margin is a setting: a tenth of the s + 50 effect makes "lost" harder to show
    tight = stats.comparisons(_measures(0.04, gain_final, NOISE), {}, margin_frac=0.1)
    assert tight[tight.measure == "passage_ce_final"].margin.iloc[0] == pytest.approx(0.004)


def test_not_significant_is_not_lost_when_the_design_cannot_tell():
    # a noisy end effect of half the s + 50 one: p_t > 0.05, but the interval reaches past the margin
    noise = 10 * NOISE
    comp = stats.comparisons(_measures(0.04, 0.02, noise), {})
    end = comp[comp.measure == "passage_ce_final"].iloc[0]
    assert end.p_t > 0.05 and not end.equivalent
    assert stats.verdict(end) == "inconclusive (neither an effect nor equivalence shown)"
    assert end.mde > abs(end["diff"])  # and the MDE says why


def test_every_row_names_the_floor_of_its_sign_flip_p():
    comp = stats.comparisons(_measures(0.04, 0.0, NOISE), {})
    assert (comp.p_perm_min == sign_flip_floor(8)).all() and (comp.p_perm >= comp.p_perm_min).all()
    s50 = comp[comp.measure == "passage_ce_s50"].iloc[0]
    assert s50.p_t < 1e-4 and s50.p_perm == sign_flip_floor(8)  # 'p < 1e-4' with 8 seeds: the t-test's
