"""The size axis at a fixed trajectory: how large a row's perturbation may be and stay linear.

A bank with ``candidates.weights`` forks every candidate c once per loss weight w of its row r, the batch
loss (Σ_{i≠r} ℓ_i + (1 − w)·ℓ_r + w·ℓ_c)/N (w = 1: the swap). weighted.parquet holds measured(w) =
L_q(run with c at weight w) − L_q(twin) per seed × candidate × query × horizon × w; attribution.parquet's
estimator :data:`TANGENT` (``unroll-tangent``) holds U0, the w → 0 limit of measured(w)/w (nats/token per
unit weight, every step linearized, the first too). Own-row controls (measured 0 by construction) are left out.

**Per seed**, query kind k, horizon h and weight w, over the kind's (ordinary candidate × query) cells
present on both sides:

- the relative error  e(w) = ‖measured(w)/w − U0‖₂ / ‖U0‖₂  (NaN where ‖U0‖ = 0);
- ρ(w): Spearman(measured(w), U0) over the candidates, per query, then the mean over the kind's queries
  (as attribution/analyses/stats.py; ρ of measured(w) and of measured(w)/w are the same).

**Over seeds**: ē(w) and ρ̄(w), the means over seeds, each with the percentile interval of
:data:`RESAMPLES` seeded bootstrap resamples of the seeds (with replacement; one set of resamples shared by
every kind, horizon, weight and derived number below, so they are paired; no interval with one seed).
Every derived number is recomputed in each resample from that resample's ē and ρ̄.

- **Convergence** (:func:`convergence`): per kind and horizon, the OLS slope of ln ē(w) on ln w (1 when
  measured(w) = w·U0 + O(w²); 0 when e does not fall as w → 0) with its interval, and whether the smallest
  w has the smallest ē (``closest``): the test that unroll's propagation is the w → 0 limit.
- **The linear regime's size** (:func:`regime`): per kind and horizon, the largest w with ē(w') ≤ τ_e
  (``tolerance``, 0.10: the issue's 10 %) at that w and at every smaller weight (the regime is a range from
  0: one stray w inside it beyond a failing smaller one does not count). ``status`` "bounded" (some weights
  fail), "at least" (every weight is within: the size is at least the largest weight), "below" (none is:
  smaller than the smallest weight; ``largest`` NaN, and an interval end there is written 0). The interval: the
  α/2 and 1 − α/2 quantiles (inverted empirical CDF) of the resamples' sizes, each end a weight or 0.
- **h\\*(w)** (:func:`h_star`): per kind and weight, the first horizon at which measured(w) is no longer
  predicted by U0. The rule is a seam (:data:`Rule`): ``rule(rho, low, high)`` says per horizon whether it
  predicts. The default (:func:`by_interval`): predicted while the seed-bootstrap interval of ρ̄(w) lies above
  0 (low > 0) and ρ̄(w) ≥ τ_ρ (``threshold``, 0.5 as horizon.py's ``attribute.h_star_rho``; with one seed,
  which has no interval, ρ̄(w) ≥ τ_ρ alone). The report's own
  rule ("unroll no longer predicts beyond every baseline", horizon.py) can be passed in its place once it
  exists. Horizons where ρ̄ is undefined are skipped. The interval of h\\*(w): the same rule in every
  resample, with the resample's ρ̄ standing for its own interval (low = high = ρ̄_b), and the inverted-CDF
  quantiles of the first horizons ("not reached" after the last), as horizon.py's. Beside it ``bent``: the
  first horizon at which ē(w) > τ_e, the same criterion as the regime's.
- **The perturbation's size** (:func:`epsilon`): ε(w) = ‖θ_w − θ_twin‖₂ at the first recorded step after s
  (s+1 when every step is recorded) of the candidates' arms at weight w (distances.parquet, kinds
  candidate (w = 1) and weighted): per seed the median over its arms, then the median over seeds, with the
  seed-bootstrap interval.
- **The scale where the response bends** (:func:`bend`): per kind and horizon, D(w, h) = the median over
  seeds of each seed's median distance at h of its arms at weight w (log-linear interpolation between
  recorded steps), and ε_nl(h) = the distance at which ē crosses τ_e: ln ē interpolated linearly in ln D
  between the regime's largest weight and the next (NaN when the regime is "at least" or "below"). Per
  kind (:func:`scales`) ε_nl = the median over the horizons where it crossed. Both with seed-bootstrap
  intervals (per resample: that resample's ē and D).

:func:`analyse` runs it all and returns :class:`SizeAxis`; attribution/analyses/chaos.py uses ε and ε_nl in the law
h* ≈ s + ln(ε_nl / ε)/λ, attribution/report/size.py renders it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.stats import ALPHA, RESAMPLES, SEED
from seedlab.errors import SeedlabError
from seedlab.stats import bootstrap_interval, slope_along, spearman_along

TANGENT = "unroll-tangent"  # attribution.parquet's estimator: U0, the w → 0 limit of measured(w)/w
TOLERANCE = 0.10  # τ_e: the "within 10 % of the w → 0 limit"
THRESHOLD = 0.5  # τ_ρ of the default h*(w) rule (horizon.py's attribute.h_star_rho default)
ARM_KINDS = ("candidate", "weighted")  # distances.parquet's kinds of a candidate's arms at a weight (w = 1, w < 1)
WEIGHTED = ["seed", "candidate", "candidate_kind", "query", "query_kind", "horizon", "after", "label", "weight",
            "measured"]
DISTANCES = ["seed", "arm", "kind", "candidate", "weight", "step", "after", "distance"]

#: h*(w)'s rule: (ρ̄, its low, its high), arrays [..., H], -> whether measured(w) is predicted at each horizon
Rule = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def by_interval(threshold: float = THRESHOLD) -> Rule:
    """The default rule of h*(w): predicted where the interval of ρ̄ lies above 0 and ρ̄ ≥ ``threshold`` (with
    one seed there is no interval: ρ̄ ≥ ``threshold`` alone)."""
    if not 0 <= threshold < 1:
        raise SeedlabError(f"threshold: must lie in [0, 1), got {threshold!r}")

    def rule(rho: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        return ((low > 0) | np.isnan(low)) & (rho >= threshold)

    return rule


def _nanmean(v: np.ndarray, axis) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(v, axis=axis)


def _nanmedian(v: np.ndarray, axis) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(v, axis=axis)


def _need(df: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df]
    if missing:
        raise SeedlabError(f"{what}: columns {missing} are missing")


# ---------------------------------------------------------------- the cells as arrays


@dataclass
class Grid:
    """weighted.parquet beside U0 as arrays, per query kind: ``M[k]`` [S, H, W, Q, C] measured(w) and ``U[k]``
    [S, H, Q, C] U0 (NaN where absent), over the sorted seeds, horizons, weights and candidates."""

    seeds: list[int]
    horizons: list[int]
    labels: dict[int, tuple[str, int]]  # horizon -> (label, after)
    weights: np.ndarray  # ascending
    candidates: list[str]
    queries: dict[str, list[str]]  # kind -> its queries
    M: dict[str, np.ndarray]
    U: dict[str, np.ndarray]

    @classmethod
    def of(cls, weighted: pd.DataFrame, attribution: pd.DataFrame) -> Grid:
        _need(weighted, WEIGHTED, "weighted.parquet")
        _need(attribution, ["seed", "candidate", "query", "horizon", "estimator", "estimate"], "attribution.parquet")
        w = weighted[weighted.candidate_kind != "control"]
        if not len(w):
            raise SeedlabError("weighted.parquet: no ordinary candidate (a bank with candidates.weights?)")
        bad = w.weight[(w.weight <= 0) | (w.weight > 1) | w.weight.isna()]
        if len(bad):
            raise SeedlabError(f"weighted.parquet: a weight must lie in (0, 1], got {float(bad.iloc[0])!r}")
        u = attribution[attribution.estimator == TANGENT]
        if not len(u):
            raise SeedlabError(f"attribution.parquet: no {TANGENT} estimate (`seedlab attribution attribute DIR "
                               f"--estimator {TANGENT} --add`)")
        keys = ["seed", "candidate", "query", "horizon"]
        u = u.drop_duplicates(keys)[[*keys, "estimate"]]
        seeds = sorted(int(v) for v in w.seed.unique())
        hs = sorted(int(v) for v in w.horizon.unique())
        ws = np.array(sorted(float(v) for v in w.weight.unique()))
        cands = sorted(w.candidate.unique())
        labels = {int(r.horizon): (r.label, int(r.after)) for r in w.drop_duplicates("horizon").itertuples()}
        queries = {k: list(dict.fromkeys(g["query"])) for k, g in w.groupby("query_kind", sort=False)}
        M, U = {}, {}
        for kind, qs in queries.items():
            g = w[w.query_kind == kind].drop_duplicates([*keys, "weight"])
            idx = pd.MultiIndex.from_product([seeds, hs, list(ws), qs], names=["seed", "horizon", "weight", "query"])
            m = g.set_index(["seed", "horizon", "weight", "query", "candidate"]).measured.unstack("candidate")
            M[kind] = m.reindex(index=idx, columns=cands).to_numpy(np.float64).reshape(
                len(seeds), len(hs), len(ws), len(qs), len(cands))
            iu = pd.MultiIndex.from_product([seeds, hs, qs], names=["seed", "horizon", "query"])
            t = u[u["query"].isin(qs)].set_index(["seed", "horizon", "query", "candidate"]).estimate.unstack("candidate")
            U[kind] = t.reindex(index=iu, columns=cands).to_numpy(np.float64).reshape(
                len(seeds), len(hs), len(qs), len(cands))
        return cls(seeds, hs, labels, ws, cands, queries, M, U)

    def at(self, h: int) -> dict:
        label, after = self.labels[h]
        return {"horizon": h, "label": label, "after": after}


def per_seed_values(g: Grid) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per query kind: (e [S, H, W], ρ [S, H, W]) per seed (module doc)."""
    out = {}
    w = g.weights[None, None, :, None, None]
    for kind in g.queries:
        M, U = g.M[kind], g.U[kind][:, :, None]  # [S, H, W, Q, C], [S, H, 1, Q, C]
        ok = ~np.isnan(M) & ~np.isnan(U)
        num = np.where(ok, (M / w - U) ** 2, 0.0).sum(axis=(-2, -1))
        den = np.where(ok, np.broadcast_to(U, M.shape) ** 2, 0.0).sum(axis=(-2, -1))
        with np.errstate(invalid="ignore", divide="ignore"):
            e = np.where(den > 0, np.sqrt(num / den), np.nan)
        rho = _nanmean(spearman_along(M, U), -1)  # over the kind's queries
        out[kind] = (e, rho)
    return out


def seed_draws(n: int, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` seeded bootstrap resamples of n seeds: the drawn positions [resamples, n]."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


# ---------------------------------------------------------------- what the size axis is


@dataclass
class SizeAxis:
    """What :func:`analyse` found (each frame's columns in the function that makes it)."""

    tolerance: float  # τ_e
    threshold: float  # τ_ρ of the default rule (NaN when another rule was passed)
    alpha: float
    seeds: int
    weights: list[float]
    injection_step: int | None  # s, from the frames' horizon − after
    per_seed: pd.DataFrame
    summary: pd.DataFrame
    convergence: pd.DataFrame
    regime: pd.DataFrame
    h_star: pd.DataFrame
    epsilon: pd.DataFrame
    bend: pd.DataFrame
    scales: pd.DataFrame


SUMMARY = ["query_kind", "horizon", "label", "after", "weight", "error", "error_low", "error_high", "rho", "rho_low",
           "rho_high", "seeds", "candidates", "queries"]
CONVERGENCE = ["query_kind", "horizon", "label", "after", "slope", "low", "high", "closest", "smallest",
               "error_smallest"]
REGIME = ["query_kind", "horizon", "label", "after", "tolerance", "status", "largest", "low", "high"]
H_STAR = ["query_kind", "weight", "status", "horizon", "label", "after", "rho", "previous_after", "low_label",
          "high_label", "low_after", "high_after", "reached", "bent_label", "bent_after", "bent_previous_after",
          "last_after"]
EPSILON = ["weight", "after", "epsilon", "low", "high", "seeds", "arms"]
BEND = ["query_kind", "horizon", "label", "after", "status", "below", "above", "distance", "low", "high"]
SCALES = ["query_kind", "eps_nl", "low", "high", "horizons"]


def analyse(weighted: pd.DataFrame, attribution: pd.DataFrame, distances: pd.DataFrame | None = None, *,
            tolerance: float = TOLERANCE, threshold: float = THRESHOLD, rule: Rule | None = None,
            resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> SizeAxis:
    """The size axis (module doc) from weighted.parquet's and attribution.parquet's frames (and
    distances.parquet's for ε and ε_nl; None: those frames empty). ``rule`` replaces h*(w)'s default
    (:func:`by_interval` at ``threshold``)."""
    if not 0 < tolerance < 1:
        raise SeedlabError(f"tolerance: must lie in (0, 1), got {tolerance!r}")
    if not 0 < alpha < 1:
        raise SeedlabError(f"alpha: must lie in (0, 1), got {alpha!r}")
    g = Grid.of(weighted, attribution)
    values = per_seed_values(g)
    idx = seed_draws(len(g.seeds), resamples, seed)
    boot = {k: (_nanmean(e[idx], 1), _nanmean(r[idx], 1)) for k, (e, r) in values.items()}  # [b, H, W] each
    if len(g.seeds) < 2:  # a resample of one seed is that seed: no interval
        boot = {k: (np.full_like(e, np.nan), np.full_like(r, np.nan)) for k, (e, r) in boot.items()}
    summary = _summary(g, values, boot, alpha)
    s = weighted.horizon - weighted.after
    dist = None if distances is None or not len(distances) else distances
    eps = epsilon(dist, g.seeds, idx, alpha) if dist is not None else pd.DataFrame(columns=EPSILON)
    bend_frame, scales_frame = (bends(g, values, boot, dist, idx, tolerance, alpha) if dist is not None
                                else (pd.DataFrame(columns=BEND), pd.DataFrame(columns=SCALES)))
    return SizeAxis(tolerance, threshold if rule is None else math.nan, alpha, len(g.seeds), list(g.weights),
                    int(s.iloc[0]) if len(s) else None,
                    _per_seed(g, values), summary, convergence(g, values, boot, alpha),
                    regime(g, values, boot, tolerance, alpha),
                    h_star(g, summary, boot, rule or by_interval(threshold), tolerance, alpha),
                    eps, bend_frame, scales_frame)


def _per_seed(g: Grid, values) -> pd.DataFrame:
    rows = []
    for kind, (e, r) in values.items():
        for a, sd in enumerate(g.seeds):
            for i, h in enumerate(g.horizons):
                for j, w in enumerate(g.weights):
                    rows.append({"seed": sd, "query_kind": kind, **g.at(h), "weight": float(w),
                                 "error": float(e[a, i, j]), "rho": float(r[a, i, j])})
    return pd.DataFrame(rows, columns=["seed", "query_kind", "horizon", "label", "after", "weight", "error", "rho"])


def _summary(g: Grid, values, boot, alpha: float) -> pd.DataFrame:
    """Per kind × horizon × weight: ē and ρ̄ over seeds with their seed-bootstrap intervals (columns :data:`SUMMARY`)."""
    rows = []
    for kind, (e, r) in values.items():
        em, rm = _nanmean(e, 0), _nanmean(r, 0)
        (elo, ehi), (rlo, rhi) = bootstrap_interval(boot[kind][0], alpha), bootstrap_interval(boot[kind][1], alpha)
        for i, h in enumerate(g.horizons):
            for j, w in enumerate(g.weights):
                rows.append({"query_kind": kind, **g.at(h), "weight": float(w), "error": float(em[i, j]),
                             "error_low": float(elo[i, j]), "error_high": float(ehi[i, j]), "rho": float(rm[i, j]),
                             "rho_low": float(rlo[i, j]), "rho_high": float(rhi[i, j]),
                             "seeds": int(np.count_nonzero(~np.isnan(e[:, i, j]))), "candidates": len(g.candidates),
                             "queries": len(g.queries[kind])})
    return pd.DataFrame(rows, columns=SUMMARY)


def _log(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(v > 0, np.log(np.where(v > 0, v, 1.0)), np.nan)


def convergence(g: Grid, values, boot, alpha: float = ALPHA) -> pd.DataFrame:
    """Per kind × horizon: the slope of ln ē on ln w (``slope``, its interval ``low, high``; ē ≤ 0 left out),
    ``closest`` (the smallest weight has the smallest ē), ``smallest`` (that weight) and ``error_smallest``
    (its ē). Columns :data:`CONVERGENCE`."""
    lw = np.log(g.weights)
    rows = []
    for kind, (e, _) in values.items():
        em = _nanmean(e, 0)  # [H, W]
        slope = slope_along(lw, _log(em), min_n=2)
        lo, hi = bootstrap_interval(slope_along(lw, _log(boot[kind][0]), min_n=2), alpha)
        for i, h in enumerate(g.horizons):
            row = em[i]
            closest = bool(not np.isnan(row[0]) and np.nanmin(row) == row[0]) if (~np.isnan(row)).any() else False
            rows.append({"query_kind": kind, **g.at(h), "slope": float(slope[i]), "low": float(lo[i]),
                         "high": float(hi[i]), "closest": closest, "smallest": float(g.weights[0]),
                         "error_smallest": float(row[0])})
    return pd.DataFrame(rows, columns=CONVERGENCE)


def within_count(e: np.ndarray, tolerance: float) -> np.ndarray:
    """[..., W] ē over ascending weights -> how many of the smallest weights are all within (ē ≤ tolerance;
    NaN counts as not within)."""
    return np.cumprod(e <= tolerance, axis=-1).sum(axis=-1)


def _quantile_ends(codes: np.ndarray, alpha: float) -> tuple[float, float]:
    codes = codes[~np.isnan(codes)]
    if not len(codes):
        return math.nan, math.nan
    lo, hi = np.quantile(codes, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
    return float(lo), float(hi)


def regime(g: Grid, values, boot, tolerance: float = TOLERANCE, alpha: float = ALPHA) -> pd.DataFrame:
    """Per kind × horizon: the linear regime's size (module doc): ``status``, ``largest`` (the largest weight
    within; NaN for "below"), ``low, high`` (weights, 0 for an end "below"; NaN with one seed). Columns :data:`REGIME`."""
    W = len(g.weights)
    code_w = np.concatenate([[0.0], g.weights])  # k weights within -> the k-th weight; 0: below the smallest
    rows = []
    for kind, (e, _) in values.items():
        em = _nanmean(e, 0)
        k = within_count(em, tolerance)  # [H]
        kb = within_count(boot[kind][0], tolerance).astype(np.float64)  # [b, H]
        kb[np.isnan(boot[kind][0]).all(axis=-1)] = np.nan
        for i, h in enumerate(g.horizons):
            lo, hi = _quantile_ends(kb[:, i], alpha)
            status = "below" if k[i] == 0 else "at least" if k[i] == W else "bounded"
            rows.append({"query_kind": kind, **g.at(h), "tolerance": tolerance, "status": status,
                         "largest": float(code_w[k[i]]) if k[i] else math.nan,
                         "low": math.nan if math.isnan(lo) else float(code_w[int(lo)]),
                         "high": math.nan if math.isnan(hi) else float(code_w[int(hi)])})
    return pd.DataFrame(rows, columns=REGIME)


def first_failing(predicted: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """[..., H] -> the index of the first horizon not predicted (horizons with ρ̄ undefined skipped); H where
    every defined one is predicted ("not reached"); NaN where ρ̄ is defined at none."""
    fail = ~predicted.astype(bool) & ~np.isnan(rho)
    first = np.where(fail.any(axis=-1), fail.argmax(axis=-1), rho.shape[-1]).astype(np.float64)
    return np.where(np.isnan(rho).all(axis=-1), np.nan, first)


def h_star(g: Grid, summary: pd.DataFrame, boot, rule: Rule, tolerance: float = TOLERANCE,
           alpha: float = ALPHA) -> pd.DataFrame:
    """Per kind × weight: h*(w) by ``rule`` (module doc). ``status`` "reached", "not reached", "undefined";
    ``horizon, label, after, rho`` at h*(w); ``previous_after`` the horizon before it (0 for the first: the
    crossing lies in (previous_after, after]); ``low_label, high_label, low_after, high_after`` the interval's
    ends ("not reached": after NaN); ``reached`` the fraction of resamples reaching it; ``bent_label,
    bent_after`` the first horizon with ē(w) > tolerance (None/NaN: none) and ``bent_previous_after`` the horizon
    before it (0 for the first); ``last_after`` the last horizon.
    Columns :data:`H_STAR`."""
    H = len(g.horizons)
    rows = []

    def end(i: float) -> tuple[str, float]:
        if math.isnan(i):
            return "undefined", math.nan
        return ("not reached", math.nan) if i >= H else g.labels[g.horizons[int(i)]]

    for kind in g.queries:
        s = summary[summary.query_kind == kind]
        for j, w in enumerate(g.weights):
            t = s[s.weight == w].set_index("horizon").reindex(g.horizons)
            rho, lo, hi, err = (t[c].to_numpy(np.float64) for c in ("rho", "rho_low", "rho_high", "error"))
            point = first_failing(rule(rho, lo, hi), rho)
            rb = boot[kind][1][:, :, j]  # [b, H]
            resampled = first_failing(rule(rb, rb, rb), rb)
            resampled = resampled[~np.isnan(resampled)]
            (low_label, low_after), (high_label, high_after) = map(end, _quantile_ends(resampled, alpha))
            bent = np.flatnonzero(err > tolerance)
            row = {"query_kind": kind, "weight": float(w),
                   "status": "undefined" if np.isnan(point) else "not reached" if point >= H else "reached",
                   "horizon": None, "label": None, "after": math.nan, "rho": math.nan, "previous_after": math.nan,
                   "low_label": low_label, "high_label": high_label, "low_after": low_after,
                   "high_after": high_after, "reached": float(np.mean(resampled < H)) if len(resampled) else math.nan,
                   "bent_label": g.labels[g.horizons[bent[0]]][0] if len(bent) else None,
                   "bent_after": float(g.labels[g.horizons[bent[0]]][1]) if len(bent) else math.nan,
                   "bent_previous_after": (float(g.labels[g.horizons[bent[0] - 1]][1]) if bent[0] else 0.0)
                   if len(bent) else math.nan,
                   "last_after": float(g.labels[g.horizons[-1]][1])}
            if row["status"] == "reached":
                i = int(point)
                row.update(g.at(g.horizons[i]), rho=float(rho[i]),
                           previous_after=float(g.labels[g.horizons[i - 1]][1]) if i else 0.0)
            rows.append(row)
    return pd.DataFrame(rows, columns=H_STAR)


# ---------------------------------------------------------------- the perturbation's size and the bend's


def _arm_distances(distances: pd.DataFrame) -> pd.DataFrame:
    _need(distances, DISTANCES, "distances.parquet")
    d = distances[distances.kind.isin(ARM_KINDS)]
    return d[d.weight.notna()]


def epsilon(distances: pd.DataFrame, seeds: list[int], idx: np.ndarray, alpha: float = ALPHA) -> pd.DataFrame:
    """Per weight: ε(w) (module doc) at ``after``, the first recorded step after s; ``low, high`` its
    seed-bootstrap interval (``idx``: the drawn positions [b, S] in ``seeds``; NaN with one seed); ``seeds``
    (those with the weight's arms), ``arms``. Columns :data:`EPSILON`."""
    d = _arm_distances(distances)
    d = d[(d.after >= 1) & d.seed.isin(seeds)]
    if not len(d):
        return pd.DataFrame(columns=EPSILON)
    first = int(d.after.min())
    d = d[d.after == first]
    per = d.groupby(["weight", "seed"]).distance.median().unstack("seed").reindex(columns=seeds)  # [W, S]
    v = per.to_numpy(np.float64)
    rows = []
    for j, w in enumerate(per.index):
        b = _nanmedian(v[j][idx], 1) if len(seeds) > 1 else np.array([np.nan])
        lo, hi = bootstrap_interval(b, alpha)
        rows.append({"weight": float(w), "after": first, "epsilon": float(_nanmedian(v[j], 0)), "low": float(lo),
                     "high": float(hi), "seeds": int(np.count_nonzero(~np.isnan(v[j]))),
                     "arms": int((d.weight == w).sum())})
    return pd.DataFrame(rows, columns=EPSILON)


def distance_at(distances: pd.DataFrame, steps: list[int]) -> pd.DataFrame:
    """Each arm's distance at ``steps`` (ln distance interpolated linearly between the recorded steps after s
    with a positive distance; NaN outside them): columns seed, arm, weight, step, distance."""
    d = distances[(distances.after >= 1) & (distances.distance > 0)].sort_values(["seed", "arm", "step"])
    cols = ["seed", "arm", "weight", "step", "distance"]
    if not len(d):
        return pd.DataFrame(columns=cols)
    codes = d.groupby(["seed", "arm"], sort=False).ngroup().to_numpy()
    cuts = np.r_[0, np.flatnonzero(np.diff(codes)) + 1, len(d)]
    x, y = d.step.to_numpy(np.float64), np.log(d.distance.to_numpy(np.float64))
    first = d.iloc[cuts[:-1]]
    at = np.stack([np.interp(steps, x[i:j], y[i:j], left=np.nan, right=np.nan) for i, j in zip(cuts[:-1], cuts[1:])])
    n, k = at.shape
    return pd.DataFrame({"seed": np.repeat(first.seed.to_numpy(), k), "arm": np.repeat(first.arm.to_numpy(), k),
                         "weight": np.repeat(first.weight.to_numpy(np.float64), k),
                         "step": np.tile(np.asarray(steps), n), "distance": np.exp(at).ravel()})


def crossing(e: np.ndarray, D: np.ndarray, tolerance: float) -> np.ndarray:
    """[..., W] ē and D over ascending weights -> the distance at which ln ē reaches ln ``tolerance``,
    interpolated linearly in ln D between the regime's largest weight and the next; NaN when every weight
    or none is within (or D is missing there)."""
    W = e.shape[-1]
    k = within_count(e, tolerance)
    ok = (k > 0) & (k < W)
    i0, i1 = np.clip(k - 1, 0, W - 1)[..., None], np.clip(k, 0, W - 1)[..., None]
    le, lD = np.log(np.clip(e, 1e-300, None)), _log(D)
    e0, e1 = np.take_along_axis(le, i0, -1)[..., 0], np.take_along_axis(le, i1, -1)[..., 0]
    d0, d1 = np.take_along_axis(lD, i0, -1)[..., 0], np.take_along_axis(lD, i1, -1)[..., 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(e1 > e0, (math.log(tolerance) - e0) / (e1 - e0), 0.0)
        out = np.exp(d0 + t * (d1 - d0))
    return np.where(ok, out, np.nan)


def bends(g: Grid, values, boot, distances: pd.DataFrame, idx: np.ndarray, tolerance: float = TOLERANCE,
          alpha: float = ALPHA) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The bend (module doc): per kind × horizon (columns :data:`BEND`: ``status`` as the regime's, ``below,
    above`` the two weights interpolated between, ``distance`` ε_nl(h) with ``low, high``), and per kind
    (columns :data:`SCALES`: ``eps_nl`` the median over the crossed horizons, its interval, ``horizons``)."""
    at = distance_at(_arm_distances(distances), g.horizons)
    per = at.groupby(["seed", "weight", "step"]).distance.median()  # each seed's median over its arms
    full = pd.MultiIndex.from_product([g.seeds, list(g.weights), g.horizons], names=["seed", "weight", "step"])
    Ds = per.reindex(full).to_numpy(np.float64).reshape(len(g.seeds), len(g.weights), len(g.horizons))
    Ds = np.swapaxes(Ds, 1, 2)  # [S, H, W]
    D = _nanmedian(Ds, 0)  # [H, W]
    Db = _nanmedian(Ds[idx], 1)  # [b, H, W]
    one = len(g.seeds) < 2
    W = len(g.weights)
    rows, scale_rows = [], []
    for kind, (e, _) in values.items():
        em = _nanmean(e, 0)
        point, resampled = crossing(em, D, tolerance), crossing(boot[kind][0], Db, tolerance)  # [H], [b, H]
        if one:
            resampled = np.full_like(resampled, np.nan)
        lo, hi = bootstrap_interval(resampled, alpha)
        k = within_count(em, tolerance)
        for i, h in enumerate(g.horizons):
            status = "below" if k[i] == 0 else "at least" if k[i] == W else "bounded"
            rows.append({"query_kind": kind, **g.at(h), "status": status,
                         "below": float(g.weights[k[i] - 1]) if status == "bounded" else math.nan,
                         "above": float(g.weights[k[i]]) if status == "bounded" else math.nan,
                         "distance": float(point[i]), "low": float(lo[i]), "high": float(hi[i])})
        slo, shi = bootstrap_interval(_nanmedian(resampled, -1), alpha)
        scale_rows.append({"query_kind": kind, "eps_nl": float(_nanmedian(point, 0)), "low": float(slo),
                           "high": float(shi), "horizons": int(np.count_nonzero(~np.isnan(point)))})
    return pd.DataFrame(rows, columns=BEND), pd.DataFrame(scale_rows, columns=SCALES)
