"""The sweep report: ``run_dir/report.md`` plus PNG figures beside it.

Read top to bottom, the module follows the report: load the sweep, the opening
paragraph (question and a data-derived answer), the headline tables laid out like
the paper's, the statistics (Fisher tests between ratios, the logistic
capacity × ratio interaction), then one function per figure. Every number in the
report is computed from ``summary.parquet`` / ``curves.parquet``; only the paper's
own numbers are constants (``PAPER``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.reporting import Fig, Report, figure_block, fmt_num, fmt_p, md_table, new_figure, p_text, pct, save_figure

# The paper's headline (task sum2-max, weight decay 0.1): (layers, ratio) -> % of seeds that generalize.
PAPER_TASK, PAPER_WD = "sum2-max", 0.1
PAPER = {(2, 0.5): 0, (2, 0.9): 77, (1, 0.5): 33, (1, 0.9): 0}

CAPACITY = ["layers", "heads"]
GROUP = ["task", "weight_decay"]  # one headline table per group
MAX_SEEDS_DRAWN = 12  # per panel of curves.png
SPLIT_COLORS = {"val": "tab:blue", "adv": "tab:orange"}
SPLIT_NOTES = {"val": "r = 1, shortcut holds", "adv": "r = 0, shortcut misleads"}


def write_report(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.md`` and its figures; returns the report's path."""
    from seedlab.store import write_text

    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    rates = rate_cells(summary)
    rep = Report()
    rep.add("# Shortcut saturation: sweep report")
    rep.add(intro(summary, run_dir))
    rep.add("## Headline: generalization rate", headline_note())
    for (task, wd), cells in rates.groupby(GROUP, sort=True):
        rep.add(headline_table(task, wd, cells))
    rep.add("## Statistics", ratio_contrasts_section(summary), interaction_section(summary))
    rep.add("## Figures")
    rep.add(figure_block(rate_vs_ratio_figure(summary, rates, run_dir)))
    rep.add(figure_block(curves_figure(summary, run_dir)))
    rep.add(figure_block(gen_epoch_figure(summary, run_dir)))
    rep.add(figure_block(transient_figure(summary, run_dir)), transient_counts(summary))
    rep.add("## Mechanism", "### Phases", phases_table(summary))
    rep.add(figure_block(aligned_figure(summary, run_dir)))
    for fig in gradient_figures(summary, run_dir) + circuit_figures(summary, run_dir):
        rep.add(figure_block(fig))
    return write_text(run_dir / "report.md", rep.text())


# ---------------------------------------------------------------- loading


def load_summary(run_dir: Path) -> pd.DataFrame:
    path = run_dir / "summary.parquet"
    if not path.is_file():
        raise SeedlabError(f"{run_dir}: no summary.parquet (run `seedlab shortcut sweep` first)")
    df = pd.read_parquet(path)
    if df.empty:
        raise SeedlabError(f"{path}: no members (the sweep wrote an empty summary)")
    df["generalized"] = df["generalized"].astype(bool)
    return df


def rate_cells(summary: pd.DataFrame) -> pd.DataFrame:
    """Generalization rate with its Wilson interval for every task × wd × capacity × ratio cell."""
    from seedlab.stats import rate_table

    return rate_table(summary, by=[*GROUP, *CAPACITY, "ratio"])


# ---------------------------------------------------------------- formatting helpers


def cap_label(layers: int, heads: int) -> str:
    return f"{int(layers)}L/{int(heads)}H"


def paper_order(cell: tuple) -> tuple:
    """Sort key for (layers, heads[, ratio]): 2L before 1L, as the paper's table."""
    return (-cell[0], *cell[1:])


def fmt_ratio(r: float) -> str:
    return f"{r:g}"


def paper_pct(task: str, wd: float, layers: int, ratio: float) -> int | None:
    """The paper's rate for this cell, when it reports one."""
    if task != PAPER_TASK or not np.isclose(wd, PAPER_WD):
        return None
    for (lay, r), v in PAPER.items():
        if lay == layers and np.isclose(r, ratio):
            return v
    return None


# ---------------------------------------------------------------- opening paragraph


def intro(summary: pd.DataFrame, run_dir: Path) -> str:
    tasks = sorted(summary["task"].unique())
    caps = sorted({cap_label(lay, h) for lay, h in summary[CAPACITY].drop_duplicates().itertuples(index=False)})
    ratios = ", ".join(fmt_ratio(r) for r in sorted(summary["ratio"].unique()))
    wds = ", ".join(f"{w:g}" for w in sorted(summary["weight_decay"].unique()))
    n, k = len(summary), int(summary["generalized"].sum())
    jobs = summary["job"].nunique() if "job" in summary else 1
    config = " The sweep's config is in `sweep.yaml`." if (run_dir / "sweep.yaml").is_file() else ""
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
    from seedlab.stats import chance

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
    from seedlab.stats import fisher

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
    if (v2, v1) == ("rises", "falls"):
        significant = moves[2][3] < 0.05 and moves[1][3] < 0.05
        verdict = "Yes" if significant else "Yes in direction (not every change is significant at p < 0.05)"
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
    from seedlab.stats import ratio_contrasts

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
    from seedlab.stats import interaction_logit

    lines = [
        "### Capacity × ratio interaction (logistic regression)",
        "",
        "`generalized ~ dist * cap`, with dist = |r − chance| and cap = 1 for 2 layers, fitted per task, weight "
        "decay and head count. The dist:cap estimate is the extra change in log-odds per unit of dist for 2L over "
        "1L; a positive value is the paper's flip (distance from chance helps 2L, not 1L).",
        "",
    ]
    for (task, wd, heads), sub in summary.groupby([*GROUP, "heads"], sort=True):
        name = f"- **{task}, weight decay {wd:g}, {int(heads)}H**: "
        try:
            res = interaction_logit(sub)
        except ValueError as e:
            lines.append(name + f"not estimable — {e}")
            continue
        lines.append(
            name
            + f"estimate {fmt_num(res['estimate'])} (95% CI {fmt_num(res['ci_low'])} to {fmt_num(res['ci_high'])}), "
            f"{p_text(res['p'])}, n = {res['n']}, method: {res['method']}, separated: {res['separated']}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- figures


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    ncols = min(n, max_cols)
    return math.ceil(n / ncols), ncols


def rate_vs_ratio_figure(summary: pd.DataFrame, rates: pd.DataFrame, run_dir: Path) -> Fig:
    from seedlab.stats import chance

    tasks = sorted(rates["task"].unique())
    fig, axes = new_figure(*_grid(len(tasks)))
    many_wd = summary["weight_decay"].nunique() > 1
    for ax, task in zip(axes, tasks, strict=False):
        t = rates[rates["task"] == task]
        lines = list(t.groupby([*CAPACITY, "weight_decay"], sort=True))
        for i, ((layers, heads, wd), d) in enumerate(lines):
            d = d.sort_values("ratio")
            x = d["ratio"].to_numpy() + 0.006 * (i - (len(lines) - 1) / 2)  # separate overlapping bars
            y = 100 * d["rate"].to_numpy()
            err = [y - 100 * d["lo"].to_numpy(), 100 * d["hi"].to_numpy() - y]
            label = cap_label(layers, heads) + (f" wd={wd:g}" if many_wd else "")
            ax.errorbar(x, y, yerr=err, marker="o", ms=4, capsize=3, lw=1.2, label=label)
        ax.axvline(chance(task), ls="--", color="gray", lw=1, label="chance")
        ax.set(title=task, xlabel="spurious ratio r", ylabel="generalization rate (%)")
        ax.set(xlim=(-0.02, 1.02), ylim=(-5, 105))
        ax.legend(fontsize=7)
    for ax in axes[len(tasks) :]:
        ax.set_visible(False)
    path = save_figure(fig, run_dir / "rate_vs_ratio.png")
    return Fig(
        "Generalization rate vs spurious ratio",
        path,
        "Look for the lines to cross: 2L should rise as r moves away from chance (dashed line) while 1L falls; "
        "bars are 95% Wilson intervals.",
    )


def pick_members(d: pd.DataFrame, k: int = MAX_SEEDS_DRAWN) -> pd.DataFrame:
    """Up to k members, half from the generalized ones when there are any, so both kinds show."""
    d = d.sort_values("member")
    gen, rest = d[d["generalized"]], d[~d["generalized"]]
    g = gen.head(max(k // 2, k - len(rest)))
    return pd.concat([g, rest.head(k - len(g))]).sort_values("member")


def curves_figure(summary: pd.DataFrame, run_dir: Path) -> Fig:
    import pyarrow.parquet as pq
    from matplotlib.lines import Line2D

    title = "Training curves per seed"
    path = run_dir / "curves.parquet"
    if not path.is_file():
        return Fig(title, None, "no curves.parquet in the sweep folder.")
    task, wd = answer_group(summary)
    sub = summary[(summary["task"] == task) & np.isclose(summary["weight_decay"], wd)]
    panels = [(key, pick_members(d)) for key, d in sub.groupby([*CAPACITY, "ratio"], sort=True)]
    wanted = pd.concat([p for _, p in panels])
    has_job = "job" in wanted and "job" in pq.read_schema(path).names
    keys = ["job", "member"] if has_job else ["member"]
    curves = pd.read_parquet(
        path,
        columns=[*keys, "epoch", "split", "acc"],
        filters=[("member", "in", [int(m) for m in wanted["member"]]), ("split", "in", ["val", "adv"])],
    )
    if curves.empty:
        return Fig(title, None, f"curves.parquet has no val/adv rows for the members of {task}.")
    caps = sorted({k[:2] for k, _ in panels}, key=paper_order)
    ratios = sorted({k[2] for k, _ in panels})
    fig, axes = new_figure(len(caps), len(ratios), w=3.6, h=2.8)
    axes = axes.reshape(len(caps), len(ratios))
    for ax in axes.ravel():
        ax.set_visible(False)
    for (layers, heads, r), members in panels:
        ax = axes[caps.index((layers, heads)), ratios.index(r)]
        ax.set_visible(True)
        mc = curves.merge(members[keys], on=keys)
        for _, m in mc.groupby(keys, sort=False):
            for split, s in m.groupby("split"):
                s = s.sort_values("epoch")
                ax.plot(s["epoch"], 100 * s["acc"], lw=0.6, alpha=0.75, color=SPLIT_COLORS[split])
        n_all = len(sub[(sub["layers"] == layers) & (sub["heads"] == heads) & np.isclose(sub["ratio"], r)])
        ax.set_title(f"{cap_label(layers, heads)}, r={fmt_ratio(r)} ({len(members)} of {n_all} seeds)", fontsize=9)
        ax.set(xlabel="epoch", ylabel="accuracy (%)", ylim=(-3, 103))
    handles = [Line2D([], [], color=c, lw=1.2, label=f"{s} ({SPLIT_NOTES[s]})") for s, c in SPLIT_COLORS.items()]
    fig.legend(handles=handles, loc="outside upper right", fontsize=8)
    fig.suptitle(f"{task}, weight decay {wd:g}", fontsize=10)
    out = save_figure(fig, run_dir / "curves.png")
    return Fig(
        title,
        out,
        f"{task}, wd {wd:g}, at most {MAX_SEEDS_DRAWN} seeds per panel. Look for the two phases: val (blue) "
        "reaches ~100% first (the shortcut), then in generalizing seeds adv (orange) climbs to 100% later "
        "while val stays high.",
    )


def gen_epoch_figure(summary: pd.DataFrame, run_dir: Path) -> Fig:
    title = "When seeds generalize"
    gen = summary[summary["generalized"] & summary["gen_epoch"].notna()]
    if gen.empty:
        return Fig(title, None, "no member generalized, so there is no generalization epoch to show.")
    tasks = sorted(summary["task"].unique())
    wds = sorted(summary["weight_decay"].unique())
    colors = {w: f"C{i}" for i, w in enumerate(wds)}
    fig, axes = new_figure(*_grid(len(tasks), 2), w=5.5, h=3.4)
    rng = np.random.default_rng(0)  # jitter only
    for ax, task in zip(axes, tasks, strict=False):
        t = summary[summary["task"] == task]
        cells = sorted(t[[*CAPACITY, "ratio"]].drop_duplicates().itertuples(index=False, name=None), key=paper_order)
        labels = []
        for i, (layers, heads, r) in enumerate(cells):
            d = t[(t["layers"] == layers) & (t["heads"] == heads) & np.isclose(t["ratio"], r)]
            g = d[d["generalized"] & d["gen_epoch"].notna()]
            labels.append(f"{cap_label(layers, heads)}\nr={fmt_ratio(r)}\n{len(g)}/{len(d)}")
            for w, dw in g.groupby("weight_decay"):
                y = dw["gen_epoch"].astype(float).to_numpy()
                ax.scatter(i + rng.uniform(-0.18, 0.18, len(y)), y, s=12, alpha=0.8, color=colors[w])
            if len(g):
                ax.hlines(float(g["gen_epoch"].astype(float).median()), i - 0.3, i + 0.3, color="k", lw=1.5)
        ax.set_xticks(range(len(cells)), labels, fontsize=7)
        ax.set_xlim(-0.6, len(cells) - 0.4)
        ax.set(title=task, ylabel="first epoch with adv = 100%")
    for ax in axes[len(tasks) :]:
        ax.set_visible(False)
    if len(wds) > 1:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], ls="", marker="o", color=c, label=f"wd={w:g}") for w, c in colors.items()]
        fig.legend(handles=handles, loc="outside upper right", fontsize=8)
    out = save_figure(fig, run_dir / "gen_epoch.png")
    return Fig(
        title,
        out,
        "One dot per generalizing seed, black bar = median; ticks give generalized/seeds. "
        "Look at the spread: the onset varies widely between seeds, and should come earlier with more heads in 2L.",
    )


def transient_figure(summary: pd.DataFrame, run_dir: Path) -> Fig:
    wds = sorted(summary["weight_decay"].unique())
    fig, axes = new_figure(1, 1, w=4.6, h=4.2)
    ax = axes[0]
    for i, w in enumerate(wds):
        d = summary[np.isclose(summary["weight_decay"], w)]
        marker = "osD^v<>"[i % 7]  # hollow, distinct shapes: identical points of two decays stay visible
        ax.scatter(100 * d["peak_adv_acc"], 100 * d["final_adv_acc"], s=18 + 10 * i, marker=marker,
                   facecolors="none", edgecolors=f"C{i}", linewidths=1, label=f"wd={w:g}")
    ax.plot([0, 100], [0, 100], ls="--", color="gray", lw=1, label="y = x")
    ax.set(xlabel="peak adversarial accuracy (%)", ylabel="final adversarial accuracy (%)")
    ax.set(xlim=(-3, 103), ylim=(-3, 103))
    ax.set_aspect("equal")
    ax.legend(fontsize=8)
    out = save_figure(fig, run_dir / "transient.png")
    return Fig(
        "Transient generalization: peak vs final adversarial accuracy",
        out,
        "One dot per member. On the diagonal, a model kept its best; dots at peak 100% but below the diagonal "
        "generalized and then lost it — expected more often at high weight decay (0.4).",
    )


def transient_counts(summary: pd.DataFrame) -> str:
    rows = []
    for w, d in summary.groupby("weight_decay", sort=True):
        k = int(d["generalized"].sum())
        kept = int((d["generalized"] & d["retained"].astype(bool)).sum())
        rows.append([f"{w:g}", str(len(d)), str(k), str(kept), str(k - kept)])
    return md_table(["weight decay", "members", "generalized", "retained to the end", "lost (transient)"], rows)


# ---------------------------------------------------------------- mechanism (issue 4)


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


def aligned_figure(summary: pd.DataFrame, run_dir: Path) -> Fig:
    """Adversarial and validation accuracy of generalizing members, aligned at their gen_epoch."""
    title = "Curves aligned at the generalization epoch"
    gen = summary[summary["generalized"]]
    path = run_dir / "curves.parquet"
    if gen.empty or not path.is_file():
        return Fig(title, None, "no member generalized" if gen.empty else "no curves.parquet")
    curves = pd.read_parquet(path, columns=["member", "epoch", "split", "acc"])
    caps = sorted({(int(a), int(b)) for a, b in gen[["layers", "heads"]].itertuples(index=False)}, key=paper_order)
    fig, axes = new_figure(1, len(caps), w=4.2)
    for ax, (layers, heads) in zip(axes, caps, strict=False):
        d = gen[(gen["layers"] == layers) & (gen["heads"] == heads)]
        for _, m in pick_members(d).iterrows():
            c = curves[curves["member"] == m["member"]]
            for split in ("val", "adv"):
                s = c[c["split"] == split]
                ax.plot(s["epoch"] - m["gen_epoch"], 100 * s["acc"], lw=0.8, alpha=0.6, color=SPLIT_COLORS[split])
        ax.axvline(0, ls="--", color="gray", lw=1)
        ax.set(title=f"{cap_label(layers, heads)} ({len(d)} generalized)", xlabel="epochs from gen_epoch", ylabel="accuracy (%)")
    return Fig(title, save_figure(fig, run_dir / "aligned.png"),
               "Seed-conditional view: aligned at the epoch each seed reaches 100% adversarial accuracy, runs that look "
               "different on the raw time axis share one transition shape (blue val, orange adv).")


def gradient_figures(summary: pd.DataFrame, run_dir: Path) -> list[Fig]:
    """Gradient conflict over training, and amplification against r/(1-r) (gradients.parquet)."""
    path = run_dir / "gradients.parquet"
    if not path.is_file():
        return [Fig("Gradient dynamics", None, "no gradients.parquet (set train.gradients.enabled: true)")]
    g = pd.read_parquet(path).merge(summary[["member", "layers", "heads", "ratio"]], on="member")
    fig, axes = new_figure(1, 1, w=5.0)
    ax = axes[0]
    top = g["ratio"].max()
    for i, (layers, d) in enumerate(sorted(g[g["ratio"] == top].groupby("layers"), key=lambda kv: -kv[0])):
        for _, m in d.groupby("member"):
            ax.plot(m["epoch"], m["cosine"], color=f"C{i}", lw=0.7, alpha=0.5)
        ax.plot([], [], color=f"C{i}", label=f"{layers}L")
        med = d.groupby("epoch")["cosine"].median()
        ax.plot(med.index, med.values, color=f"C{i}", lw=2.2)
    ax.axhline(0, color="gray", lw=1, ls="--")
    ax.set(xlabel="epoch", ylabel="cos(g_consistent, g_anti)", title=f"gradient conflict at r = {top:g}")
    ax.legend()
    conflict = Fig("Gradient conflict over training", save_figure(fig, run_dir / "grad_conflict.png"),
                   "Cosine between the consistent-sample and anti-sample gradients (thin: seeds; thick: median). The "
                   "paper: negative at first; in 2L at high r it resolves toward 0 as the model generalizes, in 1L it persists.")
    fig, axes = new_figure(1, 1, w=5.0)
    ax = axes[0]
    d = g[np.isfinite(g["expected_ratio"]) & g["per_example_ratio"].notna()]
    for i, (layers, dd) in enumerate(sorted(d.groupby("layers"), key=lambda kv: -kv[0])):
        ax.scatter(dd["expected_ratio"], dd["per_example_ratio"], s=8, alpha=0.4, color=f"C{i}", label=f"{layers}L")
    if len(d):
        lim = [d["expected_ratio"].min(), d["expected_ratio"].max()]
        ax.plot(lim, lim, ls="--", color="gray", lw=1, label="ratio = r/(1-r)")
    ax.set(xlabel="r / (1 - r)", ylabel="per-example gradient norm, anti / consistent", yscale="log")
    ax.legend(fontsize=8)
    amp = Fig("Gradient amplification", save_figure(fig, run_dir / "grad_amplification.png"),
              "Each dot is one member at one measurement. Once the shortcut saturates, anti-shortcut samples carry "
              "far more gradient than consistent ones (paper: 9-17x at r = 0.9, against r/(1-r) = 9).")
    return [conflict, amp]


def circuit_figures(summary: pd.DataFrame, run_dir: Path) -> list[Fig]:
    """Fingerprint evolution per head, and ablation heatmaps (circuits.parquet, `seedlab shortcut analyze`)."""
    path = run_dir / "circuits.parquet"
    if not path.is_file():
        return [Fig("Circuits", None, "no circuits.parquet (checkpoint the runs, then `seedlab shortcut analyze DIR`)")]
    caps_of = summary[["member", "layers", "heads", "ratio"]].rename(columns={"layers": "n_layers", "heads": "n_heads"})
    c = pd.read_parquet(path).merge(caps_of, on="member")  # member ids are global in a sweep
    heads = c[c["head"] >= 0]
    prints = [("qk_rho_value", "QK rho with token value"), ("attn_pos0", "attention on position 0"), ("ov_rho_residue", "OV rho with residue")]
    caps = sorted({(int(a), int(b)) for a, b in heads[["n_layers", "n_heads"]].itertuples(index=False)}, key=paper_order)
    fig, axes = new_figure(len(caps), len(prints), w=3.8, h=2.8)
    for row, (L, H) in enumerate(caps):
        d = heads[(heads["n_layers"] == L) & (heads["n_heads"] == H)]
        for col, (name, label) in enumerate(prints):
            ax = axes[row * len(prints) + col]
            for (layer, head, r), g in d.groupby(["layer", "head", "ratio"]):
                med = g.groupby("epoch")[name].median()
                ax.plot(med.index, med.values, marker=".", lw=1, label=f"L{layer}H{head} r={r:g}")
            ax.set(title=f"{cap_label(L, H)}: {label}", xlabel="epoch", ylim=(-1.05, 1.05) if "rho" in name else (0, 1.02))
            if col == 0:
                ax.legend(fontsize=6)
    fp = Fig("Fingerprint evolution per head", save_figure(fig, run_dir / "fingerprints.png"),
             "Median over seeds at each checkpoint. A shortcut head: QK rho near 1 (attends to the max) or attention on "
             "position 0 near 1 (first-element shortcut); a robust head: OV rho with parity near 1.")
    last = c[c["epoch"] == c.groupby("member")["epoch"].transform("max")]
    last = last.assign(component=np.where(last["head"] >= 0, "L" + last["layer"].astype(str) + "H" + last["head"].astype(str), "L" + last["layer"].astype(str) + "MLP"))
    cells = sorted({(int(a), int(b), float(r)) for a, b, r in last[["n_layers", "n_heads", "ratio"]].itertuples(index=False)}, key=paper_order)
    comps = sorted(last["component"].unique())
    fig, axes = new_figure(1, 2, w=max(4.0, 0.9 * len(comps) + 2), h=0.45 * len(cells) + 1.6)
    for ax, split in zip(axes, ("val", "adv"), strict=True):
        grid = np.full((len(cells), len(comps)), np.nan)
        for i, (L, H, r) in enumerate(cells):
            d = last[(last["n_layers"] == L) & (last["n_heads"] == H) & np.isclose(last["ratio"], r)]
            for j, comp in enumerate(comps):
                v = d.loc[d["component"] == comp, f"zero_ablation_{split}"]
                grid[i, j] = 100 * v.mean() if len(v) else np.nan
        im = ax.imshow(grid, cmap="RdBu", vmin=-100, vmax=100, aspect="auto")
        ax.set_xticks(range(len(comps)), comps, fontsize=7)
        ax.set_yticks(range(len(cells)), [f"{cap_label(L, H)} r={r:g}" for L, H, r in cells], fontsize=7)
        ax.set_title(f"zero-ablation: change in {split} accuracy (points)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    abl = Fig("Ablation heatmap (last checkpoint)", save_figure(fig, run_dir / "ablation.png"),
              "Mean over seeds of the accuracy change when one component's output is zeroed. A component the shortcut "
              "needs costs validation accuracy; one the rule needs costs adversarial accuracy.")
    return [fp, abl]
