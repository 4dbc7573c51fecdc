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

**Two LDS kinds, each named for what it is** (:func:`both`, :data:`SINGLE`, :data:`TRAK`):

- :data:`SINGLE`, "single-model LDS (MAGIC)": the above — small α-fractions removed from one deterministic run after
  the shared prefix, each subset's effect measured once (MAGIC's LDS, Ilyas & Engstrom 2025);
- :data:`TRAK`, "TRAK LDS (retrained subsets, seed-averaged)": subsets that each *keep* a fraction α_keep (0.5 in
  TRAK, Park et al. 2023) of the rows of steps s .. end − 1, each retrained from the shared prefix ``trak.retrains``
  times and its measured effect averaged over the retrainings (:func:`trak_groups`; trak.parquet). The retrainings are
  the seeds TRAK averages over: after the prefix the bank's training is deterministic, and a bank seed fixes every
  batch's rows as well as the init, so the first retraining is plain and each later one is nudged by one ulp at s
  (attribution/bank/removals.py). A subset's prediction sums its *removed* rows (``alpha`` = 1 − α_keep here), which
  ranks the subsets as TRAK's Σ over the kept rows of τ = −value does (the two differ by the sum over every row, one
  constant per seed, query and horizon). The LDS then is this module's, on the averaged effects. Each subset run keeps
  the schedule and its steps, the removed rows' loss weight 0: not TRAK's shorter run on a smaller data set.

**The ceilings** beside both (columns ``retest``, ``reliability``, ``bound``, each with its interval). The single-model
LDS: a bank with ``ceiling`` removes the first subsets again from the nudged twin (retest.parquet); ``retest`` is the
LDS of that second measurement as a predictor (:func:`single_ceiling`: Spearman over the retested subsets between
the effects on the twin and on the nudged twin, the mean over queries, then seeds, the same resamples),
``reliability`` = ``retest`` (the LDS correlates against one measurement) and ``bound`` = √reliability. The TRAK LDS
(:func:`trak_ceiling`): ``retest`` the Spearman over subsets between two retrainings' effects (the mean over pairs of
retrainings, then queries, then seeds), ``reliability`` its Spearman–Brown step-up to the mean of the R retrainings
(R·r / (1 + (R − 1)·r)), ``bound`` = √reliability: the attenuation bound of a predictor of what every retraining
shares (attribution/analyses/loo.py ``ceiling`` says when it binds). Interval ends map through √ as they are (an end
≤ 0 to 0).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.loo import RETEST
from seedlab.attribution.analyses.stats import ALPHA, RESAMPLES, SEED, joint_gathers
from seedlab.stats import bootstrap_interval, jackknife_se, spearman_along, spearman_brown

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


def resampled(measured: pd.DataFrame, predicted: pd.DataFrame, *, resamples: int = RESAMPLES,
              seed: int = SEED) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    """Per cell of :func:`lds`'s table (its keys as a dict): (keys, the per-seed LDS [S], the LDS of each joint
    resample [resamples]) — the draws :func:`lds` summarises, for a test on them (the resamples depend on the
    design's shape and ``seed`` only: two estimators of one cell are paired)."""
    if not len(measured) or not len(predicted):
        return []
    return [(keys, per_seed, draws) for keys, _, per_seed, draws in _drawn(measured, predicted, resamples, seed)]


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


# ---------------------------------------------------------------- both LDS kinds, and their ceilings

SINGLE = "single-model LDS (MAGIC)"
TRAK = "TRAK LDS (retrained subsets, seed-averaged)"
KINDS = (SINGLE, TRAK)
CEILING = ["alpha", "query_kind", "horizon", "retest", "retest_low", "retest_high", "retest_subsets", "reliability",
           "reliability_low", "reliability_high", "bound", "bound_low", "bound_high"]
TRAK_CEILING = ["keep", *CEILING, "seeds", "queries", "retrains"]
BOTH = ["lds_kind", "estimator", "unit", "keep", "alpha", "retrains", "query_kind", "horizon", "label", "seeds",
        "subsets", "queries", "lds", "low", "high", "se_seeds", "coverage", *CEILING[3:]]


def _removed_fraction(keep) -> np.ndarray:
    """α of a TRAK subset: the fraction of the rows it removes, 1 − α_keep (computed one way for every frame)."""
    return 1.0 - np.asarray(keep, dtype=np.float64)


def trak_groups(trak: pd.DataFrame) -> pd.DataFrame:
    """trak.parquet averaged over the retrainings, in groups.parquet's shape (``alpha`` = 1 − α_keep, the fraction
    removed): per seed × α_keep × subset × query × horizon the mean ``measured``, with ``keep`` and ``retrains`` (how
    many retrainings the mean holds: one unfinished is left out of it)."""
    keys = ["seed", "keep", "subset", "query", "query_kind", "horizon", "label"]
    g = trak.groupby(keys, sort=True).agg(measured=("measured", "mean"), retrains=("retrain", "nunique")).reset_index()
    return g.assign(alpha=_removed_fraction(g.keep))


def trak_members(trak_rows: pd.DataFrame) -> pd.DataFrame:
    """trak_rows.parquet (the rows each TRAK subset removed) in group_rows.parquet's shape (``alpha`` = 1 − α_keep)."""
    return trak_rows.assign(alpha=_removed_fraction(trak_rows.keep))[["seed", "alpha", "subset", "step", "row"]]


def trak_analyse(trak: pd.DataFrame | None, trak_rows: pd.DataFrame | None, scores: pd.DataFrame | None,
                 reference: str = "metagrad", **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The TRAK LDS (module doc): (:func:`lds`, :func:`differences` against ``reference``) of the retrainings' mean
    effects against the row scores, each table with ``keep`` (α_keep) beside ``alpha`` (1 − α_keep)."""
    if trak is None or trak_rows is None or not len(trak):
        return pd.DataFrame(columns=[*COLUMNS, "keep"]), pd.DataFrame(columns=[*DIFFERENCES, "keep"])
    table, paired = analyse_paired(trak_groups(trak), trak_members(trak_rows), scores, reference, **kw)
    keep = lambda t: t.assign(keep=1.0 - t.alpha.astype(np.float64)) if len(t) else t.assign(keep=np.nan)
    return keep(table), keep(paired)


def _root(v):
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(v), np.nan, np.sqrt(np.clip(v, 0.0, None)))


def single_ceiling(retest: pd.DataFrame | None, *, resamples: int = RESAMPLES, seed: int = SEED,
                   alpha: float = ALPHA) -> pd.DataFrame:
    """The single-model LDS's ceiling (module doc; :data:`CEILING`) per α × query kind × horizon, from retest.parquet's
    group rows: the LDS of the retest on the nudged twin as a predictor of the effect on the twin."""
    g = pd.DataFrame() if retest is None or not len(retest) else retest[retest.removal == "group"]
    if not len(g):
        return pd.DataFrame(columns=CEILING)
    measured = g[["seed", "alpha", "subset", "query", "query_kind", "horizon", "label", "measured"]]
    predicted = pd.DataFrame({"estimator": RETEST, "unit": "nats/token", "seed": g.seed, "alpha": g.alpha,
                              "subset": g.subset, "query": g["query"], "horizon": g.horizon, "predicted": g.retest,
                              "coverage": 1.0})
    t = lds(measured, predicted, resamples=resamples, seed=seed, alpha=alpha)
    out = pd.DataFrame({"alpha": t.alpha, "query_kind": t.query_kind, "horizon": t.horizon, "retest": t.lds,
                        "retest_low": t.low, "retest_high": t.high, "retest_subsets": t.subsets})
    for end, src in (("", "retest"), ("_low", "retest_low"), ("_high", "retest_high")):
        out["reliability" + end] = out[src]
        out["bound" + end] = _root(out[src])
    return out[CEILING]


def _pairwise(X: np.ndarray) -> np.ndarray:
    """[..., R, K] -> [...]: the mean over pairs of retrainings of the Spearman over the K subsets (NaN: R < 2)."""
    R = X.shape[-2]
    pairs = [spearman_along(X[..., a, :], X[..., b, :]) for a in range(R) for b in range(a + 1, R)]
    if not pairs:
        return np.full(X.shape[:-2], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.stack(pairs), axis=0)


def trak_ceiling(trak: pd.DataFrame | None, *, resamples: int = RESAMPLES, seed: int = SEED,
                 alpha: float = ALPHA) -> pd.DataFrame:
    """The TRAK LDS's ceiling (module doc; :data:`TRAK_CEILING`) per α_keep × query kind (each, and :data:`ALL`) ×
    horizon, from trak.parquet: the retrainings' test–retest, its Spearman–Brown reliability for their mean, and
    √ of that; the resamples of :func:`lds` (seeds, then subsets within each drawn seed: paired with it)."""
    if trak is None or not len(trak):
        return pd.DataFrame(columns=TRAK_CEILING)
    kinds = list(dict.fromkeys(trak.query_kind))
    kinds = [*kinds, ALL] if len(kinds) > 1 else kinds
    out = []
    for (keep, h), g in trak.groupby(["keep", "horizon"], sort=True):
        for kind in kinds:
            gk = g if kind == ALL else g[g.query_kind == kind]
            if not len(gk):
                continue
            axes = [sorted(gk[c].unique()) for c in ("seed", "query", "retrain", "subset")]
            X = np.full(tuple(len(a) for a in axes), np.nan)  # [S, Q, R, K]
            at = tuple(gk[c].map({v: n for n, v in enumerate(vals)}).to_numpy()
                       for c, vals in zip(("seed", "query", "retrain", "subset"), axes))
            X[at] = gk.measured.to_numpy(np.float64)
            R = X.shape[2]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                point = float(np.nanmean(np.nanmean(_pairwise(X), axis=1))) if R > 1 else math.nan
                draws = (np.concatenate([np.nanmean(np.nanmean(_pairwise(X[i]), axis=2), axis=1)
                                         for i in joint_gathers(X.shape, 3, resamples, seed)])
                         if R > 1 else np.full(resamples, np.nan))
            lo, hi = bootstrap_interval(draws, alpha)
            rel = [spearman_brown(v, R) if np.isfinite(v) else math.nan for v in (point, float(lo), float(hi))]
            bound = _root(rel)
            out.append({"keep": float(keep), "alpha": float(_removed_fraction(keep)), "query_kind": kind,
                        "horizon": int(h), "retest": point, "retest_low": float(lo), "retest_high": float(hi),
                        "retest_subsets": X.shape[3], "reliability": rel[0], "reliability_low": rel[1],
                        "reliability_high": rel[2], "bound": float(bound[0]), "bound_low": float(bound[1]),
                        "bound_high": float(bound[2]), "seeds": X.shape[0], "queries": X.shape[1], "retrains": R})
    return pd.DataFrame(out, columns=TRAK_CEILING)


def both(groups: pd.DataFrame | None, group_rows: pd.DataFrame | None, trak: pd.DataFrame | None,
         trak_rows: pd.DataFrame | None, scores: pd.DataFrame | None, retest: pd.DataFrame | None = None, *,
         resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> pd.DataFrame:
    """Both LDS kinds of a bank (module doc; :data:`BOTH`), each row named by ``lds_kind`` (:data:`SINGLE` or
    :data:`TRAK`), per estimator × fraction × query kind × horizon, with its ceiling beside it (NaN where the bank has
    none: no ``ceiling`` for the single-model LDS, one retraining for TRAK's). ``groups``/``group_rows``:
    groups.parquet, group_rows.parquet; ``trak``/``trak_rows``: trak.parquet, trak_rows.parquet; ``scores``:
    rowscores.py ``read_scores``; ``retest``: retest.parquet."""
    kw = {"resamples": resamples, "seed": seed, "alpha": alpha}
    keys = ["alpha", "query_kind", "horizon"]
    frames = []
    if groups is not None and group_rows is not None and len(groups):
        t = analyse(groups, group_rows, scores, **kw)
        if len(t):
            t = t.assign(lds_kind=SINGLE, keep=1.0 - t.alpha.astype(np.float64), retrains=1)
            frames.append(_beside(t, single_ceiling(retest, **kw), keys))
    if trak is not None and trak_rows is not None and len(trak):
        t = trak_analyse(trak, trak_rows, scores, **kw)[0]
        if len(t):
            n = trak_groups(trak).groupby(["alpha", "horizon"]).retrains.min()
            t = t.assign(lds_kind=TRAK, retrains=[int(n.get((a, h), 0)) for a, h in zip(t.alpha, t.horizon)])
            frames.append(_beside(t, trak_ceiling(trak, **kw)[CEILING], keys))
    if not frames:
        return pd.DataFrame(columns=BOTH)
    return pd.concat(frames, ignore_index=True)[BOTH]


def _beside(table: pd.DataFrame, ceiling: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``table`` with ``ceiling``'s columns beside each row of the same α (to 1e-9), query kind and horizon."""
    if not len(ceiling):
        return table.assign(**{c: np.nan for c in CEILING if c not in keys})
    key = lambda f: f.assign(alpha=np.round(f.alpha.astype(np.float64), 9), horizon=f.horizon.astype(np.int64))
    return key(table).merge(key(ceiling), on=keys, how="left")
