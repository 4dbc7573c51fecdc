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
    from seedlab.shortcut.stats import at_evaluations
    from seedlab.shortcut.report_data import cadence_rates

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


def test_resolving_toward_zero_needs_a_minimum_rise():
    """A shallow wobble back toward 0 is not "resolves": the rise from the most negative value to the last must be at
    least MIN_RISE (0.1), besides ending within half that value's size of 0."""
    from seedlab.shortcut.stats import MIN_RISE, conflict_shape, resolves_toward_zero

    assert MIN_RISE == 0.1
    wobble = pd.Series([0.05, -0.04, -0.01])  # within half of -0.04 of 0, but a rise of 0.03
    assert not resolves_toward_zero(wobble) and resolves_toward_zero(wobble, min_rise=0.02)
    deep = pd.Series([0.3, -0.5, -0.3, -0.2])  # a rise of 0.3, ending at 0.2 <= 0.25
    assert resolves_toward_zero(deep) and not resolves_toward_zero(deep, min_rise=0.31)
    assert resolves_toward_zero(pd.Series([0.0, -0.2, -0.1]))  # a rise of exactly 0.1 counts
    assert not resolves_toward_zero(pd.Series([0.0, -0.5, -0.3]))  # risen 0.2 but still beyond half of -0.5
    assert not resolves_toward_zero(pd.Series([0.0, -0.5, 0.5]))  # an overshoot is not toward 0
    shape = conflict_shape(wobble)
    assert (shape.lowest, shape.last, shape.resolves) == (-0.04, -0.01, False)


def _grads_frame(series: dict[int, list[tuple]], **more) -> pd.DataFrame:
    """gradients.parquet rows: member -> [(epoch, loss_consistent, loss_anti, logit_grad_ratio, per_example_ratio)]."""
    return pd.DataFrame([{"member": m, "epoch": e, "loss_consistent": lc, "loss_anti": la, "logit_grad_ratio": lr,
                          "per_example_ratio": pr, "expected_ratio": 9.0, **more}
                         for m, rows in series.items() for e, lc, la, lr, pr in rows])


def test_the_saturated_window_follows_the_threshold():
    """Amplification is measured where the majority group's mean loss is below the threshold: the consistent group's
    at r >= 1/2, the anti group's below; per member the median there, then quartiles over members with a window."""
    from seedlab.shortcut.report_data import amplification

    summary = pd.DataFrame([{"member": m, "task": "sum2-max", "layers": 2, "heads": 1, "ratio": r}
                            for m, r in ((0, 0.9), (1, 0.9), (2, 0.15))])
    grads = _grads_frame({
        0: [(0, 0.7, 0.7, 1.0, 1.0), (10, 0.04, 0.9, 8.0, 3.0), (20, 0.01, 0.8, 12.0, 5.0), (30, 0.2, 0.2, 2.0, 2.0)],
        1: [(0, 0.7, 0.7, 1.0, 1.0), (10, 0.08, 0.9, 6.0, 2.0), (20, 0.06, 0.9, 20.0, 7.0)],
        2: [(0, 0.7, 0.7, 1.0, 1.0), (10, 0.9, 0.03, 0.2, 0.5), (20, 0.01, 0.9, 50.0, 50.0)],  # anti is the majority
    })
    strict = amplification(summary, grads, 0.05).set_index("ratio")
    # r = 0.9 below 0.05: member 0 at epochs 10 and 20 (medians 10 and 4), member 1 never
    assert strict.loc[0.9, ["members", "saturated"]].tolist() == [2, 1]
    assert strict.loc[0.9, ["logit_q25", "logit_q50", "logit_q75"]].tolist() == [10.0] * 3
    assert strict.loc[0.9, "param_q50"] == 4.0 and strict.loc[0.9, "expected"] == 9.0
    # r = 0.15: the anti group's loss decides (epoch 10), not the consistent group's (epoch 20)
    assert strict.loc[0.15, ["saturated", "logit_q50", "param_q50"]].tolist() == [1, 0.2, 0.5]
    loose = amplification(summary, grads, 0.1).set_index("ratio")  # member 1 joins: epochs 10 and 20, median 13
    assert loose.loc[0.9, "saturated"] == 2
    assert loose.loc[0.9, ["logit_q25", "logit_q50", "logit_q75"]].tolist() == pytest.approx([10.75, 11.5, 12.25])
    assert amplification(summary, grads.drop(columns="loss_consistent"), 0.05).empty  # an older gradients.parquet


def test_head_conflict_intervals_against_a_control():
    """Per member: its shortcut head, and the mean over its other heads; then mean and 95% t interval over members,
    generalizing and non-generalizing members apart; members without a shortcut head left out."""
    from seedlab.shortcut.report_data import head_conflict_intervals, head_roles
    from seedlab.stats import mean_ci

    cell = {"task": "sum2-max", "weight_decay": 0.1, "layers": 2, "heads": 2, "ratio": 0.9}
    summary = pd.DataFrame([{"member": m, "generalized": m < 3, **cell} for m in range(6)])
    rng = np.random.default_rng(0)
    heads = pd.DataFrame([{"member": m, "epoch": e, "layer": la, "head": h, "cosine": rng.uniform(-1, 1),
                           "pair_cosine": rng.uniform(-1, 1)}
                          for m in range(6) for e in (0, 50) for la in (0, 1) for h in (0, 1)])
    chosen = pd.DataFrame({"member": [0, 1, 2, 3, 4], "layer": [0, 1, 1, 0, 0], "head": [1, 0, 0, 0, 1]})  # not 5
    roles = head_roles(heads, chosen)
    assert set(roles.member) == {0, 1, 2, 3, 4} and len(roles) == 5 * 2 * 2
    for m, la, h in chosen.itertuples(index=False):
        rows = heads[(heads.member == m) & (heads.epoch == 50)]
        mine = (rows.layer == la) & (rows["head"] == h)
        own = roles[(roles.member == m) & (roles.epoch == 50)].set_index("role")
        assert own.loc["shortcut", "cosine"] == rows[mine].cosine.item()
        assert own.loc["other", "pair_cosine"] == pytest.approx(rows[~mine].pair_cosine.mean())
    iv = head_conflict_intervals(summary, roles)
    assert len(iv) == 2 * 2 * 2  # outcome x epoch x role
    for gen, ms in ((True, [0, 1, 2]), (False, [3, 4])):
        for role in ("shortcut", "other"):
            row = iv[(iv.generalized == gen) & (iv.epoch == 50) & (iv.role == role)].iloc[0]
            vals = roles[roles.member.isin(ms) & (roles.epoch == 50) & (roles.role == role)].cosine
            mean, lo, hi, n = mean_ci(vals)
            assert row.members == n == len(ms)
            assert (row.cosine, row.cosine_lo, row.cosine_hi) == pytest.approx((mean, lo, hi))
            half = stats.t.ppf(0.975, n - 1) * vals.std(ddof=1) / np.sqrt(n)
            assert row.cosine_hi - row.cosine == pytest.approx(half)


def test_the_flip_verdict_is_the_tests_decision_alone():
    """"shown" only where the intersection-union test rejects; the raw direction of the rates is no verdict."""
    from seedlab.shortcut.stats import flip_answer, flip_verdict, why_untestable

    assert flip_verdict({"flip": True, "p_flip": 0.01}) == "shown"
    assert flip_verdict({"flip": False, "p_flip": 0.2}) == flip_verdict(None) == "not shown"
    # 2L rises and 1L falls, but the test does not reject: not shown (once "in direction only")
    df = summary_of_cells([(2, 0.5, 2, 8), (2, 0.9, 4, 8), (1, 0.5, 3, 8), (1, 0.9, 2, 8)], retained=True)
    a = flip_answer(df)
    assert (a.moves[2].direction, a.moves[1].direction) == ("rises", "falls")
    assert not a.slopes["flip"] and a.verdict == "not shown" and a.untestable == ""
    # no outcome varies: the slopes are not estimable, the test cannot run, and the verdict is not shown
    none = summary_of_cells([(2, 0.5, 0, 4), (2, 0.9, 0, 4), (1, 0.5, 0, 4), (1, 0.9, 0, 4)], retained=True)
    a = flip_answer(none)
    assert a.slopes is None and a.verdict == "not shown"
    assert a.untestable == why_untestable(none) == "none of its 16 1- and 2-layer members generalized"
    every = none.assign(generalized=True)
    assert why_untestable(every) == "every one of its 16 1- and 2-layer members generalized"
    assert why_untestable(df) == ""
