"""attribution/analyses/size.py (the size axis at a fixed trajectory) on synthetic frames whose answers are known:
measured(w) = w·U0 + w²·Q with ‖Q‖/‖U0‖ = r per seed, kind and horizon gives e(w) = w·r exactly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from seedlab.attribution.analyses import size
from seedlab.attribution.analyses.size import TANGENT, analyse, by_interval, crossing, within_count
from seedlab.errors import SeedlabError

S = 4  # the injection step
WEIGHTS = (1.0, 0.25, 0.0625, 0.015625)
AFTERS = (1, 3, 5, 7)
LABELS = {1: "s+1", 3: "s+3", 5: "s+5", 7: "end"}


def frames(ratio, *, seeds=(0, 1, 2, 3), n=20, queries=("q0", "q1"), measured=None, seed=0, eps1=1e-3, lam=None):
    """weighted.parquet, attribution.parquet and distances.parquet, synthetic.

    U0 ~ N(0, 1) per seed, query, horizon, candidate; measured(w) = w·U0 + w²·Q, Q ~ N scaled so that
    ‖Q‖/‖U0‖ = ``ratio(seed, after)`` over the kind's cells (so e(w) = w·ratio exactly), or
    ``measured(w, after, U0, rng)`` instead. One own-row control per seed with absurd values (must be left
    out). Distances (when ``lam``): a candidate's arm at weight w is at w·eps1·e^{λ(after−1)} (0 at s), times
    0.5, 1 or 4 by candidate (the median over a seed's arms is the factor 1)."""
    rng = np.random.default_rng(seed)
    cands = [f"c{i}" for i in range(n)]
    wrows, arows, drows = [], [], []
    for k in seeds:
        for a in AFTERS:
            U = rng.normal(size=(len(queries), n))
            Q = rng.normal(size=U.shape)
            Q *= ratio(k, a) * np.linalg.norm(U) / np.linalg.norm(Q) if measured is None else 0
            for qi, q in enumerate(queries):
                base = {"seed": k, "query": q, "query_kind": "heldout", "horizon": S + a, "after": a, "label": LABELS[a]}
                arows += [{**base, "candidate": c, "candidate_kind": "passage", "estimator": e, "estimate": v}
                          for e, vals in ((TANGENT, U[qi]), ("unroll", -U[qi])) for c, v in zip(cands, vals)]
                arows.append({**base, "candidate": "own", "candidate_kind": "control", "estimator": TANGENT,
                              "estimate": 0.0})
                for w in WEIGHTS:
                    m = w * U[qi] + w * w * Q[qi] if measured is None else measured(w, a, U[qi], rng)
                    wrows += [{**base, "candidate": c, "candidate_kind": "passage", "weight": w, "measured": v}
                              for c, v in zip(cands, m)]
                    wrows.append({**base, "candidate": "own", "candidate_kind": "control", "weight": w,
                                  "measured": 1e3})
        if lam is not None:
            for ci, c in enumerate(cands):
                for w in WEIGHTS:
                    f = (0.5, 1.0, 4.0)[ci % 3]
                    for a in range(0, AFTERS[-1] + 1):
                        drows.append({"seed": k, "arm": c if w == 1 else f"weight.{w}.{c}",
                                      "kind": "candidate" if w == 1 else "weighted", "candidate": c, "weight": w,
                                      "step": S + a, "after": a,
                                      "distance": 0.0 if a == 0 else f * w * eps1 * math.exp(lam * (a - 1))})
            drows += [{"seed": k, "arm": "nudge.x", "kind": "nudge", "candidate": None, "weight": math.nan,
                       "step": S + a, "after": a, "distance": 1e-9 * 2.0 ** a} for a in range(AFTERS[-1] + 1)]
    w = pd.DataFrame(wrows)[size.WEIGHTED]
    return w, pd.DataFrame(arows), (pd.DataFrame(drows)[size.DISTANCES] if drows else None)


RATIO = {1: 0.05, 3: 0.3, 5: 1.0, 7: 20.0}  # e(w) = w·r: regimes ≥ 1, 0.25, 0.0625, below 1/64


def _at(frame, **keys):
    m = np.ones(len(frame), dtype=bool)
    for k, v in keys.items():
        m &= frame[k].to_numpy() == v
    return frame[m]


def test_relative_error_is_w_times_the_ratio_and_converges_with_slope_one():
    w, a, _ = frames(lambda k, h: RATIO[h])
    out = analyse(w, a, resamples=200)
    s = out.summary
    assert set(s.query_kind) == {"heldout"} and (s.candidates == 20).all() and (s.seeds == 4).all()
    for r in s.itertuples():
        assert r.error == pytest.approx(r.weight * RATIO[r.after], rel=1e-9)
        assert r.error_low == pytest.approx(r.error, rel=1e-9) and r.error_high == pytest.approx(r.error, rel=1e-9)
    ps = out.per_seed
    assert len(ps) == 4 * 4 * 4 and np.allclose(ps.error, ps.weight * ps.after.map(RATIO))
    c = out.convergence.set_index("after")
    assert np.allclose(c.slope, 1.0) and np.allclose(c.low, 1.0) and c.closest.all()
    assert (c.smallest == WEIGHTS[-1]).all()
    # the ranking: ρ(measured(w), U0) falls as w·r grows (the w² Q part swamps w·U0)
    r5 = _at(s, after=7).set_index("weight").rho
    assert r5[WEIGHTS[-1]] > 0.9 and r5[1.0] < 0.3


def test_regime_size_is_the_largest_weight_within_ten_percent():
    w, a, _ = frames(lambda k, h: RATIO[h])
    g = analyse(w, a, resamples=200).regime.set_index("after")
    assert list(g.status) == ["at least", "bounded", "bounded", "below"]
    assert g.largest[1] == 1.0 and g.largest[3] == 0.25 and g.largest[5] == 0.0625 and math.isnan(g.largest[7])
    assert (g.low[3], g.high[3]) == (0.25, 0.25) and (g.low[7], g.high[7]) == (0.0, 0.0)
    # a tighter tolerance shrinks it: e(0.25) = 0.075 at s+3 fails 5 %
    tight = analyse(w, a, tolerance=0.05, resamples=50).regime.set_index("after")
    assert tight.largest[3] == 0.0625 and tight.largest[1] == 1.0


def test_regime_is_a_range_from_zero_a_stray_weight_beyond_a_failing_one_does_not_count():
    e = np.array([[0.05, 0.2, 0.05, 0.05]])  # ascending weights: the second fails, the larger ones are within
    assert within_count(e, 0.1).tolist() == [1]
    assert within_count(np.array([[np.nan, 0.01]]), 0.1).tolist() == [0]


def test_regime_interval_spans_seeds_that_disagree():
    """Two seeds with r = 0.3 at s+3 (regime 0.25), two with r = 3 (regime 1/64): the mean e decides the
    point, the seed resamples range over both."""
    w, a, _ = frames(lambda k, h: (0.3 if k < 2 else 3.0) if h == 3 else RATIO[h])
    g = analyse(w, a, resamples=400).regime.set_index("after").loc[3]
    # ē(0.0625) = 0.0625·1.65 = 0.103 > 0.1: the mean regime is 1/64
    assert (g.status, g.largest) == ("bounded", 0.015625)
    assert g.low == 0.015625 and g.high == 0.25


def test_convergence_fails_when_the_error_does_not_fall_with_w():
    """measured(w)/w = U0 + a fixed Q (not shrinking with w): e is the same at every w, slope 0, and the regime
    is all or nothing."""
    def flat(w, a, U, rng):
        return w * (U + 0.5 * rng.normal(size=U.shape))
    w, a, _ = frames(None, measured=flat)
    out = analyse(w, a, resamples=200)
    c = out.convergence
    assert (c.slope.abs() < 0.1).all()
    assert (out.regime.status == "below").all()


def test_h_star_by_weight_follows_where_measured_stops_tracking_u0():
    """measured(w) = w·U0 up to a horizon that is later for smaller w, then noise: h*(w) is that horizon."""
    last = {1.0: 1, 0.25: 3, 0.0625: 7, 0.015625: 7}

    def m(w, a, U, rng):
        return w * U if a <= last[w] else w * rng.normal(size=U.shape)
    w, a, _ = frames(None, measured=m, seed=3)
    h = analyse(w, a, resamples=400).h_star.set_index("weight")
    assert (h.status[1.0], h.label[1.0], h.after[1.0], h.previous_after[1.0]) == ("reached", "s+3", 3, 1)
    assert (h.status[0.25], h.label[0.25], h.previous_after[0.25]) == ("reached", "s+5", 3)
    assert (h.status[0.0625], h.low_label[0.0625], h.reached[0.0625]) == ("not reached", "not reached", 0.0)
    assert (h.low_label[1.0], h.high_label[1.0]) == ("s+3", "s+3")
    assert h.rho[1.0] < 0.5
    assert math.isnan(h.bent_after[0.0625]) and h.bent_label[1.0] == "s+3"


def test_h_star_rule_is_a_seam():
    def m(w, a, U, rng):
        return w * (U + (0.2 * a) * rng.normal(size=U.shape))  # ρ falls gradually with the horizon
    w, a, _ = frames(None, measured=m, seed=1)
    default = analyse(w, a, resamples=200).h_star
    strict = analyse(w, a, resamples=200, rule=lambda rho, lo, hi: rho >= 0.95).h_star
    never = analyse(w, a, resamples=50, rule=lambda rho, lo, hi: np.ones(rho.shape, bool)).h_star
    assert (never.status == "not reached").all()
    assert (strict.after.fillna(99) <= default.after.fillna(99)).all()
    assert (strict.after.fillna(99) < default.after.fillna(99)).any()
    rule = by_interval(0.5)
    assert rule(np.array([0.6, 0.6, 0.4]), np.array([0.1, -0.1, 0.2]), np.ones(3)).tolist() == [True, False, False]
    assert rule(np.array([0.6]), np.array([np.nan]), np.array([np.nan])).tolist() == [True]  # one seed: no interval


def test_epsilon_and_the_bend_scale():
    """Distances w·ε1·e^{λ(after−1)} and ratio r(h) = c·ε1·e^{λ(after−1)}: e = c·D at every weight and horizon,
    so the response bends at the same distance 0.1/c everywhere; ε(w) = w·ε1 at s+1."""
    lam, eps1, c = math.log(2), 1e-3, 300.0
    w, a, d = frames(lambda k, h: c * eps1 * math.exp(lam * (h - 1)), eps1=eps1, lam=lam)
    out = analyse(w, a, d, resamples=200)
    e = out.epsilon.set_index("weight")
    assert (e.after == 1).all() and np.allclose(e.epsilon, np.array(e.index) * eps1, rtol=1e-12)
    assert np.allclose(e.low, e.epsilon) and (e.seeds == 4).all() and (e.arms == 80).all()
    b = out.bend.set_index("after")
    crossed = b[b.status == "bounded"]
    assert len(crossed) >= 2 and np.allclose(crossed.distance, 0.1 / c, rtol=1e-9)
    sc = out.scales.iloc[0]
    assert sc.eps_nl == pytest.approx(0.1 / c, rel=1e-9) and sc.low == pytest.approx(0.1 / c, rel=1e-9)
    assert sc.horizons == len(crossed)
    assert out.injection_step == S and out.weights == sorted(WEIGHTS)


def test_crossing_interpolates_in_log_log():
    e = np.array([[0.01, 0.04, 0.4]])  # crosses 0.1 between the 2nd and 3rd weights
    D = np.array([[1.0, 4.0, 40.0]])
    t = (math.log(0.1) - math.log(0.04)) / (math.log(0.4) - math.log(0.04))
    assert crossing(e, D, 0.1)[0] == pytest.approx(math.exp(math.log(4) + t * (math.log(40) - math.log(4))))
    assert np.isnan(crossing(np.array([[0.01, 0.02]]), np.array([[1.0, 2.0]]), 0.1)[0])  # never bends


def test_one_seed_has_points_but_no_intervals():
    w, a, _ = frames(lambda k, h: RATIO[h], seeds=(5,))
    out = analyse(w, a, resamples=50)
    assert out.summary.error_low.isna().all() and out.regime.low.isna().all()
    assert out.regime.set_index("after").largest[3] == 0.25
    assert (out.h_star.status != "undefined").all() and (out.h_star.low_label == "undefined").all()


def test_bad_input_is_one_line():
    w, a, _ = frames(lambda k, h: RATIO[h])
    with pytest.raises(SeedlabError, match=TANGENT):
        analyse(w, a[a.estimator != TANGENT])
    with pytest.raises(SeedlabError, match=r"\(0, 1\]"):
        analyse(w.assign(weight=w.weight * 2), a)
    with pytest.raises(SeedlabError, match="tolerance"):
        analyse(w, a, tolerance=1.5)
    with pytest.raises(SeedlabError, match="missing"):
        analyse(w.drop(columns="weight"), a)
