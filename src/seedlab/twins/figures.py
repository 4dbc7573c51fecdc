"""The twins report's figures, one function per figure: each draws what twins/report_data.py computes from
the measured files (``twins.rundir.Measured``), saves its PNG beside report.md and returns a :class:`~seedlab.reporting.Fig`
(title, file, caption), or a Fig without a file saying what it needs when the data are not there.
Every figure colours a condition by :func:`color` (one map, :data:`COLORS`), so a condition has one
colour in every panel of every figure. A condition whose measure is exactly 0 everywhere is not drawn
on a log axis: the caption names it instead (a panel where every condition is 0 is left out).
"""

from __future__ import annotations

import numpy as np

from seedlab.reporting import Fig, new_figure, save_figure
from seedlab.twins import report_data
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
    fig, (a1, a2, a3) = new_figure(1, 3, w=4.2)
    for (kind, cond, _seed, _seed_b), g in d.paths.groupby(["kind", "condition", "seed", "seed_b"]):
        c = color("seed" if kind == "seed" else cond)
        label = "different seeds" if kind == "seed" else cond
        a1.plot(g.alpha, g.loss, color=c, alpha=0.7, lw=1, label=label)
        (a2 if kind == "seed" else a3).plot(g.alpha, g.rise, color=c, alpha=0.7, lw=1, label=label)
    a1.set(xlabel="α (0: run, 1: its twin / other seed)", ylabel="held-out CE (nats)", title="loss")
    a2.set(xlabel="α", ylabel="rise above the chord (nats)", title="twins of different seeds")
    a3.set(xlabel="α", ylabel="rise above the chord (nats)", title="each condition vs its twin")
    for ax in (a2, a3):
        ax.axhline(0, color="k", lw=0.5)
    _legend(a1)
    _legend(a3)
    return Fig(title, save_figure(fig, d.dir.figure("interpolation.png")),
               "Held-out loss along the straight line between two final weight vectors (left), and its rise above the "
               "chord between the end losses for twins of different seeds (middle) and for each injected run against its "
               "twin (right, its own scale); the barrier is the largest rise.")


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
            sm.plot(curve.index, curve, color=color(cond), lw=None if first else 0.8, ls="-" if first else "--",
                    label=f"{cond}, {w} steps")
    raw.set(yscale="log", xlabel="step", ylabel="|loss − twin's loss| (nats)", title="unsmoothed")
    sm.set(yscale="log", xlabel="step", ylabel="|loss − twin's loss| (nats, smoothed)", title="centred rolling mean")
    for ax in (raw, sm):
        ax.axvline(s, color="k", lw=0.5, ls=":")
        _legend(ax)
    return Fig(title, save_figure(fig, d.dir.figure("loss_difference.png")),
               f"Mean over seeds of |training loss − twin's| per step after the injection (step {s}), both panels on a log "
               f"axis: left unsmoothed, right a centred rolling mean over {m.smooth_steps} steps (solid) and "
               f"{m.smooth_steps_alt} steps (dashed), from which the report's peak / trough ratios come; the paper's curve "
               "peaks ~100 steps after the injection and then decays slowly."
               + (f" {course.zeros} step(s) where the difference is exactly 0 are not drawn on the left." if course.zeros else "")
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
    title = "CKA per layer"
    m = d.measures
    cols = [c for c in m.columns if c.startswith("cka.")]
    if not cols or not len(m):
        return Fig(title, None, "no pair measured")
    fig, (ax,) = new_figure(1, 1, w=5.6, h=3.4)
    means = report_data.cka_means(m)
    width = 0.8 / len(means)
    for i, (name, row) in enumerate(means.iterrows()):
        ax.bar(np.arange(len(cols)) + i * width, row, width, color=color(name), label=name if name != "seed" else "different seed")
    ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2, [c.removeprefix("cka.") for c in cols])
    lo = float(np.nanmin(m[cols].to_numpy()))
    ax.set(ylabel="linear CKA", ylim=(max(0.0, lo - 0.05 * (1 - lo) - 1e-3), 1.0))
    ax.legend(fontsize=7)
    return Fig(title, save_figure(fig, d.dir.figure("cka.png")),
               "Linear CKA of the residual stream after each block on a fixed held-out probe batch, each run against its "
               "twin (mean over seeds) and between twins of different seeds.")


def passage_figure(d: Measured) -> Fig:
    title = "The injected passage's cross-entropy over steps"
    c = d.checkpoints
    if not len(c):
        return Fig(title, None, "no injected condition measured")
    fig, (ax,) = new_figure(1, 1, w=6.0, h=3.6)
    for cond, g in report_data.mean_sd_course(c, c.twin_passage_ce - c.passage_ce).groupby("condition"):  # the gain: twin − injected
        ax.errorbar(g.step, g["mean"], yerr=g.sd, color=color(cond), marker="o", ms=3, capsize=2, label=cond)
    ax.axhline(0, color="k", lw=0.5)
    ax.axvline(d.steps["injection"], color="k", lw=0.5, ls=":")
    ax.set(xlabel="step", ylabel="twin's CE − injected run's CE (nats)")
    ax.legend(fontsize=7)
    return Fig(title, save_figure(fig, d.dir.figure("passage_ce.png")),
               "How much better the run that saw the passage predicts it than its twin, at every checkpoint (mean ± sd over "
               "seeds); 0 at the injection step, where the weights are identical. The paper: up 50 steps after the "
               "injection, gone by the end.")


def distance_course_figure(d: Measured) -> Fig:
    title = "Distance and barrier to the twin over training"
    c = d.checkpoints
    if not len(c):
        return Fig(title, None, "no injected condition measured")
    bc = report_data.barrier_course(c, d.measures)
    has_barrier = bc is not None
    flat = bc.flat if has_barrier else []
    drawn = has_barrier and len(bc.course)
    fig, axes = new_figure(1, 2 if drawn else 1, w=5.0, h=3.4)
    ax = axes[0]
    for cond, g in report_data.distance_fraction_course(c).groupby("condition"):
        ax.plot(g.step, g.frac, marker="o", ms=3, color=color(cond), label=cond)
    ax.set(xlabel="step", ylabel="distance / final distance", title="weight distance")
    if drawn:
        b = axes[1]
        for cond, g in bc.course.groupby("condition"):
            b.errorbar(g.step, g["mean"], yerr=g.sd, marker="o", ms=3, capsize=2, color=color(cond), label=cond)
        if np.isfinite(bc.seed_barrier):
            b.axhline(bc.seed_barrier, color=color("seed"), lw=1, ls="--", label="different seeds (end)")
        b.set_yscale("symlog", linthresh=bc.smallest / 2 if np.isfinite(bc.smallest) else 1e-6)  # linear near 0, log above
        b.set(xlabel="step", ylabel="barrier on held-out rows (nats)", title="interpolation barrier", ylim=(0, None))
        _legend(b)
    for a in axes:
        a.axvline(d.steps["mid"], color="k", lw=0.5, ls=":")
    _legend(ax)
    barrier_text = (" Right: the interpolation barrier between each injected run and its twin at the same step, on the "
                    "held-out rows (mean ± sd over seeds; symmetric-log axis, linear near 0), and the barrier between "
                    "twins of different seeds at the end (dashed). The paper: the barrier stays small throughout."
                    + _zero_text(flat, "The barrier") if drawn else
                    f" No barrier panel: the barrier to the twin is exactly 0 at every checkpoint for every condition "
                    f"({', '.join(flat)}). The paper: the barrier stays small throughout." if has_barrier else
                    " (checkpoints.parquet has no barrier column: measure again for the barrier panel.)")
    return Fig(title, save_figure(fig, d.dir.figure("distance_course.png")),
               f"Left: weight distance to the twin at each checkpoint as a fraction of its final value (mean over seeds); dotted: "
               f"the mid-point (step {d.steps['mid']}). The paper: 92% of the final distance by the mid-point." + barrier_text)
