"""The linear-response horizon: how far the exact first-order counterfactual carries.

The estimator :data:`UNROLL` (``unroll``, label "reference", nats/token) is the exact first-order
response to the candidate: the one-step change of the weights at s, Δθ_s (exact), carried through
the twin's actual steps s+1 .. h with forward-mode JVPs to Δθ_h and read out linearly,
⟨∇L_q(θ_h), Δθ_h⟩ — so, unlike the estimators at θ_s, its estimate differs per horizon. Two more
responses, when attribution.parquet has them (older banks do not; every number below is then left
out, not failed), split its miss in three:

- :data:`TANGENT` (``unroll-tangent``, per unit row weight): the step at s linearised too (the
  w → 0 limit; at w = 1 the fully linear prediction). ρ(unroll, unroll-tangent): what the
  non-linearity of the step at s itself (Adam's normalisation under the swap) does;
- :data:`READOUT` (``unroll-readout``): the same Δθ_h read out exactly, L_q(θ_h + Δθ_h) − L_q(θ_h).
  ρ(unroll, unroll-readout): the readout's curvature alone (same Δθ_h); ρ(measured,
  unroll-readout): the propagation's error alone (s+1 has no propagation: there it is 1 up to the
  step at s being exact);
- ρ(measured, unroll): both; ρ(unroll, e) for every other estimator e in the frame (baselines
  included, the derived kind baseline not): what e loses to its own approximations.

Each response's **calibration** stands beside its Spearman at every horizon (stats.py's
:func:`~seedlab.attribution.analyses.stats.calibration`: the OLS slope of measured on the response and the
median ratio measured / response, with bootstrap intervals): a ranking can survive while the
magnitude is off many-fold.

The references of the track do not involve unroll: within seed the **row invariance** ρ_rep =
Spearman(Δ(c@r), Δ(c@r′)) and its ceiling √ρ_rep (:data:`CEILING`), across seeds the
Spearman–Brown reliability R of the seed-mean and √R (attribution/analyses/stats.py: why √ρ_rep is a
ceiling for every predictor that ranks a candidate the same whichever row it replaces, and why
ρ_rep < 1 has the same cause as unroll's miss: within a seed nothing is noise).

Both tracks are attribution/analyses/stats.py's, computed by its :func:`~seedlab.attribution.analyses.stats.correlations`
(ρ(unroll, e) on :meth:`Arrays.against <seedlab.attribution.analyses.stats.Arrays.against>`: unroll's
estimate in the place of the measured effect). Intervals in ``table``: the percentile interval of
the same seeded bootstrap resamples of candidates as stats.py's (every number here is paired with
every other and with the report's correlations); ``se_seeds`` the jackknife over seeds.

**h\\*** (per response and query kind, within seed): the first horizon, in order, at which the
response no longer *predicts* the measured effect by the report's own rule (stats.py
:func:`~seedlab.attribution.analyses.stats.verdict`): the interval of its ρ above 0 and the interval of
ρ − ρ_b above 0 for every baseline b whose ρ is defined (the registry's baselines and the kind
baseline). h* is a claim about training, not about these seeds, so its intervals resample seeds
and candidates jointly (:func:`~seedlab.attribution.analyses.stats.within_joint`: seeds with replacement,
then candidates within each drawn seed; wider than the tables' candidate-only intervals, so h* can
come before the last horizon the verdict tables credit unroll with). Its interval: each resample
applies the same rule to its own ρ's, each interval kept at the sample's distance below its point
(a resample predicts at h when ρ*(h) − (ρ(h) − low(h)) > 0 and likewise for each difference), its
h* taken in horizon order, "not reached" ranked after the last horizon, and the α/2 and 1 − α/2
quantiles of that ordinal distribution by the inverted empirical CDF (each end a horizon or "not
reached"). A horizon where the response's ρ is undefined counts as one where it does not predict
(as in the verdict). ``status``: "reached", "not reached" (it predicts at every horizon) or
"undefined" (ρ defined at none). Nothing assumes how many horizons there are.

Beside it, descriptive only: the first horizon with ρ(measured, response) < τ
(``attribute.h_star_rho``, the threshold docs/preregistration/attribution-confirm.md named), with its interval over
the same joint resamples (:func:`first_below`).

:func:`linear_response` computes all of it and returns it as data (:class:`LinearResponse`);
attribution/report/horizon.py words it (the report's first sentence and its section) and
attribution/report/figures.py ``linear_response_figure`` draws it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.stats import (
    ALPHA,
    KIND,
    READOUT,
    REFERENCES,
    RESAMPLES,
    RESPONSES,
    ROW_INVARIANCE,
    SEED,
    TANGENT,
    UNROLL,
    Arrays,
    calibration,
    correlations,
    is_baseline,
    with_kind_baseline,
    within_joint,
    within_rho,
)
from seedlab.stats import bootstrap_interval
from seedlab.errors import SeedlabError

__all__ = ["CEILING", "MEASURED", "READOUT", "TANGENT", "UNROLL", "LinearResponse", "first_below", "first_failing",
           "h_star", "linear_response", "predicts"]

MEASURED = "measured"  # ``against`` of ρ(measured, ·)
CEILING = "ceiling"  # ``compared`` of the track reference's bound: √ρ_rep within seed, √R across seeds
RUN_IT = "seedlab attribution attribute DIR --estimator unroll --add"
COLUMNS = ["track", "query_kind", "horizon", "label", "after", "against", "compared", "baseline", "rho", "low", "high",
           "se_seeds", "seeds", "candidates", "queries"]
H_STAR = ["response", "query_kind", "status", "horizon", "label", "after", "rho", "low", "high", "unbeaten",
          "low_label", "high_label", "low_after", "high_after", "reached", "invariance", "invariance_low",
          "invariance_high", "ceiling", "ceiling_low", "ceiling_high", "tau_label", "tau_after", "tau_low_label",
          "tau_high_label", "last_label", "baselines"]
NOT_REACHED = "not reached"


@dataclass
class LinearResponse:
    """What :func:`linear_response` found (empty frames when the frame holds no :data:`UNROLL` rows)."""

    threshold: float  # τ of the descriptive crossing
    alpha: float
    ran: bool  # the frame holds unroll rows
    references: list[str]  # the frame's reference estimators (the responses; any other labelled "reference")
    responses: list[str]  # the exact responses in the frame, in RESPONSES' order (unroll first)
    table: pd.DataFrame  # columns COLUMNS: per track × query kind × horizon × (against, compared)
    calibration: pd.DataFrame  # stats.calibration's columns, the responses only
    h_star: pd.DataFrame  # columns H_STAR: per response × query kind, within seed


def linear_response(df: pd.DataFrame, *, threshold: float = 0.5, resamples: int = RESAMPLES, seed: int = SEED,
                    alpha: float = ALPHA) -> LinearResponse:
    """From attribution.parquet's frame: ``table`` — per track × query kind × horizon: ρ(measured, r)
    for every response r (``against`` = :data:`MEASURED`, ``compared`` = r), the track's reference and
    its ceiling (``against`` = MEASURED, ``compared`` = ROW_INVARIANCE / RELIABILITY and
    :data:`CEILING`), and ρ(unroll, e) for every other estimator e (``against`` = :data:`UNROLL`,
    ``compared`` = e), each with ``rho, low, high, se_seeds`` (module doc), ``baseline`` (e is a
    baseline), ``label, after, seeds, candidates, queries``; ``calibration`` of the responses; and
    ``h_star`` per response × query kind (:func:`h_star`). ``threshold``: τ, in (0, 1)."""
    if not 0 < threshold < 1:
        raise SeedlabError(f"h_star_rho: the threshold must lie in (0, 1), got {threshold!r}")
    labelled = df.estimator_label == "reference" if "estimator_label" in df else pd.Series(False, index=df.index)
    present = set(df.estimator)
    responses = [r for r in RESPONSES if r in present]
    references = list(dict.fromkeys([*responses, *df.estimator[labelled]]))
    if UNROLL not in responses:
        return LinearResponse(threshold, alpha, False, references, responses, pd.DataFrame(columns=COLUMNS),
                              pd.DataFrame(), pd.DataFrame(columns=H_STAR))
    b = Arrays.of(with_kind_baseline(df))
    a = b.only([e for e in b.estimators if e != KIND])  # the frame's own estimators
    corr = correlations(a.only(responses), resamples, seed, alpha)[0]
    refs = corr[corr.estimator.isin(REFERENCES)]
    frames = [corr.assign(against=MEASURED, compared=corr.estimator),
              refs.assign(against=MEASURED, compared=CEILING, rho=refs.bound, low=_root(refs.low),
                          high=_root(refs.high), se_seeds=math.nan)]
    if len(a.estimators) > 1:
        other = correlations(a.against(UNROLL), resamples, seed, alpha)[0]
        frames.append(other[~other.estimator.isin(REFERENCES)].assign(against=UNROLL, compared=other.estimator))
    table = pd.concat(frames, ignore_index=True)[COLUMNS]
    baselines = [e for e in b.estimators if is_baseline(e)]
    joint = within_joint(b.only([*responses, *baselines]), resamples, seed)
    stars = [h_star(b, table, joint[kind][..., [i, *range(len(responses), len(responses) + len(baselines))]],
                    r, baselines, kind, threshold, alpha)
             for i, r in enumerate(responses) for kind in dict.fromkeys(b.kinds)]
    return LinearResponse(threshold, alpha, True, references, responses, table,
                          calibration(a.only(responses), df, resamples, seed, alpha), pd.DataFrame(stars, columns=H_STAR))


def _root(v: pd.Series) -> pd.Series:
    """√max(v, 0): a monotone map, so the √ of a percentile interval's ends is the interval of the √."""
    return np.sqrt(v.clip(lower=0))


def first_below(rho: np.ndarray, threshold: float) -> np.ndarray:
    """Per row of ``rho`` [..., H] (ρ at the horizons in order): the index of the first horizon with
    ρ < ``threshold`` (undefined ρ skipped); H where none is ("not reached"); NaN where no ρ is defined."""
    rho = np.asarray(rho, dtype=np.float64)
    below = rho < threshold  # NaN compares False: skipped
    first = np.where(below.any(axis=-1), below.argmax(axis=-1), rho.shape[-1]).astype(np.float64)
    return np.where(np.isnan(rho).all(axis=-1), np.nan, first)


def first_failing(ok: np.ndarray, defined: np.ndarray) -> np.ndarray:
    """Per row of ``ok`` [..., H] (whether the response predicts at each horizon, in order): the index of
    the first horizon where it does not; H where it predicts at every horizon; NaN where ``defined``
    [..., H] (its ρ is defined) holds at no horizon."""
    fail = ~ok
    first = np.where(fail.any(axis=-1), fail.argmax(axis=-1), ok.shape[-1]).astype(np.float64)
    return np.where(defined.any(axis=-1), first, np.nan)


def predicts(lows: np.ndarray) -> np.ndarray:
    """The verdict's rule on lower interval ends [..., H, 1 + B] (ρ, then ρ − ρ_b for each baseline b):
    ρ's above 0 and no difference's at or below 0 (an undefined difference, NaN, is no rival: stats.verdict)."""
    with np.errstate(invalid="ignore"):
        return (lows[..., 0] > 0) & ~np.any(lows[..., 1:] <= 0, axis=-1)


def h_star(a: Arrays, table: pd.DataFrame, boot: np.ndarray, response: str, baselines: list[str], kind: str,
           threshold: float, alpha: float = ALPHA) -> dict:
    """One response's and query kind's h* (module doc). ``a``: the frame's arrays with the kind baseline;
    ``boot`` [b, H, 1 + len(baselines)]: the joint resamples of the within-seed ρ of the response, then of
    each baseline (:func:`~seedlab.attribution.analyses.stats.within_joint`). Returns ``status`` ("reached", "not
    reached", "undefined"); at h*: ``horizon, label, after``, the response's ``rho`` with its joint
    interval ``low, high`` and ``unbeaten`` (what it does not clearly exceed there: "0" and/or baselines);
    the interval of h* ``low_label, high_label`` (``low_after, high_after``, NaN for "not reached");
    ``reached``, the fraction of resamples (with a defined h*) in which h* is reached; the row invariance
    and its ceiling √ρ_rep at h* (the table's intervals); ``tau_label, tau_after`` the first horizon with
    ρ < τ and ``tau_low_label, tau_high_label`` its interval; ``last_label``; ``baselines``."""
    H = len(a.horizons)
    point = within_rho(a.only([response, *baselines]))[kind]  # [H, 1 + B]
    with np.errstate(invalid="ignore"):
        diffs = np.concatenate([point[:, :1], point[:, :1] - point[:, 1:]], axis=1)  # ρ; ρ − ρ_b
        bdiffs = np.concatenate([boot[..., :1], boot[..., :1] - boot[..., 1:]], axis=-1)
        (low, _), (lo_rho, hi_rho) = bootstrap_interval(bdiffs, alpha), bootstrap_interval(boot[..., 0], alpha)
        shifted = bdiffs - (diffs - low)  # each resample's lower ends, at the sample's distance below its point
    at = first_failing(predicts(low), ~np.isnan(point[:, 0]))
    resampled = first_failing(predicts(shifted), ~np.isnan(boot[..., 0]))
    resampled = resampled[~np.isnan(resampled)]
    tau_at, tau_resampled = first_below(point[:, 0], threshold), first_below(boot[..., 0], threshold)

    def end(i: float) -> tuple[str, float]:
        if np.isnan(i):
            return "undefined", math.nan
        return (NOT_REACHED, math.nan) if i >= H else a.labels[a.horizons[int(i)]]

    (low_label, low_after), (high_label, high_after) = map(end, _quantiles(resampled, alpha))
    (tau_low, _), (tau_high, _) = map(end, _quantiles(tau_resampled[~np.isnan(tau_resampled)], alpha))
    row = {"response": response, "query_kind": kind,
           "status": "undefined" if np.isnan(at) else NOT_REACHED if at >= H else "reached",
           "horizon": None, "label": None, "after": math.nan, "rho": math.nan, "low": math.nan, "high": math.nan,
           "unbeaten": [], "low_label": low_label, "high_label": high_label, "low_after": low_after,
           "high_after": high_after, "reached": float(np.mean(resampled < H)) if len(resampled) else math.nan,
           "invariance": math.nan, "invariance_low": math.nan, "invariance_high": math.nan, "ceiling": math.nan,
           "ceiling_low": math.nan, "ceiling_high": math.nan, "tau_label": end(tau_at)[0], "tau_after": end(tau_at)[1],
           "tau_low_label": tau_low, "tau_high_label": tau_high, "last_label": a.labels[a.horizons[-1]][0],
           "baselines": list(baselines)}
    if row["status"] == "reached":
        i = int(at)
        h = a.horizons[i]
        with np.errstate(invalid="ignore"):
            unbeaten = (["0"] if not low[i, 0] > 0 else []) + [b for j, b in enumerate(baselines) if low[i, j + 1] <= 0]
        row.update(a.at(h), rho=float(point[i, 0]), low=float(lo_rho[i]), high=float(hi_rho[i]), unbeaten=unbeaten)
        g = table[(table.track == "within") & (table.query_kind == kind) & (table.horizon == h)].set_index("compared")
        if ROW_INVARIANCE in g.index:
            f, c = g.loc[ROW_INVARIANCE], g.loc[CEILING]
            row.update(invariance=float(f.rho), invariance_low=float(f.low), invariance_high=float(f.high),
                       ceiling=float(c.rho), ceiling_low=float(c.low), ceiling_high=float(c.high))
    return row


def _quantiles(resampled: np.ndarray, alpha: float) -> tuple[float, float]:
    """The α/2 and 1 − α/2 quantiles of an ordinal distribution (inverted CDF); NaN when empty."""
    if not len(resampled):
        return math.nan, math.nan
    lo, hi = np.quantile(resampled, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    return float(lo), float(hi)
