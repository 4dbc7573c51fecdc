"""Additivity: is the effect of two rows at once the sum of their single-row effects?

Group benchmarks (the linear datamodeling score, LDS) score an attribution method by summing its
per-example estimates over a subset and correlating the sums with retrained models: they assume
that effects add. The bank tests that one example at a time. A *pair* (``candidates.pairs``, arm
``pair.<first>..<second>``) carries c₁ in row r (``injection_row``) and c₂ in row r′
(``replicate_row``) of the batch of s. Per seed, query q and horizon h::

    measured_pair   = L_q(pair run)        − L_q(twin)      Δ(c₁@r and c₂@r′)
    measured_first  = L_q(c₁'s run)        − L_q(twin)      Δ(c₁@r): the candidate run
    measured_second = L_q(c₂'s replicate)  − L_q(twin)      Δ(c₂@r′): the replicate run
    sum             = measured_first + measured_second
    interaction     = measured_pair − sum                   0 when the effects add

The pair and the sum replace the same two rows (r and r′), so the row each candidate displaces
cancels; what is left is the interaction of the two changes through training. The batch's
gradient at s is exactly additive in the rows; AdamW's update (√v̂) and every later step are not.
Only the *shared* queries are compared (held-out rows and probes): c₁'s run does not evaluate
c₂'s text nor c₂'s replicate c₁'s, so a candidate's own text has no sum (the pair run records
both texts all the same).

**The control.** ``swapped`` = Δ(c₁@r′) + Δ(c₂@r) (c₁'s replicate, c₂'s candidate run): the same
two candidates and the same two displaced rows, each candidate in the other row. To first order
in the batch's change it equals ``sum`` — and so does ``measured_pair`` — so the distance of
``swapped`` from ``sum`` is what second-order effects do to single-row measurements that
linearity says are the same, at the pair's own scale. (Δ(c@r) against Δ(c@r′) is no such
control: to first order they differ by the displaced rows' own effects, a term shared by the
candidates but not by the queries, so pooled over queries its slope and relative difference
measure the rows, not the non-linearity.) ``first_other_row`` = Δ(c₁@r′) and
``second_other_row`` = Δ(c₂@r) are kept for that comparison too.

:func:`additivity` summarises per query kind and horizon, within each seed over pairs × queries
and then the mean over seeds: Pearson and Spearman of ``measured_pair`` against ``sum``, the OLS
slope of ``measured_pair`` on ``sum`` (1: additive; below 1: the pair does less than its parts),
and the median relative interaction |measured_pair − sum| / (|measured_first| + |measured_second|);
the same numbers with ``swapped`` in place of ``measured_pair``, and their differences. Intervals:
percentile intervals of seeded two-level bootstrap resamples (attribution/analyses/stats.py
:func:`~seedlab.attribution.analyses.stats.joint_draws`): the seeds with replacement, then the pairs anew
within each drawn seed, every number recomputed per drawn seed and averaged over the drawn seeds
(one set of resamples for every number, so the differences are paired). It is built for ≥ 30 pairs
per seed, which no longer fit disjointly (a candidate then sits in several pairs, so pairs are not
fully independent units and the interval over them is somewhat narrow: it resamples pairs, not
candidates); with 4 pairs a seed has at most 35 distinct resamples, so such intervals are coarse. Pairs with the own-row control are left out of the
numbers: with it in row r the pair is bitwise the second's replicate (interaction exactly 0,
checked by the bank and again by :func:`summarise`), which says the injection is exact, not that
effects add.

additivity.parquet is written by the bank (attribution/bank/measure.py ``write_additivity``, columns
``PAIR_COLUMNS``); this module only computes from its frame, and attribution/report/additivity.py
words the result.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.stats import joint_draws
from seedlab.stats import bootstrap_interval, slope_along, spearman_along

METRICS = ("pearson", "spearman", "slope", "interaction")
PAIR, SWAPPED, DIFF = "pair", "swapped", "pair − swapped"
ALL = "all"  # every shared query, when there are several kinds
ALPHA = 0.05
RESAMPLES = 2000
SEED = 0
_BLOCK = 1_000_000  # values gathered per bootstrap chunk (memory)


def ordinary(df: pd.DataFrame) -> pd.DataFrame:
    """The pairs of two ordinary candidates (neither is the own-row control)."""
    return df[(df.first_kind != "control") & (df.second_kind != "control")]


# ---------------------------------------------------------------- the numbers


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r along the last axis, pairwise complete, from the two OLS slopes
    (``seedlab.stats.slope_along``): r² = b_yx · b_xy, with b_yx's sign. NaN where a side is constant."""
    b_yx, b_xy = slope_along(x, y), slope_along(y, x)
    with np.errstate(invalid="ignore"):
        return np.sign(b_yx) * np.sqrt(np.clip(b_yx * b_xy, 0.0, 1.0))


def _metrics(x: np.ndarray, y: np.ndarray, den: np.ndarray) -> dict[str, np.ndarray]:
    """Along the last axis (pairs × queries of one seed): Pearson and Spearman of y against x, the
    OLS slope of y on x, and the median of |y − x| / den (den > 0; else left out)."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: NaN
        rel = np.nanmedian(np.where(den > 0, np.abs(y - x) / den, np.nan), axis=-1)
    return {"pearson": _pearson(x, y), "spearman": spearman_along(x, y), "slope": slope_along(x, y),
            "interaction": rel}


def _seed_mean(per_seed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """[..., S] -> [...]: the mean over seeds (a seed without a value left out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {k: np.nanmean(v, axis=-1) for k, v in per_seed.items()}


def _numbers(pair: np.ndarray, total: np.ndarray, swapped: np.ndarray, den: np.ndarray) -> dict:
    """{comparison: {metric: [..., H]}} from arrays [..., H, S, C] (C: pairs × queries of a seed)."""
    p, s = _seed_mean(_metrics(total, pair, den)), _seed_mean(_metrics(total, swapped, den))
    return {PAIR: p, SWAPPED: s, DIFF: {m: p[m] - s[m] for m in METRICS}}


def _resampled(arrays: list[np.ndarray], resamples: int, seed: int) -> dict:
    """:func:`_numbers` in every two-level resample (:func:`~seedlab.attribution.analyses.stats.joint_draws`) of
    ``arrays`` (pair, sum, swapped, den; each [H, S, P, Q]): {comparison: {metric: [resamples, H]}}."""
    H, S, P, Q = arrays[0].shape
    slots, idx = joint_draws(S, P, resamples, seed)
    per = {c: {m: np.full((resamples, S, H), np.nan) for m in METRICS} for c in (PAIR, SWAPPED)}
    chunk = max(1, _BLOCK // max(H * P * Q, 1))
    for s in range(S):
        rows, cols = np.nonzero(slots == s)
        for i in range(0, len(rows), chunk):
            r, c = rows[i:i + chunk], cols[i:i + chunk]
            pair, total, swapped, den = (a[:, s][:, idx[r, c]].reshape(H, len(r), P * Q) for a in arrays)  # [H, n, C]
            for name, y in ((PAIR, pair), (SWAPPED, swapped)):
                for m, v in _metrics(total, y, den).items():  # [H, n]
                    per[name][m][r, c] = v.T
    out = {c: _seed_mean({m: np.moveaxis(v, 1, -1) for m, v in per[c].items()}) for c in per}  # [b, H]
    return out | {DIFF: {m: out[PAIR][m] - out[SWAPPED][m] for m in METRICS}}


def additivity(df: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> pd.DataFrame:
    """Per query kind (and :data:`ALL` with several kinds) × comparison × horizon, over the ordinary
    pairs of additivity.parquet's frame: every metric of :data:`METRICS` (module doc) within each
    seed over pairs × queries, the mean over seeds, and its bootstrap interval over seeds and pairs
    (``<metric>_low``, ``<metric>_high``; ``resamples`` seeded by ``seed``). ``comparison``:
    :data:`PAIR` (measured_pair against sum), :data:`SWAPPED` (swapped against sum, the control)
    and :data:`DIFF` (their difference, on the same resamples). Also ``label, after, seeds, pairs,
    queries``. Empty when no ordinary pair is left."""
    d = ordinary(df)
    cols = ["query_kind", "comparison", "horizon", "label", "after",
            *(f"{m}{s}" for m in METRICS for s in ("", "_low", "_high")), "seeds", "pairs", "queries"]
    if not len(d):
        return pd.DataFrame(columns=cols)
    hs = sorted(int(h) for h in d.horizon.unique())
    seeds = sorted(int(s) for s in d.seed.unique())
    pairs = list(dict.fromkeys(d.pair))
    at = {int(r.horizon): (r.label, int(r.after)) for r in d.drop_duplicates("horizon").itertuples()}
    kinds = list(dict.fromkeys(d.query_kind))
    groups = {k: d[d.query_kind == k] for k in kinds} | ({ALL: d} if len(kinds) > 1 else {})
    rows = []
    for kind, g in groups.items():
        queries = list(dict.fromkeys(g["query"]))
        full = pd.MultiIndex.from_product([hs, seeds, pairs, queries])
        shape = (len(hs), len(seeds), len(pairs), len(queries))

        def grid(col: str, g=g, full=full, shape=shape) -> np.ndarray:
            return g.set_index(["horizon", "seed", "pair", "query"])[col].reindex(full).to_numpy(float).reshape(shape)

        arrays = [grid("measured_pair"), grid("sum"), grid("swapped"),
                  np.abs(grid("measured_first")) + np.abs(grid("measured_second"))]
        point = _numbers(*(a.reshape(*shape[:2], -1) for a in arrays))
        boot = _resampled(arrays, resamples, seed)
        for comparison in (PAIR, SWAPPED, DIFF):
            intervals = {m: bootstrap_interval(boot[comparison][m], alpha) for m in METRICS}
            for i, h in enumerate(hs):
                row = {"query_kind": kind, "comparison": comparison, "horizon": h, "label": at[h][0], "after": at[h][1]}
                for m in METRICS:
                    row |= {m: float(point[comparison][m][i]), f"{m}_low": float(intervals[m][0][i]),
                            f"{m}_high": float(intervals[m][1][i])}
                rows.append(row | {"seeds": len(seeds), "pairs": len(pairs), "queries": len(queries)})
    return pd.DataFrame(rows, columns=cols)


@dataclass
class Additivity:
    """What the report says of a bank's pairs (:func:`summarise`)."""

    rows: int  # rows of additivity.parquet (0: no pair run finished)
    numbers: pd.DataFrame  # :func:`additivity`'s frame; empty when every pair holds the own-row control
    own_row: list[str]  # the pairs with the own-row control first
    own_row_exact: bool  # in those, Δ(c₁ at r) and the interaction exactly 0 at every seed, query and horizon


def summarise(df: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> Additivity:
    """additivity.parquet's frame summarised: :func:`additivity` over the ordinary pairs and the check
    of the own-row pairs (the own-row control, of kind "control", first: the pair is then bitwise its
    second's replicate)."""
    own = df[df.first_kind == "control"]
    exact = bool((own.interaction == 0).all() and (own.measured_first == 0).all())
    return Additivity(len(df), additivity(df, resamples=resamples, seed=seed, alpha=alpha),
                      list(dict.fromkeys(own.pair)), exact)
