"""attribution/horizon.py (the linear-response horizon h*) on synthetic frames whose answers are known, and its
words (attribution/report_horizon.py) and figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from helpers import attribution_frame
from seedlab.attribution import stats
from seedlab.attribution.config import AttributeConfig
from seedlab.attribution.figures import linear_response_figure
from seedlab.attribution.horizon import MEASURED, UNROLL, first_below, linear_response
from seedlab.attribution.report_horizon import horizon_sentence, linear_response_section
from seedlab.attribution.rundir import BankDir
from seedlab.config import parse
from seedlab.errors import SeedlabError

S = 4  # the injection step
HORIZONS = ((5, "s+1"), (6, "s+2"), (14, "s+10"), (54, "s+50"), (104, "end"))


def _frame(estimators, *, horizons=HORIZONS, **kw):
    """helpers.attribution_frame with this file's horizons and the seeds' own noise 0.3."""
    return attribution_frame(estimators, horizons=horizons, own=0.3, s=S, **kw)


def _unroll_until(last: int, sd: float = 0.1):
    """unroll = measured + sd·N(0, 1) at the horizons ≤ ``last``, independent noise after them."""
    return lambda m, rng, h: m + sd * rng.normal(size=len(m)) if h <= last else rng.normal(size=len(m))


def _noise(m, rng, h):
    return rng.normal(size=len(m))


def _rows(lr, track, compared):
    t = lr.table
    return t[(t.track == track) & (t.compared == compared)].set_index("horizon")


def _star(lr, kind="heldout"):
    return lr.h_star.set_index("query_kind").loc[kind]


# ---------------------------------------------------------------- h*


def test_first_below_by_hand():
    rho = np.array([[0.9, 0.4, 0.8], [0.9, np.nan, 0.3], [0.9, 0.8, 0.7], [np.nan] * 3, [0.2, 0.9, 0.9]])
    out = first_below(rho, 0.5)
    assert list(out[:3]) == [1, 2, 3] and np.isnan(out[3]) and out[4] == 0  # 3: not reached; NaN: undefined


def test_h_star_is_the_horizon_where_unroll_stops_tracking_the_measured_effect():
    lr = linear_response(_frame({UNROLL: _unroll_until(14)}, replicate=lambda h: 0.2), resamples=300)
    m = _rows(lr, "within", MEASURED)
    assert (m.rho.loc[[5, 6, 14]] > 0.95).all() and (m.rho.loc[[54, 104]].abs() < 0.2).all()
    s = _star(lr)
    assert (s.status, s.horizon, s.label, s.after) == ("reached", 54, "s+50", 50)
    assert s.rho == pytest.approx(m.rho[54])
    assert (s.low_label, s.high_label, s.reached) == ("s+50", "s+50", 1.0)  # every resample crosses at s+50
    floor = _rows(lr, "within", stats.REPLICATE).loc[54]
    assert (s.floor, s.floor_low, s.floor_high) == (floor.rho, floor.low, floor.high) and s.floor > 0.9
    # unroll tracking the effect one horizon longer moves h* one horizon later
    assert linear_response(_frame({UNROLL: _unroll_until(54)}), resamples=100).h_star.label.iloc[0] == "end"


def test_h_star_interval_is_in_horizon_labels_and_holds_the_point():
    """One seed, one query, 15 candidates, unroll ever noisier: ρ falls through 0.5 gradually, so the resamples
    disagree on h*; the interval's ends are horizons (or "not reached") around the point."""
    sd = dict(zip([h for h, _ in HORIZONS], (0.3, 0.9, 1.4, 1.9, 4.0), strict=True))
    df = _frame({UNROLL: lambda m, rng, h: m + sd[h] * rng.normal(size=len(m))}, seeds=(0,), n=15, queries=("q0",),
                seed=1)
    s = _star(linear_response(df, resamples=500))
    order = [label for _, label in HORIZONS] + ["not reached"]
    lo, at, hi = order.index(s.low_label), order.index(s.label), order.index(s.high_label)
    assert s.status == "reached" and lo <= at <= hi and lo < hi and 0 < s.reached <= 1
    assert s.low_after == {label: h - S for h, label in HORIZONS}[s.low_label]


def test_a_threshold_never_crossed_is_not_reached():
    df = _frame({UNROLL: _unroll_until(104), "sgd": _noise})
    lr = linear_response(df, resamples=100)
    s = _star(lr)
    assert (s.status, s.high_label, s.reached) == ("not reached", "not reached", 0.0) and s.horizon is None
    assert np.isnan(s.floor)  # no h*: no floor at it
    assert linear_response(df, threshold=0.999, resamples=100).h_star.status.iloc[0] == "reached"  # τ near 1: crossed
    text = linear_response_section(lr, stats.analyse(df, resamples=50).verdict)
    assert "stays at ρ ≥ 0.5 up to end (h* not reached; 95% interval not reached .. not reached)" in text
    assert "h* (ρ(measured, unroll) < 0.5): not reached by end (95% interval not reached .. not reached; reached " \
           "in 0% of the resamples)." in text


def test_one_horizon_and_missing_values():
    one = linear_response(_frame({UNROLL: _noise}, horizons=HORIZONS[:1]), resamples=100)
    assert (_star(one).status, _star(one).label) == ("reached", "s+1") and len(one.table.horizon.unique()) == 1
    df = _frame({UNROLL: _unroll_until(6)})
    df.loc[(df.estimator == UNROLL) & (df.horizon == 14), "estimate"] = np.nan  # unroll missing at s+10: skipped
    df.loc[df.index[7], "measured"] = np.nan
    lr = linear_response(df, resamples=100)
    assert np.isnan(_rows(lr, "within", MEASURED).rho[14]) and _star(lr).label == "s+50"
    df.loc[df.estimator == UNROLL, "estimate"] = 1.0  # constant: ρ undefined at every horizon
    s = _star(linear_response(df, resamples=50))
    assert (s.status, s.low_label) == ("undefined", "undefined")


# ---------------------------------------------------------------- the two parts and the references


def test_measured_against_unroll_is_stats_own_correlation():
    """ρ(measured, unroll) and the references are attribution/stats.py's numbers, intervals included (the same
    resamples), on both tracks."""
    df = _frame({UNROLL: _unroll_until(14, sd=0.8), "sgd": lambda m, rng, h: m + rng.normal(size=len(m))},
                replicate=lambda h: 0.5)
    lr = linear_response(df, resamples=200, seed=4)
    corr = stats.analyse(df, resamples=200, seed=4).correlations
    for track, ref in (("within", stats.REPLICATE), ("across", stats.RELIABILITY)):
        for mine, theirs in ((MEASURED, UNROLL), (ref, ref)):
            a = _rows(lr, track, mine)[["rho", "low", "high", "se_seeds"]]
            b = corr[(corr.track == track) & (corr.estimator == theirs)].set_index("horizon")[a.columns]
            pd.testing.assert_frame_equal(a, b, check_names=False)


def test_an_estimator_equal_to_unroll_agrees_perfectly():
    df = _frame({UNROLL: _unroll_until(14, sd=0.5), "sgd": _noise})
    u = df[df.estimator == UNROLL]
    df = pd.concat([df, u.assign(estimator="copy", estimator_label="estimator", estimate=u.estimate * 2 + 1),
                    u.assign(estimator="mirror", estimator_label="estimator", estimate=-u.estimate)], ignore_index=True)
    lr = linear_response(df, resamples=100)
    assert set(lr.table.compared) == {MEASURED, stats.REPLICATE, stats.RELIABILITY, "sgd", "copy", "mirror"} - {
        stats.REPLICATE}  # no replicate in this frame
    for track in stats.TRACKS:
        assert np.allclose(_rows(lr, track, "copy")[["rho", "low", "high"]], 1)
        assert np.allclose(_rows(lr, track, "mirror").rho, -1)
        assert (_rows(lr, track, "sgd").rho.abs() < 0.3).all()
    assert np.allclose(_rows(lr, "within", "copy").se_seeds, 0)


def test_unroll_against_an_estimator_by_hand():
    """Within seed: per seed and query Spearman(e, unroll) over the ordinary candidates, the mean over queries then
    seeds; across seeds: the Spearman of the seed-means, the mean over queries."""
    df = _frame({UNROLL: _unroll_until(104, sd=1.0), "sgd": lambda m, rng, h: m + 2 * rng.normal(size=len(m))}, n=25)
    lr = linear_response(df, resamples=50)
    d = df[df.candidate_kind != "control"].pivot_table(index=["horizon", "query", "seed", "candidate"],
                                                        columns="estimator", values="estimate")
    for h, _ in HORIZONS:
        within = np.mean([np.mean([sps.spearmanr(d.loc[(h, q, k)].sgd, d.loc[(h, q, k)][UNROLL]).statistic
                                   for q in ("q0", "q1")]) for k in (0, 1, 2)])
        means = d.loc[h].groupby(["query", "candidate"]).mean()
        across = np.mean([sps.spearmanr(means.loc[q].sgd, means.loc[q][UNROLL]).statistic for q in ("q0", "q1")])
        assert _rows(lr, "within", "sgd").rho[h] == pytest.approx(within)
        assert _rows(lr, "across", "sgd").rho[h] == pytest.approx(across)


# ---------------------------------------------------------------- words, section, figure, config


def _contest():
    """'good' tracks the measured effect at s+1 and s+2 only, 'random' is a baseline, unroll tracks it until s+10
    (and beats good there: it must not be named as the estimator that predicts)."""
    return _frame({UNROLL: _unroll_until(14, sd=0.05), "good": _unroll_until(6, sd=0.3), "random": _noise},
                  replicate=lambda h: 0.2)


def test_the_first_sentence_names_the_estimator_and_h_star():
    df = _contest()
    text = horizon_sentence(linear_response(df, resamples=300), stats.analyse(df, resamples=300).verdict)
    assert text.startswith("**heldout queries.** **good** predicts the measured effect of a single row beyond every "
                           "baseline from s+1 to s+2 (no estimator from s+10 to end); even the exact linear response "
                           "(unroll) stops predicting it at s+50 (h*: ρ(measured, unroll) ")
    assert "< 0.5; 95% interval s+50 .. s+50), where the replicate floor is 0.9" in text
    assert "it is the linear response that fails)." in text and "**unroll**" not in text
    # two estimators in turn; a reference that wins is passed over for the next that predicts
    verdict = pd.DataFrame({"track": "within", "query_kind": "heldout", "horizon": [5, 6, 14], "label": ["s+1", "s+2",
                            "s+10"], "winner": [UNROLL, "b", UNROLL], "others": [["a"], [], []]})
    assert horizon_sentence(linear_response(df, resamples=50), verdict).startswith(
        "**heldout queries.** The measured effect of a single row is predicted beyond every baseline by **a** at s+1 "
        "and by **b** at s+2 (by none at s+10); even the exact linear response (unroll) stops predicting it at s+50")
    # the floor below τ at h*: nothing is reproducible there, which the sentence says instead
    df = _frame({UNROLL: _unroll_until(14)}, replicate=lambda h: 0.1 if h < 54 else 30.0)
    text = horizon_sentence(linear_response(df, resamples=200), stats.analyse(df, resamples=50).verdict)
    assert text.startswith("**heldout queries.** No estimator predicts the measured effect of a single row beyond "
                           "every baseline at any horizon; the exact linear response (unroll) stops predicting it at s+50")
    assert "below 0.5 as well: little of the effect is reproducible there at all" in text


def test_the_section_tables_and_h_star(tmp_path):
    df = _contest()
    lr = linear_response(df, resamples=200)
    text = linear_response_section(lr, stats.analyse(df, resamples=100).verdict)
    assert text.startswith("## The linear-response horizon\n\n**heldout queries.** ")
    assert "### heldout queries" in text and "Within seed (3 seeds, 40 candidates, 2 queries):" in text
    assert "| horizon | ρ(measured, unroll) | replicate floor | ρ(unroll, good) | ρ(unroll, *random*) |" in text
    assert "| reliability R |" in text and "| s+50 (54) ← h* |" in text
    assert "h* (ρ(measured, unroll) < 0.5): **s+50** (50 updates after s; ρ " in text
    fig = linear_response_figure(lr, BankDir(tmp_path))
    assert fig.path == tmp_path / "linear_response.png" and fig.path.stat().st_size > 5000


def test_without_unroll_the_section_says_how_to_run_it(tmp_path):
    df = _frame({"good": _unroll_until(6, sd=0.3), "random": _noise})
    lr = linear_response(df, resamples=50)
    assert not lr.ran and lr.table.empty and lr.h_star.empty
    text = linear_response_section(lr, stats.analyse(df, resamples=100).verdict)
    assert text.startswith("## The linear-response horizon\n\n**heldout queries.** **good** predicts the measured effect of "
                           "a single row beyond every baseline from s+1 to s+2 (no estimator from s+10 to end); the "
                           "exact linear response (unroll) was not run on this bank (`seedlab attribution attribute DIR "
                           "--estimator unroll --add` computes it).")
    fig = linear_response_figure(lr, BankDir(tmp_path))
    assert fig.path is None and "--estimator unroll" in fig.caption and not (tmp_path / "linear_response.png").exists()


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.2, float("nan"), "half"])
def test_h_star_rho_must_lie_between_0_and_1(bad):
    assert parse(AttributeConfig, {}).h_star_rho == 0.5 and parse(AttributeConfig, {"h_star_rho": 0.3}).h_star_rho == 0.3
    with pytest.raises(SeedlabError, match=r"^attribute\.h_star_rho: ") as e:
        parse(AttributeConfig, {"h_star_rho": bad}, "attribute")
    assert "\n" not in str(e.value)
    if not isinstance(bad, str):
        with pytest.raises(SeedlabError, match=r"^h_star_rho: the threshold must lie in \(0, 1\)"):
            linear_response(_frame({UNROLL: _noise}, n=5), threshold=bad)
