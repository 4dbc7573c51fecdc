"""The report of a sweep (or one ensemble run): ``report.md`` plus PNG figures beside it.

Read top to bottom, the module follows the report: load the summary, the opening
paragraph (question and a data-derived answer), the headline tables laid out like
the paper's, the statistics (Fisher tests between ratios, the logistic
capacity × ratio interaction, from :mod:`seedlab.shortcut.stats`; the rate against the
accuracy cut-off and against the adversarial split's size), then the figures
(:mod:`seedlab.shortcut.figures`) with the tables that go with them, and the mechanism
(phases, gradient conflict over all parameters and within the shortcut head's, circuits).
Every number in the report is computed from the folder's tables; only the paper's own
numbers are constants (``PAPER``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.config import load_yaml
from seedlab.errors import SeedlabError
from seedlab.reporting import Report, figure_block, fmt_num, fmt_p, md_table, p_text, pct
from seedlab.shortcut import figures
from seedlab.shortcut.circuits_report import circuits_section
from seedlab.shortcut.config import DataConfig
from seedlab.shortcut.figures import CAPACITY, cap_label, fmt_ratio, paper_order
from seedlab.shortcut.rundir import RunDir, SweepDir, open_folder
from seedlab.shortcut.stats import chance, interaction_logit, ratio_contrasts, simple_slopes
from seedlab.shortcut.tasks import get_task
from seedlab.stats import fisher, rate_table, wilson
from seedlab.store import file_sha256, write_text

# The paper's headline (task sum2-max, weight decay 0.1): (layers, ratio) -> % of seeds that generalize.
PAPER_TASK, PAPER_WD = "sum2-max", 0.1
PAPER = {(2, 0.5): 0, (2, 0.9): 77, (1, 0.5): 33, (1, 0.9): 0}

GROUP = ["task", "weight_decay"]  # one headline table per group
CELL = [*GROUP, *CAPACITY, "ratio"]


def write_report(run_dir: str | Path) -> Path:
    """Write the folder's ``report.md`` and its figures; returns the report's path."""
    folder = open_folder(run_dir)
    summary = load_summary(folder)
    rates = rate_cells(summary)
    rep = Report()
    rep.add("# Shortcut saturation: sweep report")
    rep.add(intro(summary, isinstance(folder, SweepDir)))
    if isinstance(folder, SweepDir) and folder.preregistration_record.is_file():
        rep.add("## Pre-registration: a confirmatory sweep", preregistration_section(folder))
    rep.add("## Headline: generalization rate", headline_note())
    for (task, wd), cells in rates.groupby(GROUP, sort=True):
        rep.add(headline_table(task, wd, cells))
    rep.add("## Statistics", ratio_contrasts_section(summary), interaction_section(summary), threshold_section(summary),
            split_size_section(summary, adv_split_size(folder)))
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
    rep.add(head_conflict_section(summary, folder))
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
    return rate_table(summary, by=CELL)


def adv_split_size(folder: RunDir | SweepDir) -> int | None:
    """``data.n_adv`` of the folder's config (a run's config.yaml, a sweep's sweep.yaml); None without one."""
    if not folder.config_path.is_file():
        return None
    return DataConfig.model_validate(load_yaml(folder.config_path).get("data", {})).n_adv


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


def preregistration_section(folder: SweepDir) -> str:
    """The pre-registration kept in the sweep folder (``--preregistration``), quoted whole, with its hash."""
    rec = json.loads(folder.preregistration_record.read_text())
    text = folder.preregistration_path.read_text()
    intact = file_sha256(folder.preregistration_path) == rec["sha256"]
    state = "unchanged since" if intact else "**edited since: its SHA-256 no longer matches**"
    quoted = "\n".join(f"> {line}" if line else ">" for line in text.splitlines())
    return (f"This sweep was pre-registered: `preregistration.md` was copied from `{rec['source']}` at {rec['written_utc']} "
            f"UTC, before its first member was trained (SHA-256 `{rec['sha256'][:12]}`, {state}). Its hypotheses and "
            "decision rules are quoted below; the statistics that follow are the tests it names, so read this sweep as "
            "confirmatory, apart from any exploration that chose its protocol.\n\n" + quoted)


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

    return f"{verdict}. {where}, {phrase(2, True)}, while {phrase(1, False)}.{transience_note(sub)}"


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
    note = (
        "### How the rate depends on the cut-off\n\nThe paper counts a member as generalized when its adversarial "
        "accuracy reaches 100% at some evaluation. With a few hundred adversarial rows one wrong row is a failure, so "
        "here is the rate had the cut-off been lower (peak adversarial accuracy over the evaluations >= t; 95% Wilson "
        "intervals). The evaluation cadence (`train.eval_every`) bounds how short a peak can be and still be seen."
    )
    return note + "\n\n" + criteria_table(summary, {f"t = {100 * t:.0f}%": summary["peak_adv_acc"] >= t - 1e-12 for t in thresholds})


SPLIT_SIZE_MIN = 16  # the smallest adversarial split of the split-size table


def split_sizes(n_adv: int) -> list[int]:
    """The adversarial split sizes of the split-size table: powers of two from ``SPLIT_SIZE_MIN`` below n_adv, then n_adv."""
    sizes, m = [], SPLIT_SIZE_MIN
    while m < n_adv:
        sizes.append(m)
        m *= 2
    return [*sizes, n_adv]


def split_size_section(summary: pd.DataFrame, n_adv: int | None) -> str:
    """The generalization rate had the adversarial split been its first m rows, for m from 16 to ``n_adv``."""
    head = "### How the rate depends on the adversarial split's size"
    if "adv_prefix_max" not in summary.columns or summary["adv_prefix_max"].isna().any():
        return f"{head}\n\n*Needs summary.parquet's `adv_prefix_max` column, which runs from an older seedlab lack: train them again.*"
    if n_adv is None:
        return f"{head}\n\n*Needs `data.n_adv` from the folder's config.yaml or sweep.yaml, which is missing.*"
    note = (
        f"{head}\n\nAt every check of the adversarial split (each evaluation, and every `train.adv_every` epochs when set), "
        "the *adv prefix* is the number of its leading rows that are all correct; summary.parquet's `adv_prefix_max` is "
        "its maximum over the checks. The rows are in random order, so the first m are a uniform sample of the split, and "
        "a member would have generalized on an adversarial split of m rows (with this run's training data) iff "
        "`adv_prefix_max` >= m. A smaller split is an easier criterion (fewer rows must all be right at once), so the rate "
        f"can only fall as m grows; the headline uses the whole split, m = n_adv = {n_adv}. Larger splits need a rerun "
        "with `data.n_adv` raised. 95% Wilson intervals."
    )
    sizes = split_sizes(n_adv)
    return note + "\n\n" + criteria_table(summary, {f"m = {m}": summary["adv_prefix_max"] >= m for m in sizes})


def by_cell(df: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """``df.groupby(CELL)`` in the report's order: task, weight decay, capacity (2L first, as the paper), r."""
    return sorted(df.groupby(CELL), key=lambda kv: (kv[0][:2], paper_order(kv[0][2:4]), kv[0][4]))


def criteria_table(summary: pd.DataFrame, criteria: dict[str, pd.Series]) -> str:
    """One row per cell (task, wd, capacity, r) and one column per criterion (a boolean per member): the share of
    the cell's members that meet it, with its 95% Wilson interval."""
    rows = []
    for (task, wd, layers, heads, r), d in by_cell(summary):
        cells = []
        for met in criteria.values():
            k, n = int(met[d.index].sum()), len(d)
            lo, hi = wilson(k, n)
            cells.append(f"{pct(k / n)} [{100 * lo:.0f}–{100 * hi:.0f}]")
        rows.append([task, f"{wd:g}", cap_label(layers, heads), fmt_ratio(r), *cells])
    return md_table(["task", "wd", "model", "r", *criteria], rows)


# ---------------------------------------------------------------- tables beside the figures


def _kept(d: pd.DataFrame) -> tuple[int, int]:
    """(generalized, of them still at 100% adversarial accuracy at the end) among ``d``'s members."""
    return int(d["generalized"].sum()), int((d["generalized"] & d["retained"].astype(bool)).sum())


def transient_counts(summary: pd.DataFrame) -> str:
    """Per cell: members, generalized at some point, and how many of those kept the rule to the end."""
    rows = []
    for (task, wd, layers, heads, r), d in by_cell(summary):
        k, kept = _kept(d)
        rows.append([task, f"{wd:g}", cap_label(layers, heads), fmt_ratio(r), str(len(d)), str(k), str(kept), str(k - kept)])
    return md_table(["task", "weight decay", "model", "r", "members", "generalized", "retained to the end",
                     "lost (transient)"], rows)


def transience_note(group: pd.DataFrame) -> str:
    """A sentence for the answer when most generalizing members of its group (``group``) lost the rule again by the end."""
    k, kept = _kept(group)
    if k == 0 or kept * 2 >= k:
        return ""
    return (f" Most of this generalization is transient: {kept} of the {k} members that reached 100% kept it to the "
            "end (per cell under \"Transient generalization\"), so the rates count passing hits.")


# ---------------------------------------------------------------- mechanism


def phases_table(summary: pd.DataFrame) -> str:
    """Median phase epochs per capacity x ratio: phase 2 comes earlier with more heads in 2L (paper)."""
    if "phase2_epoch" not in summary.columns:
        return "*No phase columns in summary.parquet (a sweep from an older seedlab).*"
    rows = []
    for (layers, heads, r), d in sorted(summary.groupby(["layers", "heads", "ratio"]), key=lambda kv: paper_order(kv[0])):
        med = lambda c: fmt_num(float(d[c].dropna().median())) if d[c].notna().any() else "—"  # noqa: B023
        rows.append([cap_label(layers, heads), fmt_ratio(r), str(len(d)), med("shortcut_epoch"), med("phase2_epoch"), med("gen_epoch")])
    note = (
        "Medians over seeds of the epoch the shortcut is learned (validation >= 99%), the onset of phase 2 "
        "(adversarial accuracy rising from its trough while validation stays >= 99%) and the generalization epoch."
    )
    return note + "\n\n" + md_table(["model", "r", "seeds", "shortcut learned", "phase 2 onset", "generalized"], rows)




def gradient_tables(summary: pd.DataFrame, folder: RunDir | SweepDir) -> str:
    """The conflict measures by outcome at the highest ratio, and amplification per capacity."""
    if not folder.gradients_path.is_file():
        return ""
    g = pd.read_parquet(folder.gradients_path).merge(
        summary[["member", "task", "layers", "heads", "ratio", "generalized", "shortcut_epoch", "gen_epoch"]], on="member")
    out = []
    conflict = [c for c in ("cosine", "pair_cosine") if c in g and g[c].notna().any()]
    top = g[np.isclose(g["ratio"], g["ratio"].max())]
    rows = []
    for (layers, gen), d in sorted(top.groupby(["layers", "generalized"]), key=lambda kv: (-kv[0][0], not kv[0][1])):
        med = d.groupby("epoch")[conflict].median().sort_index()
        cells = []
        for c in conflict:
            series = med[c].dropna()
            cells.append("—" if series.empty else lowest_to_last(series) + " ✓" * resolves_toward_zero(series))
        rows.append([f"{int(layers)}L", "yes" if gen else "no", str(d["member"].nunique()), *cells])
    if rows:
        out += ["### Gradient conflict by outcome",
                f"Members at r = {fmt_ratio(float(top['ratio'].max()))} split by whether they generalized: the median over "
                "members at each measured epoch, its lowest value → its last. `cosine` compares the two groups' mean "
                "gradients; `pair_cosine` averages cos(g_i, g_j) over pairs of one consistent and one anti example. ✓: the "
                "series matches the paper's description (negative, then at the end within half the size of its most "
                "negative value of 0); the paper says so of 2L models as they generalize. The next section restricts both "
                "measures to the shortcut head's parameters.", "",
                md_table(["model", "generalized", "members", *(f"{c}: lowest → last" for c in conflict)], rows)]
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


# ---------------------------------------------------------------- gradient conflict in the shortcut head's parameters

# the circuits.parquet fingerprint that marks a shortcut head, per shortcut feature (the paper's QK fingerprints)
SHORTCUT_FINGERPRINT = {"max": "qk_rho_value", "first": "attn_pos0"}
SHOWN_EPOCHS = 6  # measured epochs shown per cell (evenly spaced, first and last included)
CONFLICT = [("cosine", "cosine (all parameters)"), ("pair_cosine", "pair_cosine (all parameters)"),
            ("head_cosine", "cosine (shortcut head)"), ("head_pair_cosine", "pair_cosine (shortcut head)")]


def shortcut_heads(summary: pd.DataFrame, circuits: pd.DataFrame | None) -> pd.DataFrame:
    """Each member's shortcut head: ``member, layer, head``, one row per member that circuits.parquet covers.

    The rule: the attention head with the highest shortcut fingerprint, averaged over the member's
    checkpoints: the activation-based QK rho with token value (``qk_rho_value``: attends to the max) for
    ``*-max`` tasks, the readout's attention on position 0 (``attn_pos0``) for ``*-first`` tasks.
    """
    if circuits is None or circuits.empty:
        return pd.DataFrame({"member": [], "layer": [], "head": []}, dtype="int64")
    c = circuits[circuits["head"] >= 0].merge(summary[["member", "task"]], on="member")
    first = c["task"].map(lambda t: get_task(t).shortcut == "first")
    c = c.assign(score=np.where(first, c[SHORTCUT_FINGERPRINT["first"]], c[SHORTCUT_FINGERPRINT["max"]]))
    mean = c.groupby(["member", "layer", "head"], as_index=False)["score"].mean().dropna(subset=["score"])
    return mean.loc[mean.groupby("member")["score"].idxmax(), ["member", "layer", "head"]].reset_index(drop=True)


def conflict_medians(summary: pd.DataFrame, grads: pd.DataFrame, heads: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """Median over members per cell and epoch of both conflict measures over all parameters and within each
    member's shortcut head (``chosen``; members it lacks contribute all their heads, one observation each)."""
    keys = ["member", "layer", "head"]
    rest = heads[~heads["member"].isin(chosen["member"])]
    own = pd.concat([heads.merge(chosen, on=keys), rest]).rename(columns={"cosine": "head_cosine", "pair_cosine": "head_pair_cosine"})
    cell = summary[["member", *CELL]]
    by = [*CELL, "epoch"]
    full = grads.merge(cell, on="member").groupby(by)
    head = own.merge(cell, on="member").groupby(by)[["head_cosine", "head_pair_cosine"]].median()
    members = full["member"].nunique().rename("members")
    return pd.concat([members, full[["cosine", "pair_cosine"]].median(), head], axis=1).reset_index()


def lowest_to_last(series: pd.Series) -> str:
    """A median series over epochs as its lowest value → its last (the two numbers :func:`resolves_toward_zero` compares)."""
    return f"{fmt_num(float(series.min()))} → {fmt_num(float(series.iloc[-1]))}"


def resolves_toward_zero(series: pd.Series) -> bool:
    """The paper's description of one median series over epochs: it goes negative (the conflict appears once
    the shortcut is learned; at epoch 0 the weights are random, so not at the first measurement) and at the last
    measurement it is within half the size of its most negative value of 0 (an overshoot to +0.9 is not "toward 0")."""
    s = series.dropna()
    return bool(len(s) > 1 and s.min() < 0 and s.idxmin() != s.index[-1] and abs(s.iloc[-1]) <= abs(s.min()) / 2)


def conflict_verdict(med: pd.DataFrame) -> str:
    """Which conflict measures match "starts negative, resolves toward 0" in every 2L cell at the highest ratio."""
    cells = med[(med["layers"] == 2) & np.isclose(med["ratio"], med["ratio"].max())]
    if cells.empty:
        return "No 2-layer cell: the paper's description (negative at first, toward 0 as 2L models generalize) cannot be checked."
    match, values = [], []
    for col, name in CONFLICT:
        series = {cap_label(lay, h): d.sort_values("epoch")[col].dropna() for (lay, h), d in cells.groupby(CAPACITY)}
        if all(s.empty for s in series.values()):
            continue
        if all(resolves_toward_zero(s) for s in series.values()):
            match.append(f"`{name}`")
        ends = ", ".join(f"{cap} {lowest_to_last(s)}" for cap, s in series.items() if len(s))
        values.append(f"`{name}` {ends}")
    which = f"{' and '.join(match)} match{'es' * (len(match) == 1)}" if match else "none of the measures matches"
    return (f"In the data, {which} the paper's description in 2L at r = {fmt_ratio(float(cells['ratio'].max()))} (median "
            f"negative at some measurement and, at the last, within half the size of its most negative value of 0). "
            f"Most negative → last median: {'; '.join(values)}.")


def head_conflict_section(summary: pd.DataFrame, folder: RunDir | SweepDir) -> str:
    """The gradient conflict over all parameters and within the shortcut circuit's head, per capacity, ratio and epoch."""
    if not folder.gradients_path.is_file():
        return ""
    head = "### Gradient conflict within the shortcut head's parameters"
    if not folder.gradients_heads_path.is_file():
        return f"{head}\n\n*No gradients_heads.parquet (gradients measured by an older seedlab: train again).*"
    circuits = pd.read_parquet(folder.circuits_path) if folder.circuits_path.is_file() else None
    per_head = pd.read_parquet(folder.gradients_heads_path)
    chosen = shortcut_heads(summary, circuits)
    if circuits is None:
        rule = "No circuits.parquet (`seedlab shortcut analyze DIR`), so no shortcut head is identified: every head is used."
    else:
        rule = ("Each member's shortcut head is the attention head with the highest shortcut fingerprint in "
                f"circuits.parquet, averaged over its checkpoints (`{SHORTCUT_FINGERPRINT['max']}` for max tasks, "
                f"`{SHORTCUT_FINGERPRINT['first']}` for first tasks).")
        if missing := len(set(per_head["member"]) - set(chosen["member"])):
            rule += f" {missing} member{'s' * (missing != 1)} without circuits use every head."
    task, wd = answer_group(summary)
    med = conflict_medians(summary, pd.read_parquet(folder.gradients_path), per_head, chosen)
    med = med[(med["task"] == task) & np.isclose(med["weight_decay"], wd)]
    rows = []
    for (_, _, layers, heads, r), d in by_cell(med):
        d = d.sort_values("epoch")
        shown = d.iloc[np.unique(np.linspace(0, len(d) - 1, SHOWN_EPOCHS).round().astype(int))]
        for e in shown.itertuples(index=False):
            cells = [fmt_num(float(getattr(e, c))) if pd.notna(getattr(e, c)) else "—" for c, _ in CONFLICT]
            rows.append([cap_label(layers, heads), fmt_ratio(r), str(int(e.epoch)), str(int(e.members)), *cells])
    note = (
        f"{head}\n\nThe conflict between the shortcut-consistent and anti-shortcut groups' gradients "
        "(shortcut/gradients.py), over all parameters and restricted to the shortcut head's own parameters (its slices of "
        "W_Q, W_K, W_V, their biases and W_O). `cosine` compares the two groups' mean gradients; `pair_cosine` averages "
        "cos(g_i, g_j) over pairs of one consistent and one anti example. Why they can differ: once one rule fits both "
        "groups their mean gradients align (`cosine` → +1), while single examples' gradients in many dimensions stay "
        f"nearly orthogonal (`pair_cosine` → 0). {rule} In {task}, weight decay {wd:g}: median "
        f"over members per capacity, r and measured epoch ({SHOWN_EPOCHS} evenly spaced epochs shown per cell). "
        f"{conflict_verdict(med)}"
    )
    return note + "\n\n" + md_table(["model", "r", "epoch", "members", *(n for _, n in CONFLICT)], rows)
