"""The shortcut study's statistics: chance levels, Fisher contrasts between ratios, the dist x cap interaction."""

import math

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from helpers import summary_of_cells
from scipy import optimize, stats
from scipy.special import expit

from seedlab.shortcut.stats import chance, interaction_logit, ratio_contrasts
from seedlab.stats import fisher

members = summary_of_cells  # (layers, ratio, k, n) cells -> a summary frame


# a separated sweep: 1L 4/10 at chance, 0/10 far from it; 2L 0/10 at chance, 8/10 far
SEPARATED = [(1, 0.5, 4, 10), (1, 0.9, 0, 10), (2, 0.5, 0, 10), (2, 0.9, 8, 10)]


def test_chance_values_and_bad_names():
    assert chance("sum2-max") == 0.5
    assert chance("sum2-first") == 0.5
    assert chance("sum3-max") == pytest.approx(1 / 3)
    assert chance("sum3-first") == pytest.approx(1 / 3)
    for bad in ("sum4-max", "max-sum2", "sum23-max", ""):
        with pytest.raises(ValueError):
            chance(bad)


def test_ratio_contrasts_pairs_within_cells():
    df = pd.concat([members([(2, 0.5, 0, 10), (2, 0.75, 3, 10), (2, 0.9, 8, 10)]),
                    members([(1, 0.5, 4, 10), (1, 0.9, 0, 10)])])
    c = ratio_contrasts(df)
    assert list(c.columns) == ["task", "weight_decay", "layers", "heads", "ratio_a", "ratio_b",
                               "rate_a", "rate_b", "odds_ratio", "p"]
    assert len(c) == 1 + 3  # 1L: one pair; 2L: three pairs; never across capacities
    row = c[(c.layers == 2) & (c.ratio_a == 0.5) & (c.ratio_b == 0.9)].iloc[0]
    assert (row.rate_a, row.rate_b) == (0.0, 0.8)
    assert row.p == pytest.approx(stats.fisher_exact([[0, 10], [8, 2]]).pvalue)
    row1 = c[c.layers == 1].iloc[0]
    assert (row1.ratio_a, row1.ratio_b, row1.rate_a, row1.rate_b) == (0.5, 0.9, 0.4, 0.0)
    assert row1.p == pytest.approx(fisher(4, 10, 0, 10)[1])


def simulated(seed=0, reps=50):
    """400 members from logit P = -1 + 0.5 dist + 0.2 cap + 4 dist:cap, dist in {0, 1/3, 2/3}."""
    rng = np.random.default_rng(seed)
    cells = [("sum2-max", 0.5), ("sum3-first", 0.0), ("sum3-first", 1.0), ("sum2-first", 1.0)]
    df = pd.DataFrame([(t, r, L) for t, r in cells for L in (1, 2) for _ in range(reps)],
                      columns=["task", "ratio", "layers"])
    dist = np.abs(df["ratio"] - df["task"].map(chance)).to_numpy()
    cap = (df["layers"] == 2).to_numpy()
    df["generalized"] = rng.random(len(df)) < expit(-1 + 0.5 * dist + 0.2 * cap + 4 * dist * cap)
    return df


def test_interaction_logit_recovers_a_known_interaction():
    df = simulated()
    r = interaction_logit(df)
    assert set(r) == {"estimate", "ci_low", "ci_high", "p", "n", "method", "separated"}
    assert r["n"] == 400 and r["separated"] is False and r["method"] == "mle-wald"
    assert abs(r["estimate"] - 4) < 2.5
    assert r["ci_low"] < 4 < r["ci_high"]
    assert r["p"] < 0.01
    # same numbers as the statsmodels formula API on the same model
    df = df.assign(dist=np.abs(df["ratio"] - df["task"].map(chance)), cap=(df["layers"] == 2).astype(int),
                   y=df["generalized"].astype(int))
    ref = smf.logit("y ~ dist * cap", df).fit(disp=0)
    assert r["estimate"] == pytest.approx(ref.params["dist:cap"], rel=1e-6)
    assert r["p"] == pytest.approx(ref.pvalues["dist:cap"], rel=1e-4)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx(tuple(ref.conf_int().loc["dist:cap"]), rel=1e-5)


def test_interaction_logit_no_effect_is_not_significant():
    df = members([(1, 0.5, 5, 20), (1, 0.9, 5, 20), (2, 0.5, 5, 20), (2, 0.9, 5, 20)])
    r = interaction_logit(df)
    assert not r["separated"]
    assert r["estimate"] == pytest.approx(0, abs=1e-6) and r["p"] == pytest.approx(1, abs=1e-6)


def test_interaction_logit_separated_falls_back_to_firth():
    r = interaction_logit(members(SEPARATED))
    assert r["separated"] is True and r["method"].startswith("firth")
    assert math.isfinite(r["estimate"]) and r["estimate"] > 0
    assert 0 < r["p"] < 1
    assert r["ci_low"] < r["estimate"] < r["ci_high"]
    # in a saturated model Firth's fit is exactly p = (k + 1/2) / (n + 1) in every cell
    lg = lambda k, n: math.log((k + 0.5) / (n - k + 0.5))
    want = ((lg(8, 10) - lg(0, 10)) - (lg(0, 10) - lg(4, 10))) / 0.4
    assert r["estimate"] == pytest.approx(want, rel=1e-6)


def test_firth_likelihood_ratio_matches_a_generic_optimizer():
    """The penalized LR p-value, recomputed by maximizing l + 1/2 log|I| with scipy directly."""
    df = members(SEPARATED)
    dist = np.abs(df["ratio"].to_numpy() - 0.5)
    cap = (df["layers"] == 2).to_numpy(float)
    X = np.column_stack([np.ones(len(df)), dist, cap, dist * cap])
    y = df["generalized"].to_numpy(float)

    def neg_pll(b):
        eta = X @ b
        w = expit(eta) * (1 - expit(eta))
        return -(np.sum(y * eta - np.logaddexp(0, eta)) + 0.5 * np.linalg.slogdet(X.T @ (X * w[:, None]))[1])

    full = optimize.minimize(neg_pll, np.zeros(4), method="Nelder-Mead",
                             options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000, maxfev=20000))
    null = optimize.minimize(lambda b: neg_pll(np.r_[b, 0.0]), np.zeros(3), method="Nelder-Mead",
                             options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000, maxfev=20000))
    p = stats.chi2.sf(2 * (null.fun - full.fun), 1)
    r = interaction_logit(df)
    assert r["estimate"] == pytest.approx(full.x[3], rel=1e-3)
    assert r["p"] == pytest.approx(p, rel=1e-3)
    # each end of the profile interval sits where the penalized LR statistic reaches chi2(1) 95%
    for b in (r["ci_low"], r["ci_high"]):
        prof = optimize.minimize(lambda v: neg_pll(np.r_[v, b]), full.x[:3], method="Nelder-Mead",  # noqa: B023
                                 options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000, maxfev=20000))
        assert 2 * (prof.fun - full.fun) == pytest.approx(stats.chi2.ppf(0.95, 1), rel=1e-3)


def test_interaction_logit_not_identified():
    with pytest.raises(ValueError, match="not identified"):  # one capacity
        interaction_logit(members([(2, 0.5, 0, 10), (2, 0.9, 8, 10)]))
    with pytest.raises(ValueError, match="not identified"):  # one distance
        interaction_logit(members([(1, 0.9, 2, 10), (2, 0.9, 8, 10)]))
    with pytest.raises(ValueError, match="not identified"):  # 1L at one distance only
        interaction_logit(members([(1, 0.5, 2, 10), (2, 0.5, 1, 10), (2, 0.9, 8, 10)]))
    with pytest.raises(ValueError, match="nothing to contrast"):  # nobody generalized
        interaction_logit(members([(c, r, 0, 5) for c in (1, 2) for r in (0.5, 0.9)]))


def _flip_frame(k1: dict, k2: dict, n: int = 16) -> pd.DataFrame:
    """Members of sum2-max at r = 0.5 and 0.9: k1[r] of n 1L members and k2[r] of n 2L ones generalize."""
    rows = []
    for layers, ks in ((1, k1), (2, k2)):
        for r, k in ks.items():
            rows += [{"task": "sum2-max", "ratio": r, "layers": layers, "generalized": i < k} for i in range(n)]
    return pd.DataFrame(rows)


def test_simple_slopes_and_the_flip():
    from seedlab.shortcut.stats import simple_slopes

    flip = simple_slopes(_flip_frame({0.5: 10, 0.9: 1}, {0.5: 1, 0.9: 12}))
    assert flip["1L"]["estimate"] < 0 < flip["2L"]["estimate"]
    assert flip["1L"]["ci_high"] < 0 < flip["2L"]["ci_low"]
    assert flip["p_flip"] == max(flip["1L"]["p_one_sided"], flip["2L"]["p_one_sided"]) < 0.05 and flip["flip"]
    # the interaction is there (2L slope > 1L slope) but 1L does not fall: no flip
    flat = simple_slopes(_flip_frame({0.5: 2, 0.9: 2}, {0.5: 1, 0.9: 12}))
    assert flat["2L"]["p_one_sided"] < 0.05 and flat["1L"]["p_one_sided"] > 0.3 and not flat["flip"]
    # the 1L slope equals the dist coefficient of interaction_logit's fit
    from seedlab.shortcut.stats import _design
    from seedlab.stats import logit_coefficient

    X, y = _design(_flip_frame({0.5: 10, 0.9: 1}, {0.5: 1, 0.9: 12}))
    assert logit_coefficient(X, y, 1)["estimate"] == pytest.approx(flip["1L"]["estimate"])


def test_a_three_layer_model_is_not_one_layer():
    from seedlab.shortcut.stats import interaction_logit, simple_slopes

    df = _flip_frame({0.5: 10, 0.9: 1}, {0.5: 1, 0.9: 12})
    three = pd.concat([df, df[df.layers == 2].assign(layers=3)])
    for fn in (interaction_logit, simple_slopes):
        with pytest.raises(ValueError, match=r"capacity: compares 1- and 2-layer models, got layers \[3\]"):
            fn(three)


def test_at_evaluations_counts_only_the_evaluations_and_keeps_jobs_apart():
    from seedlab.shortcut.stats import at_evaluations, cadence_rates

    cell = {"task": "sum2-max", "weight_decay": 1.0, "heads": 2}
    summary = pd.DataFrame([
        {"job": "a", "member": 0, "layers": 1, "ratio": 0.5, "seed": 0, "generalized": True, "retained": False, **cell},  # hit between evaluations only
        {"job": "a", "member": 1, "layers": 1, "ratio": 0.5, "seed": 1, "generalized": True, "retained": True, **cell},   # hit at an evaluation
        {"job": "b", "member": 2, "layers": 1, "ratio": 0.5, "seed": 2, "generalized": False, "retained": False, **cell},
    ])
    ev = lambda job, m, acc: [{"job": job, "member": m, "epoch": e, "split": s, "acc": a}
                              for e, a in zip((0, 10, 20), acc) for s in ("adv", "val")]
    curves = pd.DataFrame(ev("a", 0, (0.5, 0.99, 0.98)) + ev("a", 1, (0.5, 1.0, 0.9)) + ev("b", 2, (0.5, 0.7, 0.8))
                          # another job's member 2 at 100% must not count for job b's member 2
                          + ev("c", 2, (1.0, 1.0, 1.0)))
    assert at_evaluations(summary, curves).tolist() == [False, True, False]
    table, _, _ = cadence_rates(summary, curves)
    assert table[["members", "generalized", "at_evaluations", "added"]].values.tolist() == [[3, 2, 1, 1]]
