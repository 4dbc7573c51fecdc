"""The twins report's figures, one function per figure: each draws what twins/report_data.py computes from
the measured files (``twins.rundir.Measured``), saves its PNG beside report.md and returns a :class:`~seedlab.reporting.Fig`
(title, file, caption), or a Fig without a file saying what it needs when the data are not there.
Every figure colours a condition by :func:`color` (its registered colour, twins/variants.py; each ordinary row
a shade of the ordinary-row null's own), so a condition has one colour in every panel of every figure and no two
arms share one; a legend lists only what its panel draws. A condition whose measure is exactly 0 everywhere is not drawn
on a log axis: the caption names it instead (a panel where every condition is 0 is left out).
"""

from __future__ import annotations

import numpy as np

from seedlab.reporting import Fig, new_figure, save_figure
from seedlab.twins import dose, report_data
from seedlab.twins.rundir import Measured
from seedlab.twins.variants import SEED_COLOR, VARIANTS
from seedlab.twins.variants import color as _variant_color

#: the colour of every condition as registered (twins/variants.py) and of "seed" (twins of different seeds)
COLORS = {name: v.color for name, v in VARIANTS.items()} | {"seed": SEED_COLOR}


def color(condition: str):
    """The one colour of ``condition`` (or "seed") in every twins figure, from the registry (twins/variants.py
    ``color``): every ordinary row (``ordinary-row.<i>``) a shade of the ordinary-row null's own, a condition
    measured under a former name its variant's."""
    return _variant_color(condition)


def _zero_text(conds: list[str], what: str) -> str:
    """The caption's sentence for the conditions whose ``what`` is exactly 0 everywhere ("" for none)."""
    return f" {what} is exactly 0 for {', '.join(conds)} (not drawn on the log axis)." if conds else ""


def path_figure(d: Measured) -> Fig:
    title = "Loss along the interpolation path"
    if not len(d.paths):
        return Fig(title, None, "no pair measured")
    pc = report_data.path_course(d.paths)
    fig, (a1, a2) = new_figure(1, 2, w=5.0, h=3.6)
    for i, g in enumerate(pc.seeds):
        a1.plot(g.alpha, g.loss, color=color("seed"), lw=1, marker="o", ms=3, label="different seeds" if i == 0 else None)
    for cond, wide in pc.rise.items():
        for k in wide.columns.drop("mean"):  # each seed thin, the mean over seeds drawn and named
            a2.plot(wide.index, wide[k], color=color(cond), lw=0.5, alpha=0.35)
        a2.plot(wide.index, wide["mean"], color=color(cond), lw=1.5, marker="o", ms=3, label=cond)
    a1.set(xlabel="α (0: one seed's twin, 1: the other's)", ylabel="held-out CE (nats)", title="twins of different seeds")
    a2.set(xlabel="α (0: the run, 1: its twin)", ylabel="loss − chord (nats)", title="each condition vs its twin")
    a2.axhline(0, color="k", lw=0.5)
    for ax in (a1, a2):
        if ax.get_legend_handles_labels()[0]:
            _legend(ax)
    if not pc.seeds:
        a1.set_visible(False)
    return Fig(title, save_figure(fig, d.dir.figure("interpolation.png")),
               "Held-out loss along the straight line between two final weight vectors. Left: between the twins of "
               "two different seeds (each pair a line): the bump above the end points is the inter-seed barrier. "
               "Right: each injected run against its own twin, as the loss minus the chord between the two ends "
               "(its own scale: on the left's these paths are flat), the mean over seeds (thick) and each seed (thin); "
               "the barrier is the largest value above 0, and a curve below 0 is a path lower than the chord.")


def _legend(ax) -> None:
    h, labels = ax.get_legend_handles_labels()
    keep = dict(zip(labels, h))  # one entry per label
    ax.legend(keep.values(), keep.keys(), fontsize=7)


def loss_diff_figure(d: Measured) -> Fig:
    title = "Training-loss difference, injected − twin"
    tc = d.timecourse
    if not len(tc):
        return Fig(title, None, "no injected condition measured")
    s, m = d.steps["injection"], d.settings
    fig, (raw, sm) = new_figure(1, 2, w=5.2, h=3.6)
    course = report_data.loss_diff_course(tc, s, [m.smooth_steps, m.smooth_steps_alt])  # exact zeros left out of the raw curve
    for cond, shown in course.raw.items():
        raw.plot(shown.index, shown, color=color(cond), lw=0.6, label=cond)
        for w, curve in course.smooth[cond].items():
            first = w == m.smooth_steps
            sm.plot(curve.index, curve, color=color(cond), lw=None if first else 0.8, ls="-" if first else "--")
    raw.set(yscale="log", xlabel="step", ylabel="|loss − twin's loss| (nats)", title="unsmoothed")
    sm.set(yscale="log", xlabel="step", ylabel="|loss − twin's loss| (nats, smoothed)",
           title=f"centred rolling mean: {m.smooth_steps} steps (solid), {m.smooth_steps_alt} (dashed)")
    for ax in (raw, sm):
        ax.axvline(s, color="k", lw=0.5, ls=":")
    _legend(raw)  # one legend: the colours are the same in both panels
    return Fig(title, save_figure(fig, d.dir.figure("loss_difference.png")),
               f"Mean over seeds of |training loss − twin's| per step after the injection (step {s}), both panels on a log "
               f"axis: left unsmoothed, right a centred rolling mean over {m.smooth_steps} steps (solid) and "
               f"{m.smooth_steps_alt} steps (dashed), from which the report's peak / trough ratios come; the paper's curve "
               "peaks ~100 steps after the injection and then decays slowly."
               + (f" {course.zeros} step(s) where the difference is exactly 0 are not drawn on the left." if course.zeros else "")
               + (f" {course.smooth_zeros} smoothed point(s) of exactly 0 (a window of zeros) are not drawn on the right."
                  if course.smooth_zeros else "")
               + _zero_text(course.flat, "The difference"))


def distance_barrier_figure(d: Measured) -> Fig:
    title = "Distance vs barrier, normalized by seed variance"
    sc = report_data.seed_scaled(d.measures)
    if sc is None:
        return Fig(title, None, "needs at least two seeds' twins (with a barrier between them) and one injected condition")
    if not len(sc.points):
        return Fig(title, None, f"every injected run's barrier to its twin is exactly 0 ({', '.join(sc.flat)}: no grid point "
                   "above the chord), so there is nothing to draw on a log axis; the distances are in the tables")
    fig, (ax,) = new_figure(1, 1, w=5.0, h=4.0)
    for cond, g in sc.points.groupby("condition"):
        ax.scatter(g.distance_rel, g.barrier_rel, color=color(cond), label=cond, s=18)
    ax.scatter([1], [1], color=color("seed"), marker="*", s=120, label="different seed (= 1, 1)")
    ax.set(xscale="log", yscale="log", xlabel="distance / inter-seed distance", ylabel="barrier / inter-seed barrier")
    lo = min(ax.get_xlim()[0], ax.get_ylim()[0])
    ax.plot([lo, 1], [lo, 1], color="k", lw=0.5, ls=":")
    ax.legend(fontsize=7)
    return Fig(title, save_figure(fig, d.dir.figure("distance_vs_barrier.png")),
               "Each point is one seed's injected run against its twin, on log axes. Below the diagonal: the example moved "
               "the weights more than the function (the paper: 44% of seed distance, 3% of seed barrier). A positive "
               "barrier means the loss rises above the chord somewhere on the path (it is not convex there); no line is "
               "fitted through these points."
               + (f" {sc.dropped} pair(s) with a barrier of exactly 0 (no grid point above the chord) are not drawn, so the "
                  "points are not a sample of all pairs." if sc.dropped else "")
               + _zero_text(sc.flat, "The barrier"))


def cka_figure(d: Measured) -> Fig:
    title = "How far each layer's representation moved: 1 − CKA"
    m = d.measures
    if not [c for c in m.columns if c.startswith("cka.")] or not len(m):
        return Fig(title, None, "no pair measured")
    gap = report_data.cka_gap(m)
    layers = [c.removeprefix("cka.") for c in gap.values.columns]
    fig, (ax,) = new_figure(1, 1, w=5.6, h=3.6)
    x = np.arange(len(layers))
    for name, row in gap.values.iterrows():
        if name in gap.zero:
            continue
        shown = row.to_numpy() > 0  # a log axis: a layer with 1 − CKA <= 0 is left out of its line
        ax.plot(x[shown], row.to_numpy()[shown], color=color(name), marker="o", ms=4,
                ls="--" if name == "seed" else "-", label="different seeds" if name == "seed" else name)
    ax.set_xticks(x, layers)
    ax.set(yscale="log", xlabel="residual stream after block", ylabel="1 − linear CKA with the twin")
    _legend(ax)
    return Fig(title, save_figure(fig, d.dir.figure("cka.png")),
               "1 − linear CKA of the residual stream after each block on a fixed held-out probe batch (0: the same "
               "representation up to rotation and scale), each run against its twin (mean CKA over seeds) and between "
               "twins of different seeds (dashed), on a log axis: one example moves each layer by orders of magnitude "
               "less than a different seed does." + _zero_text(gap.zero, "1 − CKA"))


def passage_figure(d: Measured) -> Fig:
    title = "The injected passage's cross-entropy over steps"
    c = d.checkpoints
    if not len(c):
        return Fig(title, None, "no injected condition measured")
    pc = report_data.passage_course(c)
    if not len(pc.course):
        return Fig(title, None, f"no measured condition injects a text of its own ({', '.join(pc.textless)})")
    fig, (ax,) = new_figure(1, 1, w=6.0, h=3.6)
    for cond, g in pc.course.groupby("condition"):  # the gain: twin − injected
        ax.errorbar(g.step, g["mean"], yerr=g.sd, color=color(cond), marker="o", ms=3, capsize=2, label=cond)
    ax.axhline(0, color="k", lw=0.5)
    ax.axvline(d.steps["injection"], color="k", lw=0.5, ls=":")
    ax.set(xlabel="step", ylabel="twin's CE − injected run's CE (nats)")
    _legend(ax)
    return Fig(title, save_figure(fig, d.dir.figure("passage_ce.png")),
               "How much better the run that saw the text predicts it than its twin, at every checkpoint (mean ± sd over "
               "seeds; an ordinary row's own stretch of held-out text for each ordinary row); 0 at the injection step "
               "(dotted), where the weights are identical. The paper: up 50 steps after the injection, gone by the end."
               + (f" {', '.join(pc.textless)} inject no text of their own: nothing to draw." if pc.textless else ""))


def distance_course_figure(d: Measured) -> Fig:
    title = "Distance and barrier to the twin over training"
    c = d.checkpoints
    if not len(c):
        return Fig(title, None, "no injected condition measured")
    bc = report_data.barrier_course(c, d.measures)
    has_barrier = bc is not None
    flat = bc.flat if has_barrier else []
    drawn = has_barrier and len(bc.course)
    fig, axes = new_figure(1, 2 if drawn else 1, w=5.0, h=3.6)
    ax = axes[0]
    for cond, g in report_data.distance_fraction_course(c).groupby("condition"):
        ax.plot(g.step, g.frac, marker="o", ms=3, color=color(cond), label=cond)
    ax.set(xlabel="step", ylabel="distance / final distance", title="weight distance")
    if drawn:
        b = axes[1]
        for cond, g in bc.points.groupby("condition"):  # each seed's positive barrier, faint
            b.scatter(g.step, g.barrier, color=color(cond), s=8, alpha=0.35, lw=0)
        for cond, g in bc.course.groupby("condition"):
            b.plot(g.step, g["mean"], marker="o", ms=3, color=color(cond), label=cond)
        if np.isfinite(bc.seed_barrier):
            b.axhline(bc.seed_barrier, color=color("seed"), lw=1, ls="--", label="different seeds (end)")
        b.set(yscale="log", xlabel="step", ylabel="barrier on held-out rows (nats)", title="interpolation barrier")
        _legend(b)
    for a in axes:
        a.axvline(d.steps["mid"], color="k", lw=0.5, ls=":")
    _legend(ax)
    zeros = (f" A mean of exactly 0 (at step {', '.join(map(str, bc.zero_steps))}: at the injection step the weights are "
             "identical) is not drawn on the log axis." if drawn and bc.zero_steps else "")
    barrier_text = (" Right: the interpolation barrier between each injected run and its twin at the same step, on the "
                    "held-out rows, on a log axis: the mean over seeds (line) and each seed's positive value (dots), and the "
                    "barrier between twins of different seeds at the end (dashed). The paper: the barrier stays small "
                    "throughout." + zeros + _zero_text(flat, "The barrier") if drawn else
                    f" No barrier panel: the barrier to the twin is exactly 0 at every checkpoint for every condition "
                    f"({', '.join(flat)}). The paper: the barrier stays small throughout." if has_barrier else
                    " (checkpoints.parquet has no barrier column: measure again for the barrier panel.)")
    return Fig(title, save_figure(fig, d.dir.figure("distance_course.png")),
               f"Left: weight distance to the twin at each checkpoint as a fraction of its final value (mean over seeds); dotted: "
               f"the mid-point (step {d.steps['mid']}). The paper: 92% of the final distance by the mid-point." + barrier_text)


def dose_figure(d: Measured, dr: dose.DoseResponse) -> Fig:
    """Each end measure against the dose at s (twins/dose.py ``summarize``): the ordinary rows as points with their
    line and its 95% t band over seeds, every passage and null marked, one panel per measure with a line."""
    title = "Each end measure against the dose at s"
    fitted = [ln for ln in dr.lines.values() if ln.fitted]
    if not fitted:
        return Fig(title, None, "no measure has an ordinary rows' line (the section's table says why)")
    ncols = min(3, len(fitted))
    nrows = -(-len(fitted) // ncols)
    fig, axes = new_figure(nrows, ncols, w=4.0, h=3.2)
    t = dr.table
    handles: dict[str, object] = {}
    for ax, ln in zip(axes, fitted):
        k, log = ln.measure, ln.scale == "log-log"
        pts = t[np.isfinite(t[k]) & ((t[k] > 0) & (t.dose > 0) if log else True)]
        ordinary = pts[pts.role == "ordinary"]
        handles["ordinary rows"] = ax.scatter(ordinary.dose, ordinary[k], color=color("ordinary-row"), s=12, alpha=0.7,
                                              lw=0, label="ordinary rows")
        b = dose.band(ln, alpha=dr.alpha)
        handles["band"] = ax.fill_between(b.dose, b.low, b.high, color="0.82", lw=0,
                                          label="the line's 95% t band over seeds")
        handles["line"] = ax.plot(b.dose, b["mean"], color="k", lw=1, label="ordinary rows' line (mean over seeds)")[0]
        for group, g in pts[pts.role.isin(["passage", "null"])].groupby("group", sort=False):
            handles[group] = ax.scatter(g.dose, g[k], color=color(group), s=22, marker="D" if g.role.iloc[0] == "passage"
                                        else "s", edgecolors="k", linewidths=0.4, label=group)
        ax.set(xscale="log" if (t.dose > 0).all() else "linear", yscale="log" if log else "linear",
               xlabel="dose: ‖Δθ_{s+1}‖", ylabel=dose.LABELS.get(k, k))
        ax.set_title(f"{dose.LABELS.get(k, k)}\n{'log–log' if log else 'linear'}", fontsize=9)
        _log_ticks(ax)
    for ax in axes[len(fitted):]:
        ax.set_visible(False)
    fig.legend(handles=list(handles.values()), loc="outside right upper", fontsize=7)
    unfitted = [ln.measure for ln in dr.lines.values() if not ln.fitted]
    return Fig(title, save_figure(fig, d.dir.figure("dose.png")),
               "Each point is one seed's arm against its twin: its dose at s (‖θ_{s+1} − θ_{s+1}(twin)‖, dose.json) and "
               "its end measure; the ordinary rows (every ordinary-row arm and its row-weight arms: the lower doses) as "
               "small points, the passages (diamonds, their row-weight arms in their passage's colour) and the nulls (squares) "
               "marked. The line is the mean of the seeds' own lines through their ordinary rows and the band its 95% t "
               "interval over seeds, drawn where the ordinary rows' doses lie; a panel is log–log where every dose and "
               "value of its measure is positive, else linear in both (the dose axis drawn on a log scale, where a line "
               "bends). The test is each arm's residual from its own seed's line (the section's table), not its distance "
               "from this mean line."
               + (f" No line (so no panel) for {', '.join(unfitted)}: the table says why." if unfitted else ""))


def _log_ticks(ax) -> None:
    """A log axis's tick labels, short: over less than ~1.5 decades every 1, 2 and 5 labelled plainly (0.2, 0.5, 1),
    else the decades alone (no crowded minor-tick labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    short = FuncFormatter(lambda v, _: f"{v:.2g}")
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if axis.get_scale() != "log":
            continue
        if lo > 0 and hi / lo < 30:
            axis.set_major_locator(LogLocator(subs=(1.0,)))
            axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
            axis.set_major_formatter(short)
            axis.set_minor_formatter(short)
        else:
            axis.set_minor_formatter(NullFormatter())
