"""The scale axis's words and figures: what twins/scale.py computed across the cells, as one
markdown text (:func:`scale_report`) and one PNG per measure against scale (:func:`measure_figure`). It computes
nothing: every number comes from scale.py's frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from seedlab.reporting import Fig, figure_block, fmt_num, level, md_lines, new_figure, save_figure
from seedlab.twins.figures import color
from seedlab.twins.rundir import ScaleDir
from seedlab.twins.scale import FOCAL, MEASURES, NULLS, ORDINARY_ROWS, Cell
from seedlab.twins.trends import AXES, MIN_LEVELS, PAPER_SCALE, Prediction

#: each group's colour: the twins figures' (twins/figures.py COLORS), the ordinary-row distribution as ordinary-row
_GROUP_COLOR = {ORDINARY_ROWS: "ordinary-row"}


def group_color(group: str) -> str:
    return color(_GROUP_COLOR.get(group, group))


def _ci(r) -> str:
    """``value [low, high]``, or the value alone without an interval; n/a for NaN."""
    if not np.isfinite(r.value):
        return "n/a"
    return fmt_num(r.value) + ("" if not np.isfinite(r.low) else f" [{fmt_num(r.low)}, {fmt_num(r.high)}]")


def _cell_label(c: Cell) -> str:
    return c.description()


def _level(v) -> str:
    return f"{v:g}"


def _held(r) -> str:
    held = r.get("held", "")
    return held if isinstance(held, str) and held else "—"


def _paper(m) -> str:
    return fmt_num(m.paper) if np.isfinite(m.paper) else (m.paper_note or "—")


def _groups(frame: pd.DataFrame) -> list[str]:
    """The groups ``frame`` holds, in the report's order: the passage, then its nulls."""
    held = set(frame.group)
    return [g for g in (FOCAL, *NULLS) if g in held]


def scale_report(cells: Sequence[Cell], table: pd.DataFrame, trends: pd.DataFrame, paper: pd.DataFrame,
                 figures: Sequence[Fig] = (), prediction: Prediction | None = None, verdict: dict | None = None,
                 beside: pd.DataFrame | None = None, alpha: float = 0.05) -> str:
    """The scale table's markdown from scale.py's frames (``table``, ``trends``, ``paper``: ``paper_extrapolation``),
    the figures already drawn, and, when made, the confirmatory prediction and its verdict."""
    lv = level(alpha)
    out = ["# The twins' scale axis", ""]
    if not cells:
        return "\n".join([*out, "No cell is summarised yet.", ""])
    out += [f"{len(cells)} cell(s), each a measured twins design (presets twins/scale-*): the fabricated passage in "
            "row 0 of the batch of s beside its nulls, the ordinary-row distribution (per seed the mean of its "
            "ordinary rows), matched-gradient and the nudge. The paper: B = 256, 9,336 updates after s on a decay "
            f"to its end, peak lr 6e-4, GPT-2 small (d 768, 12 heads of 64, 12 layers). Every interval is a {lv} t interval over the cell's seeds: the value ± t(n − 1) × "
            "its jackknife standard error (leave one seed out; for a mean over seeds, sd/√n).", ""]
    rows = []
    for c in cells:
        stages = ", ".join(f"{k} {v:.0f} s" for k, v in c.stages.items()) or "—"
        lr = "n/a" if c.peak_lr is None else f"{c.peak_lr:g}" + ("" if c.min_lr is None else f" → {c.min_lr:g}")
        rows.append([c.name, str(c.batch_size), str(c.after), str(c.label("decay_after")), lr,
                     f"{c.n_embd} × {c.n_layer}", f"{c.label('n_head')} × {c.label('head_size')}", c.model,
                     f"{len(c.seeds)} ({', '.join(map(str, c.seeds))})", str(len(c.arms)), stages])
    out += md_lines(["cell", "B", "updates after s", "decay: s to min_lr", "peak lr → min", "d × layers",
                     "heads × size", "model", "seeds", "arms", "wall time"], rows)
    out += ["## The table", ""]
    groups = _groups(table)
    for k, m in MEASURES.items():
        t = table[table.measure == k]
        if not len(t):
            continue
        out += [f"### {k}: {m.what} ({m.unit}; paper: {_paper(m)})", ""]
        rows = []
        for c in cells:
            r = t[t.cell == c.name].set_index("group")
            line = [c.name, _cell_label(c)]
            for g in groups:
                cell = "—" if g not in r.index else _ci(r.loc[g])
                if g == ORDINARY_ROWS and g in r.index and np.isfinite(r.loc[g].arm_min):
                    cell += f" (rows {fmt_num(r.loc[g].arm_min)} .. {fmt_num(r.loc[g].arm_max)})"
                line.append(cell)
            rows.append(line)
        out += md_lines(["cell", "scale", *groups], rows)
    fitted = trends[trends.fitted.astype(bool)] if len(trends) else trends
    out += ["## Trends (exploratory)", "",
            "Per measure and axis, the cells that differ in that axis alone, and the number of distinct levels they "
            f"rest on. A trend is fitted only through at least {MIN_LEVELS} levels (a line through two "
            "points is the points, and three levels do not tell a power law from a bend): an OLS fit of "
            "log10(value) on log10(level) where every cell's value is positive (a power law: the slope is its "
            "exponent), else of the value on log10(level) (slope per decade), its slope's interval the OLS t "
            "interval on the residuals. *At the paper*: the fit at the paper's level of that axis (B 256, 9,336 "
            "updates after s and as many to the decay's end, peak lr 6e-4, d 768), an extrapolation where that lies "
            "outside the levels. *Holds*: what every cell of the family shares besides the other labels; a family "
            "that lets a confound move with its level says so.", ""]
    if len(trends) and not len(fitted):
        most = int(trends.points.max())
        out += [f"No trend is fitted: every axis has at most {most} levels (fewer than {MIN_LEVELS}); the table "
                "above is what the cells say, level by level.", ""]
    for g in groups:
        t = trends[trends.group == g]
        if not len(t):
            continue
        rows = [[r.measure, AXES[r.axis], str(r.points), r.levels, r["values"], _held(r),
                 (f"{r.kind}: " + fmt_num(r.slope) + f" [{fmt_num(r.low)}, {fmt_num(r.high)}], df {r.df:.0f}")
                 if r.fitted else f"none: {r.note}",
                 fmt_num(r.at_paper) + f" [{fmt_num(r.at_paper_low)}, {fmt_num(r.at_paper_high)}]" if r.fitted else "—"]
                for _, r in t.iterrows()]
        out += [f"### {g}", ""]
        out += md_lines(["measure", "axis", "n levels", "levels", "values", "holds", "fit (slope)", "at the paper"],
                        rows)
    if len(paper):
        out += ["## At the paper's scale (exploratory)", "",
                "The B fit at B = 256, moved along the steps, schedule, rate and width fits (where the cells have an "
                "axis) to 9,336 updates after s, a decay over all of them, peak lr 6e-4 and d 768 (a steps family "
                "whose decay is stretched with the run moves the schedule with it), assuming the axes do not "
                "interact; the paper's 12 layers are not on any axis. Only where every axis used has a fit; an extrapolation even then: a direction, not a "
                "number to test against.", ""]
        focal = paper[paper.group == FOCAL]
        if not np.isfinite(focal.predicted.astype(float)).any():
            out += ["None is made, " + " / ".join(dict.fromkeys(focal.note)) + ".", ""]
        else:
            rows = []
            for r in focal.itertuples():
                ci = ("—" if not np.isfinite(r.predicted) else fmt_num(r.predicted)
                      + ("" if not np.isfinite(r.low) else f" [{fmt_num(r.low)}, {fmt_num(r.high)}]"))
                rows.append([r.measure, r.axes.replace(",", " + "), ci, r.note,
                             fmt_num(r.paper) if np.isfinite(r.paper) else (r.paper_note or "—")])
            out += md_lines(["measure", "axes", f"{FOCAL} predicted", "what it is, or why none", "paper"], rows)
    if prediction is not None:
        p = prediction
        out += ["## The confirmatory prediction", "",
                f"Pre-registered from the trend: **{p.measure}** of {p.group} at {p.axis} = {p.at} on fresh seeds "
                f"{p.seeds}: {fmt_num(p.predicted)}, confirmed if the new cell lies in [{fmt_num(p.low)}, "
                f"{fmt_num(p.high)}]" + ("" if p.trend_shown else " (the trend's slope interval includes 0)") + ".", ""]
        if verdict is not None:
            v = verdict
            out += [f"Measured ({v['cell']}): {fmt_num(v['value'])} [{fmt_num(v['low'])}, {fmt_num(v['high'])}]: "
                    f"**{v['verdict']}**; the change from the nearest fitted cell "
                    f"{'has' if v['direction'] else 'does not have'} the slope's sign.", ""]
        if beside is not None and len(beside):
            out += [f"The confirmatory cell's every measure beside its nulls (exploratory: the pre-registered rule "
                    f"reads {p.measure} of {p.group} alone, so the verdict tests the trend's shape, not the passage "
                    f"against its nulls; {lv} intervals over the cell's seeds):", ""]
            present = _groups(beside)
            rows = []
            for k in MEASURES:
                r = beside[beside.measure == k].set_index("group")
                if len(r):
                    rows.append([k, *("—" if g not in r.index else _ci(r.loc[g]) for g in present)])
            out += md_lines(["measure", *present], rows)
    if figures:
        out += ["## Figures", ""]
        for f in figures:
            out += [figure_block(f), ""]
    return "\n".join(out).rstrip() + "\n"


def measure_figure(measure: str, cells: Sequence[Cell], table: pd.DataFrame, trends: pd.DataFrame,
                   where: ScaleDir, prediction: Prediction | None = None, verdict: dict | None = None) -> Fig:
    """One measure against scale: a panel per axis with a family (B, updates after s, width), every group with its
    interval at each level (log axes where every value is positive), the focal passage's fitted line over the
    measured levels where the axis has a fit (at least trends.MIN_LEVELS levels), and the paper's value at its level
    as a star; where ``prediction`` is of this measure, its pre-registered interval at its level on its axis's
    panel, and ``verdict``'s measured value with its interval."""
    m = MEASURES[measure]
    title = f"{measure} against scale"
    t = trends[(trends.measure == measure)]
    axes = [a for a in AXES if (t.axis == a).any()]
    if not axes:
        return Fig(title, None, "no axis has two cells yet")
    fig, panels = new_figure(1, len(axes), w=4.2)
    by = {c.name: c for c in cells}
    predicted = prediction is not None and prediction.measure == measure
    lines = 0
    for ax, axis in zip(panels, axes):
        shown = predicted and prediction.axis == axis
        ta = t[t.axis == axis]
        names = ta.cells.iloc[0].split(",")
        power = (ta.kind == "power").all()
        for j, g in enumerate(dict.fromkeys(ta.group)):
            rows = table[(table.measure == measure) & (table.group == g) & table.cell.isin(names)]
            xs = np.array([by[n].label(axis) for n in rows.cell], dtype=float) * (1 + 0.04 * j)  # apart, the passage at its level
            err = np.vstack([rows.value - rows.low, rows.high - rows.value])
            ax.errorbar(xs, rows.value, yerr=np.where(np.isfinite(err), np.abs(err), 0), fmt="o-", ms=4, lw=1,
                        capsize=2, color=group_color(g), label=g)
        r = ta[ta.group == FOCAL]
        if len(r) and bool(r.iloc[0].fitted):
            r = r.iloc[0]
            lv = [float(v) for v in r.levels.split(",")]
            x = np.geomspace(min(lv), max(lv), 50)
            y = r.intercept + r.slope * np.log10(x)
            ax.plot(x, 10 ** y if r.kind == "power" else y, ls="--", lw=1, color=group_color(FOCAL),
                    label=f"{FOCAL} fit")
            lines += 1
        if shown:
            p = prediction
            ax.vlines(p.at, p.low, p.high, lw=6, color="0.8", label=f"pre-registered interval ({p.axis} = {p.at})")
            if verdict is not None:
                v = verdict
                ax.errorbar([p.at], [v["value"]], yerr=[[v["value"] - v["low"]], [v["high"] - v["value"]]], fmt="D",
                            ms=5, mfc="white", color="k", capsize=2,
                            label=f"confirmatory cell, seeds {', '.join(map(str, p.seeds))}: {v['verdict']}")
        if np.isfinite(m.paper):
            ax.plot([PAPER_SCALE[axis]], [m.paper], "*", ms=11, color="k", label="paper")
        ax.set_xscale("log")
        ticks = sorted({by[n].label(axis) for n in names} | {PAPER_SCALE[axis]} | ({prediction.at} if shown else set()))
        ax.set_xticks(ticks, [_level(v) for v in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        if power:
            ax.set_yscale("log")
        ax.set(xlabel=AXES[axis], ylabel=f"{measure} ({m.unit})")
    panels[0].legend(fontsize=7)
    path = save_figure(fig, where.figure(measure))
    caption = [f"{m.what} ({m.unit}) for the fabricated passage and its nulls, each cell with its t interval over "
               "seeds, the points of a group joined level to level (a guide, not a fit)",
               ("the dashed line the passage's fit over the measured levels (exploratory)" if lines else
                f"no fitted line: no axis here has {MIN_LEVELS} levels"),
               "the star the paper's value at its level where it gives one"]
    if predicted:
        caption.append("the grey bar the pre-registered interval of the confirmatory prediction"
                       + (", the open diamond the confirmatory cell's passage (fresh seeds, never fitted)"
                          if verdict is not None else ""))
    return Fig(title, path, "; ".join(caption) + ".")


def write_scale(cells: Sequence[Cell], table: pd.DataFrame, trends: pd.DataFrame, paper: pd.DataFrame,
                where: ScaleDir, prediction: Prediction | None = None, verdict: dict | None = None,
                beside: pd.DataFrame | None = None) -> str:
    """Draw every measure's figure into ``where`` and return the report's text (the caller writes it); ``beside``:
    the confirmatory cell's :func:`~seedlab.twins.scale.table`, every group, rendered under the verdict."""
    where.root.mkdir(parents=True, exist_ok=True)
    figs = [measure_figure(k, cells, table, trends, where, prediction, verdict) for k in MEASURES] if len(trends) else []
    return scale_report(cells, table, trends, paper, [f for f in figs if f.path is not None], prediction, verdict,
                        beside)
