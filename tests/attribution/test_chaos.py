"""attribution/analyses/chaos.py (training's largest Lyapunov exponent and the law h* ≈ s + ln(ε_nl/ε)/λ) on synthetic
distance curves and size axes whose answers are known, and report_size.py's sections and figure on them."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

from seedlab.attribution.analyses import size
from seedlab.attribution.analyses.chaos import ALL, analyse, compare, fit, growth, predict, predict_interval
from seedlab.attribution.report.size import chaos_section, size_figure, size_section
from seedlab.attribution.bank.rundir import BankDir
from seedlab.attribution.analyses.size import TANGENT
from seedlab.errors import SeedlabError

S = 10
AFTERS = (1, 3, 5, 7, 9)
WEIGHTS = (1.0, 0.25, 0.0625, 0.015625)


def curve(eps, lam, plateau, steps, start=1):
    """A nudge's distance: 0 at s, eps·e^{λ(after − 1)} from s+1, saturating at ``plateau``."""
    return np.array([0.0 if a < start else min(eps * math.exp(lam * (a - 1)), plateau) for a in steps])


def nudges(lams, *, eps=1e-9, plateau=1.0, end=60, every=1, tensors=("a", "b")):
    """distances.parquet with one arm per tensor per seed; ``lams[seed][tensor]`` its λ."""
    steps = list(range(0, end + 1, every))
    rows = []
    for seed, per in lams.items():
        for t in tensors:
            d = curve(eps, per[t], plateau, steps)
            rows += [{"seed": seed, "arm": f"nudge.{t}", "kind": "nudge", "candidate": None, "weight": math.nan,
                      "step": S + a, "after": a, "distance": v} for a, v in zip(steps, d)]
    return pd.DataFrame(rows)[size.DISTANCES]


def test_fit_recovers_lambda_over_the_growth_phase_only():
    steps = np.arange(0, 61)
    d = curve(1e-9, 0.5, 1.0, steps)  # reaches the plateau at after ≈ 42.4
    f = fit(steps, d)
    assert f["rate"] == pytest.approx(0.5, rel=1e-12) and f["r2"] == pytest.approx(1.0)
    assert f["saturated"] and f["first_after"] == 1 and f["last_after"] == 38  # 1e-9·e^{0.5·37} ≥ 0.1 first
    assert f["peak"] == 1.0 and f["intercept"] == pytest.approx(math.log(1e-9) - 0.5)
    # the whole curve, plateau included, would not give λ: the window is what makes it right
    whole = fit(steps, d, fraction=1.0)
    assert whole["last_after"] == 43 and whole["rate"] < 0.5  # to the first point at the plateau: bent
    naive = np.polyfit(steps[1:], np.log(d[1:]), 1)[0]
    assert naive < 0.4
    # an unsaturated curve: the phase runs to 0.1 of the last value; too few points: NaN
    assert not fit(steps[:10], curve(1e-9, 0.5, 1.0, steps[:10]), fraction=1.0)["saturated"]
    assert math.isnan(fit(np.array([0, 1, 2]), np.array([0.0, 1e-9, 2e-9]))["rate"])


def test_lyapunov_per_nudge_and_for_the_cell_with_t_intervals():
    lams = {0: {"a": 0.4, "b": 0.5}, 1: {"a": 0.44, "b": 0.52}, 2: {"a": 0.38, "b": 0.6}}
    c = analyse(nudges(lams))
    ly = c.lyapunov.set_index("nudge")
    assert ly.rate["nudge.a"] == pytest.approx(np.mean([0.4, 0.44, 0.38]), rel=1e-9)
    cell = np.mean([np.mean([v["a"], v["b"]]) for v in lams.values()])
    rate, lo, hi = c.cell_rate
    assert rate == pytest.approx(cell, rel=1e-9) and lo < rate < hi and ly.seeds[ALL] == 3
    per_seed = [np.mean([v["a"], v["b"]]) for v in lams.values()]
    half = 4.302652729911275 * np.std(per_seed, ddof=1) / math.sqrt(3)  # t(0.975, 2)
    assert hi - rate == pytest.approx(half, rel=1e-6)
    assert (c.growth.saturated).all() and len(c.curves) == 6 * 61


def test_every_kth_step_and_the_rates_of_row_perturbations():
    """Recorded every 4th step, λ is the same; a weighted arm growing at another rate is told apart from the nudge."""
    d = nudges({0: {"a": 0.3, "b": 0.3}, 1: {"a": 0.3, "b": 0.3}}, every=4, end=80)
    rows = [{"seed": k, "arm": "weight.0.25.c0", "kind": "weighted", "candidate": "c0", "weight": 0.25, "step": S + a,
             "after": a, "distance": v} for k in (0, 1) for a, v in zip(range(0, 81, 4), curve(1e-4, 0.1, 1.0, range(0, 81, 4)))]
    c = analyse(pd.concat([d, pd.DataFrame(rows)], ignore_index=True))
    assert c.cell_rate[0] == pytest.approx(0.3, rel=1e-9)
    r = c.rates.set_index("kind")
    assert r.rate["weighted"] == pytest.approx(0.1, rel=1e-9) and r.weight["weighted"] == 0.25
    assert math.isnan(r.weight["nudge"]) and r.arms["nudge"] == 4


def test_predict_and_its_interval():
    assert predict(0.5, 1e-6, 1e-3, 1.0) == pytest.approx(1 + math.log(1000) / 0.5)
    assert predict(0.0, 1e-6, 1e-3) == math.inf and predict(-0.1, 1e-2, 1e-3, 2.0) == 2.0
    lo, hi = predict_interval((0.4, 0.6), (1e-6, 1e-6), (1e-3, 1e-3))
    assert (lo, hi) == pytest.approx((1 + math.log(1000) / 0.6, 1 + math.log(1000) / 0.4))
    assert predict_interval((-0.1, 0.6), (1e-6, 1e-6), (1e-3, 1e-3))[1] == math.inf


def _bank(lam, eps1, c, *, seeds=(0, 1, 2), n=12, every=1, seed=0):
    """weighted/attribution/distances frames where every arm at weight w is at w·eps1·e^{λ(after−1)} and
    e(w, h) = c·(that distance): the response bends at distance 0.1/c (test_size.py's construction)."""
    rng = np.random.default_rng(seed)
    cands = [f"c{i}" for i in range(n)]
    wrows, arows, drows = [], [], []
    for k in seeds:
        for a in AFTERS:
            U = rng.normal(size=(2, n))
            Q = rng.normal(size=U.shape)
            Q *= c * eps1 * math.exp(lam * (a - 1)) * np.linalg.norm(U) / np.linalg.norm(Q)
            for qi in range(2):
                base = {"seed": k, "query": f"q{qi}", "query_kind": "heldout", "horizon": S + a, "after": a,
                        "label": f"s+{a}", "candidate_kind": "passage"}
                arows += [{**base, "candidate": cn, "estimator": TANGENT, "estimate": v} for cn, v in zip(cands, U[qi])]
                wrows += [{**base, "candidate": cn, "weight": w, "measured": v} for w in WEIGHTS
                          for cn, v in zip(cands, w * U[qi] + w * w * Q[qi])]
        steps = range(0, AFTERS[-1] + 1, every)
        drows += [{"seed": k, "arm": cn if w == 1 else f"weight.{w}.{cn}", "kind": "candidate" if w == 1 else "weighted",
                   "candidate": cn, "weight": w, "step": S + a, "after": a, "distance": v}
                  for cn in cands for w in WEIGHTS for a, v in zip(steps, curve(w * eps1, lam, 1e9, steps))]
    d = pd.concat([pd.DataFrame(drows), nudges({k: {"a": lam, "b": lam} for k in seeds}, every=every)], ignore_index=True)
    return pd.DataFrame(wrows)[size.WEIGHTED], pd.DataFrame(arows), d[size.DISTANCES]


def test_the_law_predicts_where_the_error_crosses_its_tolerance():
    """With every distance growing at λ and e ∝ distance, the law is exact: ε(w) = w·ε1 at s+1, ε_nl = 0.1/c,
    and the predicted h*(w) − s = 1 + ln(ε_nl / ε(w))/λ lies in the bracket of the first horizon with ē(w) > 10 %."""
    lam, eps1, c = math.log(2), 1e-3, 300.0
    w, a, d = _bank(lam, eps1, c)
    sa, ch = size.analyse(w, a, d, resamples=200), analyse(d)
    out = compare({"B8": (sa, ch)}).set_index("weight")
    assert list(out.cell.unique()) == ["B8"] and len(out) == 4
    want = 1 + np.log((0.1 / c) / (np.array(out.index) * eps1)) / lam
    assert np.allclose(out.predicted, want, rtol=1e-9) and np.allclose(out.eps_nl, 0.1 / c, rtol=1e-9)
    horizons = np.array(AFTERS, float)
    for _, r in out.iterrows():
        first = horizons[horizons > r.predicted]  # e = w·ε1·c·2^{a−1} > 0.1 exactly after the prediction
        assert (r.bent_after == first[0]) if len(first) else math.isnan(r.bent_after)
    assert out.consistent_bent.all()
    # read every 3rd step: ε is read at s+3 and is 4x larger, the prediction the same
    w3, a3, d3 = _bank(lam, eps1, c, every=3)
    out3 = compare({"B8": (size.analyse(w3, a3, d3, resamples=100), analyse(d3))}).set_index("weight")
    assert (out3.epsilon_after == 3).all() and np.allclose(out3.epsilon, out.epsilon * 4)
    assert np.allclose(out3.predicted, out.predicted, rtol=1e-9)


def test_compare_says_whether_the_prediction_meets_the_measured_bracket():
    lam, eps1, c = math.log(2), 1e-3, 300.0
    w, a, d = _bank(lam, eps1, c)
    sa, ch = size.analyse(w, a, d, resamples=100), analyse(d)
    p = compare({"x": (sa, ch)}).set_index("weight").predicted  # 1 + log2(1/(3w)): w=1 → -0.58, 1/64 → 5.42
    hs = sa.h_star.assign(status="reached", after=7.0, previous_after=5.0, label="s+7")
    out = compare({"x": (dataclasses.replace(sa, h_star=hs), ch)}).set_index("weight")
    assert bool(out.consistent[0.015625]) and not bool(out.consistent[1.0])
    assert p[0.015625] == pytest.approx(1 + math.log2(64 / 3))
    never = sa.h_star.assign(status="not reached", after=math.nan, previous_after=math.nan)
    out = compare({"x": (dataclasses.replace(sa, h_star=never), ch)}).set_index("weight")
    assert not out.consistent.any()  # every prediction lies before the last horizon, s+9
    undefined = compare({"x": (dataclasses.replace(sa, h_star=sa.h_star.assign(status="undefined")), ch)})
    assert undefined.consistent.isna().all()


def test_report_sections_and_figure_render_the_numbers(tmp_path):
    lam, eps1, c = math.log(2), 1e-3, 300.0
    w, a, d = _bank(lam, eps1, c)
    sa, ch = size.analyse(w, a, d, resamples=100), analyse(d)
    lines = size_section(sa)
    text = "\n".join(lines)
    assert lines[0].startswith("## ") and "10%" in text and "unroll-tangent" in text
    reg = sa.regime.set_index("after")
    assert f"{reg.largest[1]:g}" in text
    law = compare({"B8": (sa, ch)})
    chaos = "\n".join(chaos_section(ch, law))
    assert f"{ch.cell_rate[0]:.3f}" in chaos and "B8" in chaos and f"{law.predicted.iloc[-1]:.1f}" in chaos
    assert "No nudge arms" in "\n".join(chaos_section(analyse(d[d.kind != "nudge"]), None))
    fig = size_figure(sa, ch, BankDir(tmp_path))
    assert fig.path is not None and fig.path.is_file() and fig.path.stat().st_size > 1000


def test_bad_parameters_are_one_line():
    d = nudges({0: {"a": 0.3, "b": 0.3}})
    with pytest.raises(SeedlabError, match="fraction"):
        analyse(d, fraction=0)
    with pytest.raises(SeedlabError, match="start"):
        analyse(d, start=0)
    with pytest.raises(SeedlabError, match="missing"):
        growth(d.drop(columns="distance"))


def test_a_common_window_ends_the_fit_where_told():
    # ln d grows at 1 per update to s+10, at 0.1 after: the default phase runs to a tenth of the maximum over all
    # 40 recorded steps; last=10 fits s+1 .. s+10 only, whatever was recorded after
    t = np.arange(1, 41, dtype=float)
    d = np.exp(np.where(t <= 10, t, 10 + 0.1 * (t - 10))) * 1e-9
    whole, window = fit(t, d), fit(t, d, last=10)
    assert window["last_after"] <= 10 and window["rate"] == pytest.approx(1.0)  # (to a tenth of the window's maximum)
    assert whole["last_after"] > 10 and whole["rate"] < 1.0
    with pytest.raises(SeedlabError, match="last"):
        analyse(pd.DataFrame(columns=size.DISTANCES), last=2)
