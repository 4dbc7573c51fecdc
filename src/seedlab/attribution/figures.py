"""The attribution report's figures, one function each: it draws from attribution.parquet (and its
summary), saves a PNG beside report.md and returns a :class:`~seedlab.reporting.Fig`, or a Fig
without a file saying what is missing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from seedlab.attribution.rundir import BankDir
from seedlab.attribution.stats import CEILING
from seedlab.reporting import Fig, new_figure, save_figure

COLORS = {"sgd": "tab:blue", "adam": "tab:orange", "tracin": "tab:green", "cosine": "tab:purple", "ekfac": "tab:red",
          "kfac": "tab:brown"}


def scatter_figure(df: pd.DataFrame, rd: BankDir, kind: str) -> Fig:
    """Estimate vs measured, one panel per estimator × horizon, for the queries of ``kind``."""
    title = f"Estimate vs measured ({kind} queries)"
    d = df[(df.query_kind == kind) & (df.candidate_kind != "control")]
    if not len(d):
        return Fig(title, None, f"no {kind} query measured")
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
                ax.scatter(gk.measured, gk.estimate, s=6, alpha=0.6, color=colors[k], label=f"seed {k}")
            ax.axhline(0, color="k", lw=0.4)
            ax.axvline(0, color="k", lw=0.4)
            ax.set_title(f"{e} @ {labels[h]}", fontsize=8)
            ax.tick_params(labelsize=6)
            if i == len(ests) - 1:
                ax.set_xlabel("measured Δ L (nats)", fontsize=7)
            if j == 0:
                ax.set_ylabel("estimate", fontsize=7)
    axes[0].legend(fontsize=5, markerscale=2)
    path = save_figure(fig, rd.figure(f"scatter-{kind}.png"))
    return Fig(title, path, f"Each point is one candidate × {kind} query of one seed (colour); x: the measured change of the "
                            "query's loss, L(run with the candidate) − L(twin); y: the estimate (cosine: unitless). "
                            "Rows: estimators; columns: horizons. Own-row controls left out.")


def _grid(nrows: int, ncols: int, w: float = 2.6, h: float = 2.2):
    """A grid of small panels with fixed margins (constrained layout costs seconds on a 5 x 4 grid)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w * ncols, h * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    fig.subplots_adjust(left=0.8 / (w * ncols), right=1 - 0.1 / (w * ncols), bottom=0.45 / (h * nrows),
                        top=1 - 0.3 / (h * nrows), wspace=0.35, hspace=0.45)
    return fig, axes


def correlation_figure(summary: pd.DataFrame, rd: BankDir, method: str = "spearman") -> Fig:
    """Correlation vs horizon, one panel per query kind, each estimator with its 95% interval
    over seeds, and the noise ceiling as a grey band."""
    title = f"{method.capitalize()} correlation vs horizon, with the noise ceiling"
    if not len(summary):
        return Fig(title, None, "nothing to correlate")
    kinds = list(dict.fromkeys(summary.query_kind))
    fig, axes = new_figure(1, len(kinds), w=4.0, h=3.2)
    for ax, kind in zip(axes, kinds):
        g = summary[summary.query_kind == kind]
        c = g[g.estimator == CEILING].sort_values("after")
        if len(c):
            ax.fill_between(c.after, c[f"{method}_low"].fillna(c[method]), c[f"{method}_high"].fillna(c[method]),
                            color="0.85", label="ceiling (95% CI)")
            ax.plot(c.after, c[method], color="0.4", lw=1.5, ls="--", label="ceiling (seed vs seed)")
        for e, ge in g[g.estimator != CEILING].groupby("estimator", sort=False):
            ge = ge.sort_values("after")
            err = np.vstack([ge[method] - ge[f"{method}_low"], ge[f"{method}_high"] - ge[method]])
            ax.errorbar(ge.after, ge[method], yerr=np.nan_to_num(err), marker="o", ms=3, capsize=2, lw=1,
                        color=COLORS.get(e), label=e)
        ax.set(xscale="log", xlabel="updates after the injection", ylabel=f"{method} (estimate, measured)",
               title=f"{kind} queries", ylim=(-1.05, 1.05))
        ax.axhline(0, color="k", lw=0.4)
        ax.legend(fontsize=6)
    path = save_figure(fig, rd.figure(f"correlation-{method}.png"))
    return Fig(title, path, f"Per seed, the {method} correlation across candidates between an estimator and the measured "
                            "effects (averaged over the queries of a kind), then the mean over seeds with its 95% t "
                            "interval. Grey: the noise ceiling, one seed's measured effects against another seed's.")
