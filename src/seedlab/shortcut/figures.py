"""The figures of the shortcut report, one function per figure.

Each takes the per-member summary and the folder (a run or sweep folder, see
:mod:`seedlab.shortcut.rundir`), draws one PNG beside the report and returns a
:class:`~seedlab.reporting.Fig` (its title, path and caption); a figure whose data are
missing returns a Fig without a path that says why. The folder's tables are read by
:mod:`seedlab.shortcut.rundir` and what is drawn is computed by :mod:`seedlab.shortcut.report_data` and
:mod:`seedlab.shortcut.circuit_data`;
this module only draws. The labels both the text and the figures use (capacities, ratios) are
here too, and the one colour map: each condition (a split, a depth, a weight decay) has one colour in
every panel and figure, and the heads (components) a palette of their own that shares no colour with
the conditions'. Captions are written from what the run holds (its tasks, ratios, weight decays).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from seedlab.reporting import Fig, new_figure, save_figure
from seedlab.shortcut import circuit_data, report_data
from seedlab.shortcut.rundir import RunDir, SweepDir, read_table, table_columns
from seedlab.shortcut.stats import CAPACITY, chance, paper_order

Folder = RunDir | SweepDir
MAX_SEEDS_DRAWN = 12  # per panel of curves.png

# ---------------------------------------------------------------- the colour map (one colour per condition)

SPLIT_COLORS = {"val": "tab:blue", "adv": "tab:orange"}
#: what each split's rows are, whatever ratio r the members trained at
SPLIT_NOTES = {"val": "every row shortcut-consistent", "adv": "every row anti-shortcut"}
#: a model's depth, in every figure that tells depths apart (2L and 1L: the contrast the question is about)
DEPTH_COLORS = {2: "tab:green", 1: "tab:purple", 3: "tab:brown", 4: "tab:pink"}
WD_COLORS = ("tab:cyan", "tab:olive", "tab:red", "#c49c94")  # weight decays, in ascending order
#: heads and MLPs (``L0H1``, ``L1MLP``), in name order: a palette of their own, no colour of the conditions above
COMPONENT_COLORS = ("#393b79", "#bd9e39", "#ad494a", "#637939", "#a55194", "#6b6ecf", "#8c6d31", "#d6616b",
                    "#7b4173", "#8ca252")
REFERENCE_COLOR = "gray"  # chance, y = x, zero: dashed reference lines
ABSENT_COLOR = "#d9d9d9"  # a heatmap cell without data (hatched): never white, which is a zero change
#: the colours' names in captions
COLOR_NAMES = {"tab:blue": "blue", "tab:orange": "orange"}
#: a second condition inside one colour (a depth's head counts, the ratios of one head), in ascending order
LINE_STYLES = ("-", "--", ":", "-.")


def depth_color(layers: int) -> str:
    return DEPTH_COLORS.get(int(layers), "black")


def wd_colors(summary: pd.DataFrame) -> dict[float, str]:
    """Each weight decay of the summary -> its colour (the same in every figure of one report)."""
    return {w: WD_COLORS[i % len(WD_COLORS)] for i, w in enumerate(sorted(summary["weight_decay"].unique()))}


def component_colors(components) -> dict[str, str]:
    """Each component name (``L0H1``) -> its colour of :data:`COMPONENT_COLORS`, in name order (the same in every
    figure of one report, which all draw the components of one circuits.parquet)."""
    return {c: COMPONENT_COLORS[i % len(COMPONENT_COLORS)] for i, c in enumerate(sorted(set(components)))}


def split_legend(fig, splits) -> None:
    """One legend for the figure: the splits drawn, each with what its rows are."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=SPLIT_COLORS[s], lw=1.2, label=f"{s}: {SPLIT_NOTES[s]}")
               for s in SPLIT_COLORS if s in set(splits)]
    fig.legend(handles=handles, loc="outside upper right", fontsize=8)


def splits_text(splits) -> str:
    """'val (blue) and adv (orange)': the drawn splits with their colours, for a caption."""
    return " and ".join(f"{s} ({COLOR_NAMES[SPLIT_COLORS[s]]})" for s in SPLIT_COLORS if s in set(splits))


def shortcut_fingerprint_text(tasks) -> str:
    """What marks a shortcut head in the tasks a run holds: QK ρ with token value for max tasks, attention on
    position 0 for first tasks."""
    kinds = {str(t).rsplit("-", 1)[-1] for t in tasks}
    parts = [text for kind, text in (("max", "QK ρ with token value near 1 (attends to the max)"),
                                     ("first", "attention on position 0 near 1 (the first-element shortcut)"))
             if kind in kinds]
    return " or ".join(parts) if parts else "its task's shortcut fingerprint"


def panel_count(shown: int, total: int) -> str:
    """'5 members', or 'first 12 of 14 members' where a panel shows fewer than it has."""
    return f"{total} member{'s' * (total != 1)}" if shown == total else f"first {shown} of {total} members"


# ---------------------------------------------------------------- labels (the report's text uses them too)


def cap_label(layers: int, heads: int) -> str:
    return f"{int(layers)}L/{int(heads)}H"


def fmt_ratio(r: float) -> str:
    return f"{r:g}"


# ---------------------------------------------------------------- headline figures


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    ncols = min(n, max_cols)
    return math.ceil(n / ncols), ncols


def rate_vs_ratio_figure(summary: pd.DataFrame, rates: pd.DataFrame, folder: Folder) -> Fig:
    """Generalization rate (Wilson intervals) against r, one line per capacity, one panel per task."""
    tasks = sorted(rates["task"].unique())
    fig, axes = new_figure(*_grid(len(tasks)))
    many_wd = summary["weight_decay"].nunique() > 1
    wds = sorted(summary["weight_decay"].unique())
    heads_of = {layers: sorted(d["heads"].unique()) for layers, d in rates.groupby("layers")}
    for ax, task in zip(axes, tasks, strict=False):
        t = rates[rates["task"] == task]
        lines = list(t.groupby([*CAPACITY, "weight_decay"], sort=True))
        for i, ((layers, heads, wd), d) in enumerate(lines):
            d = d.sort_values("ratio")
            x = d["ratio"].to_numpy() + 0.006 * (i - (len(lines) - 1) / 2)  # separate overlapping bars
            y = 100 * d["rate"].to_numpy()
            err = [y - 100 * d["lo"].to_numpy(), 100 * d["hi"].to_numpy() - y]
            label = cap_label(layers, heads) + (f" wd={wd:g}" if many_wd else "")
            style = LINE_STYLES[heads_of[layers].index(heads) % len(LINE_STYLES)]  # a depth's head counts apart
            ax.errorbar(x, y, yerr=err, marker="osD^v"[wds.index(wd) % 5], ms=4, capsize=3, lw=1.2, ls=style,
                        color=depth_color(layers), label=label)
        ax.axvline(chance(task), ls="--", color=REFERENCE_COLOR, lw=1, label="chance")
        ratios = sorted(t["ratio"].unique())
        ax.set(title=task, xlabel="spurious ratio r", ylabel="generalization rate (%)")
        ax.set(xlim=ratio_limits([*ratios, chance(task)]), ylim=(-5, 105))
        ax.set_xticks(ratios, [fmt_ratio(r) for r in ratios])
        ax.legend(fontsize=7)
    for ax in axes[len(tasks) :]:
        ax.set_visible(False)
    path = save_figure(fig, folder.figure("rate_vs_ratio.png"))
    return Fig("Generalization rate vs spurious ratio", path, rate_caption(rates))


def ratio_limits(xs: list[float]) -> tuple[float, float]:
    """The x-axis of a rate-vs-ratio panel: the ratios run (and chance), with a margin of a tenth of their span
    (0.05 at least) on each side."""
    lo, hi = min(xs), max(xs)
    pad = max(0.05, 0.1 * (hi - lo))
    return lo - pad, hi + pad


def rate_caption(rates: pd.DataFrame) -> str:
    """What to look for in the rate-vs-ratio figure, from what it draws."""
    bars = "bars are 95% Wilson intervals; the dashed line is chance."
    if rates.groupby("task")["ratio"].nunique().max() < 2:
        return f"Each capacity was trained at one ratio, so no line has a slope; {bars}"
    if {1, 2} <= set(rates["layers"]):
        return f"Look for the lines to cross: the paper has 2L rise as r moves away from chance while 1L falls; {bars}"
    return f"How each capacity's rate changes as r moves away from chance; {bars}"


def curves_figure(summary: pd.DataFrame, folder: Folder, task: str, wd: float) -> Fig:
    """Validation and adversarial accuracy of up to MAX_SEEDS_DRAWN seeds per capacity x ratio, in one (task, wd)."""
    title = "Training curves per seed"
    if not folder.curves_path.is_file():
        return Fig(title, None, "no curves.parquet in the sweep folder.")
    panels = report_data.curve_panels(summary, task, wd, MAX_SEEDS_DRAWN)
    wanted = pd.concat([p for _, p, _ in panels])
    has_job = "job" in wanted and "job" in table_columns(folder, "curves")
    keys = ["job", "member"] if has_job else ["member"]
    curves = read_table(
        folder, "curves",
        columns=[*keys, "epoch", "split", "acc"],
        filters=[("member", "in", [int(m) for m in wanted["member"]]), ("split", "in", ["val", "adv"])],
    )
    if curves.empty:
        return Fig(title, None, f"curves.parquet has no val/adv rows for the members of {task}.")
    caps = sorted({k[:2] for k, _, _ in panels}, key=paper_order)
    ratios = sorted({k[2] for k, _, _ in panels})
    fig, axes = new_figure(len(caps), len(ratios), w=3.6, h=2.8)
    splits = sorted(set(curves["split"]))
    axes = axes.reshape(len(caps), len(ratios))
    for ax in axes.ravel():
        ax.set_visible(False)
    for (layers, heads, r), members, n_all in panels:
        ax = axes[caps.index((layers, heads)), ratios.index(r)]
        ax.set_visible(True)
        mc = curves.merge(members[keys], on=keys)
        for _, m in mc.groupby(keys, sort=False):
            for split, s in m.groupby("split"):
                s = s.sort_values("epoch")
                ax.plot(s["epoch"], 100 * s["acc"], lw=0.6, alpha=0.75, color=SPLIT_COLORS[split])
        ax.set_title(f"{cap_label(layers, heads)} trained at r = {fmt_ratio(r)}: {panel_count(len(members), n_all)}",
                     fontsize=9)
        ax.set(xlabel="epoch", ylabel="accuracy (%)", ylim=(-3, 103))
    split_legend(fig, splits)
    fig.suptitle(f"{task}, weight decay {wd:g}", fontsize=10)
    out = save_figure(fig, folder.figure("curves.png"))
    two = {"val", "adv"} <= set(splits)
    look = (" Look for the two phases: val reaches ~100% first (the shortcut), then in generalizing members adv "
            "climbs to 100% later while val stays high." if two else "")
    return Fig(
        title,
        out,
        f"{task}, weight decay {wd:g}: one line per member and split, {splits_text(splits)}, at most "
        f"{MAX_SEEDS_DRAWN} members per panel. The panels' r is the ratio the members trained at; the evaluation "
        f"splits are the same at every r.{look}",
    )


def gen_epoch_figure(summary: pd.DataFrame, folder: Folder) -> Fig:
    """The generalization epoch of every generalizing seed, per capacity x ratio."""
    title = "When seeds generalize"
    gen = summary[summary["generalized"] & summary["gen_epoch"].notna()]
    if gen.empty:
        return Fig(title, None, "no member generalized, so there is no generalization epoch to show.")
    by_task = report_data.gen_epochs(summary)
    colors = wd_colors(summary)
    fig, axes = new_figure(*_grid(len(by_task), 2), w=5.5, h=3.4)
    rng = np.random.default_rng(0)  # jitter only
    for ax, (task, cells) in zip(axes, by_task.items(), strict=False):
        labels = []
        for i, c in enumerate(cells):
            labels.append(f"{cap_label(c.layers, c.heads)}\nr={fmt_ratio(c.ratio)}\n{len(c.epochs)}/{c.members}")
            for w, dw in c.epochs.groupby("weight_decay"):
                y = dw["gen_epoch"].to_numpy()
                ax.scatter(i + rng.uniform(-0.18, 0.18, len(y)), y, s=12, alpha=0.8, color=colors[w])
            if c.median is not None:
                ax.hlines(c.median, i - 0.3, i + 0.3, color="k", lw=1.5)
        ax.set_xticks(range(len(cells)), labels, fontsize=7)
        ax.set_xlim(-0.6, len(cells) - 0.4)
        ax.set(title=task, ylabel="first epoch with adv = 100%")
    for ax in axes[len(by_task) :]:
        ax.set_visible(False)
    if len(colors) > 1:
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], ls="", marker="o", color=c, label=f"wd={w:g}") for w, c in colors.items()]
        fig.legend(handles=handles, loc="outside upper right", fontsize=8)
    out = save_figure(fig, folder.figure("gen_epoch.png"))
    heads_2l = summary.loc[summary["layers"] == 2, "heads"].nunique()
    more_heads = ", and in the paper comes earlier with more heads in 2L" if heads_2l > 1 else ""
    colours = "; colour: weight decay" if len(colors) > 1 else ""
    return Fig(
        title,
        out,
        f"One dot per generalizing member, black bar = median; ticks give generalized/members{colours}. "
        f"Look at the spread: the onset varies between members{more_heads}.",
    )


def transient_figure(summary: pd.DataFrame, folder: Folder) -> Fig:
    """Peak against final adversarial accuracy of every member, per weight decay."""
    colors = wd_colors(summary)
    fig, axes = new_figure(1, 1, w=4.6, h=4.2)
    ax = axes[0]
    for i, w in enumerate(colors):
        d = summary[np.isclose(summary["weight_decay"], w)]
        marker = "osD^v<>"[i % 7]  # hollow, distinct shapes: identical points of two decays stay visible
        ax.scatter(100 * d["peak_adv_acc"], 100 * d["final_adv_acc"], s=18 + 10 * i, marker=marker,
                   facecolors="none", edgecolors=colors[w], linewidths=1, label=f"wd={w:g}")
    ax.plot([0, 100], [0, 100], ls="--", color=REFERENCE_COLOR, lw=1, label="y = x")
    ax.set(xlabel="peak adversarial accuracy (%)", ylabel="final adversarial accuracy (%)")
    ax.set(xlim=(-3, 103), ylim=(-3, 103))
    ax.set_aspect("equal")
    ax.legend(fontsize=8)
    out = save_figure(fig, folder.figure("transient.png"))
    high = (f"; the paper expects it more often at high weight decay ({max(colors):g} here)" if len(colors) > 1
            else "")
    return Fig(
        "Transient generalization: peak vs final adversarial accuracy",
        out,
        "One dot per member. On the diagonal, a model kept its best; dots at peak 100% but below the diagonal "
        f"generalized and then lost it{high}.",
    )


# ---------------------------------------------------------------- mechanism figures


def aligned_figure(summary: pd.DataFrame, folder: Folder) -> Fig:
    """Adversarial and validation accuracy of generalizing members, aligned at their gen_epoch."""
    title = "Curves aligned at the generalization epoch"
    gen = summary[summary["generalized"]]
    curves = read_table(folder, "curves", columns=["member", "epoch", "split", "acc"])
    if gen.empty or curves is None:
        return Fig(title, None, "no member generalized" if gen.empty else "no curves.parquet")
    panels = report_data.aligned_curves(summary, curves, MAX_SEEDS_DRAWN)
    fig, axes = new_figure(*_grid(len(panels), 2), w=4.2)
    splits = set()
    for ax, ((layers, heads), n, lines) in zip(axes, panels, strict=False):
        for (_, split), s in lines.groupby(["member", "split"], sort=False):
            ax.plot(s["epochs_from_gen"], 100 * s["acc"], lw=0.8, alpha=0.6, color=SPLIT_COLORS[split])
            splits.add(split)
        ax.axvline(0, ls="--", color=REFERENCE_COLOR, lw=1)
        shown = lines["member"].nunique()
        ax.set(title=f"{cap_label(layers, heads)}: {panel_count(shown, n)} that generalized",
               xlabel="epochs from gen_epoch", ylabel="accuracy (%)", ylim=(-3, 103))
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    split_legend(fig, splits)
    return Fig(title, save_figure(fig, folder.figure("aligned.png")),
               "Seed-conditional view: aligned at the epoch each member reaches 100% adversarial accuracy (dashed line), "
               f"runs that look different on the raw time axis share one transition shape; {splits_text(splits)}.")


def gradient_figures(summary: pd.DataFrame, folder: Folder) -> list[Fig]:
    """Gradient conflict over training, and amplification against r/(1-r) (gradients.parquet)."""
    grads = read_table(folder, "gradients")
    if grads is None:
        return [Fig("Gradient dynamics", None, "no gradients.parquet (set train.gradients.enabled: true)")]
    g = grads.merge(summary[["member", "layers", "heads", "ratio"]], on="member")
    return [grad_conflict_figure(g, folder), grad_amplification_figure(g, folder)]


def grad_conflict_figure(g: pd.DataFrame, folder: Folder) -> Fig:
    """Both conflict measures over training, at the highest r: the cosine of the groups' mean gradients
    and the mean pairwise per-example cosine (shortcut/gradients.py)."""
    measures = [("cosine", "cos(mean g_consistent, mean g_anti)", "the cosine of the two groups' mean gradients"),
                ("pair_cosine", "mean pairwise cos(g_i, g_j)", "the mean cosine over pairs of one consistent and one "
                                                               "anti example")]
    measures = [m for m in measures if m[0] in g and g[m[0]].notna().any()]
    fig, axes = new_figure(len(measures), 1, w=6.0, h=3.2)  # stacked: one epoch axis, a page's width
    for ax, (col, label, _) in zip(axes, measures, strict=True):
        top, depths = report_data.conflict_over_training(g, col)
        for layers, members, med in depths:
            for m in members:
                ax.plot(m["epoch"], m[col], color=depth_color(layers), lw=0.7, alpha=0.5)
            ax.plot(med.index, med.values, color=depth_color(layers), lw=2.2, label=f"{layers}L")
        ax.axhline(0, color=REFERENCE_COLOR, lw=1, ls="--")
        ax.set(xlabel="epoch", ylabel=label, title=f"{label} at r = {top:g}")
        ax.legend(fontsize=8)
    where = ("Top: {}; bottom: {}." if len(measures) == 2 else "{}.").format(*(m[2] for m in measures))
    return Fig("Gradient conflict over training", save_figure(fig, folder.figure("grad_conflict.png")),
               f"Thin: members; thick: median; colour: depth. {where[0].upper() + where[1:]} The paper: negative at "
               "first, resolving toward 0 in 2L at high r; the table below says which measure does that here.")


def grad_amplification_figure(g: pd.DataFrame, folder: Folder) -> Fig:
    """The anti/consistent gradient-norm ratio of every member at every measurement against a calibrated model's, in
    logit space (the calibrated ratio's own space) and in parameter space; gradients.parquet from before the logit
    ratio existed: parameter space alone."""
    spaces = [(c, lab) for c, lab in (("logit_grad_ratio", "logit space: |∂ℓ/∂z|, anti / consistent"),
                                      ("per_example_ratio", "parameter space: |∂ℓ/∂θ|, anti / consistent"))
              if c in g and g[c].notna().any()] or [("per_example_ratio", "parameter space: |∂ℓ/∂θ|, anti / consistent")]
    fig, axes = new_figure(len(spaces), 1, w=6.0, h=3.4)  # stacked: one x axis, a page's width
    for ax, (col, label) in zip(axes, spaces, strict=True):
        d = g[np.isfinite(g["expected_ratio"]) & g[col].notna()]
        for layers, dd in sorted(d.groupby("layers"), key=lambda kv: -kv[0]):
            ax.scatter(dd["expected_ratio"], dd[col], s=8, alpha=0.4, color=depth_color(layers), label=f"{layers}L")
        if len(d):
            lim = [d["expected_ratio"].min(), d["expected_ratio"].max()]
            ax.plot(lim, lim, ls="--", color=REFERENCE_COLOR, lw=1, label="a calibrated model's ratio")
        ax.set(xlabel="calibrated model's ratio, r/(1-r) for two classes", ylabel="anti / consistent", yscale="log",
               title=label)
        ax.legend(fontsize=8)
    paper = (" (the paper: 9-17x at r = 0.9, against r/(1-r) = 9)" if np.isclose(g["ratio"], 0.9).any() else "")
    logit = (" The calibrated model's ratio is measured on the logits' gradient, so the logit-space panel is the "
             "like-for-like one." if len(spaces) > 1 else "")
    return Fig("Gradient amplification", save_figure(fig, folder.figure("grad_amplification.png")),
               "Each dot is one member at one measurement; colour: depth. Once the shortcut saturates, anti-shortcut "
               f"samples carry far more gradient than consistent ones{paper}.{logit}")


def circuit_figures(summary: pd.DataFrame, folder: Folder) -> list[Fig]:
    """Fingerprint evolution per head, and ablation heatmaps (circuits.parquet, `seedlab shortcut analyze`)."""
    circuits = read_table(folder, "circuits")
    if circuits is None:
        return [Fig("Circuits", None, "no circuits.parquet (checkpoint the runs, then `seedlab shortcut analyze DIR`)")]
    caps_of = summary[["member", "layers", "heads", "ratio"]].rename(columns={"layers": "n_layers", "heads": "n_heads"})
    c = circuits.merge(caps_of, on="member")  # member ids are global in a sweep
    return [fingerprints_figure(c, folder, sorted(summary["task"].unique())), ablation_figure(summary, circuits, folder)]


def fingerprints_figure(c: pd.DataFrame, folder: Folder, tasks: list[str]) -> Fig:
    """Median QK/OV fingerprints of every head at every checkpoint, per capacity and ratio (colour: the head, as in
    the head-roles figure; line style: the ratio)."""
    heads = c[c["head"] >= 0]
    colors = component_colors("L" + heads["layer"].astype(str) + "H" + heads["head"].astype(str))
    ratios = sorted(heads["ratio"].unique())
    prints = [("qk_rho_value", "QK rho with token value"), ("attn_pos0", "attention on position 0"), ("ov_rho_residue", "OV rho, token residue (direct)")]
    caps = sorted({(int(a), int(b)) for a, b in heads[["n_layers", "n_heads"]].itertuples(index=False)}, key=paper_order)
    fig, axes = new_figure(len(caps), len(prints), w=3.8, h=2.8)
    for row, (L, H) in enumerate(caps):
        d = heads[(heads["n_layers"] == L) & (heads["n_heads"] == H)]
        for col, (name, label) in enumerate(prints):
            ax = axes[row * len(prints) + col]
            for (layer, head, r), med in circuit_data.fingerprint_series(d, name):
                ax.plot(med.index, med.values, marker=".", lw=1, color=colors[f"L{layer}H{head}"],
                        ls=LINE_STYLES[ratios.index(r) % len(LINE_STYLES)], label=f"L{layer}H{head} r={r:g}")
            ax.set(title=f"{cap_label(L, H)}: {label}", xlabel="epoch", ylim=(-1.05, 1.05) if "rho" in name else (0, 1.02))
            if col == 0:
                ax.legend(fontsize=6)
    return Fig("Fingerprint evolution per head", save_figure(fig, folder.figure("fingerprints.png")),
               "Median over seeds at each checkpoint; colour = head, line style = r. A shortcut head: "
               f"{shortcut_fingerprint_text(tasks)}; OV ρ: each token's own residue on the direct path, not the sum's "
               "parity.")


def ablation_figure(summary: pd.DataFrame, circuits: pd.DataFrame, folder: Folder) -> Fig:
    """Mean zero-ablation effect of every component at each member's last checkpoint, per capacity and ratio
    (:func:`seedlab.shortcut.circuit_data.ablation_grid`)."""
    from matplotlib.patches import Patch, Rectangle

    cells, comps, grids = circuit_data.ablation_grid(summary, circuits)
    # stacked, val above adv: one row of cells per capacity and ratio, a page's width for the components
    fig, axes = new_figure(2, 1, w=max(4.5, 0.8 * len(comps) + 2.5), h=0.45 * len(cells) + 1.4)
    absent = dict(facecolor=ABSENT_COLOR, edgecolor="#969696", hatch="///", lw=0)
    for ax, split in zip(axes, ("val", "adv"), strict=True):
        im = ax.imshow(grids[split], cmap="RdBu", vmin=-100, vmax=100, aspect="auto")
        for i, j in zip(*np.nonzero(np.isnan(grids[split])), strict=True):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **absent))
        ax.set_xticks(range(len(comps)), comps, fontsize=7)
        ax.set_yticks(range(len(cells)), [f"{cap_label(L, H)} r={r:g}" for L, H, r in cells], fontsize=7)
        ax.set_title(f"zero-ablation: change in {split} accuracy")
        fig.colorbar(im, ax=ax, shrink=0.8, label="points (white: no change)")
    missing = np.isnan(grids["val"]).any() or np.isnan(grids["adv"]).any()
    if missing:
        fig.legend(handles=[Patch(label="absent: the model has no such component", **absent)], loc="outside lower center",
                   fontsize=8)
    note = " Hatched grey: a component the cell's models do not have." if missing else ""
    return Fig("Ablation heatmap (last checkpoint)", save_figure(fig, folder.figure("ablation.png")),
               "Mean over seeds of the accuracy change when one component's output is zeroed; white is no change. A "
               f"component the shortcut needs costs validation accuracy; one the rule needs costs adversarial accuracy.{note}")
