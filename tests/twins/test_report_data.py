"""twins.report_data: what the report prints and the figures draw, computed once from a run's measured files with
twins.stats' tests (on the tiny real design and on hand-made tables)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from seedlab.twins import report_data, stats

S = 10  # injection step of the hand-made courses


def test_summary_computes_each_number_once_from_the_measured_files(design):
    """summarize: the headline's pooled numbers are the tables' own (the windows computed once, for the
    headline and the window table alike), and the nulls' answer counts the end rows of null_contrasts."""
    from seedlab.twins.rundir import Measured

    d = Measured.read(design / "run")
    s = report_data.summarize(d)
    fl = s.norm[s.norm.condition.isin(["fluent-fabricated", "fluent-attested"])]
    assert s.headline.barrier_pct == stats.percent(fl.barrier.mean(), fl.seed_barrier.iloc[0])
    assert s.headline.distance_pct == stats.percent(fl.distance.mean(), fl.seed_distance.iloc[0])
    w = s.windows[s.windows.condition.isin(fl.condition)]
    assert s.headline.peak_ratios == [(int(k), g.peak_over_trough.mean()) for k, g in w.groupby("window", sort=False)]
    assert [k for k, _ in s.headline.peak_ratios] == [d.settings.smooth_steps, d.settings.smooth_steps_alt]
    end = s.nulls[s.nulls.kind == "end"]
    assert sum(v.tests for v in s.null_verdicts) == s.null_family.end == len(end)
    assert s.null_family.checkpoint == int((s.nulls.kind == "checkpoint").sum()) > 0
    assert s.ordinary_margin == 0.25 and s.null_family.equivalence == int(end.tost_equivalent.notna().sum()) > 0
    assert s.null_family.tests == len(s.nulls) + s.null_family.equivalence  # every p-value of the table, counted
    assert sum(len(v.differ) for v in s.null_verdicts) == int((end.p_t_holm < stats.ALPHA).sum())
    # the ordinary rows as one null (their distribution); the fixture trains every null but sign-gradient
    assert set(s.nulls.null) == set(stats.NULL_CONDITIONS) - {"sign-gradient"}
    sizes = s.null_sizes.set_index("condition")  # each gradient null's size, from its perturbation.json, per channel
    assert list(sizes.index) == ["matched-gradient"] and sizes.loc["matched-gradient", "seeds"] == 2
    recs = [json.loads((d.dir.root / f"seed-{k}" / "matched-gradient" / "perturbation.json").read_text()) for k in (0, 1)]
    assert sizes.loc["matched-gradient", "grad_ratio"] == pytest.approx(np.median([r["norm"] / r["like_norm"] for r in recs]))
    assert sizes.loc["matched-gradient", "update_ratio"] == pytest.approx(
        np.median([r["update_norm"] / r["like_update_norm"] for r in recs]))
    assert (s.comp.gain == -s.comp["diff"]).all() and s.last_before == d.steps["injection"] - 1
    assert set(s.matrix) == {d.steps["s50"], d.steps["final"]} and s.gradmatch is None


def test_what_the_figures_draw_on_hand_made_tables():
    m = pd.DataFrame({"kind": ["seed", "injected", "injected", "injected"], "condition": ["twin", "a", "a", "b"],
                      "seed": [0, 0, 1, 0], "barrier": [0.2, 0.1, 0.0, 0.0], "distance": [4.0, 1.0, 2.0, 1.0],
                      "cka.blocks.0": [0.5, 0.9, 0.7, 1.0]})
    sc = report_data.seed_scaled(m)
    assert sc.points[["distance_rel", "barrier_rel"]].values.tolist() == [[0.25, 0.5]] and sc.dropped == 2 and sc.flat == ["b"]
    assert report_data.seed_scaled(m.assign(barrier=0.0)) is None  # no inter-seed barrier to scale by
    assert report_data.cka_means(m)["cka.blocks.0"].to_dict() == {"a": 0.8, "b": 1.0, "seed": 0.5}
    ck = pd.DataFrame({"condition": ["a", "a", "a", "a", "b", "b"], "seed": [0, 1, 0, 1, 0, 0], "step": [S, S, 20, 20, S, 20],
                       "barrier": [0.0, 0.0, 0.1, 0.3, 0.0, 0.0], "distance": [0.0, 0.0, 1.0, 3.0, 0.0, 2.0]})
    bc = report_data.barrier_course(ck, m)  # for a log axis: the positive means, each seed's positive value
    assert bc.flat == ["b"] and bc.zero_steps == [S] and bc.seed_barrier == 0.2
    assert bc.course.step.tolist() == [20] and bc.course["mean"].tolist() == pytest.approx([0.2])
    assert bc.points.barrier.tolist() == [0.1, 0.3] and set(bc.points.condition) == {"a"}
    gap = report_data.cka_gap(m)  # 1 − the mean CKA: b's representation did not move
    assert gap.values["cka.blocks.0"].to_dict() == pytest.approx({"a": 0.2, "b": 0.0, "seed": 0.5}) and gap.zero == ["b"]
    paths = pd.DataFrame({"kind": ["seed"] * 2 + ["injected"] * 4, "condition": ["twin"] * 2 + ["a"] * 4,
                          "seed": [0, 0, 0, 0, 1, 1], "seed_b": [1, 1, 0, 0, 1, 1], "alpha": [0, 1, 0, 1, 0, 1],
                          "loss": [1.0, 1.1, 2.0, 2.0, 3.0, 3.0], "rise": [0.0, 0.0, 0.0, -0.2, 0.0, -0.4]})
    pc = report_data.path_course(paths)
    assert len(pc.seeds) == 1 and pc.rise["a"]["mean"].tolist() == pytest.approx([0.0, -0.3])
    ck2 = ck.assign(passage_ce=[1.0, 1.0, 0.5, 0.7, float("nan"), float("nan")], twin_passage_ce=1.0)
    course = report_data.passage_course(ck2)
    assert course.textless == ["b"] and course.course["mean"].tolist() == pytest.approx([0.0, 0.4])
    assert report_data.barrier_course(ck.drop(columns="barrier"), m) is None
    assert report_data.distance_fraction_course(ck).frac.tolist() == [0.0, 1.0, 0.0, 1.0]


def test_the_answers_words_come_from_its_tests():
    """passage_findings: learned, more than an ordinary row in its place, lost: each a test's decision at α = 0.05
    (a positive effect with p < α), None where no test ran."""
    comp = pd.DataFrame([
        {"comparison": "fluent-fabricated vs twin, own passage at s + 50", "measure": "passage_ce_s50", "gain": 0.02,
         "p_t": 0.01, "label": "exploratory"},
        {"comparison": "fluent-fabricated vs twin, own passage at end", "measure": "passage_ce_final", "gain": 0.0,
         "p_t": 0.9, "label": "exploratory", "lost": False, "lost_p_t": 0.4},
        {"comparison": "fluent-attested vs twin, own passage at s + 50", "measure": "passage_ce_s50", "gain": 0.02,
         "p_t": 0.2, "label": "exploratory"},
        {"comparison": "random-chars vs twin, own passage at s + 50", "measure": "passage_ce_s50", "gain": -0.02,
         "p_t": 0.001, "label": "exploratory"},
    ])
    spec = pd.DataFrame([{"condition": "fluent-fabricated", "what": "vs ordinary rows", "step": 60, "diff": 0.01, "p_t": 0.03},
                         {"condition": "fluent-fabricated", "what": "specificity", "step": 60, "diff": 0.01, "p_t": np.nan},
                         {"condition": "fluent-attested", "what": "vs ordinary rows", "step": 110, "diff": 0.01, "p_t": 0.03}])
    fab, att, chars = report_data.passage_findings(comp, spec, 60)
    assert (fab.passage, fab.learned_shown, fab.beyond_ordinary_shown, fab.beyond_other_shown, fab.lost) == (
        "fluent-fabricated", True, True, None, False)
    assert att.learned_shown is False and att.beyond_ordinary is None and att.end is None and att.lost is None
    assert chars.learned_shown is False  # p < α, but the run predicts its passage worse: not "learned"
