"""Agreement of estimates with measured effects, judged against seed noise.

Everything is computed *across candidates*: for one seed, one query and one horizon, the
candidates' estimates are correlated with their measured effects. Control candidates (the own
row: measured 0 by construction) are left out.

- :func:`agreement` — per estimator × horizon × query kind × seed: Spearman and Pearson
  correlation across candidates for every query of the kind, averaged over those queries; and
  the **sign agreement**, the fraction of (candidate, query) pairs whose estimate has the sign of
  the measured effect (pairs where either is exactly 0 are left out).
- :func:`ceiling` — the **noise ceiling**, per horizon × query kind × seed: the same correlations
  between one seed's measured effects and another seed's, for the same candidates and queries
  (each seed against every other, averaged). Within a seed the measured effect is exact (the runs
  are deterministic), so what lowers the ceiling is seed-to-seed variation — initialisation, data
  order and the replaced row: it says how far a candidate's effect is determined by the
  candidate. An estimator computed from one seed's own state may exceed it (it then tracks that
  seed's effects better than another seed's measurement does).
- :func:`summary` — the per-seed values averaged over seeds, with a 95% t interval over seeds
  (the generic ``seedlab.stats.mean_ci``; clipped to the measure's range; none for the ceiling
  of two seeds, whose per-seed values are one pair's), and each estimator's correlation as a
  fraction of the ceiling's (only where the ceiling is positive).
- :func:`effects` — the size of the measured effects per horizon (mean |Δ| and the fraction that
  are negative), to read the correlations beside.
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd

from seedlab.stats import mean_ci

ALPHA = 0.05
METHODS = ("spearman", "pearson")
CEILING = "ceiling"  # the estimator name of the noise ceiling's rows in summary()


def _corr(a: pd.Series, b: pd.Series, method: str) -> float:
    """Correlation across candidates; NaN when fewer than 3 or either side is constant."""
    if len(a) < 3 or a.nunique() < 2 or b.nunique() < 2:
        return math.nan
    return float(a.corr(b, method=method))


def _ordinary(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.candidate_kind != "control"]


def agreement(df: pd.DataFrame) -> pd.DataFrame:
    """Per estimator × horizon × query kind × seed (attribution.parquet's frame): spearman,
    pearson (means over the kind's queries), sign agreement, candidates and queries counted."""
    rows = []
    for (est, h, kind, seed), g in _ordinary(df).groupby(["estimator", "horizon", "query_kind", "seed"]):
        per_q = [{m: _corr(q.estimate, q.measured, m) for m in METHODS} for _, q in g.groupby("query")]
        both = g[(g.estimate != 0) & (g.measured != 0)]
        rows.append({"estimator": est, "horizon": h, "query_kind": kind, "seed": seed,
                     **{m: _mean_of(per_q, m) for m in METHODS},
                     "sign": float((np.sign(both.estimate) == np.sign(both.measured)).mean()) if len(both) else math.nan,
                     "candidates": g.candidate.nunique(), "queries": len(per_q)})
    return pd.DataFrame(rows)


def _mean_of(values: list[dict], key: str) -> float:
    """The mean of ``key`` over dicts, NaNs left out (NaN when all are)."""
    v = [d[key] for d in values if not math.isnan(d[key])]
    return float(np.mean(v)) if v else math.nan


def ceiling(measured: pd.DataFrame) -> pd.DataFrame:
    """Per horizon × query kind × seed: the correlation across candidates between this seed's
    measured effects and each other seed's (same candidates and queries), averaged over the
    queries, then over the other seeds; and the sign agreement between seeds."""
    m = _ordinary(measured)
    rows = []
    for (h, kind), g in m.groupby(["horizon", "query_kind"]):
        wide = g.pivot_table(index=["query", "candidate"], columns="seed", values="measured")
        seeds = list(wide.columns)
        pair: dict[tuple[int, int], dict[str, float]] = {}
        for a, b in combinations(seeds, 2):
            ab = wide[[a, b]].dropna()
            per_q = [{k: _corr(q[a], q[b], k) for k in METHODS} for _, q in ab.groupby(level="query")]
            nz = ab[(ab[a] != 0) & (ab[b] != 0)]
            pair[(a, b)] = pair[(b, a)] = {
                **{k: _mean_of(per_q, k) for k in METHODS},
                "sign": float((np.sign(nz[a]) == np.sign(nz[b])).mean()) if len(nz) else math.nan}
        for a in seeds:
            others = [pair[(a, b)] for b in seeds if b != a]
            rows.append({"horizon": h, "query_kind": kind, "seed": a, **{k: _mean_of(others, k) for k in (*METHODS, "sign")},
                         "candidates": g.candidate.nunique(), "queries": g["query"].nunique()})
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per estimator × horizon × query kind: every per-seed measure's mean and 95% interval over
    seeds (``spearman``, ``spearman_low``, ``spearman_high``, ... ``sign``), the number of seeds,
    the ceiling's rows (estimator ``ceiling``), and ``spearman_of_ceiling`` /
    ``pearson_of_ceiling``: the estimator's mean as a fraction of the ceiling's mean."""
    measured = df.drop_duplicates(["seed", "candidate", "query", "horizon"])
    per_seed = pd.concat([agreement(df), ceiling(measured).assign(estimator=CEILING)], ignore_index=True)
    rows = []
    for (est, h, kind), g in per_seed.groupby(["estimator", "horizon", "query_kind"], sort=False):
        row = {"estimator": est, "horizon": h, "query_kind": kind, "seeds": int(g.seed.nunique()),
               "candidates": int(g.candidates.max()), "queries": int(g.queries.max())}
        for k in (*METHODS, "sign"):
            m, lo, hi, _ = mean_ci(g[k], ALPHA)
            if est == CEILING and row["seeds"] < 3:  # 2 seeds: one pair, its two per-seed values are the same number
                lo = hi = math.nan
            bounds = (0.0, 1.0) if k == "sign" else (-1.0, 1.0)
            row[k], row[f"{k}_low"], row[f"{k}_high"] = m, max(lo, bounds[0]), min(hi, bounds[1])
        rows.append(row)
    out = pd.DataFrame(rows)
    ceil = out[out.estimator == CEILING].set_index(["horizon", "query_kind"])
    for k in METHODS:
        ref = np.asarray(out.set_index(["horizon", "query_kind"]).index.map(ceil[k].to_dict().get), dtype=np.float64)
        out[f"{k}_of_ceiling"] = np.where(ref > 0, out[k] / np.where(ref > 0, ref, 1.0), np.nan)  # of a positive ceiling only
    labels = df.drop_duplicates("horizon").set_index("horizon")
    out["label"], out["after"] = out.horizon.map(labels.label), out.horizon.map(labels.after)
    return out.sort_values(["query_kind", "estimator", "horizon"], ignore_index=True)


def effects(measured: pd.DataFrame) -> pd.DataFrame:
    """Per horizon × query kind: mean |measured|, its median, the fraction of negative effects
    (the query's loss went down), over every ordinary (seed, candidate, query)."""
    m = _ordinary(measured).drop_duplicates(["seed", "candidate", "query", "horizon"])
    g = m.assign(abs=m.measured.abs(), neg=m.measured < 0).groupby(["query_kind", "horizon", "label", "after"])
    return g.agg(mean_abs=("abs", "mean"), median_abs=("abs", "median"), negative=("neg", "mean"),
                 n=("measured", "size")).reset_index()
