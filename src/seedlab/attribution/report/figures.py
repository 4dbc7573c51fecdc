"""The attribution report's figures, one function each: it draws what attribution/analyses/stats.py and
horizon.py computed (and attribution.parquet's points), saves a PNG beside report.md and returns a
:class:`~seedlab.reporting.Fig`, or a Fig without a file saying what is missing. It computes
nothing. Every estimator has one colour in every panel and figure (:func:`color`).
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.horizon import CEILING, MEASURED, NOT_REACHED, READOUT, RUN_IT, TANGENT, UNROLL, LinearResponse
from seedlab.attribution.bank.rundir import BankDir
from seedlab.attribution.analyses.stats import KIND, REFERENCES, RELIABILITY, ROW_INVARIANCE, is_baseline
from seedlab.reporting import Fig, new_figure, save_figure

#: the one colour map: every registered estimator and the kind baseline (the references are black)
COLORS = {"sgd": "tab:blue", "adam": "tab:orange", "tracin": "tab:green", "cosine": "tab:purple", "ekfac": "tab:red",
          "kfac": "tab:brown", "random": "0.75", "loss": "tab:olive", "gradnorm": "tab:cyan", "length": "tab:pink",
          KIND: "tab:gray", "adam-linear": "moccasin", "tracin-cp": "palegreen", "adam-cosine": "orchid",
          "trak": "darkred", UNROLL: "goldenrod", READOUT: "saddlebrown", TANGENT: "gold", "metagrad": "darkgoldenrod",
          "metagrad-trunc": "peru"}
REFERENCE_COLOR = "k"  # the row invariance, the reliability R, their ceilings, and τ and h* (fixed marks)
#: colours for names not in COLORS (plug-ins), none of them in COLORS
SPARE = ("teal", "navy", "maroon", "darkkhaki", "slateblue", "sienna", "deeppink", "olivedrab")


UNDEFINED = ("every Spearman correlation is undefined (the measured effects, or the estimates, are the same for every "
             "candidate: 0 everywhere at this scale?), so there is nothing to draw")


def color(name: str) -> str:
    """An estimator's colour, the same in every figure: :data:`COLORS`, black for the references, and
    for any other name (a plug-in) one of :data:`SPARE` chosen by a stable hash of the name."""
    if name in REFERENCES:
        return REFERENCE_COLOR
    return COLORS.get(name) or SPARE[zlib.crc32(name.encode()) % len(SPARE)]


def scatter_figure(df: pd.DataFrame, rd: BankDir, query: str) -> Fig:
    """Estimate vs measured for one query (queries differ in scale: never pooled), one panel per
    estimator (baselines left out) × horizon, every seed in its colour."""
    title = f"Estimate vs measured (query {query})"
    d = df[(df["query"] == query) & (df.candidate_kind != "control") & ~df.estimator.map(is_baseline)]
    if not len(d):
        return Fig(title, None, f"no estimate for query {query}")
    ests, hs = list(dict.fromkeys(d.estimator)), sorted(d.horizon.unique())
    labels = d.drop_duplicates("horizon").set_index("horizon").label
    fig, axes = _grid(len(ests), len(hs))
    seeds = sorted(d.seed.unique())
    colors = dict(zip(seeds, [f"C{i % 10}" for i in range(len(seeds))]))
    for i, e in enumerate(ests):
        for j, h in enumerate(hs):
            ax = axes[i * len(hs) + j]
            g = d[(d.estimator == e) & (d.horizon == h)]
            for k, gk in g.groupby("seed"):
                ax.scatter(gk.measured, gk.estimate, s=8, alpha=0.7, color=colors[k], label=f"seed {k}")
            ax.axhline(0, color="k", lw=0.4)
            ax.axvline(0, color="k", lw=0.4)
            ax.set_title(f"{e} @ {labels[h]}", fontsize=8)
            ax.tick_params(labelsize=6)
            if i == len(ests) - 1:
                ax.set_xlabel("measured Δ L (nats)", fontsize=7)
            if j == 0:
                ax.set_ylabel("estimate", fontsize=7)
    axes[0].legend(fontsize=5, markerscale=2)
    path = save_figure(fig, rd.figure(f"scatter-{_slug(query)}.png"))
    what = "each candidate's own text" if query == "self" else f"the query {query}"
    return Fig(title, path, f"Each point is one candidate of one seed (colour), on {what}; x: the measured change of "
                            "the query's loss, L(run with the candidate) − L(twin); y: the estimate (cosine: "
                            "unitless). "
                            "Rows: estimators; columns: horizons. Own-row controls and baselines left out.")


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def _grid(nrows: int, ncols: int, w: float = 2.6, h: float = 2.2):
    """A grid of small panels with fixed margins (constrained layout costs seconds on a 5 x 4 grid)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    fig.subplots_adjust(left=0.8 / (w * ncols), right=1 - 0.1 / (w * ncols), bottom=0.45 / (h * nrows),
                        top=1 - 0.3 / (h * nrows), wspace=0.35, hspace=0.45)
    return fig, axes


def correlation_figure(corr: pd.DataFrame, rd: BankDir) -> Fig:
    """Spearman vs horizon: a row per track (within seed, across seeds), a column per query kind; each
    estimator with its bootstrap interval, baselines dashed, the track's reference (row invariance,
    reliability R) in black and its ceiling (√ρ_rep, √R) dotted."""
    title = "Spearman correlation vs horizon, within seed and across seeds"
    if not len(corr):
        return Fig(title, None, "nothing to correlate")
    if corr.rho.isna().all():
        return Fig(title, None, UNDEFINED)
    kinds = list(dict.fromkeys(corr.query_kind))
    fig, axes = new_figure(2, len(kinds), w=4.0, h=3.2)
    for t, (track, name) in enumerate((("within", "within seed"), ("across", "across seeds (seed-means)"))):
        for c, kind in enumerate(kinds):
            ax = axes[t * len(kinds) + c]
            g = corr[(corr.track == track) & (corr.query_kind == kind)]
            for i, (e, ge) in enumerate(g.groupby("estimator", sort=False)):
                ge = ge.sort_values("after")
                if e in (ROW_INVARIANCE, RELIABILITY):
                    ax.plot(ge.after, ge.rho, color=color(e), lw=2, label=e if e == ROW_INVARIANCE else "reliability R")
                    ax.plot(ge.after, ge.bound, color=color(e), lw=1, ls=":",
                            label="ceiling √ρ_rep" if e == ROW_INVARIANCE else "√R")
                    continue
                err = np.vstack([ge.rho - ge.low, ge.high - ge.rho])
                base = bool(ge.baseline.iloc[0])
                x = ge.after * 1.04 ** (i - g.estimator.nunique() / 2)  # side by side: the bars do not hide each other
                ax.errorbar(x, ge.rho, yerr=np.nan_to_num(err), marker="o", ms=2 if base else 3, capsize=2,
                            lw=0.8 if base else 1.2, ls="--" if base else "-", color=color(e), label=e)
            ax.set(xscale="log", xlabel="updates after the injection", ylabel="Spearman (estimate, measured)",
                   title=f"{kind} queries, {name}", ylim=(-1.05, 1.05))
            ax.axhline(0, color="k", lw=0.4)
            ax.legend(fontsize=5)
    path = save_figure(fig, rd.figure("correlation-spearman.png"))
    return Fig(title, path, "Top: per seed, the Spearman correlation across candidates between an estimator and "
                            "the measured effects (averaged over the queries of a kind), then the mean over seeds; "
                            "black: the row invariance ρ_rep, Spearman(measured, measured at another row), and dotted its "
                            "ceiling √ρ_rep, the most a predictor that ranks a candidate the same whichever row it "
                            "replaces can reach. Bottom: the seed-mean estimate against the seed-mean measured effect; "
                            "black: the Spearman–Brown reliability R of that seed-mean, dotted: √R. Bars: 95% "
                            "bootstrap intervals over candidates; dashed: baselines.")


def linear_response_figure(lr: LinearResponse, rd: BankDir) -> Fig:
    """The linear-response horizon (attribution/analyses/horizon.py), within seed, one panel per query kind,
    against the updates after s (log x): ρ(measured, unroll) (thick, unroll's colour, its bootstrap
    interval shaded), ρ(measured, r) for the other responses the bank has (unroll-readout,
    unroll-tangent: medium, their colours), ρ(unroll, e) for every other estimator (thin, e's colour;
    baselines dotted) and in black the row invariance (dashed), its ceiling √ρ_rep (dash-dot), the
    descriptive threshold τ (dotted) and unroll's h* (a vertical line, its interval shaded grey).
    Saved as linear_response.png."""
    title = "The linear-response horizon"
    if not lr.ran:
        return Fig(title, None, f"the exact linear response ({UNROLL}) was not run: `{RUN_IT}`")
    t = lr.table[lr.table.track == "within"]
    if t.rho.isna().all():
        return Fig(title, None, UNDEFINED)
    kinds = list(dict.fromkeys(t.query_kind))
    fig, axes = new_figure(1, len(kinds), w=4.4, h=3.4)
    left, right = t.after.min() / 1.6, t.after.max() * 1.6
    for ax, kind in zip(axes, kinds, strict=True):
        g = t[t.query_kind == kind]
        for (against, c), gc in g.groupby(["against", "compared"], sort=False):
            gc = gc.sort_values("after")
            if against == MEASURED and c == UNROLL:
                ax.fill_between(gc.after, gc.low, gc.high, color=color(UNROLL), alpha=0.2, lw=0)
                ax.plot(gc.after, gc.rho, color=color(UNROLL), lw=2.2, marker="o", ms=3,
                        label=f"ρ(measured, {UNROLL})")
            elif c == ROW_INVARIANCE:
                ax.plot(gc.after, gc.rho, color=color(c), lw=1.2, ls="--", label="row invariance ρ_rep")
            elif c == CEILING:
                ax.plot(gc.after, gc.rho, color=REFERENCE_COLOR, lw=1.0, ls="-.", label="ceiling √ρ_rep")
            elif against == MEASURED:
                ax.plot(gc.after, gc.rho, color=color(c), lw=1.6, marker="s", ms=3, label=f"ρ(measured, {c})")
            else:
                ax.plot(gc.after, gc.rho, color=color(c), lw=0.8, ls=":" if gc.baseline.iloc[0] else "-",
                        marker=".", ms=3, label=f"ρ({UNROLL}, {c})")
        ax.axhline(lr.threshold, color=REFERENCE_COLOR, lw=0.8, ls=":", label=f"τ = {lr.threshold:g} (descriptive)")
        s = lr.h_star[(lr.h_star.query_kind == kind) & (lr.h_star.response == UNROLL)].iloc[0]
        if s.status == "reached":
            ax.axvline(s.after, color=REFERENCE_COLOR, lw=1.4, label=f"h* = {s.label}")
        if not np.isnan(s.low_after) or s.low_label == NOT_REACHED:  # an end "not reached": shaded to the right edge
            ax.axvspan(right if s.low_label == NOT_REACHED else s.low_after,
                       right if np.isnan(s.high_after) else s.high_after, color=REFERENCE_COLOR, alpha=0.08, lw=0)
        ax.axhline(0, color="k", lw=0.4)
        ax.set(xscale="log", xlim=(left, right), ylim=(-1.05, 1.05), xlabel="updates after s", ylabel="Spearman",
               title=f"{kind} queries, within seed (h* {s.label if s.status == 'reached' else s.status})")
        ax.legend(fontsize=5)
    path = save_figure(fig, rd.figure("linear_response.png"))
    return Fig(title, path, f"Per seed and query, the Spearman correlation across candidates, averaged over the "
                            f"queries of a kind and then over seeds. Thick, in {UNROLL}'s colour: the exact "
                            f"first-order counterfactual ({UNROLL}) against the measured effect, with its "
                            f"{100 * (1 - lr.alpha):g}% bootstrap interval over candidates; squares: the other exact "
                            f"responses against the measured effect ({READOUT}: the same weight change read out "
                            f"exactly; {TANGENT}: the step at s linearised too), where the bank has them; thin lines: "
                            f"each other estimator against {UNROLL} (what it loses to its own approximations; "
                            "baselines dotted). Black: the row invariance ρ_rep (dashed) and its ceiling √ρ_rep "
                            "(dash-dot: the most a predictor that ranks a candidate the same whichever row it replaces "
                            f"can reach), the descriptive threshold τ = {lr.threshold:g} (dotted), h* (the first "
                            f"horizon at which {UNROLL} no longer predicts beyond every baseline) and its interval over "
                            "resamples of seeds and candidates (shaded).")
