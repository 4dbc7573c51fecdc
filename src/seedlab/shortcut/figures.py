"""The figures of the shortcut report, one function per figure.

Each takes the per-member summary and the folder (a run or sweep folder, see
:mod:`seedlab.shortcut.rundir`), draws one PNG beside the report and returns a
:class:`~seedlab.reporting.Fig` (its title, path and caption); a figure whose data are
missing returns a Fig without a path that says why. The labels both the text and the
figures use (capacities, ratios) are here too.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from seedlab.reporting import Fig, new_figure, save_figure
from seedlab.shortcut.rundir import RunDir, SweepDir
from seedlab.shortcut.stats import CAPACITY, chance, in_group, paper_order

Folder = RunDir | SweepDir
MAX_SEEDS_DRAWN = 12  # per panel of curves.png
SPLIT_COLORS = {"val": "tab:blue", "adv": "tab:orange"}
SPLIT_NOTES = {"val": "r = 1, shortcut holds", "adv": "r = 0, shortcut misleads"}


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
    path = save_figure(fig, folder.figure("rate_vs_ratio.png"))
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


def curves_figure(summary: pd.DataFrame, folder: Folder, task: str, wd: float) -> Fig:
    """Validation and adversarial accuracy of up to MAX_SEEDS_DRAWN seeds per capacity x ratio, in one (task, wd)."""
    import pyarrow.parquet as pq
    from matplotlib.lines import Line2D

    title = "Training curves per seed"
    path = folder.curves_path
    if not path.is_file():
        return Fig(title, None, "no curves.parquet in the sweep folder.")
    sub = in_group(summary, task, wd)
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
    out = save_figure(fig, folder.figure("curves.png"))
    return Fig(
        title,
        out,
        f"{task}, wd {wd:g}, at most {MAX_SEEDS_DRAWN} seeds per panel. Look for the two phases: val (blue) "
        "reaches ~100% first (the shortcut), then in generalizing seeds adv (orange) climbs to 100% later "
        "while val stays high.",
    )


def gen_epoch_figure(summary: pd.DataFrame, folder: Folder) -> Fig:
    """The generalization epoch of every generalizing seed, per capacity x ratio."""
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
    out = save_figure(fig, folder.figure("gen_epoch.png"))
    return Fig(
        title,
        out,
        "One dot per generalizing seed, black bar = median; ticks give generalized/seeds. "
        "Look at the spread: the onset varies widely between seeds, and should come earlier with more heads in 2L.",
    )


def transient_figure(summary: pd.DataFrame, folder: Folder) -> Fig:
    """Peak against final adversarial accuracy of every member, per weight decay."""
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
    out = save_figure(fig, folder.figure("transient.png"))
    return Fig(
        "Transient generalization: peak vs final adversarial accuracy",
        out,
        "One dot per member. On the diagonal, a model kept its best; dots at peak 100% but below the diagonal "
        "generalized and then lost it — expected more often at high weight decay (0.4).",
    )


# ---------------------------------------------------------------- mechanism figures


def aligned_figure(summary: pd.DataFrame, folder: Folder) -> Fig:
    """Adversarial and validation accuracy of generalizing members, aligned at their gen_epoch."""
    title = "Curves aligned at the generalization epoch"
    gen = summary[summary["generalized"]]
    path = folder.curves_path
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
    return Fig(title, save_figure(fig, folder.figure("aligned.png")),
               "Seed-conditional view: aligned at the epoch each seed reaches 100% adversarial accuracy, runs that look "
               "different on the raw time axis share one transition shape (blue val, orange adv).")


def gradient_figures(summary: pd.DataFrame, folder: Folder) -> list[Fig]:
    """Gradient conflict over training, and amplification against r/(1-r) (gradients.parquet)."""
    path = folder.gradients_path
    if not path.is_file():
        return [Fig("Gradient dynamics", None, "no gradients.parquet (set train.gradients.enabled: true)")]
    g = pd.read_parquet(path).merge(summary[["member", "layers", "heads", "ratio"]], on="member")
    return [grad_conflict_figure(g, folder), grad_amplification_figure(g, folder)]


def grad_conflict_figure(g: pd.DataFrame, folder: Folder) -> Fig:
    """Both conflict measures over training, at the highest r: the cosine of the groups' mean gradients
    and the mean pairwise per-example cosine (shortcut/gradients.py)."""
    measures = [("cosine", "cos(mean g_consistent, mean g_anti)"), ("pair_cosine", "mean pairwise cos(g_i, g_j)")]
    measures = [(c, lab) for c, lab in measures if c in g and g[c].notna().any()]
    fig, axes = new_figure(1, len(measures), w=4.6 * len(measures))
    top = g["ratio"].max()
    for ax, (col, label) in zip(axes, measures):
        for i, (layers, d) in enumerate(sorted(g[g["ratio"] == top].groupby("layers"), key=lambda kv: -kv[0])):
            for _, m in d.groupby("member"):
                ax.plot(m["epoch"], m[col], color=f"C{i}", lw=0.7, alpha=0.5)
            ax.plot([], [], color=f"C{i}", label=f"{layers}L")
            med = d.groupby("epoch")[col].median()
            ax.plot(med.index, med.values, color=f"C{i}", lw=2.2)
        ax.axhline(0, color="gray", lw=1, ls="--")
        ax.set(xlabel="epoch", ylabel=label, title=f"gradient conflict at r = {top:g}")
        ax.legend()
    return Fig("Gradient conflict over training", save_figure(fig, folder.figure("grad_conflict.png")),
               "Thin: seeds; thick: median. Left: the cosine of the two groups' mean gradients; right: the mean cosine "
               "over pairs of one consistent and one anti example. The paper: negative at first, resolving toward 0 in "
               "2L at high r; the table below says which of the two measures does that here.")


def grad_amplification_figure(g: pd.DataFrame, folder: Folder) -> Fig:
    """The anti/consistent gradient-norm ratio of every member at every measurement against a calibrated model's, in
    logit space (the calibrated ratio's own space) and in parameter space; gradients.parquet from before the logit
    ratio existed: parameter space alone."""
    spaces = [(c, lab) for c, lab in (("logit_grad_ratio", "logit space: |∂ℓ/∂z|, anti / consistent"),
                                      ("per_example_ratio", "parameter space: |∂ℓ/∂θ|, anti / consistent"))
              if c in g and g[c].notna().any()] or [("per_example_ratio", "parameter space: |∂ℓ/∂θ|, anti / consistent")]
    fig, axes = new_figure(1, len(spaces), w=5.0 * len(spaces))
    for ax, (col, label) in zip(axes, spaces):
        d = g[np.isfinite(g["expected_ratio"]) & g[col].notna()]
        for i, (layers, dd) in enumerate(sorted(d.groupby("layers"), key=lambda kv: -kv[0])):
            ax.scatter(dd["expected_ratio"], dd[col], s=8, alpha=0.4, color=f"C{i}", label=f"{layers}L")
        if len(d):
            lim = [d["expected_ratio"].min(), d["expected_ratio"].max()]
            ax.plot(lim, lim, ls="--", color="gray", lw=1, label="a calibrated model's ratio")
        ax.set(xlabel="calibrated model's ratio (r/(1-r) for two classes)", ylabel=label, yscale="log")
        ax.legend(fontsize=8)
    return Fig("Gradient amplification", save_figure(fig, folder.figure("grad_amplification.png")),
               "Each dot is one member at one measurement. Once the shortcut saturates, anti-shortcut samples carry "
               "far more gradient than consistent ones (paper: 9-17x at r = 0.9, against r/(1-r) = 9). The calibrated "
               "model's ratio is measured on the logits' gradient, so the logit-space panel is the like-for-like one.")


def circuit_figures(summary: pd.DataFrame, folder: Folder) -> list[Fig]:
    """Fingerprint evolution per head, and ablation heatmaps (circuits.parquet, `seedlab shortcut analyze`)."""
    path = folder.circuits_path
    if not path.is_file():
        return [Fig("Circuits", None, "no circuits.parquet (checkpoint the runs, then `seedlab shortcut analyze DIR`)")]
    caps_of = summary[["member", "layers", "heads", "ratio"]].rename(columns={"layers": "n_layers", "heads": "n_heads"})
    c = pd.read_parquet(path).merge(caps_of, on="member")  # member ids are global in a sweep
    return [fingerprints_figure(c, folder), ablation_figure(c, folder)]


def fingerprints_figure(c: pd.DataFrame, folder: Folder) -> Fig:
    """Median QK/OV fingerprints of every head at every checkpoint, per capacity and ratio."""
    heads = c[c["head"] >= 0]
    prints = [("qk_rho_value", "QK rho with token value"), ("attn_pos0", "attention on position 0"), ("ov_rho_residue", "OV rho, token residue (direct)")]
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
    return Fig("Fingerprint evolution per head", save_figure(fig, folder.figure("fingerprints.png")),
               "Median over seeds at each checkpoint. A shortcut head: QK rho near 1 (attends to the max) or attention on "
               "position 0 near 1 (first-element shortcut); OV rho: each token's own residue on the direct path (not the sum's parity).")


def ablation_figure(c: pd.DataFrame, folder: Folder) -> Fig:
    """Mean zero-ablation effect of every component at each member's last checkpoint, per capacity and ratio."""
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
    return Fig("Ablation heatmap (last checkpoint)", save_figure(fig, folder.figure("ablation.png")),
               "Mean over seeds of the accuracy change when one component's output is zeroed. A component the shortcut "
               "needs costs validation accuracy; one the rule needs costs adversarial accuracy.")
