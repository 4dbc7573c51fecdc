"""attribution/analyses/horizon.py (the linear-response horizon h*, by the verdict's rule, over seeds and candidates) on
synthetic frames whose answers are known, the exact responses' split (readout, tangent) and calibration, and its
words (attribution/report/horizon.py) and figure."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from helpers import attribution_frame
from seedlab.attribution.analyses import stats
from seedlab.attribution.bank.config import AttributeConfig
from seedlab.attribution.report.figures import linear_response_figure
from seedlab.attribution.analyses.horizon import (
    CEILING,
    MEASURED,
    READOUT,
    TANGENT,
    UNROLL,
    first_below,
    first_failing,
    linear_response,
    predicts,
)
from seedlab.attribution.report.horizon import horizon_sentence, linear_response_section
from seedlab.attribution.bank.rundir import BankDir
from seedlab.config import parse
from seedlab.errors import SeedlabError

S = 4  # the injection step
#: finer than four horizons, as issue 31's config will have them
HORIZONS = ((5, "s+1"), (6, "s+2"), (9, "s+5"), (14, "s+10"), (24, "s+20"), (54, "s+50"), (104, "end"))
LABELS = [label for _, label in HORIZONS]


def _frame(estimators, *, horizons=HORIZONS, **kw):
    """helpers.attribution_frame with this file's horizons and the seeds' own noise 0.3."""
    return attribution_frame(estimators, horizons=horizons, own=0.3, s=S, **kw)


def _unroll_until(last: int, sd: float = 0.1):
    """unroll = measured + sd·N(0, 1) at the horizons ≤ ``last``, independent noise after them."""
    return lambda m, rng, h: m + sd * rng.normal(size=len(m)) if h <= last else rng.normal(size=len(m))


def _noise(m, rng, h):
    return rng.normal(size=len(m))


def _rows(lr, track, compared, against=MEASURED):
    t = lr.table
    return t[(t.track == track) & (t.against == against) & (t.compared == compared)].set_index("horizon")


def _star(lr, kind="heldout", response=UNROLL):
    h = lr.h_star
    return h[(h.query_kind == kind) & (h.response == response)].iloc[0]


# ---------------------------------------------------------------- the rule and its pieces


def test_first_below_first_failing_and_the_rule_by_hand():
    rho = np.array([[0.9, 0.4, 0.8], [0.9, np.nan, 0.3], [0.9, 0.8, 0.7], [np.nan] * 3, [0.2, 0.9, 0.9]])
    out = first_below(rho, 0.5)
    assert list(out[:3]) == [1, 2, 3] and np.isnan(out[3]) and out[4] == 0  # 3: not reached; NaN: undefined
    ok = np.array([[True, False, True], [True, True, True], [False, True, True]])
    f = first_failing(ok, np.array([[True] * 3, [True] * 3, [False] * 3]))
    assert list(f[:2]) == [1, 3] and np.isnan(f[2])  # predicts everywhere: H; ρ defined nowhere: NaN
    # lower ends of (ρ, ρ − ρ_b1, ρ − ρ_b2): ρ must clear 0, every defined difference too; NaN: no rival
    lows = np.array([[0.1, 0.2, 0.05], [0.1, 0.2, -0.01], [-0.1, 0.5, 0.5], [0.1, np.nan, 0.3], [np.nan, 0.1, 0.1]])
    assert list(predicts(lows)) == [True, False, False, True, False]


def test_h_star_is_the_first_horizon_where_unroll_no_longer_predicts_beyond_every_baseline():
    lr = linear_response(_frame({UNROLL: _unroll_until(14), "random": _noise}, replicate=lambda h: 0.2),
                         resamples=300)
    m = _rows(lr, "within", UNROLL)
    assert (m.rho.loc[[5, 6, 9, 14]] > 0.95).all() and (m.rho.loc[[24, 54, 104]].abs() < 0.2).all()
    s = _star(lr)
    assert (s.status, s.horizon, s.label, s.after) == ("reached", 24, "s+20", 20)
    assert s.rho == pytest.approx(m.rho[24]) and s.low < s.rho < s.high and "0" in s.unbeaten
    assert (s.low_label, s.high_label, s.reached) == ("s+20", "s+20", 1.0)  # every resample fails at s+20
    assert s.baselines == ["random"]  # one candidate kind: no kind baseline
    inv, ceiling = _rows(lr, "within", stats.ROW_INVARIANCE).loc[24], _rows(lr, "within", CEILING).loc[24]
    assert (s.invariance, s.invariance_low, s.invariance_high) == (inv.rho, inv.low, inv.high) and s.invariance > 0.9
    assert (s.ceiling, s.ceiling_low, s.ceiling_high) == pytest.approx(
        (math.sqrt(inv.rho), math.sqrt(inv.low), math.sqrt(inv.high)))
    assert (ceiling.rho, ceiling.low, ceiling.high) == (s.ceiling, s.ceiling_low, s.ceiling_high)
    # unroll tracking the effect one horizon longer moves h* one horizon later
    assert _star(linear_response(_frame({UNROLL: _unroll_until(24)}), resamples=100)).label == "s+50"


def test_predicting_is_the_verdicts_rule_not_a_threshold():
    """ρ(measured, unroll) ≈ 0.4 from s+10 on, clearly above 0 and the baseline: below τ = 0.5, yet it still
    predicts, until it is noise at s+50; τ's crossing is only the descriptive line."""
    def weak(m, rng, h):
        return m + (0.1 if h < 14 else 2.2 if h < 54 else 50.0) * rng.normal(size=len(m))

    df = _frame({UNROLL: weak, "random": _noise}, n=60)
    lr = linear_response(df, resamples=400)
    m, s = _rows(lr, "within", UNROLL), _star(lr)
    assert 0.25 < m.rho[14] < 0.5 and 0.25 < m.rho[24] < 0.5
    assert s.label == "s+50" and (s.tau_label, s.tau_after) == ("s+10", 10)
    assert s.tau_low_label == s.tau_high_label == "s+10"
    verdict = stats.analyse(df, resamples=400).verdict
    assert UNROLL not in set(verdict.winner) and UNROLL not in set(verdict.best)  # a reference: never the verdict's


def test_a_baseline_unroll_does_not_clearly_beat_ends_its_horizon():
    """At s+20 on, the 'loss' baseline tracks the effect as well as unroll does: unroll's ρ is high there, but it
    no longer predicts beyond every baseline, so h* = s+20 with the baseline named."""
    def loss(m, rng, h):
        return m + (0.1 if h >= 24 else 30.0) * rng.normal(size=len(m))

    lr = linear_response(_frame({UNROLL: _unroll_until(104, sd=0.1), "loss": loss}), resamples=300)
    s = _star(lr)
    assert _rows(lr, "within", UNROLL).rho[24] > 0.9
    assert (s.label, s.unbeaten) == ("s+20", ["loss"])
    # with two candidate kinds the kind baseline is a rival too
    two = linear_response(_frame({UNROLL: _unroll_until(14), "random": _noise}, kinds=("a", "b")), resamples=100)
    assert _star(two).baselines == ["random", stats.KIND]


def test_h_star_interval_resamples_seeds_and_candidates():
    """Six seeds, many candidates: in three seeds unroll tracks the effect to the end, in three it is noise from s+5.
    Candidates alone barely move h*; the seeds do: the interval spans horizons and holds the point."""
    state = {"calls": 0}

    def split(m, rng, h):
        state["calls"] += 1  # one call per (seed, query, horizon), seeds outermost
        seed = (state["calls"] - 1) // (2 * len(HORIZONS))
        return m + 0.1 * rng.normal(size=len(m)) if seed < 3 or h < 9 else rng.normal(size=len(m))

    df = _frame({UNROLL: split, "random": _noise}, seeds=range(6), n=150)
    lr = linear_response(df, resamples=400)
    s = _star(lr)
    order = [*LABELS, "not reached"]
    lo, hi = order.index(s.low_label), order.index(s.high_label)
    at = order.index(s.label) if s.status == "reached" else len(LABELS)
    assert lo <= at <= hi and lo < hi and lo >= LABELS.index("s+5")
    # one seed only: the seeds cannot vary, and h* is the same in every resample
    one = linear_response(df[df.seed == 0], resamples=200)
    assert _star(one).status == "not reached" and _star(one).reached == 0.0


def test_a_threshold_never_crossed_and_unroll_predicting_everywhere_is_not_reached():
    df = _frame({UNROLL: _unroll_until(104), "sgd": _noise})
    lr = linear_response(df, resamples=100)
    s = _star(lr)
    assert (s.status, s.high_label, s.reached, s.tau_label) == ("not reached", "not reached", 0.0, "not reached")
    assert s.horizon is None and np.isnan(s.invariance)  # no h*: no row invariance at it
    text = linear_response_section(lr, stats.analyse(df, resamples=50).verdict)
    assert "predicts it beyond every baseline up to end (h* not reached; 95% interval not reached .. not reached, " \
           "seeds and candidates resampled)" in text
    assert "h* of unroll (the first horizon where it no longer predicts beyond every baseline): not reached by end " \
           "(95% interval not reached .. not reached, seeds and candidates resampled; reached in 0% of the " \
           "resamples). Descriptive: ρ(measured, unroll) first below τ = 0.5 nowhere by end." in text


def test_one_horizon_and_missing_values():
    one = linear_response(_frame({UNROLL: _noise}, horizons=HORIZONS[:1]), resamples=100)
    assert (_star(one).status, _star(one).label) == ("reached", "s+1") and len(one.table.horizon.unique()) == 1
    df = _frame({UNROLL: _unroll_until(24)})
    df.loc[(df.estimator == UNROLL) & (df.horizon == 14), "estimate"] = np.nan  # unroll missing at s+10
    df.loc[df.index[7], "measured"] = np.nan
    lr = linear_response(df, resamples=100)
    assert np.isnan(_rows(lr, "within", UNROLL).rho[14])
    assert _star(lr).label == "s+10"  # undefined there: it does not predict there (the verdict's rule)
    assert _star(lr).tau_label == "s+50"  # the descriptive crossing skips it
    df.loc[df.estimator == UNROLL, "estimate"] = 1.0  # constant: ρ undefined at every horizon
    s = _star(linear_response(df, resamples=50))
    assert (s.status, s.low_label) == ("undefined", "undefined")


# ---------------------------------------------------------------- the table: measured, references, unroll against e


def test_measured_against_unroll_is_stats_own_correlation():
    """ρ(measured, unroll) and the references are attribution/analyses/stats.py's numbers, intervals included (the same
    resamples), on both tracks; the ceiling is √ of the reference and of its interval's ends."""
    df = _frame({UNROLL: _unroll_until(14, sd=0.8), "sgd": lambda m, rng, h: m + rng.normal(size=len(m))},
                replicate=lambda h: 0.5)
    lr = linear_response(df, resamples=200, seed=4)
    corr = stats.analyse(df, resamples=200, seed=4).correlations
    for track, ref in (("within", stats.ROW_INVARIANCE), ("across", stats.RELIABILITY)):
        for mine in (UNROLL, ref):
            a = _rows(lr, track, mine)[["rho", "low", "high", "se_seeds"]]
            b = corr[(corr.track == track) & (corr.estimator == mine)].set_index("horizon")[a.columns]
            pd.testing.assert_frame_equal(a, b, check_names=False)
        ceiling, r = _rows(lr, track, CEILING), _rows(lr, track, ref)
        assert np.allclose(ceiling.rho, np.sqrt(r.rho)) and np.allclose(ceiling.low, np.sqrt(r.low.clip(0)))


def test_an_estimator_equal_to_unroll_agrees_perfectly():
    df = _frame({UNROLL: _unroll_until(14, sd=0.5), "sgd": _noise})
    u = df[df.estimator == UNROLL]
    df = pd.concat([df, u.assign(estimator="copy", estimator_label="estimator", estimate=u.estimate * 2 + 1),
                    u.assign(estimator="mirror", estimator_label="estimator", estimate=-u.estimate)], ignore_index=True)
    lr = linear_response(df, resamples=100)
    assert set(zip(lr.table.against, lr.table.compared, strict=True)) == {
        (MEASURED, UNROLL), (MEASURED, stats.RELIABILITY), (MEASURED, CEILING),
        (UNROLL, "sgd"), (UNROLL, "copy"), (UNROLL, "mirror")}  # no replicate in this frame: no row invariance
    for track in stats.TRACKS:
        assert np.allclose(_rows(lr, track, "copy", UNROLL)[["rho", "low", "high"]], 1)
        assert np.allclose(_rows(lr, track, "mirror", UNROLL).rho, -1)
        assert (_rows(lr, track, "sgd", UNROLL).rho.abs() < 0.3).all()
    assert np.allclose(_rows(lr, "within", "copy", UNROLL).se_seeds, 0)


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
        assert _rows(lr, "within", "sgd", UNROLL).rho[h] == pytest.approx(within)
        assert _rows(lr, "across", "sgd", UNROLL).rho[h] == pytest.approx(across)


# ---------------------------------------------------------------- the exact readout, the tangent, calibration


def _responses():
    """The propagation right until s+10 (readout = measured + small noise, then noise); unroll = the readout bent
    by its curvature (noise 0.6 on top); the tangent = unroll at half its size plus a little; random a baseline."""
    state = {}

    def readout(m, rng, h):
        state["r"] = m + 0.05 * rng.normal(size=len(m)) if h <= 14 else rng.normal(size=len(m))
        return state["r"]

    def unroll(m, rng, h):
        state["u"] = state["r"] + 0.6 * rng.normal(size=len(m))
        return state["u"]

    return {READOUT: readout, UNROLL: unroll, TANGENT: lambda m, rng, h: state["u"] / 2 + 0.05 * rng.normal(size=len(m)),
            "random": _noise}


def test_the_readout_and_the_tangent_split_unrolls_miss():
    df = _frame(_responses(), replicate=0.3)
    lr = linear_response(df, resamples=200)
    assert lr.responses == [UNROLL, READOUT, TANGENT] and set(lr.references) >= {UNROLL, READOUT, TANGENT}
    prop, curv, step = _rows(lr, "within", READOUT), _rows(lr, "within", READOUT, UNROLL), \
        _rows(lr, "within", TANGENT, UNROLL)
    assert (prop.rho.loc[[5, 14]] > 0.95).all() and (prop.rho.loc[[54, 104]].abs() < 0.2).all()  # propagation
    assert (curv.rho > 0.7).all() and (curv.rho < 0.95).all()  # the readout's curvature: the same at every horizon
    assert (step.rho > 0.95).all()
    assert (_rows(lr, "within", UNROLL).rho.loc[[5, 14]] < prop.rho.loc[[5, 14]]).all()  # unroll: both errors
    assert set(lr.h_star.response) == {UNROLL, READOUT, TANGENT} and _star(lr, response=READOUT).label == "s+20"
    # every exact response is a reference: never the verdict's winner, even where it is the best
    assert all(stats.is_reference(r) for r in (UNROLL, READOUT, TANGENT))
    v = stats.analyse(df, resamples=100).verdict
    assert not set(v.winner) & {UNROLL, READOUT, TANGENT} and not set(v.best) & {UNROLL, READOUT, TANGENT}
    text = linear_response_section(lr, v)
    assert "| horizon | ρ(measured, unroll) | ρ(measured, unroll-readout) | ρ(measured, unroll-tangent) | " \
           "row invariance | ceiling √ρ_rep | ρ(unroll, unroll-readout) | ρ(unroll, unroll-tangent) | " \
           "ρ(unroll, *random*) |" in text
    assert "There, the readout's curvature alone ρ(unroll, unroll-readout) " in text
    assert "h* of unroll-readout (the first horizon where it no longer predicts beyond every baseline): **s+20**" in text


def test_calibration_of_each_response_at_every_horizon():
    """unroll at half the effect's size, its readout at the size: slope and median ratio 2 and 1, at every horizon."""
    df = _frame({UNROLL: lambda m, rng, h: m / 2, READOUT: lambda m, rng, h: m.copy(), "random": _noise})
    lr = linear_response(df, resamples=100)
    cal = lr.calibration.set_index(["estimator", "horizon"])
    assert set(cal.index.get_level_values(0)) == {UNROLL, READOUT}  # a baseline is not calibrated
    assert len(cal.loc[UNROLL]) == len(HORIZONS)
    assert np.allclose(cal.loc[UNROLL][["slope", "low", "high", "ratio", "ratio_low", "ratio_high"]], 2.0)
    assert np.allclose(cal.loc[READOUT][["slope", "ratio"]], 1.0)
    text = linear_response_section(lr, stats.analyse(df, resamples=50).verdict)
    assert "| horizon | measured on unroll | measured on unroll-readout |" in text
    assert "| s+20 (24) | slope 2 [2, 2]; ratio 2 [2, 2] | slope 1 [1, 1]; ratio 1 [1, 1] |" in text


def test_an_older_bank_without_readout_or_tangent():
    lr = linear_response(_frame({UNROLL: _unroll_until(14), "random": _noise}), resamples=50)
    assert lr.responses == [UNROLL] and set(lr.h_star.response) == {UNROLL}
    assert not (lr.table.compared.isin([READOUT, TANGENT])).any()
    text = linear_response_section(lr, stats.analyse(_frame({UNROLL: _noise}), resamples=20).verdict)
    assert "ρ(measured, unroll-readout)" not in text.split("### heldout queries")[1] and "There, " not in text


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
                           "baseline from s+1 to s+2 (no estimator from s+5 to end); even the exact linear response "
                           "(unroll) stops predicting it beyond every baseline at s+20 (h*: ρ(measured, unroll) ")
    assert "not clearly above 0 and random; 95% interval s+20 .. s+20, seeds and candidates resampled); there the " \
           "row invariance is 0.9" in text
    assert "can reach at most √ρ_rep = 0.9" in text and "has the same cause as unroll's miss" in text
    assert "**unroll**" not in text and "floor" not in text
    # two estimators in turn; a reference that wins is passed over for the next that predicts
    verdict = pd.DataFrame({"track": "within", "query_kind": "heldout", "horizon": [5, 6, 9], "label": ["s+1", "s+2",
                            "s+5"], "winner": [UNROLL, "b", READOUT], "others": [["a"], [], []]})
    assert horizon_sentence(linear_response(df, resamples=50), verdict).startswith(
        "**heldout queries.** The measured effect of a single row is predicted beyond every baseline by **a** at s+1 "
        "and by **b** at s+2 (by none at s+5); even the exact linear response (unroll) stops predicting it beyond "
        "every baseline at s+20")
    # without a replicate the sentence says there is nothing to set it against
    df = _frame({UNROLL: _unroll_until(14)})
    text = horizon_sentence(linear_response(df, resamples=100), stats.analyse(df, resamples=50).verdict)
    assert text.startswith("**heldout queries.** No estimator predicts the measured effect of a single row beyond "
                           "every baseline at any horizon; the exact linear response (unroll) stops predicting it")
    assert "no replicate was measured, so there is no row-invariance ceiling to set it against." in text


def test_the_section_tables_and_h_star(tmp_path):
    df = _contest()
    lr = linear_response(df, resamples=200)
    text = linear_response_section(lr, stats.analyse(df, resamples=100).verdict)
    assert text.startswith("## The linear-response horizon\n\n**heldout queries.** ")
    assert "### heldout queries" in text and "Within seed (3 seeds, 40 candidates, 2 queries):" in text
    assert "| horizon | ρ(measured, unroll) | row invariance | ceiling √ρ_rep | ρ(unroll, good) | " \
           "ρ(unroll, *random*) |" in text
    assert "| reliability R | √R |" in text and "| s+20 (24) ← h* |" in text and "| s+5 (9) |" in text
    assert "h* of unroll (the first horizon where it no longer predicts beyond every baseline): **s+20** (20 updates " \
           "after s; ρ " in text
    assert "there, row invariance 0.9" in text and "Descriptive: ρ(measured, unroll) first below τ = 0.5 at s+20" in text
    fig = linear_response_figure(lr, BankDir(tmp_path))
    assert fig.path == tmp_path / "linear_response.png" and fig.path.stat().st_size > 5000


def test_without_unroll_the_section_says_how_to_run_it(tmp_path):
    df = _frame({"good": _unroll_until(6, sd=0.3), "random": _noise})
    lr = linear_response(df, resamples=50)
    assert not lr.ran and lr.table.empty and lr.h_star.empty
    text = linear_response_section(lr, stats.analyse(df, resamples=100).verdict)
    assert text.startswith("## The linear-response horizon\n\n**heldout queries.** **good** predicts the measured effect of "
                           "a single row beyond every baseline from s+1 to s+2 (no estimator from s+5 to end); the "
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
