"""attribution/analyses/stats.py on frames whose answers are known, and the report on the session's tiny bank."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from helpers import attribution_frame
from seedlab import stats as gstats
from seedlab.attribution.analyses import stats
from seedlab.attribution.report.bank import answer, write_report

HORIZONS = ((5, "s+1"), (9, "end"))


def _frame(estimators, *, horizons=HORIZONS, **kw):
    """helpers.attribution_frame with this file's horizons."""
    return attribution_frame(estimators, horizons=horizons, **kw)


def _noisy(sd):
    return lambda m, rng, h: m + sd * rng.normal(size=len(m))


def _rows(corr, track, estimator):
    return corr[(corr.track == track) & (corr.estimator == estimator)].set_index("horizon")


def _spearman_of_normals(r):
    """Spearman's correlation of a bivariate normal with Pearson r (Pearson 1907)."""
    return 6 / math.pi * math.asin(r / 2)


# ---------------------------------------------------------------- generic helpers (seedlab.stats)


def test_spearman_along_matches_scipy_on_every_resample():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(3, 12)), rng.normal(size=(3, 12))
    x[0, 2] = y[1, 5] = np.nan  # pairs left out
    x[2, :] = np.round(x[2, :])  # ties
    idx = rng.integers(0, 12, size=(5, 12))
    counts = np.stack([np.bincount(i, minlength=12) for i in idx])
    r, rb = gstats.spearman_along(x, y), gstats.spearman_along(x, y, counts)
    for i in range(3):
        ok = ~(np.isnan(x[i]) | np.isnan(y[i]))
        assert r[i] == pytest.approx(sps.spearmanr(x[i, ok], y[i, ok]).statistic)
        for k in range(5):  # the resample drawn, duplicates and all
            xs, ys = x[i, idx[k]], y[i, idx[k]]
            keep = ~(np.isnan(xs) | np.isnan(ys))
            assert rb[k, i] == pytest.approx(sps.spearmanr(xs[keep], ys[keep]).statistic)
    assert gstats.spearman_along(x[:, None], y[None]).shape == (3, 3)  # broadcast
    assert np.isnan(gstats.spearman_along([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]))  # constant side
    assert np.isnan(gstats.spearman_along([1.0, 2.0, np.nan], [1.0, 2.0, 3.0]))  # fewer than 3 pairs


def test_spearman_brown_and_jackknife():
    assert gstats.spearman_brown(0.5, 3) == pytest.approx(1.5 / 2)  # 3·0.5 / (1 + 2·0.5)
    assert gstats.spearman_brown(0.3, 1) == pytest.approx(0.3)
    assert math.isnan(gstats.spearman_brown(-0.6, 3))  # 1 + 2·(−0.6) < 0
    v = np.array([0.2, 0.5, 0.4, 0.9])
    loo = [(v.sum() - x) / 3 for x in v]  # a mean's leave-one-out estimates: the jackknife SE is sd/√n
    assert gstats.jackknife_se(loo) == pytest.approx(v.std(ddof=1) / 2)
    assert gstats.slope_along([1.0, 2.0, 4.0, np.nan], [2.0, 4.0, 8.0, 1.0]) == pytest.approx(2.0)


# ---------------------------------------------------------------- the two tracks


def test_within_seed_spearman_and_row_invariance_come_out_right():
    """estimate = measured + N(0, 1), replicate = measured + N(0, 0.5²), measured ~ N(0, 1) per seed:
    population Spearman 6/π·asin(r/2) with r = 1/√2 and 1/√1.25."""
    df = _frame({"e": _noisy(1.0)}, seeds=range(4), n=300, common=0.0, own=1.0, replicate=0.5)
    c = stats.analyse(df, resamples=200).correlations
    within, invariance = _rows(c, "within", "e"), _rows(c, "within", stats.ROW_INVARIANCE)
    assert np.allclose(within.rho, _spearman_of_normals(1 / math.sqrt(2)), atol=0.04)  # 0.690
    assert np.allclose(invariance.rho, _spearman_of_normals(1 / math.sqrt(1.25)), atol=0.03)  # 0.886
    assert np.allclose(invariance.bound, np.sqrt(invariance.rho))  # its ceiling √ρ_rep
    assert (within.low < within.rho).all() and (within.rho < within.high).all() and (within.se_seeds > 0).all()
    assert set(within.candidates) == {300}  # the own-row control left out
    # measured independent across seeds (common = 0): nothing is common, so the across track has nothing to find
    assert np.allclose(_rows(c, "across", stats.RELIABILITY).rho, 0, atol=0.15)
    assert stats.ROW_INVARIANCE not in set(stats.analyse(_frame({"e": _noisy(1.0)}), resamples=50).correlations.estimator)


def test_perfect_and_reversed_estimates():
    c = stats.analyse(_frame({"e": lambda m, rng, h: 3 * m + 1}), resamples=50).correlations
    for track in stats.TRACKS:  # Spearman does not see scale or offset
        assert np.allclose(_rows(c, track, "e").rho, 1)
    assert np.allclose(_rows(c, "across", stats.RELIABILITY).rho, 1)  # every seed measured the same
    r = stats.analyse(_frame({"e": lambda m, rng, h: -m}), resamples=50)
    assert np.allclose(_rows(r.correlations, "within", "e").rho, -1) and np.allclose(r.sign["sign"], 0)


def test_spearman_brown_reliability_matches_the_formula():
    seeds = (0, 1, 2, 3)
    df = _frame({"e": _noisy(1.0)}, seeds=seeds, n=30, queries=("q0",), common=1.0, own=1.0)
    rel = _rows(stats.analyse(df, resamples=50).correlations, "across", stats.RELIABILITY)
    m = df[(df.estimator == "e") & (df.candidate_kind != "control")]
    for h, _ in HORIZONS:
        wide = m[m.horizon == h].pivot(index="candidate", columns="seed", values="measured")
        rbar = np.mean([sps.spearmanr(wide[a], wide[b]).statistic for a in seeds for b in seeds if a < b])
        k = len(seeds)
        assert rel.rho[h] == pytest.approx(k * rbar / (1 + (k - 1) * rbar))
        assert rel.bound[h] == pytest.approx(math.sqrt(rel.rho[h]))
        assert math.isnan(rel.se_seeds[h])  # no jackknife for a k-dependent number


def test_bootstrap_interval_covers_the_truth_and_is_reproducible():
    truth = _spearman_of_normals(1 / math.sqrt(2))
    covered = 0
    for i in range(40):
        df = _frame({"e": _noisy(1.0)}, seeds=(0,), n=60, queries=("q0",), horizons=HORIZONS[:1], common=0.0, own=1.0,
                    seed=i)
        r = stats.correlations(stats.Arrays.of(df), resamples=400, seed=i)[0].iloc[0]
        covered += r.low <= truth <= r.high
    assert covered >= 35  # nominal 95%: 38 of 40
    df = _frame({"e": _noisy(1.0)}, n=30, common=0.0, own=1.0)
    a, b, other = (stats.analyse(df, resamples=300, seed=s).correlations for s in (7, 7, 8))
    assert a[["low", "high"]].equals(b[["low", "high"]]) and not a[["low", "high"]].equals(other[["low", "high"]])


def test_decay_between_horizons_is_found():
    """Per seed the estimate tracks the effect at s+1 (noise 0.2) and hardly at the end (noise 3)."""
    df = _frame({"e": lambda m, rng, h: m + (0.2 if h == 5 else 3.0) * rng.normal(size=len(m))}, seeds=range(6),
                n=60, common=0.0, own=1.0)
    d = stats.analyse(df, resamples=50).decay.set_index("estimator").loc["e"]
    assert (d.from_label, d.to_label, d.n) == ("s+1", "end", 6)
    assert d["diff"] > 0.5 and d.ci_low > 0 and d.p_t < 0.001 and d.p_perm == pytest.approx(2 / 2**6)
    flat = stats.analyse(_frame({"e": _noisy(0.5)}, seeds=range(6), n=60, own=1.0), resamples=50).decay
    assert flat.set_index("estimator").loc["e"].p_t > 0.01


def test_weighted_sign_agreement_and_base_rate_by_hand():
    """Δ = 3, −1, 2, −0.5, 10, 0 with estimates 1, 1, −1, −2, 0, 1: the estimate of 0 is left out and Δ = 0
    weighs nothing; agreement (3 + 0.5) / 6.5, base rate (majority sign +) (3 + 2) / 6.5."""
    delta, est = [3.0, -1.0, 2.0, -0.5, 10.0, 0.0], [1.0, 1.0, -1.0, -2.0, 0.0, 1.0]
    df = pd.DataFrame({"seed": 0, "candidate": [f"c{i}" for i in range(6)], "query": "q", "horizon": 5,
                       "measured": delta, "estimator": "e", "estimate": est, "candidate_kind": "heldout",
                       "query_kind": "heldout", "after": 1, "label": "s+1", "unit": "nats/token"})
    s = stats.sign_agreement(stats.Arrays.of(df)).iloc[0]
    assert s["sign"] == pytest.approx(3.5 / 6.5) and s.base == pytest.approx(5 / 6.5) and s.seeds == 1


def test_calibration_slope_and_ratio():
    df = pd.concat([_frame({"e": lambda m, rng, h: m / 2}),
                    _frame({"cos": lambda m, rng, h: m / 2}, unit="cosine")], ignore_index=True)
    cal = stats.analyse(df, resamples=100).calibration
    assert set(cal.estimator) == {"e"}  # cosine has no scale to calibrate
    assert np.allclose(cal.slope, 2.0) and np.allclose(cal.ratio, 2.0)
    assert np.allclose(cal.low, 2.0) and np.allclose(cal.high, 2.0)
    assert np.allclose(cal.ratio_low, 2.0) and np.allclose(cal.ratio_high, 2.0)


def test_the_ratios_interval_is_the_median_over_resampled_candidates():
    """measured / estimate = a candidate's own factor (1 .. 3): the interval of the median ratio is the percentile
    interval of the medians over the resampled candidates (every seed and query of a drawn candidate)."""
    df = _frame({"e": lambda m, rng, h: m / np.linspace(1, 3, len(m))}, n=15, queries=("q0",), horizons=HORIZONS[:1])
    a = stats.Arrays.of(df)
    cal = stats.calibration(a, df, resamples=80, seed=2).iloc[0]
    idx = stats._counts(len(a.candidates), 80, 2)[0]
    ratio = a.M[0, 0] / a.X[0, 0, 0]  # [S, C]
    medians = [np.median(ratio[:, i]) for i in idx]
    assert (cal.ratio_low, cal.ratio_high) == pytest.approx(tuple(gstats.bootstrap_interval(np.array(medians))))
    assert cal.ratio_low < cal.ratio < cal.ratio_high and cal.ratio == pytest.approx(np.median(ratio))


def test_the_joint_bootstrap_by_hand():
    """within_joint: per resample, the seeds drawn with replacement, the candidates anew within each drawn seed;
    per drawn seed the Spearman of the expanded draw per query, the mean over queries, then over the drawn seeds."""
    df = _frame({"e": _noisy(1.0), "f": _noisy(0.3)}, seeds=(0, 1, 2), n=12, own=1.0)
    a = stats.Arrays.of(df)
    boot = stats.within_joint(a, resamples=25, seed=5)["heldout"]  # [b, H, E]
    slots, idx = stats.joint_draws(3, 12, 25, 5)
    for k in (0, 7, 24):
        for i in range(len(a.horizons)):
            for j in range(2):
                by_hand = np.mean([np.mean([sps.spearmanr(a.X[q, i, j, slots[k, s], idx[k, s]],
                                                          a.M[q, i, slots[k, s], idx[k, s]]).statistic
                                            for q in range(2)]) for s in range(3)])
                assert boot[k, i, j] == pytest.approx(by_hand)
    point = stats.within_rho(a)["heldout"]
    c = stats.correlations(a, resamples=10)[0]
    assert point[:, 0] == pytest.approx(_rows(c, "within", "e").rho.to_numpy())
    # the seeds vary between resamples: a seed drawn twice in one resample, one left out
    assert any(len(set(row)) < 3 for row in slots)
    assert stats.is_reference(stats.READOUT) and stats.is_reference(stats.TANGENT) and not stats.is_baseline(
        stats.READOUT)


def test_joint_gathers_index_an_array_at_the_joint_draws_chunk_by_chunk():
    """joint_gathers (lds.py's and loo.py's resampling): x[at] is x at joint_draws' seeds and, along the units' axis,
    their units drawn anew; every other axis whole; the chunks only split the resamples; the draws follow the shape's
    seeds and units alone (two arrays of one design are resampled alike)."""
    x = np.arange(3 * 4 * 5, dtype=float).reshape(3, 4, 5)
    for axis, units in ((1, 4), (2, 5)):
        slots, idx = stats.joint_draws(3, units, 11, 7)
        got = [x[at] for at in stats.joint_gathers(x.shape, axis, 11, 7, chunk=4)]
        assert [len(g) for g in got] == [4, 4, 3]
        got = np.concatenate(got)
        assert got.shape == (11, 3, 4, 5)
        for k in (0, 6, 10):
            for j in range(3):
                want = np.take(x[slots[k, j]], idx[k, j], axis=axis - 1)
                assert np.array_equal(got[k, j], want)
        wider = (3, 9, 5) if axis == 2 else (3, 4, 9)  # another size of the axis not resampled: the same draws
        for at, at2 in zip(stats.joint_gathers(x.shape, axis, 11, 7), stats.joint_gathers(wider, axis, 11, 7)):
            assert np.array_equal(at[0], at2[0]) and np.array_equal(at[axis], at2[axis])
    with pytest.raises(ValueError, match="units' axis"):
        next(stats.joint_gathers(x.shape, 0, 11, 7))


def test_constant_estimate_has_no_correlation_and_effects_table():
    an = stats.analyse(_frame({"e": lambda m, rng, h: np.full(len(m), 0.5)}), resamples=20)
    assert _rows(an.correlations, "within", "e").rho.isna().all() and an.sign["sign"].notna().all()
    assert list(an.effects.label) == ["s+1", "end"] and set(an.effects.n) == {240}


def test_one_seed_and_missing_values():
    df = _frame({"e": _noisy(0.5)}, seeds=(0,), n=20, replicate=0.3)
    df.loc[df.index[3], "estimate"] = np.nan  # a missing estimate: left out pairwise
    df.loc[df.index[5], "measured_replicate"] = np.nan
    an = stats.analyse(df, resamples=50)
    c = an.correlations
    assert stats.RELIABILITY not in set(c.estimator) and c.se_seeds.isna().all()  # one seed: no pairs, no jackknife
    assert c.rho.notna().all() and len(an.decay) == 0 and an.by_candidate_kind.empty


# ---------------------------------------------------------------- baselines and the answer


def _contest(horizons=HORIZONS):
    """'good' tracks the effect before the end and is noise at the end; the baselines 'loss' (weakly
    informative) and 'random' (noise); two candidate kinds (20 candidates each)."""
    def good(m, rng, h):
        return m + (0.3 if h < 9 else 50.0) * rng.normal(size=len(m))

    return _frame({"good": good, "loss": _noisy(3.0), "random": lambda m, rng, h: rng.normal(size=len(m))},
                  n=40, common=1.0, own=0.3, kinds=("passage", "heldout"), replicate=0.2, horizons=horizons)


def test_baselines_the_kind_predictor_and_the_verdict():
    an = stats.analyse(_contest(), resamples=500)
    c = an.correlations
    assert set(c[c.baseline].estimator) == {"loss", "random", stats.KIND}
    kind = _rows(c, "within", stats.KIND)
    assert kind.rho.notna().all()
    v = an.verdict[an.verdict.track == "within"].set_index("horizon")
    assert v.winner[5] == "good" and v.winner[9] == "" and v.best_baseline[5] in ("loss", stats.KIND)
    assert v.reference[5] > 0.9 and v.ceiling[5] == pytest.approx(math.sqrt(v.reference[5]))  # row invariance, √
    vs = an.versus[(an.versus.track == "within") & (an.versus.horizon == 5)]
    assert set(vs.against) == {"loss", "random", stats.KIND} and (vs.low > 0).all()
    # 20 candidates of each kind: the within-kind correlations, without the kind predictor
    bk = an.by_candidate_kind
    assert set(bk.candidate_kind) == {"heldout", "passage"} and stats.KIND not in set(bk.estimator)
    assert set(bk.candidates) == {20}


def test_the_first_paragraph_names_the_winner():
    text = answer(stats.analyse(_contest(), resamples=500).verdict)
    first = text.split("\n\n")[0]
    assert first.startswith("**heldout queries.** At s+1, **good** predicts the effect on held-out rows")
    assert "row invariance 0.98 (ceiling 0.99)" in first and "best baseline: loss 0.28" in first
    assert "at end, no estimator predicts the effect on held-out rows beyond every baseline (best estimator: " \
        "good 0.09" in first
    three = answer(stats.analyse(_contest(((5, "s+1"), (6, "s+2"), (9, "end"))), resamples=300).verdict)
    assert three.startswith("**heldout queries.** From s+1 to s+2, **good** predicts the effect on held-out rows")
    assert " at s+2; row invariance " in three and "; at end, no estimator predicts the effect" in three


def test_report_sections_and_figures(tiny_bank, tmp_path):
    bank = shutil.copytree(tiny_bank / "bank", tmp_path / "bank")
    df = pd.read_parquet(bank / "attribution.parquet")
    df[df.estimator.isin(["sgd", "ekfac"])].to_parquet(bank / "attribution.parquet")  # fewer panels: a faster test
    path = write_report(bank)
    text = path.read_text()
    assert text.split("\n\n")[1].startswith("**self queries.** ") and "predicts" in text.split("\n\n")[1]
    for section in ("## Design", "## Integrity", "## The measured effects", "## Headline: within seed", "## Across seeds",
                    "### self queries", "### heldout queries", "### probe queries", "## Against the baselines",
                    "## Decay between horizons", "## Sign agreement", "## Magnitude", "## Within each candidate kind",
                    "## What the estimators are"):
        assert section in text
    assert "Replica control (seed 0)" in text and "measured effect exactly 0 at every horizon: yes" in text
    assert "every estimate exactly 0: yes" in text
    assert "Precision fp32." in text  # the bank's precision, in the intro
    assert "| **reliability** |" in text and "Skipped" not in text and "replicate floor" not in text
    assert "| **row invariance** |" not in text  # this bank measured no replicate
    for png in ("scatter-self.png", "scatter-query-0.png", "scatter-probe-gizmo.png", "correlation-spearman.png"):
        assert (bank / png).stat().st_size > 5000
