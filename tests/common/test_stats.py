"""Generic statistics: Wilson intervals, rate tables, Fisher tests, logistic coefficients, paired comparisons."""

import math

import numpy as np
import pytest
import statsmodels.api as sm
from helpers import summary_of_cells
from scipy import stats
from scipy.special import expit
from statsmodels.stats.power import TTestPower

from seedlab.stats import (
    fisher,
    logit_coefficient,
    mde_paired,
    paired,
    rate_table,
    sign_flip_floor,
    tost_paired,
    wilson,
)

members = summary_of_cells  # (layers, ratio, k, n) cells -> a summary frame


def test_wilson_known_values():
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    # z = 1.96 closed form: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    k, n, z = 7, 20, stats.norm.ppf(0.975)
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson(k, n) == pytest.approx((c - h, c + h), abs=1e-12)
    # a wider interval at a smaller alpha
    assert wilson(7, 20, alpha=0.01)[0] < wilson(7, 20)[0]


def test_wilson_empty_and_invalid():
    assert all(math.isnan(v) for v in wilson(0, 0))
    with pytest.raises(ValueError):
        wilson(11, 10)
    with pytest.raises(ValueError):
        wilson(-1, 10)


def test_fisher_textbook_and_scipy():
    odds, p = fisher(1, 10, 11, 14)
    assert p == pytest.approx(0.00276, abs=1e-5)
    assert odds == pytest.approx((1 * 3) / (9 * 11))
    ref = stats.fisher_exact([[3, 17], [9, 11]])
    assert fisher(3, 20, 9, 20) == pytest.approx((ref.statistic, ref.pvalue))
    assert fisher(5, 10, 5, 10)[1] == pytest.approx(1.0)


def test_rate_table_counts():
    df = members([(1, 0.5, 1, 4), (1, 0.9, 0, 3), (2, 0.5, 0, 2), (2, 0.9, 3, 3)])
    t = rate_table(df, ["layers", "ratio"])
    assert list(t.columns) == ["layers", "ratio", "n", "k", "rate", "lo", "hi"]
    assert t[["layers", "ratio"]].values.tolist() == [[1, 0.5], [1, 0.9], [2, 0.5], [2, 0.9]]
    assert t["n"].tolist() == [4, 3, 2, 3]
    assert t["k"].tolist() == [1, 0, 0, 3]
    assert t["rate"].tolist() == pytest.approx([0.25, 0.0, 0.0, 1.0])
    assert (t["lo"].tolist(), t["hi"].tolist()) == (
        pytest.approx([wilson(1, 4)[0], 0, 0, wilson(3, 3)[0]]),
        pytest.approx([wilson(1, 4)[1], wilson(0, 3)[1], wilson(0, 2)[1], 1.0]),
    )
    # the row order follows `by`, not the frame
    shuffled = rate_table(df.sample(frac=1, random_state=0), ["ratio", "layers"])
    assert shuffled[["ratio", "layers"]].values.tolist() == [[0.5, 1], [0.5, 2], [0.9, 1], [0.9, 2]]
    assert rate_table(df, [])[["n", "k"]].values.tolist() == [[12, 4]]


def test_rate_table_of_another_outcome():
    df = members([(1, 0.5, 1, 4), (2, 0.5, 3, 3)]).assign(retained=[True, False, False, False, True, True, False])
    t = rate_table(df, ["layers"], outcome="retained")
    assert t["k"].tolist() == [1, 2] and t["n"].tolist() == [4, 3]


def test_logit_coefficient_mle_matches_statsmodels():
    rng = np.random.default_rng(3)
    x = rng.normal(size=300)
    X = np.column_stack([np.ones(300), x])
    y = (rng.random(300) < expit(-0.5 + 1.5 * x)).astype(float)
    r = logit_coefficient(X, y, 1)
    assert set(r) == {"estimate", "ci_low", "ci_high", "p", "method", "separated"}
    assert r["method"] == "mle-wald" and r["separated"] is False
    ref = sm.Logit(y, X).fit(disp=0)
    assert r["estimate"] == pytest.approx(ref.params[1], rel=1e-8)
    assert r["p"] == pytest.approx(ref.pvalues[1], rel=1e-6)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(tuple(ref.conf_int()[1]), rel=1e-8)


def test_logit_coefficient_separated_uses_firth():
    # y = 1 exactly where x > 0: complete separation, no maximum-likelihood estimate
    x = np.linspace(-1, 1, 20)
    X = np.column_stack([np.ones(20), x])
    r = logit_coefficient(X, (x > 0).astype(float), 1)
    assert r["separated"] is True and r["method"] == "firth-profile-lr"
    assert math.isfinite(r["estimate"]) and r["ci_low"] < r["estimate"] < r["ci_high"] and 0 < r["p"] < 1


# --------------------------------------------------------------------------- paired per-seed comparisons


def _scipy_perm(d, n_resamples=np.inf, **kw):
    return stats.permutation_test((d,), np.mean, permutation_type="samples", alternative="two-sided",
                                  n_resamples=n_resamples, **kw)


def test_paired_t_test_and_interval_match_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(3.0, 0.2, 8)
    b = a - 0.15 + rng.normal(0, 0.1, 8)
    ref = stats.ttest_rel(a, b)
    for alpha in (0.05, 0.1):
        r = paired(a, b, alpha=alpha)
        assert r["n"] == 8 and r["n_dropped"] == 0 and r["df"] == ref.df == 7
        assert r["diff"] == pytest.approx(np.mean(a - b), rel=1e-12)
        assert r["mean_a"] - r["mean_b"] == pytest.approx(r["diff"], rel=1e-12)
        assert r["sd_diff"] == pytest.approx(np.std(a - b, ddof=1), rel=1e-12)
        assert r["t"] == pytest.approx(ref.statistic, rel=1e-10)
        assert r["p_t"] == pytest.approx(ref.pvalue, rel=1e-10)
        ci = ref.confidence_interval(confidence_level=1 - alpha)
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_paired_exact_permutation_p_matches_scipy():
    rng = np.random.default_rng(1)
    for _ in range(20):  # continuous differences, n = 8: p is k / 256
        a, b = rng.normal(size=8), rng.normal(0.4, 1, size=8)
        r = paired(a, b)
        assert r["perm_exact"] and r["p_perm"] == _scipy_perm(a - b).pvalue
    for _ in range(20):  # small integers: many exactly tied null values, exercising scipy's >= / <= counting
        a, b = rng.integers(-2, 3, 8).astype(float), rng.integers(-2, 3, 8).astype(float)
        if np.all(a - b == (a - b)[0]):
            continue
        assert paired(a, b)["p_perm"] == _scipy_perm(a - b).pvalue
    for _ in range(20):  # multiples of 0.1: theoretically equal null means differ in the last bits
        a, b = rng.integers(0, 5, 8) * 0.1, rng.integers(0, 5, 8) * 0.1
        if np.all(a - b == (a - b)[0]):
            continue
        assert paired(a, b)["p_perm"] == _scipy_perm(a - b).pvalue
    # all 8 differences positive: only the observed pattern and its mirror are as extreme
    assert paired(np.arange(8.0) + 1, np.zeros(8))["p_perm"] == 2 / 256


def test_paired_monte_carlo_permutation_is_seeded_and_sane():
    rng = np.random.default_rng(2)
    a = rng.normal(size=25)
    b = a - 0.3 + rng.normal(0, 1, size=25)
    r = paired(a, b)
    assert not r["perm_exact"] and r["n"] == 25
    assert 1 / 100_001 <= r["p_perm"] <= 1
    assert paired(a, b)["p_perm"] == r["p_perm"]  # seeded
    ref = _scipy_perm(a - b, n_resamples=100_000, rng=np.random.default_rng(0)).pvalue
    assert r["p_perm"] == pytest.approx(ref, abs=0.01)
    assert r["p_perm"] == pytest.approx(r["p_t"], abs=0.03)  # permutation and t agree for ~normal data
    # forcing exact enumeration at n = 25 is not needed: check the switch at exact_limit instead
    assert paired(a[:12], b[:12], exact_limit=11)["perm_exact"] is False
    assert paired(a[:12], b[:12], exact_limit=12)["perm_exact"] is True


def test_paired_zero_variance_and_nan_pairs():
    a = np.array([1.0, 2.0, 3.0, 4.0])
    r = paired(a, a - 1)  # every difference is 1
    assert math.isnan(r["t"]) and math.isnan(r["p_t"])
    assert r["sd_diff"] == 0.0 and r["ci_low"] == r["ci_high"] == r["diff"] == 1.0
    assert r["p_perm"] == _scipy_perm(np.ones(4)).pvalue == 2 / 16
    r = paired(a, a)  # no difference at all
    assert math.isnan(r["t"]) and r["diff"] == 0.0 and r["p_perm"] == 1.0
    r = paired([1.0, np.nan, 3.0, 4.0, 5.0], [0.5, 2.0, np.nan, 3.0, 5.5])
    assert r["n"] == 3 and r["n_dropped"] == 2
    assert r["p_t"] == pytest.approx(stats.ttest_rel([1.0, 4.0, 5.0], [0.5, 3.0, 5.5]).pvalue, rel=1e-10)
    with pytest.raises(ValueError, match="same length"):
        paired([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 2"):
        paired([1.0, np.nan], [2.0, 3.0])


def test_mde_paired_matches_statsmodels():
    d = mde_paired(8)
    assert d == pytest.approx(TTestPower().solve_power(nobs=8, alpha=0.05, power=0.8, alternative="two-sided"))
    power = TTestPower().power(effect_size=d, nobs=8, alpha=0.05, alternative="two-sided")
    assert power == pytest.approx(0.8, abs=1e-4)
    assert 1.0 < d < 1.3  # ~1.16 sd of the differences with 8 seeds
    assert mde_paired(8, sd_diff=0.02) == pytest.approx(0.02 * d)
    assert mde_paired(32) < d and mde_paired(8, power=0.9) > d and mde_paired(8, alpha=0.01) > d
    with pytest.raises(ValueError, match="n >= 2"):
        mde_paired(1)


# --------------------------------------------------------------------------- equivalence (TOST)


def test_tost_paired_matches_statsmodels_and_the_90_interval():
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(4)
    for _ in range(10):
        a = rng.normal(3.0, 0.2, 8)
        b = a - rng.normal(0.01, 0.02, 8)
        for low, high in ((-0.03, 0.03), (-0.01, 0.05)):
            r = tost_paired(a, b, (low, high))
            p, (t1, p1, _), (t2, p2, _) = ttost_paired(a, b, low, high)
            assert r["p"] == pytest.approx(p, rel=1e-10)
            assert (r["t_low"], r["p_low"], r["t_high"], r["p_high"]) == pytest.approx((t1, p1, t2, p2), rel=1e-10)
            # equivalent at alpha = 0.05 exactly when the 90% t interval lies inside the bounds
            ci = stats.ttest_rel(a, b).confidence_interval(confidence_level=0.9)
            assert (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high), rel=1e-10)
            assert r["equivalent"] == (r["p"] < 0.05) == (low < ci.low and ci.high < high)
    # a symmetric margin is the bounds (-m, m)
    a, b = rng.normal(size=8), rng.normal(size=8)
    assert tost_paired(a, b, 0.5)["p"] == tost_paired(a, b, (-0.5, 0.5))["p"]


def test_tost_paired_decides_equivalence_not_difference():
    base = np.linspace(0, 1, 8)
    noise = np.array([0.1, -0.1, 0.05, -0.05, 0.02, -0.02, 0.01, -0.01])
    near_zero = tost_paired(base + noise, base, 0.2)  # mean 0, small spread: equivalent within ±0.2
    assert near_zero["equivalent"] and near_zero["p"] < 0.01
    assert not tost_paired(base + noise, base, 0.03)["equivalent"]  # inside the 90% half-width (0.04): not shown
    shifted = tost_paired(base + 1.0 + noise, base, 0.2)  # clearly different: not equivalent
    assert not shifted["equivalent"] and shifted["p"] > 0.99
    r = tost_paired(np.arange(8.0) + 0.5, np.arange(8.0), 1.0)  # every difference 0.5: t undefined, the point lies inside
    assert math.isnan(r["p"]) and r["equivalent"] and r["ci_low"] == r["ci_high"] == 0.5
    assert not tost_paired(np.arange(8.0) + 0.5, np.arange(8.0), 0.4)["equivalent"]
    r = tost_paired([1.0, np.nan, 3.0, 4.0], [1.1, 2.0, 2.9, 4.05], 0.5)
    assert r["n"] == 3 and r["n_dropped"] == 1
    with pytest.raises(ValueError, match="low < high"):
        tost_paired(base, base, 0.0)
    with pytest.raises(ValueError, match="at least 2"):
        tost_paired([1.0, np.nan], [2.0, 3.0], 1.0)


def test_sign_flip_floor_is_the_smallest_p_paired_gives():
    assert sign_flip_floor(8) == 2 / 256 == pytest.approx(0.0078, abs=1e-4)
    big = np.arange(8.0) + 10  # every difference positive and large: the most extreme pattern
    r = paired(big, np.zeros(8))
    assert r["p_perm"] == sign_flip_floor(8) and r["p_t"] < 1e-4  # a p < 1e-4 with 8 seeds is the t-test's
    assert sign_flip_floor(25) == 2 / 100_001
