"""The report of a sweep (or one ensemble run): ``report.md`` plus PNG figures beside it.

Read top to bottom, the module follows the report: load the summary, the opening
paragraph (question and a data-derived answer), the headline tables laid out like
the paper's, the statistics (Fisher tests between ratios, the logistic
capacity × ratio interaction, from :mod:`seedlab.shortcut.stats`), then the figures
(:mod:`seedlab.shortcut.figures`) with the tables that go with them. Every number in the
report is computed from the folder's tables; only the paper's own numbers are
constants (``PAPER``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.reporting import Report, figure_block, fmt_num, fmt_p, md_table, p_text, pct
from seedlab.shortcut import figures
from seedlab.shortcut.circuits_report import circuits_section
from seedlab.shortcut.figures import CAPACITY, cap_label, fmt_ratio, paper_order
from seedlab.shortcut.rundir import RunDir, SweepDir, open_folder
from seedlab.shortcut.stats import chance, interaction_logit, ratio_contrasts, simple_slopes
from seedlab.stats import fisher, rate_table, wilson
from seedlab.store import write_text

# The paper's headline (task sum2-max, weight decay 0.1): (layers, ratio) -> % of seeds that generalize.
PAPER_TASK, PAPER_WD = "sum2-max", 0.1
PAPER = {(2, 0.5): 0, (2, 0.9): 77, (1, 0.5): 33, (1, 0.9): 0}

GROUP = ["task", "weight_decay"]  # one headline table per group


def write_report(run_dir: str | Path) -> Path:
    """Write the folder's ``report.md`` and its figures; returns the report's path."""
    folder = open_folder(run_dir)
    summary = load_summary(folder)
    rates = rate_cells(summary)
    rep = Report()
    rep.add("# Shortcut saturation: sweep report")
    rep.add(intro(summary, isinstance(folder, SweepDir)))
    rep.add("## Headline: generalization rate", headline_note())
    for (task, wd), cells in rates.groupby(GROUP, sort=True):
        rep.add(headline_table(task, wd, cells))
    rep.add("## Statistics", ratio_contrasts_section(summary), interaction_section(summary), threshold_section(summary))
    rep.add("## Figures")
    rep.add(figure_block(figures.rate_vs_ratio_figure(summary, rates, folder)))
    rep.add(figure_block(figures.curves_figure(summary, folder, *answer_group(summary))))
    rep.add(figure_block(figures.gen_epoch_figure(summary, folder)))
    rep.add(figure_block(figures.transient_figure(summary, folder)), transient_counts(summary))
    rep.add("## Mechanism", "### Phases", phases_table(summary))
    rep.add(figure_block(figures.aligned_figure(summary, folder)))
    for fig in figures.gradient_figures(summary, folder):
        rep.add(figure_block(fig))
    rep.add(gradient_tables(summary, folder))
    for fig in figures.circuit_figures(summary, folder):
        rep.add(figure_block(fig))
    rep.add(circuits_section(summary, *(pd.read_parquet(p) if p.is_file() else None
                                        for p in (folder.circuits_path, folder.patching_path))))
    return write_text(folder.report_path, rep.text())


# ---------------------------------------------------------------- loading


def load_summary(folder: RunDir | SweepDir) -> pd.DataFrame:
    """The folder's per-member summary (a run folder's or a sweep's merged one)."""
    path = folder.summary_path
    if not path.is_file():
        raise SeedlabError(f"{folder.root}: no summary.parquet (run `seedlab shortcut sweep` first)")
    df = pd.read_parquet(path)
    if df.empty:
        raise SeedlabError(f"{path}: no members (the sweep wrote an empty summary)")
    df["generalized"] = df["generalized"].astype(bool)
    return df


def rate_cells(summary: pd.DataFrame) -> pd.DataFrame:
    """Generalization rate with its Wilson interval for every task × wd × capacity × ratio cell."""
    return rate_table(summary, by=[*GROUP, *CAPACITY, "ratio"])


# ---------------------------------------------------------------- the paper's numbers


def paper_pct(task: str, wd: float, layers: int, ratio: float) -> int | None:
    """The paper's rate for this cell, when it reports one."""
    if task != PAPER_TASK or not np.isclose(wd, PAPER_WD):
        return None
    for (lay, r), v in PAPER.items():
        if lay == layers and np.isclose(r, ratio):
            return v
    return None


# ---------------------------------------------------------------- opening paragraph


def intro(summary: pd.DataFrame, is_sweep: bool) -> str:
    tasks = sorted(summary["task"].unique())
    caps = sorted({cap_label(lay, h) for lay, h in summary[CAPACITY].drop_duplicates().itertuples(index=False)})
    ratios = ", ".join(fmt_ratio(r) for r in sorted(summary["ratio"].unique()))
    wds = ", ".join(f"{w:g}" for w in sorted(summary["weight_decay"].unique()))
    n, k = len(summary), int(summary["generalized"].sum())
    jobs = summary["job"].nunique() if "job" in summary else 1
    config = " The sweep's config is in `sweep.yaml`." if is_sweep else ""
    return (
        f"{n} members ({jobs} job{'s' * (jobs != 1)}) over {len(tasks)} task{'s' * (len(tasks) != 1)} "
        f"({', '.join(tasks)}); capacities {', '.join(caps)}; ratios r = {ratios}; weight decay {wds}. "
        f"{k} of {n} members generalized (adversarial accuracy reached 100% at some evaluation).{config}\n\n"
        f"**Question:** does imbalance help a 2-layer model and hurt a 1-layer one?\n\n"
        f"**Answer from this sweep:** {answer(summary)}"
    )


def answer_group(summary: pd.DataFrame) -> tuple[str, float]:
    """The (task, wd) the answer speaks about: the paper's when present, else the first."""
    groups = sorted(summary[GROUP].drop_duplicates().itertuples(index=False, name=None))
    for task, wd in groups:
        if task == PAPER_TASK and np.isclose(wd, PAPER_WD):
            return task, wd
    return groups[0]


def contrast_ratios(task: str, ratios: list[float]) -> tuple[float, float] | None:
    """(balanced, imbalanced): the paper's 0.5 / 0.9 for binary tasks when present, else the
    ratio nearest chance and the one farthest from it. None when they coincide."""
    c = chance(task)
    if np.isclose(c, 0.5) and any(np.isclose(r, 0.5) for r in ratios) and any(np.isclose(r, 0.9) for r in ratios):
        return 0.5, 0.9
    if len(ratios) < 2:
        return None
    bal = min(ratios, key=lambda r: abs(r - c))
    imb = max(ratios, key=lambda r: abs(r - c))
    return None if np.isclose(abs(bal - c), abs(imb - c)) else (bal, imb)


def answer(summary: pd.DataFrame) -> str:
    """One sentence, derived from the data: how each depth's rate moves from balanced to imbalanced."""
    task, wd = answer_group(summary)
    sub = summary[(summary["task"] == task) & np.isclose(summary["weight_decay"], wd)]
    where = f"In {task} (weight decay {wd:g}, heads pooled)"
    pair = contrast_ratios(task, sorted(sub["ratio"].unique()))
    if pair is None or not {1, 2} <= set(sub["layers"].unique()):
        return f"{where}: not determinable — it needs both 1L and 2L models at a balanced and an imbalanced ratio."
    bal, imb = pair
    moves = {}
    for layers in (2, 1):
        d = sub[sub["layers"] == layers]
        kb, nb = _kn(d[np.isclose(d["ratio"], bal)])
        ki, ni = _kn(d[np.isclose(d["ratio"], imb)])
        if nb == 0 or ni == 0:
            return f"{where}: not determinable — {layers}L has no members at r={fmt_ratio(bal if nb == 0 else imb)}."
        rb, ri = kb / nb, ki / ni
        verb = "rises" if ri > rb else "falls" if ri < rb else "stays"
        _, p = fisher(ki, ni, kb, nb)
        moves[layers] = (verb, rb, ri, p)
    v2, v1 = moves[2][0], moves[1][0]
    try:  # the flip itself: both simple slopes, the intersection-union test
        sl = simple_slopes(sub[sub["layers"].isin([1, 2])])
    except ValueError:
        sl = None
    if sl is not None and sl["flip"]:
        verdict = f"Yes: the flip is shown (1L slope < 0 and 2L slope > 0, intersection-union test {p_text(sl['p_flip'])})"
    elif (v2, v1) == ("rises", "falls"):
        how = f"intersection-union test of the flip {p_text(sl['p_flip'])}" if sl else "the slopes are not estimable"
        verdict = f"In direction only: the flip is not shown ({how})"
    else:
        verdict = "Partly" if v2 == "rises" or v1 == "falls" else "No"

    def phrase(layers: int, first: bool) -> str:
        verb, rb, ri, p = moves[layers]
        rs = f" at r={fmt_ratio(bal)}" if first else ""
        ri_s = f" at r={fmt_ratio(imb)}" if first else ""
        if verb == "stays":
            move = f"stays at {pct(rb)} at both ratios"
        else:
            move = f"{verb} from {pct(rb)}{rs} to {pct(ri)}{ri_s}"
        return f"{layers}L rate {move} (Fisher {p_text(p)})"

    return f"{verdict}. {where}, {phrase(2, True)}, while {phrase(1, False)}."


def _kn(d: pd.DataFrame) -> tuple[int, int]:
    return int(d["generalized"].sum()), len(d)


# ---------------------------------------------------------------- headline tables


def headline_note() -> str:
    return (
        "Cells: rate [95% Wilson interval] (generalized/seeds). Where the paper reports the cell "
        f"({PAPER_TASK}, weight decay {PAPER_WD:g}), its number follows as *paper N%*."
    )


def headline_table(task: str, wd: float, cells: pd.DataFrame) -> str:
    """Rows = capacities (2L first, as in the paper), columns = ratios present."""
    ratios = sorted(cells["ratio"].unique())
    caps = sorted(cells[CAPACITY].drop_duplicates().itertuples(index=False, name=None), key=paper_order)
    rows = []
    for layers, heads in caps:
        row = [f"**{cap_label(layers, heads)}**"]
        for r in ratios:
            hit = cells[(cells["layers"] == layers) & (cells["heads"] == heads) & np.isclose(cells["ratio"], r)]
            paper = paper_pct(task, wd, layers, r)
            row.append(cell_text(hit.iloc[0] if len(hit) else None, paper))
        rows.append(row)
    header = ["model"] + [f"r = {fmt_ratio(r)}" for r in ratios]
    return f"### {task}, weight decay {wd:g}\n\n" + md_table(header, rows)


def cell_text(c: pd.Series | None, paper: int | None) -> str:
    if c is None:
        ours = "—"
    else:
        ours = f"{pct(c['rate'])} [{100 * c['lo']:.0f}–{100 * c['hi']:.0f}] ({int(c['k'])}/{int(c['n'])})"
    return ours if paper is None else f"{ours}; *paper {paper}%*"


# ---------------------------------------------------------------- statistics


def ratio_contrasts_section(summary: pd.DataFrame) -> str:
    head = "### Between ratios, within each capacity (Fisher's exact test)"
    con = ratio_contrasts(summary)
    if con.empty:
        return f"{head}\n\nNo contrasts: every capacity was trained at a single ratio."
    rows = [
        [
            c.task,
            cap_label(c.layers, c.heads),
            f"{c.weight_decay:g}",
            f"{fmt_ratio(c.ratio_a)} vs {fmt_ratio(c.ratio_b)}",
            f"{pct(c.rate_a)} vs {pct(c.rate_b)}",
            fmt_num(float(c.odds_ratio)),
            fmt_p(float(c.p)),
        ]
        for c in con.itertuples(index=False)
    ]
    header = ["task", "model", "wd", "r (a vs b)", "rate", "odds ratio a/b", "p"]
    return f"{head}\n\n" + md_table(header, rows)


def interaction_section(summary: pd.DataFrame) -> str:
    """The capacity × ratio interaction of a logistic model, per (task, weight decay)."""
    lines = [
        "### Capacity × ratio interaction (logistic regression)",
        "",
        "`generalized ~ dist * cap`, with dist = |r − chance| and cap = 1 for 2 layers, fitted per task, weight "
        "decay and head count. The dist:cap estimate is the extra change in log-odds per unit of dist for 2L over "
        "1L. A positive value says distance from chance helps 2L *more* than 1L; the paper's flip (it hurts 1L and "
        "helps 2L) needs both simple slopes, below.",
        "",
    ]
    other = sorted(set(summary["layers"].unique().tolist()) - {1, 2})
    if other:
        lines += [f"Only 1- and 2-layer models enter these fits; the {', '.join(map(str, other))}-layer ones are left out.", ""]
    pairs = summary[summary["layers"].isin([1, 2])]
    slope_rows = []
    for (task, wd, heads), sub in pairs.groupby([*GROUP, "heads"], sort=True):
        name = f"- **{task}, weight decay {wd:g}, {int(heads)}H**: "
        try:
            res = interaction_logit(sub)
            sl = simple_slopes(sub)
        except ValueError as e:
            lines.append(name + f"not estimable — {e}")
            continue
        lines.append(
            name
            + f"estimate {fmt_num(res['estimate'])} (95% CI {fmt_num(res['ci_low'])} to {fmt_num(res['ci_high'])}), "
            f"{p_text(res['p'])}, n = {res['n']}, method: {res['method']}, separated: {res['separated']}"
        )
        slope_rows.append([
            task, f"{wd:g}", f"{int(heads)}H",
            *(f"{fmt_num(sl[c]['estimate'])} [{fmt_num(sl[c]['ci_low'])}, {fmt_num(sl[c]['ci_high'])}], one-sided {fmt_p(sl[c]['p_one_sided'])}"
              for c in ("1L", "2L")),
            fmt_p(sl["p_flip"]), "shown" if sl["flip"] else "not shown",
        ])
    if slope_rows:
        lines += [
            "", "**The flip** (the paper's claim: the 1L slope is negative *and* the 2L slope positive). Simple slopes of "
            "log-odds per unit of dist from the same model (95% CI; one-sided p toward the paper's sign), and the "
            "intersection-union test of both (p = the larger one-sided p):", "",
            md_table(["task", "wd", "heads", "1L slope", "2L slope", "p (flip)", "flip"], slope_rows),
        ]
    return "\n".join(lines)


def threshold_section(summary: pd.DataFrame) -> str:
    """The generalization rate if "generalized" meant a peak adversarial accuracy >= t, for t from 90% to 100%."""
    if "peak_adv_acc" not in summary.columns:
        return ""
    thresholds = [0.90, 0.95, 0.98, 0.99, 1.0]
    rows = []
    for key, d in sorted(summary.groupby([*GROUP, *CAPACITY, "ratio"]), key=lambda kv: (kv[0][:2], paper_order(kv[0][2:4]), kv[0][4])):
        task, wd, layers, heads, r = key
        cells = []
        for t in thresholds:
            k, n = int((d["peak_adv_acc"] >= t - 1e-12).sum()), len(d)
            lo, hi = wilson(k, n)
            cells.append(f"{pct(k / n)} [{100 * lo:.0f}–{100 * hi:.0f}]")
        rows.append([task, f"{wd:g}", cap_label(layers, heads), fmt_ratio(r), *cells])
    note = (
        "### How the rate depends on the cut-off\n\nThe paper counts a member as generalized when its adversarial "
        "accuracy reaches 100% at some evaluation. With a few hundred adversarial rows one wrong row is a failure, so "
        "here is the rate had the cut-off been lower (peak adversarial accuracy over the evaluations >= t; 95% Wilson "
        "intervals). The evaluation cadence (`train.eval_every`) bounds how short a peak can be and still be seen."
    )
    return note + "\n\n" + md_table(["task", "wd", "model", "r", *[f"t = {100 * t:.0f}%" for t in thresholds]], rows)


# ---------------------------------------------------------------- tables beside the figures


def transient_counts(summary: pd.DataFrame) -> str:
    rows = []
    for w, d in summary.groupby("weight_decay", sort=True):
        k = int(d["generalized"].sum())
        kept = int((d["generalized"] & d["retained"].astype(bool)).sum())
        rows.append([f"{w:g}", str(len(d)), str(k), str(kept), str(k - kept)])
    return md_table(["weight decay", "members", "generalized", "retained to the end", "lost (transient)"], rows)


# ---------------------------------------------------------------- mechanism


def phases_table(summary: pd.DataFrame) -> str:
    """Median phase epochs per capacity x ratio: phase 2 comes earlier with more heads in 2L (paper)."""
    if "phase2_epoch" not in summary.columns:
        return "*No phase columns in summary.parquet (a sweep from an older seedlab).*"
    rows = []
    for (layers, heads, r), d in sorted(summary.groupby(["layers", "heads", "ratio"]), key=lambda kv: paper_order(kv[0])):
        med = lambda c: fmt_num(float(d[c].dropna().median())) if d[c].notna().any() else "—"
        rows.append([cap_label(layers, heads), fmt_ratio(r), str(len(d)), med("shortcut_epoch"), med("phase2_epoch"), med("gen_epoch")])
    note = (
        "Medians over seeds of the epoch the shortcut is learned (validation >= 99%), the onset of phase 2 "
        "(adversarial accuracy rising from its trough while validation stays >= 99%) and the generalization epoch."
    )
    return note + "\n\n" + md_table(["model", "r", "seeds", "shortcut learned", "phase 2 onset", "generalized"], rows)




def gradient_tables(summary: pd.DataFrame, folder: RunDir | SweepDir) -> str:
    """Which conflict measure resolves toward 0 as 2L models generalize, and amplification per capacity."""
    if not folder.gradients_path.is_file():
        return ""
    g = pd.read_parquet(folder.gradients_path).merge(
        summary[["member", "task", "layers", "heads", "ratio", "generalized", "shortcut_epoch", "gen_epoch"]], on="member")
    out = []
    conflict = [c for c in ("cosine", "pair_cosine") if c in g and g[c].notna().any()]
    top = g[g["ratio"] == g["ratio"].max()]
    rows = []
    for (layers, gen), d in sorted(top.groupby(["layers", "generalized"]), key=lambda kv: (-kv[0][0], not kv[0][1])):
        first = d[d["epoch"] == d["epoch"].min()]
        last = d.sort_values("epoch").groupby("member").tail(1)
        cells = [f"{fmt_num(float(first[c].median()))} → {fmt_num(float(last[c].median()))}" for c in conflict]
        rows.append([f"{int(layers)}L", "yes" if gen else "no", str(d["member"].nunique()), *cells])
    if rows:
        out += ["### Gradient conflict: which measure resolves toward 0",
                f"Median over members at r = {fmt_ratio(float(top['ratio'].max()))}, first measurement → last. `cosine` "
                "compares the two groups' mean gradients; `pair_cosine` averages cos(g_i, g_j) over pairs of one "
                "consistent and one anti example. The paper: negative at first, toward 0 as 2L models generalize.", "",
                md_table(["model", "generalized", "members", *conflict], rows)]
    if "per_example_ratio" in g:
        start = g["shortcut_epoch"].astype("float64")
        end = g["gen_epoch"].astype("float64").fillna(np.inf)
        sat = g[start.notna() & (g["epoch"] >= start.fillna(0)) & (g["epoch"] <= end)]
        per_member = sat.groupby(["member", "task", "layers", "heads", "ratio"], as_index=False).agg(
            ratio_med=("per_example_ratio", "median"), expected=("expected_ratio", "first"))
        amp = []
        for (task, layers, heads, r), d in sorted(per_member.groupby(["task", "layers", "heads", "ratio"]),
                                                  key=lambda kv: (kv[0][0], paper_order(kv[0][1:3]), kv[0][3])):
            q = d["ratio_med"].quantile([0.25, 0.5, 0.75])
            amp.append([task, cap_label(layers, heads), fmt_ratio(r), str(len(d)),
                        f"{fmt_num(q[0.25])} / {fmt_num(q[0.5])} / {fmt_num(q[0.75])}", fmt_num(float(d["expected"].iloc[0]))])
        if amp:
            out += ["", "### Amplification per capacity",
                    "Per member, the median anti/consistent per-example gradient-norm ratio over its measurements "
                    "while the shortcut is saturated (from the epoch validation reaches 99% to the generalization "
                    "epoch, or the end); quartiles over members, beside a calibrated model's ratio for the task "
                    "(r/(1−r) for two classes; shortcut/gradients.py). The paper's 9–17× is the 2L mechanism at r = 0.9.", "",
                    md_table(["task", "model", "r", "members", "quartiles (25/50/75%)", "calibrated model"], amp)]
    return "\n".join(out)
