"""twins.dose: "is it the passage?" as a dose–response, on hand-made tables (no training): a passage planted above the
ordinary rows' line is found, one on it is not; the log–log rule; no fit with too few arms or seeds; the t interval's
coverage at 4 seeds by simulation; the own-text drop against the text's CE at s; dose.json read back; the section and
figure rendered (figcheck), and on the tiny real design only where its arms recorded a dose."""

from __future__ import annotations

import json

import figcheck
import numpy as np
import pandas as pd
import pytest

from seedlab.twins import dose, figures, report_dose
from seedlab.twins.rundir import Measured, RunDir
from seedlab.twins.variants import split_weight

S, END = 10, 40  # the hand-made runs' injection step and end
FAB, ATT = "fluent-fabricated", "fluent-attested"


def tables(*, seeds=(0, 1, 2, 3), ordinary=4, ordinary_weights=(0.5, 0.25), arms=None, noise=0.03, seed=0,
           barrier_zero=False):
    """measures, checkpoints and doses frames of a hand-made measured run: per seed a line log10 y = a_k + b_k log10 x
    (its own intercept and slope) through ``ordinary`` ordinary rows (doses around 1, per seed different) and their
    row-weight arms on ordinary-row.0; ``arms``: {arm: (dose, factor)} placed at ``factor`` × the seed's line at
    ``dose`` (factor 1: on it). Held-out CE: 0.01 × dose + noise (some values negative); own-text drops 0.1 × the
    text's CE at s + noise (the nulls have no text); barrier like the distance × 0.001 (one ordinary value 0 with
    ``barrier_zero``)."""
    rng = np.random.default_rng(seed)
    arms = arms if arms is not None else {FAB: (1.1, 1.0), ATT: (1.05, 1.0), "random-chars": (1.6, 1.0),
                                          "matched-gradient": (1.1, 1.0), "nudge": (1e-4, 1.0)}
    m, ck, ds = [], [], []
    for k in seeds:
        a, b = rng.normal(0.5, 0.1), rng.normal(0.9, 0.05)
        runs = {f"ordinary-row.{i}": (10 ** rng.uniform(-0.2, 0.2), 1.0) for i in range(ordinary)}
        base = runs["ordinary-row.0"][0] if ordinary else 1.0
        runs |= {f"ordinary-row.0@w{w:g}": (base * w, 1.0) for w in ordinary_weights if ordinary}
        runs |= arms
        for arm, (x, factor) in runs.items():
            dist = factor * 10 ** (a + b * np.log10(x) + rng.normal(0, noise))
            text = not arm.startswith(("matched-gradient", "nudge", "weight-kick", "sign-gradient"))
            ce_s = (8.0 if arm.startswith("random-chars") else rng.uniform(3, 6)) if text else np.nan
            drop50, drop = (0.1 * ce_s + rng.normal(0, 0.01), 0.02 * ce_s + rng.normal(0, 0.01)) if text else (np.nan,) * 2
            m.append({"kind": "injected", "seed": k, "condition": arm, "step": END, "distance": dist,
                      "distance_aligned": np.nan, "barrier": 0.001 * dist, "heldout_ce_diff": 0.01 * x + rng.normal(0, 0.005),
                      "passage_ce_s50": ce_s - drop50, "twin_passage_ce_s50": ce_s, "passage_ce_final": ce_s - drop,
                      "twin_passage_ce_final": ce_s})
            ck.append({"seed": k, "condition": arm, "step": S, "passage_ce": ce_s, "twin_passage_ce": ce_s})
            ds.append({"seed": k, "condition": arm, "step": S, "theta_l2": x, "theta_q50": x / 1e3, "theta_q90": x / 1e2,
                       "theta_q99": x / 10, "theta_max": x, "changed_fraction": 0.9, "exp_avg_l2": x / 10,
                       "exp_avg_sq_l2": x / 1e4})
    m = pd.DataFrame(m)
    if barrier_zero:
        m.loc[m.condition == "ordinary-row.1", "barrier"] = 0.0
    m = pd.concat([m, pd.DataFrame([{"kind": "seed", "seed": 0, "condition": "twin", "distance": 30.0}])], ignore_index=True)
    return m, pd.DataFrame(ck), pd.DataFrame(ds)


def response(**kw) -> dose.DoseResponse:
    m, ck, ds = tables(**kw)
    return dose.dose_response(dose.arm_table(m, ck, ds, S))


def _row(dr, measure, arm):
    r = dr.residuals
    return r[(r.measure == measure) & (r.condition == arm)].iloc[0]


def test_arm_names_their_weight_and_text():
    assert split_weight("fluent-fabricated@w0.25") == (FAB, 0.25)
    assert split_weight("ordinary-row.3@w0.5") == ("ordinary-row.3", 0.5)
    assert split_weight("ordinary-row.3") == ("ordinary-row.3", 1.0) and split_weight("nudge") == ("nudge", 1.0)
    texts = {FAB: [1], "ordinary-row.0": [2]}
    assert dose.own_text("fluent-fabricated@w0.25", texts) == FAB and dose.own_text("ordinary-row.0@w0.5", texts) == "ordinary-row.0"
    assert dose.own_text("nudge", texts) is None and dose.own_text(FAB, texts) == FAB
    assert dose.role_of("ordinary-row.0@w0.5") == ("ordinary", "ordinary-rows")
    assert dose.role_of("fluent-fabricated@w0.25") == ("passage", FAB) and dose.role_of("weight-kick") == ("null", "weight-kick")


def test_a_passage_above_the_line_is_found_and_one_on_it_is_not():
    arms = {FAB: (1.1, 1.5), "fluent-fabricated@w0.25": (0.3, 1.5), ATT: (1.05, 1.0), "weight-kick": (1.0, 0.5),
            "matched-gradient": (1.2, 1.0)}
    dr = response(arms=arms)
    line = dr.line_rows.set_index("measure").loc["distance"]
    assert line.fitted and line.scale == "log-log" and line.seeds == 4 and line.points == 4 * 6
    assert line.slope_low < 0.9 < line.slope_high  # the planted exponent
    fab, att = _row(dr, "distance", FAB), _row(dr, "distance", ATT)
    assert fab.verdict == "above the line" and fab.low > 0 and fab.resid == pytest.approx(np.log10(1.5), abs=0.05)
    assert att.verdict == "not shown to differ from the line" and att.low < 0 < att.high
    assert _row(dr, "distance", "fluent-fabricated@w0.25").verdict == "above the line"  # its weight arm, at a lower dose
    assert _row(dr, "distance", "weight-kick").verdict == "below the line"
    assert _row(dr, "distance", "matched-gradient").verdict == "not shown to differ from the line"
    assert set(dr.residuals.role) == {"passage", "null"}  # the ordinary rows are the line, never tested against it
    tested = dr.residuals[dr.residuals.p.notna()]
    assert (tested.p_holm >= tested.p).all() and tested.p_holm.notna().all()  # one Holm family over the table
    assert (tested.holm == (tested.p_holm < 0.05)).all() and _row(dr, "distance", "weight-kick").holm is True
    # the numbers the report prints: the residual as a factor of the line on log–log; words from the interval only
    text = report_dose.dose_section(dr)
    assert "×1.5" in text or "×1.4" in text or "×1.6" in text
    assert "the same" not in text and "equal" not in text.replace("equivalence", "")
    assert "above the line" in report_dose.dose_in_words(dr) or "above on distance" in report_dose.dose_in_words(dr)


def test_the_residual_is_the_test_the_arrays_give():
    """residuals() is line_residuals on each seed's points: the same numbers from the table and from the arrays."""
    m, ck, ds = tables(arms={FAB: (1.1, 1.2)}, ordinary_weights=())
    t = dose.arm_table(m, ck, ds, S)
    dr = dose.dose_response(t)
    o, p = t[t.role == "ordinary"].sort_values(["seed", "condition"]), t[t.condition == FAB].sort_values("seed")
    x, y = np.log10(o.dose.to_numpy()).reshape(4, 4), np.log10(o.distance.to_numpy()).reshape(4, 4)
    ci = dose.line_residuals(x, y, np.log10(p.dose.to_numpy()), np.log10(p.distance.to_numpy()))
    r = _row(dr, "distance", FAB)
    assert (r.resid, r.low, r.high, r.p) == pytest.approx((ci.mean, ci.low, ci.high, ci.p))


def test_the_log_rule_is_every_dose_and_value_positive_throughout():
    dr = response()
    rows = dr.line_rows.set_index("measure")
    assert rows.loc["distance", "scale"] == "log-log" and rows.loc["distance", "rule"].startswith("log–log: every dose")
    assert rows.loc["barrier", "scale"] == "log-log"
    assert rows.loc["heldout_ce_diff", "scale"] == "linear" and "≤ 0" in rows.loc["heldout_ce_diff", "rule"]
    zero = response(barrier_zero=True).line_rows.set_index("measure").loc["barrier"]
    assert zero.scale == "linear" and zero.rule.startswith("linear: 4 of ") and zero.fitted  # one arm on 4 seeds
    # one null's value at 0 is enough: the rule holds over every arm and seed, not the ordinary rows alone
    m, ck, ds = tables()
    m.loc[m.condition == "nudge", "barrier"] = 0.0
    assert dose.dose_response(dose.arm_table(m, ck, ds, S)).lines["barrier"].scale == "linear"
    assert dose.scale_of([1, 2], [1, -1]) == ("linear", "linear: 1 of 2 values ≤ 0 (log–log needs every one positive)")
    assert dose.scale_of([0, 2], [1, 1])[0] == "linear" and dose.scale_of([np.nan], [np.nan]) == ("", "no value measured")


def test_no_fit_with_too_few_ordinary_arms_or_seeds_and_it_is_said():
    few_arms = response(ordinary=2, ordinary_weights=())
    assert not few_arms.line_rows.fitted.any() and not len(few_arms.residuals)
    note = few_arms.line_rows.set_index("measure").loc["distance", "note"]
    assert note.startswith("no fit: 0 seed(s) with a line, the fit needs 3") and "seed 0: 2" in note
    few_seeds = response(seeds=(0, 1))
    assert not few_seeds.line_rows.fitted.any()
    assert few_seeds.line_rows.set_index("measure").loc["distance", "note"] == "no fit: 2 seed(s) with a line, the fit needs 3"
    aligned = response().line_rows.set_index("measure").loc["distance_aligned"]
    assert not aligned.fitted and "only between twins of different seeds" in aligned.note
    # a seed whose ordinary rows share one dose has no line (left out; three seeds remain)
    m, ck, ds = tables()
    ds.loc[(ds.seed == 0) & ds.condition.str.startswith("ordinary"), "theta_l2"] = 1.0
    dr = dose.dose_response(dose.arm_table(m, ck, ds, S))
    assert dr.lines["distance"].seeds == [1, 2, 3] and dr.lines["distance"].fitted
    # an arm on fewer than 3 of the line's seeds: no interval, said
    m, ck, ds = tables()
    keep = ~((m.condition == FAB) & m.seed.isin([2, 3]))
    r = _row(dose.dose_response(dose.arm_table(m[keep], ck, ds, S)), "distance", FAB)
    assert r.verdict == "no interval" and r.note == "measured on 2 of the line's seeds (needs 3)" and np.isnan(r.p_holm)
    # rendered: the table says why, and no residual table
    text = report_dose.dose_section(few_seeds)
    assert "no fit: 2 seed(s) with a line" in text and "*No measure has a line: no residual to test.*" in text


def test_the_interval_covers_at_four_seeds_by_simulation():
    """The t interval over 4 seeds of per-seed residuals from per-seed lines (seeds differing in intercept, slope and
    doses; the passage inside or beyond the ordinary doses): ~95% coverage of a passage on the line with one scatter
    for every seed, not below it when each seed has its own scatter or the noise has heavy tails; a passage 25% above
    the line found far more often than 5%."""
    rng = np.random.default_rng(1)
    reps, seeds, arms = 4000, 4, 6
    x = rng.uniform(-0.4, 0.4, (reps, seeds, arms))  # log10 doses, different for every seed
    a = rng.normal(0.5, 0.2, (reps, seeds, 1))
    b = rng.normal(0.9, 0.1, (reps, seeds, 1))

    def coverage(sd, x_arm, noise=rng.normal, shift=0.0):
        y = a + b * x + rng.normal(0, 1, x.shape) * sd
        y_arm = a[..., 0] + b[..., 0] * x_arm + noise(size=(reps, seeds)) * sd[..., 0] + shift
        ci = dose.line_residuals(x, y, np.full((reps, seeds), x_arm), y_arm)
        return float(((ci.low <= 0) & (0 <= ci.high)).mean()), float((ci.low > 0).mean())

    same, own = np.full((reps, seeds, 1), 0.05), rng.uniform(0.02, 0.08, (reps, seeds, 1))  # one scatter; each seed's
    for x_arm in (0.05, 0.8):  # inside the ordinary doses; well beyond them (an extrapolation)
        assert 0.935 <= coverage(same, x_arm)[0] <= 0.965, x_arm  # 4000 draws: the Monte Carlo sd is 0.0034
        assert 0.935 <= coverage(own, x_arm)[0] <= 0.98, x_arm
        assert coverage(same, x_arm, shift=np.log10(1.25))[1] > (0.5 if x_arm < 0.5 else 0.2), x_arm
    assert coverage(own, 0.05, noise=lambda size: rng.standard_t(3, size))[0] >= 0.935  # heavy tails (t, 3 df)


def test_the_own_text_drop_against_the_texts_ce_at_s():
    dr = response()
    f = dr.fraction.set_index(["group", "weight"])
    assert {(FAB, 1.0), (ATT, 1.0), ("random-chars", 1.0), ("ordinary-rows", 1.0), ("ordinary-rows", 0.5),
            ("ordinary-rows", 0.25)} == set(f.index)  # no row for a null without a text
    assert f.loc[("ordinary-rows", 1.0), "arms"] == 4 and f.loc[(FAB, 1.0), "n"] == 4
    assert f.loc[("random-chars", 1.0), "ce_s"] == pytest.approx(8.0)
    for key in f.index:  # the planted fractions: 0.1 at s + 50, 0.02 at the end
        assert f.loc[key, "frac_s50_low"] < f.loc[key, "frac_s50"] < f.loc[key, "frac_s50_high"]
        assert f.loc[key, "frac_s50"] == pytest.approx(0.1, abs=0.01) and f.loc[key, "frac_final"] == pytest.approx(0.02, abs=0.01)
    c = dr.ce_slope.set_index("when")
    assert c.loc["s + 50", "slope_low"] < 0.1 < c.loc["s + 50", "slope_high"] and c.loc["s + 50", "seeds"] == 4
    assert c.loc["s + 50", "texts"] == 7  # 3 passages + 4 ordinary rows at weight 1; the weight arms left out
    assert c.loc["the end", "slope_low"] < 0.02 < c.loc["the end", "slope_high"]
    two = response(seeds=(0, 1)).ce_slope.set_index("when")
    assert two.loc["the end", "note"] == "no fit: 2 seed(s) with 3 texts or more, the fit needs 3"
    assert np.isnan(two.loc["the end", "slope"])
    text = report_dose.text_fraction_section(dr)
    assert "`ordinary-rows` @w0.5" in text and "nats of drop per nat of CE at s" in text


def test_the_own_text_ce_at_s_is_read_from_the_checkpoints_at_s():
    m, ck, ds = tables()
    ck = pd.concat([ck, ck.assign(step=END, twin_passage_ce=99.0)])  # another step's CE is not the one at s
    t = dose.arm_table(m, ck, ds, S)
    assert (t.ce_s.dropna() < 99).all() and t[t.condition == "nudge"].ce_s.isna().all()


def test_dose_json_is_read_through_the_rundir(tmp_path):
    rd = RunDir(tmp_path)
    d = Measured(rd, *[pd.DataFrame()] * 5, {"steps": {"injection": S}}, {})
    assert d.doses.empty and list(d.doses.columns)[:4] == ["seed", "condition", "step", "theta_l2"]
    assert dose.summarize(d) is None  # no arm recorded its dose: nothing to fit, no section
    for k, arm, l2 in ((1, FAB, 2.0), (0, "ordinary-row.0@w0.5", 0.5), (0, FAB, 1.0), (0, "nudge", 1e-7)):
        rd.dose(k, arm).parent.mkdir(parents=True, exist_ok=True)
        rd.dose(k, arm).write_text(json.dumps({
            "step": S, "theta": {"l2": l2, "per_tensor": {"w": l2}, "abs_quantiles": {"0.5": 0.1, "0.9": 0.2, "0.99": 0.3,
                                                                                    "1.0": 0.4}, "changed_fraction": 0.75},
            **({"exp_avg": None, "exp_avg_sq": None} if arm == "nudge" else  # an optimizer without moments (SGD)
               {"exp_avg": {"l2": 0.01, "per_tensor": {}}, "exp_avg_sq": {"l2": 1e-5, "per_tensor": {}}})}))
    got = d.doses
    assert list(zip(got.seed, got.condition, got.theta_l2)) == [(0, FAB, 1.0), (0, "nudge", 1e-7),
                                                                (0, "ordinary-row.0@w0.5", 0.5), (1, FAB, 2.0)]
    assert got.loc[1, ["exp_avg_l2", "exp_avg_sq_l2"]].isna().all()
    assert got.loc[0, ["theta_q50", "theta_max", "changed_fraction", "exp_avg_l2", "exp_avg_sq_l2"]].tolist() == [
        0.1, 0.4, 0.75, 0.01, 1e-5]


def test_the_dose_figure_and_section_render(tmp_path, monkeypatch):
    dr = response(arms={FAB: (1.1, 1.5), "fluent-fabricated@w0.25": (0.3, 1.5), ATT: (1.05, 1.0),
                        "random-chars": (1.6, 1.0), "weight-kick": (1.0, 0.5), "nudge": (1e-4, 1.0)})

    class Dir:
        def figure(self, name):
            return tmp_path / name

    class D:
        dir = Dir()

    figs = figcheck.capture(monkeypatch, figures)
    fig = figures.dose_figure(D(), dr)
    assert fig.path == tmp_path / "dose.png" and fig.path.stat().st_size > 5000
    figcheck.check_all(figs)
    drawn = figs["dose.png"]
    assert len([ax for ax in drawn.axes if ax.get_visible()]) == int(dr.line_rows.fitted.sum()) == 5  # not the aligned one
    assert "aligned distance" in fig.caption or "distance_aligned" in fig.caption
    labels = {t.get_text() for lg in drawn.legends for t in lg.texts}
    assert {"ordinary rows", FAB, ATT, "random-chars", "weight-kick", "nudge"} <= labels
    assert figcheck.legend_styles(drawn)[FAB] == {(figcheck.to_hex(figures.color(FAB)), None, None, None)}
    none = figures.dose_figure(D(), response(seeds=(0, 1)))
    assert none.path is None and "no measure has an ordinary rows' line" in none.caption
    text = report_dose.dose_record_table(dr)
    assert "| `fluent-fabricated@w0.25` | passage | 4 |" in text and "‖Δm‖" in text


def test_the_report_has_the_section_only_where_arms_recorded_their_dose(design, tmp_path, seedlab_main):
    """The tiny real design (2 seeds, 2 ordinary rows): with the fork loop's dose.json files the report has the dose
    section, which says there is no fit and why; without them (a run trained before the fork loop wrote them) the
    report is the same text less that section, and no dose figure."""
    from helpers import copy_run

    run = copy_run(design, tmp_path)
    files = sorted(run.glob("seed-*/*/dose.json"))
    cfg = json.loads((run / "config.json").read_text())
    assert len(files) == len(cfg["seeds"]) * 8  # every arm and the twin, each seed (forks/dose.py)
    assert seedlab_main("twins", "report", str(run))[0] == 0
    text = (run / "report.md").read_text()
    head = "## Is it the passage? Each arm against the ordinary rows' dose line"
    assert head in text and text.index("## Is it the passage? Each passage") < text.index(head) < text.index("## Learned, then lost?")
    assert "no fit: 0 seed(s) with a line, the fit needs 3; too few ordinary arms on seed 0: 2, seed 1: 2" in text
    assert "*Skipped: no measure has an ordinary rows' line" in text and "**Every arm's dose at s**" in text
    assert "| `ordinary-row.1` | ordinary | 2 |" in text and "| `twin` |" not in text  # the twin is no arm of the line
    assert "**The own-text drop against how surprising the text was.**" in text and "On the ordinary rows' dose line" not in text
    kept = pd.read_csv(run / "dose-arms.csv")  # the section's tables beside the report, for a kept copy and the ledger
    assert {"seed", "condition"} <= set(kept.columns) and len(kept) == len(cfg["seeds"]) * 7
    assert all((run / f"dose-{n}.csv").is_file() for n in ("lines", "residuals", "fraction", "ce-slope"))
    d = Measured.read(run)
    injected = d.doses[d.doses.condition != "twin"]
    assert (injected.theta_l2 > 0).all() and (d.doses[d.doses.condition == "twin"].theta_l2 == 0).all()
    for f in files:
        f.unlink()
    (run / "dose.png").unlink(missing_ok=True)
    assert seedlab_main("twins", "report", str(run))[0] == 0
    before = (run / "report.md").read_text()
    cut = text.index(head)
    assert before == text[:cut] + text[text.index("\n## ", cut) + 1:]  # the same report, less the section
    assert not (run / "dose.png").exists()
