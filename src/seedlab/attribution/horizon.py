"""The linear-response horizon (issue 20 §1): how far the exact first-order counterfactual carries.

The estimator :data:`UNROLL` (``unroll``, label "reference", nats/token) is the exact first-order
response to the candidate: the one-step change of the weights at s carried through the twin's
actual steps s+1 .. h with forward-mode JVPs, read out on the query's loss at h — so, unlike the
estimators at θ_s, its estimate differs per horizon. It splits what an estimator loses against the
measured effect in two:

- ρ(measured, unroll) (``compared`` = :data:`MEASURED`): what is lost to nonlinearity and chaos,
  which no first-order method recovers;
- ρ(unroll, e) (``compared`` = e) for every other estimator e in the frame (baselines included,
  the derived kind baseline not): what e loses to its own approximations — the Spearman of e's
  estimate with unroll's over candidates;

beside the reference of the track, which does not involve unroll: the replicate floor
Spearman(measured, measured_replicate) within seed and the Spearman–Brown reliability R of the
seed-mean measured effect across seeds (attribution/stats.py :data:`~seedlab.attribution.stats.REPLICATE`,
:data:`~seedlab.attribution.stats.RELIABILITY`).

Both tracks are attribution/stats.py's, computed by its :func:`~seedlab.attribution.stats.correlations`
(ρ(unroll, e) on :meth:`Arrays.against <seedlab.attribution.stats.Arrays.against>`: unroll's
estimate in the place of the measured effect): within seed, per seed, query and horizon the
Spearman over the ordinary candidates (own-row controls left out), averaged over the kind's
queries and then the seeds; across seeds, the Spearman of the two seed-means per query and
horizon, averaged over the kind's queries. Intervals: the percentile interval of the same seeded
bootstrap resamples of candidates as stats.py's (same count, same seed: every number here is
paired with every other and with the report's correlations); ``se_seeds`` the jackknife over seeds
(none for the reliability).

**h\\*.** Per query kind, on the within-seed track: h* = the first horizon h (in order) with
ρ(measured, unroll)(h) < τ, τ = ``attribute.h_star_rho`` fixed before looking; horizons where ρ is
undefined (a constant side, too few candidates) are skipped; "not reached" when no horizon is
below τ, "undefined" when ρ is defined at none. Its interval: h* of every bootstrap resample (the
resample's ρ at every horizon, one resample of candidates for all horizons), "not reached" ranked
after the last horizon, and the α/2 and 1 − α/2 quantiles of that ordinal distribution by the
inverted empirical CDF (each end a horizon or "not reached", never between two). At h* the
replicate floor (with its interval) says how much of the measured effect is reproducible at all:
a floor above τ means the linear response fails while the effect is still the candidate's; a
floor below τ means nothing at that horizon is predictable from the candidate alone.

:func:`linear_response` computes all of it and returns it as data (:class:`LinearResponse`);
attribution/report_horizon.py words it (the report's first sentence and its section) and
attribution/figures.py ``linear_response_figure`` draws it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.attribution.stats import (
    ALPHA,
    REFERENCES,
    REPLICATE,
    RESAMPLES,
    SEED,
    Arrays,
    correlations,
)
from seedlab.errors import SeedlabError

UNROLL = "unroll"  # the exact first-order counterfactual's estimator name in attribution.parquet
MEASURED = "measured"  # ``compared`` of ρ(measured, unroll)
RUN_IT = "seedlab attribution attribute DIR --estimator unroll --add"
COLUMNS = ["track", "query_kind", "horizon", "label", "after", "compared", "baseline", "rho", "low", "high",
           "se_seeds", "seeds", "candidates", "queries"]
H_STAR = ["query_kind", "status", "horizon", "label", "after", "rho", "low_label", "high_label", "low_after",
          "high_after", "reached", "floor", "floor_low", "floor_high", "last_label"]


@dataclass
class LinearResponse:
    """What :func:`linear_response` found (empty frames when the frame holds no :data:`UNROLL` rows)."""

    threshold: float  # τ of h*
    alpha: float
    ran: bool  # the frame holds unroll rows
    references: list[str]  # the frame's reference estimators (unroll; any other labelled "reference")
    table: pd.DataFrame  # columns COLUMNS: per track × query kind × horizon × compared
    h_star: pd.DataFrame  # columns H_STAR: per query kind, within seed


def linear_response(df: pd.DataFrame, *, threshold: float = 0.5, resamples: int = RESAMPLES, seed: int = SEED,
                    alpha: float = ALPHA) -> LinearResponse:
    """From attribution.parquet's frame: ``table`` — per track × query kind × horizon, ρ(measured,
    unroll) (``compared`` = :data:`MEASURED`), the track's reference (``compared`` = REPLICATE or
    RELIABILITY) and ρ(unroll, e) for every other estimator e (``compared`` = e), each with ``rho,
    low, high, se_seeds`` (module doc), ``baseline`` (e is a baseline), ``label, after, seeds,
    candidates, queries``; and ``h_star`` — per query kind (:func:`h_star`). ``threshold``: τ, in (0, 1)."""
    if not 0 < threshold < 1:
        raise SeedlabError(f"h_star_rho: the threshold must lie in (0, 1), got {threshold!r}")
    labelled = df.estimator_label == "reference" if "estimator_label" in df else pd.Series(False, index=df.index)
    references = list(dict.fromkeys([*([UNROLL] if (df.estimator == UNROLL).any() else []),
                                     *df.estimator[labelled]]))
    if UNROLL not in references:
        return LinearResponse(threshold, alpha, False, references, pd.DataFrame(columns=COLUMNS),
                              pd.DataFrame(columns=H_STAR))
    a = Arrays.of(df)
    corr, samples = correlations(a.only([UNROLL]), resamples, seed, alpha)
    frames = [corr.assign(compared=corr.estimator.replace({UNROLL: MEASURED}))]
    if len(a.estimators) > 1:
        other = correlations(a.against(UNROLL), resamples, seed, alpha)[0]
        frames.append(other[~other.estimator.isin(REFERENCES)].assign(compared=other.estimator))
    table = pd.concat(frames, ignore_index=True)[COLUMNS]
    stars = [h_star(a, table, samples[("within", kind)][..., 0], kind, threshold, alpha)
             for kind in dict.fromkeys(a.kinds)]
    return LinearResponse(threshold, alpha, True, references, table, pd.DataFrame(stars, columns=H_STAR))


def first_below(rho: np.ndarray, threshold: float) -> np.ndarray:
    """Per row of ``rho`` [..., H] (ρ at the horizons in order): the index of the first horizon with
    ρ < ``threshold`` (undefined ρ skipped); H where none is ("not reached"); NaN where no ρ is defined."""
    rho = np.asarray(rho, dtype=np.float64)
    below = rho < threshold  # NaN compares False: skipped
    first = np.where(below.any(axis=-1), below.argmax(axis=-1), rho.shape[-1]).astype(np.float64)
    return np.where(np.isnan(rho).all(axis=-1), np.nan, first)


def h_star(a: Arrays, table: pd.DataFrame, boot: np.ndarray, kind: str, threshold: float,
           alpha: float = ALPHA) -> dict:
    """One query kind's h* (module doc) from ``table`` (:func:`linear_response`'s) and ``boot`` [b, H],
    the bootstrap resamples of the within-seed ρ(measured, unroll). ``status``: "reached", "not
    reached" or "undefined"; ``horizon, label, after, rho`` at h* (None/NaN unless reached);
    ``low_label, high_label`` (and ``low_after, high_after``, NaN for "not reached") the interval's
    ends; ``reached`` the fraction of resamples (with a defined h*) in which h* is reached;
    ``floor, floor_low, floor_high`` the replicate floor at h*; ``last_label`` the last horizon."""
    g = table[(table.track == "within") & (table.query_kind == kind)]
    rho = g[g.compared == MEASURED].set_index("horizon").rho.reindex(a.horizons).to_numpy(dtype=np.float64)
    H = len(a.horizons)
    point, resampled = first_below(rho, threshold), first_below(boot, threshold)
    resampled = resampled[~np.isnan(resampled)]

    def end(i: float) -> tuple[str, float]:
        return ("not reached", math.nan) if i >= H else a.labels[a.horizons[int(i)]]

    if len(resampled):
        lo, hi = np.quantile(resampled, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
        (low_label, low_after), (high_label, high_after) = end(lo), end(hi)
    else:
        low_label = high_label = "undefined"
        low_after = high_after = math.nan
    row = {"query_kind": kind, "status": "undefined" if np.isnan(point) else "not reached" if point >= H else "reached",
           "horizon": None, "label": None, "after": math.nan, "rho": math.nan, "low_label": low_label,
           "high_label": high_label, "low_after": low_after, "high_after": high_after,
           "reached": float(np.mean(resampled < H)) if len(resampled) else math.nan,
           "floor": math.nan, "floor_low": math.nan, "floor_high": math.nan, "last_label": a.labels[a.horizons[-1]][0]}
    if row["status"] == "reached":
        h = a.horizons[int(point)]
        row.update(a.at(h), rho=float(rho[int(point)]))
        f = g[(g.compared == REPLICATE) & (g.horizon == h)]
        if len(f):
            row.update(floor=float(f.rho.iloc[0]), floor_low=float(f.low.iloc[0]), floor_high=float(f.high.iloc[0]))
    return row
