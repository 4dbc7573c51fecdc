"""``seedlab twins report DIR``: ``DIR/report.md`` plus PNG figures beside it.

Read top to bottom, the module follows the report: load what ``twins measure`` wrote, the
design and its pre-registration, the headline (the paper's numbers beside ours), the paired
statistics, the normalized effects and the time course; the figures are twins/figures.py,
one function each. Every number is computed from the measured files; only the paper's own
numbers are constants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.reporting import Report, figure_block, fmt_num, fmt_p, md_table, p_text
from seedlab.store import write_text
from seedlab.twins import figures, stats
from seedlab.twins.config import INJECTED, MeasureConfig
from seedlab.twins.rundir import MEASURE_TABLES, RunDir

# "Learned, Then Lost" (shared/spec/single-example-counterfactual.md)
PAPER = {
    "gain_s50": {"fluent-fabricated": 0.0389, "fluent-attested": 0.0437},  # nats, p < 1e-4
    "p_final": {"fluent-fabricated": 0.25, "fluent-attested": 0.71},
    "barrier_fab_att": (0.00680, 0.509, 0.032),  # mean difference, p, MDE
    "barrier_pct": 3.0,
    "distance_pct": 44.1,
    "distance_mid_frac": 0.92,
    "peak_after": 100,  # steps after the injection where the loss difference peaks (step ~300, s = 200)
}


@dataclass
class Measured:
    """What ``seedlab twins measure`` wrote into a run folder, and the run's config.json."""

    dir: RunDir
    measures: pd.DataFrame
    checkpoints: pd.DataFrame
    timecourse: pd.DataFrame
    paths: pd.DataFrame
    meta: dict
    config: dict

    @property
    def steps(self) -> dict[str, int]:
        return self.meta["steps"]

    @property
    def settings(self) -> MeasureConfig:
        """The measurement settings the files were made with (their defaults: MeasureConfig's)."""
        return MeasureConfig.model_validate(self.meta["preregistration"]["measure"])


def load(root: str | Path) -> Measured:
    rd = RunDir(Path(root))
    tables = [rd.measure_table(name) for name in MEASURE_TABLES]
    missing = [p.name for p in [*tables, rd.measures_json] if not p.is_file()]
    if missing:
        raise SeedlabError(f"{rd.root}: no {missing[0]} (run `seedlab twins measure {rd.root}` first)")
    frames = [pd.read_parquet(p) for p in tables]
    return Measured(rd, *frames, json.loads(rd.measures_json.read_text()), json.loads(rd.config.read_text()))


def write_report(root: str | Path) -> Path:
    """Write ``root/report.md`` and its figures; returns the report's path."""
    d = load(root)
    outcomes = d.meta["preregistration"]["outcomes"]
    comp = stats.comparisons(d.measures, outcomes)
    norm = stats.normalized(d.measures)
    m = d.settings
    course = stats.time_course(d.timecourse, d.checkpoints, d.steps, smooth=m.smooth_steps, just_after=m.just_after_steps)
    rep = Report()
    rep.add("# Twins: a measured single-example counterfactual", intro(d))
    rep.add("## Pre-registration", preregistration(d))
    rep.add("## Headline: the paper's numbers beside this run's", headline(d, comp, norm, course))
    rep.add("## Learned, then lost: each passage's own cross-entropy", learned_then_lost(comp, d.steps))
    rep.add("## Fabricated vs attested, every measure", fab_vs_att(comp))
    rep.add("## Normalized effects: one example vs a different seed", normalized_table(norm))
    rep.add("## Time course", time_course_table(course, d))
    rep.add("## Figures")
    for fig in (figures.path_figure(d), figures.loss_diff_figure(d), figures.distance_barrier_figure(d),
                figures.cka_figure(d), figures.passage_figure(d), figures.distance_course_figure(d)):
        rep.add(figure_block(fig))
    return write_text(d.dir.report, rep.text())


# ---------------------------------------------------------------- sections


def intro(d: Measured) -> str:
    c, inj = d.config, d.measures[d.measures.kind == "injected"]
    seeds = sorted(set(inj.seed) | set(d.measures[d.measures.kind == "seed"].seed))
    lines = [
        f"Model `{c['model']}`, {c['steps']:,} steps of {c['batch_size']} rows, one row replaced at step "
        f"{c['injection_step']} (row {c['injection_row']}). Seeds measured: {', '.join(map(str, seeds)) or 'none'}; "
        f"conditions: {', '.join(sorted(set(inj.condition))) or 'none'}, each against the twin of its seed. "
        f"Steps below are optimizer updates completed: s = {d.steps['injection']}, s + 50 = {d.steps['s50']}, "
        f"mid-point = {d.steps['mid']}, end = {d.steps['final']}.",
    ]
    if d.meta["missing"]:
        lines.append(f"**Not measured (runs not finished):** {', '.join(d.meta['missing'])}.")
    n = inj.seed.nunique()
    if n < 8:
        lines.append(f"With {n} seeds the paired tests have little power (the paper used 8): read the minimum "
                     "detectable effects (MDE) before reading a p-value.")
    return "\n\n".join(lines)


def preregistration(d: Measured) -> str:
    path = d.dir.preregistration
    used = d.meta["preregistration"]
    order = {"primary": 0, "secondary": 1, "exploratory": 2}
    rows = sorted(([k, v] for k, v in used["outcomes"].items()), key=lambda r: (order.get(r[1], 3), r[0]))
    table = md_table(["outcome", "label"], rows)
    if not path.is_file():
        return table + "\n\n**No preregistration.json in the run folder: the outcomes were not fixed before training.**"
    before = json.loads(path.read_text())
    if before["hash"] == used["hash"]:
        return table + f"\n\nFixed before training (preregistration.json, hash `{before['hash']}`); unchanged since."
    changed = [k for k in set(before["outcomes"]) | set(used["outcomes"]) if before["outcomes"].get(k) != used["outcomes"].get(k)]
    what = (f"outcome labels changed: {', '.join(sorted(changed))}" if changed else "measurement settings changed")
    return table + (f"\n\n**Changed after pre-registration** ({what}; hash `{before['hash']}` before training, "
                    f"`{used['hash']}` when measured). The labels above are the ones used now.")


def _get(comp: pd.DataFrame, comparison: str, measure: str) -> pd.Series | None:
    row = comp[(comp.comparison == comparison) & (comp.measure == measure)]
    return row.iloc[0] if len(row) else None


def headline(d: Measured, comp: pd.DataFrame, norm: pd.DataFrame, course: pd.DataFrame) -> str:
    rows = []
    for cond in ("fluent-fabricated", "fluent-attested"):
        res = _get(comp, f"{cond} vs twin, own passage at s + 50", "passage_ce_s50")
        if res is not None:
            rows.append([f"passage learned at s + 50 ({cond}): twin − injected CE",
                         f"{PAPER['gain_s50'][cond]:.4f} nats, p < 1e-4", f"{-res['diff']:.4f} nats, {p_text(res['p_t'])}"])
        res = _get(comp, f"{cond} vs twin, own passage at end", "passage_ce_final")
        if res is not None:
            rows.append([f"passage at the end ({cond})", f"p = {PAPER['p_final'][cond]}", f"{-res['diff']:.4f} nats, {p_text(res['p_t'])}"])
    res = _get(comp, "fabricated vs attested", "barrier")
    if res is not None:
        diff, p, mde = PAPER["barrier_fab_att"]
        rows.append(["barrier, fabricated − attested", f"{diff:+.5f}, p = {p}, MDE {mde} ({diff / mde:.2f}× MDE)",
                     f"{res['diff']:+.5f}, {p_text(res['p_t'])}, MDE {fmt_num(res['mde'])} ({fmt_num(res['diff_over_mde'])}× MDE)"])
    inj = norm[norm.condition.isin(INJECTED[:2])]
    if len(inj):
        rows.append(["barrier shift, % of inter-seed barrier", f"{PAPER['barrier_pct']}%", _pct(inj.barrier.mean(), inj.seed_barrier.iloc[0])])
        rows.append(["distance, % of inter-seed distance", f"{PAPER['distance_pct']}%", _pct(inj.distance.mean(), inj.seed_distance.iloc[0])])
    fl = course[course.condition.isin(INJECTED[:2])]
    if len(fl):
        rows.append(["distance at mid-point / at the end", f"{100 * PAPER['distance_mid_frac']:.0f}%", f"{100 * fl.distance_mid_frac.mean():.0f}%"])
        rows.append(["loss difference peaks, steps after injection", f"~{PAPER['peak_after']} (~100× just after)",
                     f"{fl.peak_step.mean() - d.steps['injection']:.0f} ({fmt_num(fl.peak_over_just_after.mean())}× just after)"])
    note = ("Fluent conditions pooled where the paper pools them; the CPU scale changes the absolute numbers "
            "(model, corpus and steps are far smaller), so compare directions and orders of magnitude.")
    return md_table(["", "paper", "this run"], rows) + "\n\n" + note


def _pct(x: float, base: float) -> str:
    return f"{100 * x / base:.1f}%" if base and np.isfinite(base) and base > 0 else "n/a (no seed pair)"


def _stat_rows(rows: pd.DataFrame, name) -> list[list[str]]:
    return [[name(r), r["label"], str(r["n"]), f"{r['mean_a']:.4g}", f"{r['mean_b']:.4g}", f"{r['diff']:+.4g}",
             f"[{fmt_num(r['ci_low'])}, {fmt_num(r['ci_high'])}]", fmt_p(r["p_t"]), fmt_p(r["p_perm"]) + ("" if r["perm_exact"] else " (MC)"),
             fmt_num(r["mde"])] for _, r in rows.iterrows()]


HEAD = ["", "label", "n", "mean a", "mean b", "a − b", "95% CI", "p (t)", "p (sign-flip)", "MDE"]


def learned_then_lost(comp: pd.DataFrame, steps: dict) -> str:
    rows = comp[comp.measure.isin(["passage_ce_s50", "passage_ce_final"])]
    if not len(rows):
        return "*No injected condition measured.*"
    return ("a = the injected run's CE on its own passage, b = its twin's CE on the same passage (nats/token); "
            "negative a − b: the passage was learned.\n\n" + md_table(HEAD, _stat_rows(rows, lambda r: r["comparison"])))


def fab_vs_att(comp: pd.DataFrame) -> str:
    rows = comp[comp.comparison == "fabricated vs attested"]
    if not len(rows):
        return "*Needs both fluent conditions measured on the same seeds.*"
    return ("a = fabricated, b = attested, paired by seed. MDE: the smallest true difference the design "
            "detects with 80% power at α = 0.05 (paired t).\n\n"
            + md_table(HEAD, _stat_rows(rows, lambda r: stats.MEASURES[r["measure"]][1])))


def normalized_table(norm: pd.DataFrame) -> str:
    if not len(norm):
        return "*No injected condition measured.*"
    rows = [[r.condition, str(r.n), f"{r.barrier:.4g}", f"{r.rise_mid:+.3g}", fmt_num(r.seed_barrier), _pct(r.barrier, r.seed_barrier),
             f"{r.distance:.4g}", fmt_num(r.seed_distance), _pct(r.distance, r.seed_distance)] for r in norm.itertuples()]
    return ("Barrier and distance to the twin (mean over seeds), and the same between twins of different seeds. "
            "The inter-seed distance is inflated by gauge freedom (rotated bases computing the same function), "
            "so the distance ratio is a lower bound, as in the paper.\n\n"
            + md_table(["condition", "seeds", "barrier", "rise at α=0.5", "seed barrier", "barrier %", "distance", "seed distance", "distance %"], rows))


def time_course_table(course: pd.DataFrame, d: Measured) -> str:
    if not len(course):
        return "*No injected condition measured.*"
    rows = [[r.condition, str(r.peak_step), f"{r.peak:.3g}", f"{r.just_after:.3g}", fmt_num(r.peak_over_just_after), f"{r.final:.3g}",
             f"{100 * r.distance_mid_frac:.0f}%"] for r in course.itertuples()]
    return (f"|training loss − twin's| per step, mean over seeds, smoothed over {d.settings.smooth_steps} steps; "
            f"'just after' = the {d.settings.just_after_steps} steps after the injected batch.\n\n"
            + md_table(["condition", "peak step", "peak", "just after", "peak / just after", "at the end", "distance at mid / end"], rows))
