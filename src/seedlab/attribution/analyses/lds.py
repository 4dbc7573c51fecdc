"""The linear datamodeling score: Spearman, over random subsets of the training rows, between the
predicted and the measured effect of removing the subset. Compute only; report_lds.py words it.

The bank removes random α-fractions of the rows of steps s .. end − 1 (attribution/bank/removals.py; groups.parquet: the
measured Δ L_q per seed × α × subset × query × horizon; group_rows.parquet: each subset's rows). An estimator that
scores single training rows (attribution/estimators/rowscores.py: ``metagrad`` — the exact first order —, ``tracin``,
``grad-dot``, ``grad-cosine``, ``ekfac``) predicts a subset's effect at horizon h as the **sum** of its rows' values
over the rows before h (the additive datamodel every group attribution assumes; Ilyas et al. 2022, Park et al. 2023):

    predicted(S, q, h) = Σ_{(t, i) ∈ S, t < h} value(t, i, q, h).

Per estimator × α × horizon (and query kind, and ``all``):

- ``lds``: per seed and query, Spearman(predicted, measured) over the subsets; the mean over queries, then over
  seeds (the field's LDS: a mean over test examples of a rank correlation over subsets);
- ``low``/``high``: the percentile interval of :data:`~seedlab.attribution.analyses.stats.RESAMPLES` joint bootstrap
  resamples — the seeds with replacement, then the subsets anew within each drawn seed (stats.py ``joint_draws``),
  shared by every estimator of an (α, horizon) (paired); ``se_seeds``: the jackknife standard error over seeds;
- ``coverage``: the fraction of the (subset, row) memberships before h that the estimator scored (an estimator
  without a value for some rows — ekfac beyond the end — is summed over the rows it has; < 1 says so).

A subset whose measured effect is missing (its run unfinished) is left out of its seed.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.stats import ALPHA, RESAMPLES, SEED, joint_gathers
from seedlab.stats import bootstrap_interval, jackknife_se, spearman_along

ALL = "all"
COLUMNS = ["estimator", "unit", "alpha", "query_kind", "horizon", "label", "seeds", "subsets", "queries", "lds", "low",
           "high", "se_seeds", "coverage"]
PREDICTED = ["estimator", "unit", "seed", "alpha", "subset", "query", "horizon", "predicted", "coverage"]


def predictions(members: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """Each subset's predicted effect (:data:`PREDICTED`), per estimator × seed × α × subset × query × horizon of
    ``scores``: the sum of its rows' values over the rows before the horizon (module doc). ``members``:
    group_rows.parquet (seed, alpha, subset, step, row); ``scores``: rowscores.py ``read_scores``."""
    m = members[["seed", "alpha", "subset", "step", "row"]]
    s = scores[["estimator", "unit", "seed", "query", "horizon", "step", "row", "value"]]
    j = m.merge(s, on=["seed", "step", "row"], how="inner")
    j = j[j.step < j.horizon]
    keys = ["estimator", "unit", "seed", "alpha", "subset", "query", "horizon"]
    sums = j.groupby(keys, sort=False).agg(predicted=("value", "sum"), scored=("value", "size")).reset_index()
    # every subset of a seed at every (estimator, query, horizon) the estimator scored there: a subset none of whose
    # rows lie before h is the twin at h (measured 0) and its prediction the empty sum, 0
    grid = s[["estimator", "unit", "seed", "query", "horizon"]].drop_duplicates().merge(
        m[["seed", "alpha", "subset"]].drop_duplicates(), on="seed")
    out = grid.merge(sums, on=keys, how="left")
    out["predicted"] = out.predicted.fillna(0.0)
    out["scored"] = out.scored.fillna(0)
    # memberships before h: the subset's rows with t < h (what a complete estimator sums over)
    hs = pd.DataFrame({"horizon": sorted(s.horizon.unique())})
    before = m.merge(hs, how="cross")
    before = before[before.step < before.horizon].groupby(["seed", "alpha", "subset", "horizon"]).size()
    out = out.merge(before.rename("want").reset_index(), on=["seed", "alpha", "subset", "horizon"], how="left")
    out["want"] = out.want.fillna(0)
    out["coverage"] = np.where(out.want > 0, out.scored / out.want.where(out.want > 0, 1), 1.0)
    return out[PREDICTED]


def _draws(M: np.ndarray, P: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One cell: ``M``, ``P`` [S, Q, K] measured and predicted (NaN: absent) -> (per-seed LDS [S], the LDS of each of
    :func:`~seedlab.attribution.analyses.stats.joint_draws`' resamples [resamples]). The draws depend on (S, K, resamples,
    seed) only, so two estimators of one (α, horizon, kind) are resampled alike (paired)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_seed = np.nanmean(spearman_along(P, M), axis=1)  # [S]: Spearman over subsets, mean over queries
        draws = [np.nanmean(np.nanmean(spearman_along(P[at], M[at]), axis=2), axis=1)  # [b, S, Q] -> [b]
                 for at in joint_gathers(M.shape, 2, resamples, seed)]  # P[at]: [b, S, Q, K]
    return per_seed, np.concatenate(draws)


def _summary(per_seed: np.ndarray, draws: np.ndarray, alpha: float) -> dict:
    """lds (the mean over seeds), its percentile interval over ``draws`` and the jackknife SE over seeds."""
    S = len(per_seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lds = float(np.nanmean(per_seed)) if np.isfinite(per_seed).any() else math.nan
        loo = [np.nanmean(np.delete(per_seed, i)) for i in range(S)] if S > 1 else []
        lo, hi = bootstrap_interval(draws, alpha)
    return {"lds": lds, "low": float(lo), "high": float(hi), "se_seeds": jackknife_se(loo) if loo else math.nan}


def _cells(measured: pd.DataFrame, predicted: pd.DataFrame):
    """Per estimator × α × horizon × query kind (each, and :data:`ALL`): (the table's keys, M, P) with M, P
    [seeds, queries, subsets] (NaN: absent)."""
    j = predicted.merge(measured[["seed", "alpha", "subset", "query", "query_kind", "horizon", "label", "measured"]],
                        on=["seed", "alpha", "subset", "query", "horizon"], how="inner")
    kinds = list(dict.fromkeys(j.query_kind))
    kinds = [*kinds, ALL] if len(kinds) > 1 else kinds
    for (e, a, h), g in j.groupby(["estimator", "alpha", "horizon"], sort=True):
        for kind in kinds:
            gk = g if kind == ALL else g[g.query_kind == kind]
            if not len(gk):
                continue
            seeds, queries, subsets = (sorted(gk[c].unique()) for c in ("seed", "query", "subset"))
            M = np.full((len(seeds), len(queries), len(subsets)), np.nan)
            P = M.copy()
            si, qi, ki = (gk[c].map({v: n for n, v in enumerate(vals)}).to_numpy() for c, vals in
                          (("seed", seeds), ("query", queries), ("subset", subsets)))
            M[si, qi, ki], P[si, qi, ki] = gk.measured.to_numpy(), gk.predicted.to_numpy()
            keys = {"estimator": e, "unit": gk.unit.iloc[0], "alpha": float(a), "query_kind": kind,
                    "horizon": int(h), "label": gk.label.iloc[0], "seeds": len(seeds), "subsets": len(subsets),
                    "queries": len(queries), "coverage": float(gk.coverage.min())}
            yield keys, M, P


def _drawn(measured: pd.DataFrame, predicted: pd.DataFrame, resamples: int, seed: int) -> list[tuple]:
    """Per cell of :func:`_cells`: (keys, M, per-seed LDS, resampled LDS) — each estimator's bootstrap done once,
    for :func:`lds` and :func:`differences` alike."""
    return [(keys, M, *_draws(M, P, resamples, seed)) for keys, M, P in _cells(measured, predicted)]


def _lds_table(drawn: list[tuple], alpha: float) -> pd.DataFrame:
    return pd.DataFrame([{**keys, **_summary(per_seed, draws, alpha)} for keys, _, per_seed, draws in drawn],
                        columns=COLUMNS)


def lds(measured: pd.DataFrame, predicted: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED,
        alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`COLUMNS` per estimator × α × horizon × query kind (each, and :data:`ALL`): ``measured``: groups.parquet;
    ``predicted``: :func:`predictions`' frame (module doc)."""
    if not len(measured) or not len(predicted):
        return pd.DataFrame(columns=COLUMNS)
    return _lds_table(_drawn(measured, predicted, resamples, seed), alpha)


DIFFERENCES = ["estimator", "reference", "alpha", "query_kind", "horizon", "label", "seeds", "subsets", "difference",
               "low", "high", "se_seeds"]


def _differences_table(drawn: list[tuple], reference: str, alpha: float) -> pd.DataFrame:
    cells: dict[tuple, dict[str, tuple]] = {}
    for keys, M, per_seed, draws in drawn:
        cells.setdefault((keys["alpha"], keys["horizon"], keys["query_kind"]), {})[keys["estimator"]] = (
            keys, M, per_seed, draws)
    out = []
    for (a, h, kind), by in cells.items():
        if reference not in by:
            continue
        _, rM, r_seed, r_draws = by[reference]
        for e, (keys, M, per_seed, draws) in sorted(by.items()):
            if e == reference or M.shape != rM.shape or not np.array_equal(np.isnan(M), np.isnan(rM)):
                continue
            s = _summary(per_seed - r_seed, draws - r_draws, alpha)
            out.append({"estimator": e, "reference": reference, "alpha": a, "query_kind": kind, "horizon": h,
                        "label": keys["label"], "seeds": keys["seeds"], "subsets": keys["subsets"],
                        "difference": s["lds"], "low": s["low"], "high": s["high"], "se_seeds": s["se_seeds"]})
    return pd.DataFrame(out, columns=DIFFERENCES)


def differences(measured: pd.DataFrame, predicted: pd.DataFrame, reference: str = "metagrad", *,
                resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> pd.DataFrame:
    """Each estimator's LDS minus ``reference``'s, paired (:data:`DIFFERENCES`): per α × horizon × query kind, the
    difference of the point LDS, its percentile interval over the *same* resamples of seeds and subsets (the
    draws of :func:`_draws` depend on the design only) and the jackknife SE over seeds of the per-seed difference.
    A cell where the two estimators saw other seeds or subsets (a partial estimator) is left out: no pairing."""
    if not len(measured) or not len(predicted) or reference not in set(predicted.estimator):
        return pd.DataFrame(columns=DIFFERENCES)
    return _differences_table(_drawn(measured, predicted, resamples, seed), reference, alpha)


def analyse(measured: pd.DataFrame, members: pd.DataFrame, scores: pd.DataFrame | None, **kw) -> pd.DataFrame:
    """:func:`lds` of a bank's groups.parquet and group_rows.parquet against its row scores (rowscores.py
    ``read_scores``; None: an empty frame)."""
    return analyse_paired(measured, members, scores, **kw)[0]


def analyse_paired(measured: pd.DataFrame, members: pd.DataFrame, scores: pd.DataFrame | None,
                   reference: str = "metagrad", *, resamples: int = RESAMPLES, seed: int = SEED,
                   alpha: float = ALPHA) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`lds`, :func:`differences` against ``reference``) of a bank's groups.parquet and group_rows.parquet
    against its row scores, the subsets' predictions summed and every estimator resampled once (None: empty
    frames)."""
    predicted = None if scores is None else predictions(members, scores)
    if predicted is None or not len(measured) or not len(predicted):
        return pd.DataFrame(columns=COLUMNS), pd.DataFrame(columns=DIFFERENCES)
    drawn = _drawn(measured, predicted, resamples, seed)  # once for both tables
    return _lds_table(drawn, alpha), _differences_table(drawn, reference, alpha)


CONTRAST = ["estimator", "alpha", "query_kind", "single_rho", "single_low", "single_high", "single_predicts", "lds",
            "low", "high", "group_predicts"]


def contrast(table: pd.DataFrame, single: pd.DataFrame, kind: str | None = None) -> pd.DataFrame:
    """Per estimator × α at the end (each frame's largest horizon): its single-row ρ (loo.py ``pooled``: every
    leave-one-out row at the end) beside its LDS, and whether each *predicts* (its 95% interval above 0) — the
    report's answer: which estimators that fail on single rows succeed on groups, and at what α (:data:`CONTRAST`)."""
    if not len(table):
        return pd.DataFrame(columns=CONTRAST)
    kind = kind or (ALL if ALL in set(table.query_kind) else table.query_kind.iloc[0])
    t = table[(table.query_kind == kind) & (table.horizon == table.horizon.max())]
    sg = single[(single.query_kind == kind)] if len(single) else single
    if len(sg):
        sg = sg[sg.horizon == sg.horizon.max()].set_index("estimator")
    rows = []
    for r in t.sort_values(["estimator", "alpha"]).itertuples():
        one = sg.loc[r.estimator] if len(sg) and r.estimator in sg.index else None
        rows.append({"estimator": r.estimator, "alpha": r.alpha, "query_kind": kind,
                     "single_rho": math.nan if one is None else float(one.rho),
                     "single_low": math.nan if one is None else float(one.rho_low),
                     "single_high": math.nan if one is None else float(one.rho_high),
                     "single_predicts": None if one is None else bool(one.rho_low > 0),
                     "lds": r.lds, "low": r.low, "high": r.high, "group_predicts": bool(r.low > 0)})
    return pd.DataFrame(rows, columns=CONTRAST)
