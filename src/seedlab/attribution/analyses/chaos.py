"""Training's largest Lyapunov exponent per bank, and the law it predicts for the linear horizon.

distances.parquet holds, per seed and arm, d(t) = ‖θ_arm(t) − θ_twin(t)‖₂ at recorded steps t from s (every
step, or every ``chaos.every``-th). A nudge arm (kind ``nudge``: one ulp of one weight element just before the
update of step s) starts at d(s) = 0 and d(s+1) ≈ the ulp carried one update; while the difference is
infinitesimal it grows as d(t) ≈ d(s+1)·e^{λ(t − s − 1)}, λ training's largest Lyapunov exponent (per update,
natural log), until it saturates.

**The fit** (:func:`growth`, every arm of every kind alike): the growth phase runs from the first recorded
step with after = t − s ≥ ``start`` (1: s+1) to the first step at which d reaches ``fraction`` (0.1) of its
maximum over the recorded steps from there on (saturation; a tenth keeps the fit clear of the bend into the
plateau); λ = the OLS slope of ln d on t over the phase's steps with d > 0 (at least ``min_points``, 3;
else NaN), with its OLS standard error and R². ``saturated``: the phase ends before the last recorded step.

**Per cell** (:func:`lyapunov`): per nudge tensor the mean over seeds of λ with the two-sided t interval over
seeds (``seedlab.stats.mean_ci``), and the cell's λ (``nudge`` = :data:`ALL`): per seed the mean over its
nudges, then the mean over seeds with its t interval. :func:`rates` gives the same fit's summary per arm kind
and weight (candidates at w = 1, weighted rows, replicates, pairs, nudges), so λ(nudge) can be compared with
the growth of the rows' own perturbations.

**The law** (:func:`predict`): a perturbation of size ε, read at after₀ (the first recorded step after s:
attribution/analyses/size.py ``epsilon``), grows as ε·e^{λ(t − s − after₀)} and stays linear until it reaches ε_nl, the
distance at which the response bends (size.py ``scales``). So

    h*_pred − s = after₀ + ln(ε_nl / ε) / λ

(the issue's h* ≈ s + ln(ε_nl / ε)/λ, with the one update before ε is read kept). λ ≤ 0: never when ε <
ε_nl; ε ≥ ε_nl: at or before after₀ (the value says how far before). Its interval (:func:`predict_interval`):
the extremes over the corners of the intervals of λ, ε and ε_nl (a λ interval reaching 0: an open upper end).

**The comparison** (:func:`compare`), per cell (a bank: B, lr), query kind and weight: the prediction beside
the measured h*(w) (size.py ``h_star``: the first horizon at which U0 no longer predicts measured(w)). The
measured crossing lies in (previous horizon, h*(w)] — in (last horizon, ∞) when not reached — and
``consistent`` says whether the predicted interval meets that bracket (at the first horizon the bracket is
open below: a prediction at or before it — already bent when ε was read — meets it). ``bent_after``: the first horizon at
which ē(w) exceeds size.py's tolerance, and ``consistent_bent`` the same test against its bracket
(``bent_previous_after``, ``bent_after``] ((last horizon, ∞) when ē never exceeds it) — the criterion that
defines ε_nl, so the test of the law's mechanics; h*(w) is the ranking criterion (ρ), which a 10 % error in
magnitude need not break, and may come later. Its pieces (:func:`prediction`, :func:`bracket`, :func:`bent_bracket`,
:func:`meets`) serve attribution/analyses/grid.py's law across the B × lr grid as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.size import DISTANCES, SizeAxis
from seedlab.attribution.analyses.stats import ALPHA
from seedlab.errors import SeedlabError
from seedlab.stats import mean_ci

START = 1  # the growth phase's first step: s+1 (the nudge's distance at s is 0)
FRACTION = 0.1  # saturation: the phase ends where d first reaches this fraction of its later maximum
MIN_POINTS = 3  # points a fit needs
ALL = "all nudges"  # lyapunov's row for the cell: per seed the mean over its nudges, then over seeds
GROWTH = ["seed", "arm", "kind", "candidate", "weight", "rate", "se", "intercept", "r2", "points", "first_after",
          "last_after", "saturated", "peak", "peak_after"]
LYAPUNOV = ["nudge", "rate", "low", "high", "seeds", "r2", "saturated"]
RATES = ["kind", "weight", "rate", "low", "high", "seeds", "arms"]
COMPARE = ["cell", "query_kind", "weight", "epsilon", "epsilon_after", "eps_nl", "eps_nl_low", "eps_nl_high", "rate",
           "rate_low", "rate_high", "predicted", "predicted_low", "predicted_high", "status", "measured",
           "measured_label", "previous_after", "measured_low", "measured_high", "consistent", "bent_previous_after",
           "bent_after", "consistent_bent"]


@dataclass
class Chaos:
    """What :func:`analyse` found (columns: :data:`GROWTH`, :data:`LYAPUNOV`, :data:`RATES`; ``curves``
    the nudges' distances, distances.parquet's columns)."""

    start: int
    fraction: float
    alpha: float
    growth: pd.DataFrame
    lyapunov: pd.DataFrame
    rates: pd.DataFrame
    curves: pd.DataFrame

    @property
    def cell_rate(self) -> tuple[float, float, float]:
        """The cell's λ and its interval (NaN when there is no nudge)."""
        r = self.lyapunov[self.lyapunov.nudge == ALL]
        return (math.nan,) * 3 if not len(r) else (float(r.rate.iloc[0]), float(r.low.iloc[0]),
                                                    float(r.high.iloc[0]))


def _check(start: int, fraction: float, min_points: int, alpha: float) -> None:
    if start < 1:
        raise SeedlabError(f"start: the growth phase starts at s+1 or later, got {start!r}")
    if not 0 < fraction <= 1:
        raise SeedlabError(f"fraction: must lie in (0, 1], got {fraction!r}")
    if min_points < 2:
        raise SeedlabError(f"min_points: a slope needs at least 2 points, got {min_points!r}")
    if not 0 < alpha < 1:
        raise SeedlabError(f"alpha: must lie in (0, 1), got {alpha!r}")


def fit(after: np.ndarray, distance: np.ndarray, *, start: int = START, fraction: float = FRACTION,
        min_points: int = MIN_POINTS, last: int | None = None) -> dict:
    """One curve's growth fit (module doc): ``rate`` (λ per update), ``se``, ``intercept`` (ln d at after 0),
    ``r2``, ``points``, ``first_after``, ``last_after`` (the phase), ``saturated``, ``peak``, ``peak_after``.
    ``last``: the recorded steps after it are dropped first (the maximum and the saturation rule then look no
    further), so fits of designs of different lengths share one window."""
    order = np.argsort(after)
    t, d = np.asarray(after, np.float64)[order], np.asarray(distance, np.float64)[order]
    keep = (t >= start) & np.isfinite(d) & (t <= (np.inf if last is None else last))
    t, d = t[keep], d[keep]
    out = {"rate": math.nan, "se": math.nan, "intercept": math.nan, "r2": math.nan, "points": 0,
           "first_after": math.nan, "last_after": math.nan, "saturated": False, "peak": math.nan,
           "peak_after": math.nan}
    if not len(t):
        return out
    p = int(np.argmax(d))
    end = int(np.argmax(d >= fraction * d[p]))  # the first step at the fraction of the maximum (≤ p)
    out.update(peak=float(d[p]), peak_after=float(t[p]), saturated=bool(end < len(t) - 1))
    tt, dd = t[:end + 1], d[:end + 1]
    pos = dd > 0
    tt, y = tt[pos], np.log(dd[pos])
    out.update(points=len(tt), first_after=float(tt[0]) if len(tt) else math.nan,
               last_after=float(tt[-1]) if len(tt) else math.nan)
    if len(tt) < min_points or np.ptp(tt) == 0:
        return out
    tc = tt - tt.mean()
    slope = float((tc * (y - y.mean())).sum() / (tc * tc).sum())
    intercept = float(y.mean() - slope * tt.mean())
    resid = y - intercept - slope * tt
    ss = float(((y - y.mean()) ** 2).sum())
    se = math.sqrt(float((resid ** 2).sum()) / (len(tt) - 2) / float((tc * tc).sum())) if len(tt) > 2 else math.nan
    out.update(rate=slope, se=se, intercept=intercept, r2=1 - float((resid ** 2).sum()) / ss if ss > 0 else math.nan)
    return out


def growth(distances: pd.DataFrame, *, start: int = START, fraction: float = FRACTION,
           min_points: int = MIN_POINTS, last: int | None = None) -> pd.DataFrame:
    """Per seed × arm of distances.parquet's frame: :func:`fit` (columns :data:`GROWTH`)."""
    _check(start, fraction, min_points, ALPHA)
    missing = [c for c in DISTANCES if c not in distances]
    if missing:
        raise SeedlabError(f"distances.parquet: columns {missing} are missing")
    d = distances.sort_values(["seed", "arm", "after"])
    if not len(d):
        return pd.DataFrame(columns=GROWTH)
    codes = d.groupby(["seed", "arm"], sort=False).ngroup().to_numpy()
    cuts = np.r_[0, np.flatnonzero(np.diff(codes)) + 1, len(d)]
    t, v = d.after.to_numpy(np.float64), d.distance.to_numpy(np.float64)
    first = d.iloc[cuts[:-1]]
    fits = [fit(t[i:j], v[i:j], start=start, fraction=fraction, min_points=min_points, last=last)
            for i, j in zip(cuts[:-1], cuts[1:])]
    head = pd.DataFrame({"seed": first.seed.to_numpy(), "arm": first.arm.to_numpy(), "kind": first.kind.to_numpy(),
                         "candidate": first.candidate.to_numpy(), "weight": first.weight.to_numpy(np.float64)})
    return pd.concat([head, pd.DataFrame(fits)], axis=1)[GROWTH]


def lyapunov(g: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """Per nudge tensor and for the cell (:data:`ALL`): λ over seeds with its t interval, ``seeds``, the median
    ``r2`` of the fits and the fraction ``saturated`` (columns :data:`LYAPUNOV`)."""
    n = g[g.kind == "nudge"]
    rows = []
    for arm, a in n.groupby("arm", sort=True):
        m, lo, hi, k = mean_ci(a.rate, alpha)
        rows.append({"nudge": arm, "rate": m, "low": lo, "high": hi, "seeds": k, "r2": float(a.r2.median()),
                     "saturated": float(a.saturated.mean())})
    if len(n):
        m, lo, hi, k = mean_ci(n.groupby("seed").rate.mean(), alpha)
        rows.append({"nudge": ALL, "rate": m, "low": lo, "high": hi, "seeds": k, "r2": float(n.r2.median()),
                     "saturated": float(n.saturated.mean())})
    return pd.DataFrame(rows, columns=LYAPUNOV)


def rates(g: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """Per arm kind × weight (NaN for pairs and nudges): the growth rate's mean over seeds of each seed's mean
    over its arms, with the t interval over seeds (columns :data:`RATES`)."""
    rows = []
    for (kind, w), a in g.assign(w=g.weight.fillna(-1.0)).groupby(["kind", "w"], sort=True):
        m, lo, hi, k = mean_ci(a.groupby("seed").rate.mean(), alpha)
        rows.append({"kind": kind, "weight": math.nan if w < 0 else float(w), "rate": m, "low": lo, "high": hi,
                     "seeds": k, "arms": len(a)})
    return pd.DataFrame(rows, columns=RATES)


def analyse(distances: pd.DataFrame, *, start: int = START, fraction: float = FRACTION,
            min_points: int = MIN_POINTS, alpha: float = ALPHA, last: int | None = None) -> Chaos:
    """λ per cell from distances.parquet's frame (module doc); ``last``: :func:`fit`'s common window end."""
    _check(start, fraction, min_points, alpha)
    if last is not None and last < start + min_points - 1:
        raise SeedlabError(f"last: the window s+{start} .. s+{last} holds fewer than {min_points} steps")
    g = growth(distances, start=start, fraction=fraction, min_points=min_points, last=last)
    return Chaos(start, fraction, alpha, g, lyapunov(g, alpha), rates(g, alpha),
                 distances[distances.kind == "nudge"].reset_index(drop=True))


# ---------------------------------------------------------------- the law


def predict(rate, epsilon, eps_nl, after0=1.0) -> np.ndarray:
    """h*_pred − s = after₀ + ln(ε_nl / ε)/λ (module doc), broadcast; λ ≤ 0: ∞ when ε < ε_nl, after₀ otherwise."""
    rate, epsilon, eps_nl, after0 = (np.asarray(v, np.float64) for v in (rate, epsilon, eps_nl, after0))
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.log(eps_nl / epsilon)
        out = np.where(rate > 0, after0 + gap / np.where(rate > 0, rate, 1.0), np.where(gap > 0, np.inf, after0))
    return np.where(np.isnan(rate) | np.isnan(gap), np.nan, out)


def predict_interval(rate: tuple[float, float], epsilon: tuple[float, float], eps_nl: tuple[float, float],
                     after0: float = 1.0) -> tuple[float, float]:
    """The extremes of :func:`predict` over the corners of the (low, high) intervals of λ, ε and ε_nl (an end
    NaN: the point's value stands for it, pass it twice); a λ interval reaching 0 or below opens the upper end."""
    corners = np.array([predict(r, e, n, after0) for r in rate for e in epsilon for n in eps_nl])
    if np.isnan(corners).any():
        return math.nan, math.nan
    lo, hi = float(corners.min()), float(corners.max())
    if min(rate) <= 0 < max(rate) and math.log(max(eps_nl) / min(epsilon)) > 0:
        hi = math.inf
    return lo, hi


def _or(v: float, default: float) -> float:
    return default if v is None or math.isnan(v) else v


Triple = tuple[float, float, float]  # (value, low, high)


def prediction(rate: Triple, epsilon: Triple, eps_nl: Triple, after0: float = 1.0) -> Triple:
    """:func:`predict` and :func:`predict_interval` from (value, low, high) triples of λ, ε and ε_nl (an interval end
    NaN: the value stands for it): (predicted, low, high) in updates after s."""
    (r, rlo, rhi), (e, elo, ehi), (n, nlo, nhi) = rate, epsilon, eps_nl
    lo, hi = predict_interval((_or(rlo, r), _or(rhi, r)), (_or(elo, e), _or(ehi, e)), (_or(nlo, n), _or(nhi, n)),
                              after0)
    return float(predict(r, e, n, after0)), lo, hi


def bracket(status: str, previous_after: float, after: float, last_after: float) -> tuple[float, float] | None:
    """Where a measured h* crossing lies (module doc): (previous_after, after] when "reached", (last_after, ∞) when
    "not reached", None otherwise ("undefined")."""
    if status == "reached":
        return previous_after, after
    if status == "not reached":
        return last_after, math.inf
    return None


def bent_bracket(bent_previous_after: float, bent_after: float, last_after: float) -> tuple[float, float]:
    """Where the first ē beyond the tolerance lies: (bent_previous_after, bent_after], or (last_after, ∞) when none."""
    return (last_after, math.inf) if math.isnan(bent_after) else (bent_previous_after, bent_after)


def meets(interval: tuple[float, float], where: tuple[float, float] | None) -> bool | None:
    """Whether the predicted ``interval`` (low, high) meets the bracket ``where`` (lower end open, except a lower end
    of 0: a prediction at or before the first horizon meets it); None when either is undefined."""
    lo, hi = interval
    if where is None or math.isnan(lo):
        return None
    return bool((hi > where[0] or where[0] == 0) and lo <= where[1])


def compare(cells: Mapping[str, tuple[SizeAxis, Chaos]]) -> pd.DataFrame:
    """Per cell × query kind × weight: the law's prediction beside the measured h*(w) (module doc; columns
    :data:`COMPARE`, in updates after s: ``predicted`` with ``predicted_low, predicted_high``; ``measured``
    h*(w) (NaN unless reached) with its label, ``previous_after`` (the bracket's lower end), ``measured_low,
    measured_high`` (h*'s interval, NaN for an end "not reached"); ``consistent`` None where either side is
    undefined; ``consistent_bent`` the same against the ē bracket)."""
    rows = []
    for cell, (size, chaos) in cells.items():
        lam, lam_lo, lam_hi = chaos.cell_rate
        eps = size.epsilon.set_index("weight")
        scales = size.scales.set_index("query_kind")
        for r in size.h_star.itertuples():
            if r.weight not in eps.index or r.query_kind not in scales.index:
                continue
            e, n = eps.loc[r.weight], scales.loc[r.query_kind]
            after0 = float(e.after)
            p, lo, hi = prediction((lam, lam_lo, lam_hi), (e.epsilon, e.low, e.high), (n.eps_nl, n.low, n.high), after0)
            consistent = meets((lo, hi), bracket(r.status, r.previous_after, r.after, r.last_after))
            consistent_bent = meets((lo, hi), bent_bracket(r.bent_previous_after, r.bent_after, r.last_after))
            rows.append({"cell": cell, "query_kind": r.query_kind, "weight": r.weight, "epsilon": float(e.epsilon),
                         "epsilon_after": after0, "eps_nl": float(n.eps_nl), "eps_nl_low": float(n.low),
                         "eps_nl_high": float(n.high), "rate": lam, "rate_low": lam_lo, "rate_high": lam_hi,
                         "predicted": p, "predicted_low": lo, "predicted_high": hi, "status": r.status,
                         "measured": r.after, "measured_label": r.label, "previous_after": r.previous_after,
                         "measured_low": r.low_after, "measured_high": r.high_after, "consistent": consistent,
                         "bent_previous_after": r.bent_previous_after, "bent_after": r.bent_after,
                         "consistent_bent": consistent_bent})
    return pd.DataFrame(rows, columns=COMPARE)
