"""Leave-one-out by age: how old can a row be before its exact first-order effect no longer predicts
its measured one? Compute only; report_lds.py words it.

The bank removes row i of the batch of step t (attribution/bank/removals.py; the row's loss weight set to 0, no text) and
measures Δ L_q(h) = L_q(θ_h without the row) − L_q(θ_h of the twin) at every horizon h > t (loo.parquet). The row's
**age** at h is h − t (updates between its visit and the readout). Each estimator of attribution/estimators/rowscores.py predicts
the same Δ (its ``value``): for ``metagrad``, −∂L_q(θ_h)/∂w_{t,i} at w = 1, the exact first order of the removal
(Δw = −1) through the twin's replayed run — the horizon law (analyses/chaos.py) seen from the other side: at age 1 the first
order of one step, at larger ages the propagation of a Δ of one row through every later update.

Per estimator × query kind (and ``all`` kinds) × (t, h), over seeds:

- ``rho``: per seed, Spearman(predicted, measured) over every (row, query) of the cell (rows × queries pairs: a
  query's overall sensitivity is part of what is predicted), then the mean over seeds;
- ``rho_within``: per seed and query, Spearman over the cell's rows (which rows matter *for this query*: a prediction
  that knows only the query — its sensitivity, its sign — scores nothing here, however high its pooled ``rho``), the
  mean over queries, then over seeds. The pooled ``rho`` needs it beside it: where queries differ in how much every
  removal moves them, a query-only predictor reaches a high pooled ρ with no knowledge of the rows;
- ``slope``: the OLS slope (with intercept) of measured on predicted over every (seed, row, query) of the cell, and
  ``ratio``: the median of measured / predicted (predicted ≠ 0) — the calibration (1: the prediction has the effect's
  scale; a ranking can survive a magnitude that is off many-fold);
- intervals (``*_low``, ``*_high``): percentile intervals of :data:`~seedlab.attribution.analyses.stats.RESAMPLES` joint
  bootstrap resamples (attribution/analyses/stats.py ``joint_draws``: the seeds with replacement, then the rows anew within
  each drawn seed; a drawn row brings all its queries), shared by every estimator of a cell (paired).

Rows are few per step (``loo.rows``); with one seed the interval is over rows only.

**The nudges' floor** (:func:`beside_nudges`, :func:`nudge_floor`). A bank with ``chaos.nudges`` also trains, per
seed, one arm per nudged tensor: one ulp of one weight element at s, no row changed (forks/arms.py ``nudge``; the
arms chaos.py fits λ on), whose every text's loss is recorded at the same horizons as the removals'
(rundir.py ``read_nudge_losses``). Per seed, query and horizon h > s its |Δ L_q| = |L_q(nudged run at h) − L_q(twin
at h)| is what the chaotic dynamics alone make of the smallest possible difference; beside it the leave-one-out rows'
|Δ L_q| at the same h (every step t < h). Per horizon (every step pooled, ``step`` = :data:`EVERY_STEP`, and each step
alone): the nudges' median and max |Δ|, the removals' median, ``ratio`` = removals' median / nudges' median with its
percentile interval over :data:`~seedlab.attribution.analyses.stats.RESAMPLES` resamples of the seeds (stats.py
``joint_draws``' seed draws; a drawn seed brings its nudges and its removals, so the two medians are paired),
``below_max``: the share of the removals' |Δ| at or below the nudges' max, and ``worst_seed_ratio``: the smallest
per-seed ratio (the seed's removals' median / its nudges' median; ``worst_seed``: that seed) — chaos differs between
seeds, and a pooled median hides a seed whose nudges grew as large as its removals. One ulp is far smaller than a
removal's kick to the weights: a floor, not a size-matched null.

**The retest ceiling** (:func:`retest_pairs`, :func:`ceiling`, :func:`beside_ceiling`). A bank with ``ceiling`` removes
every leave-one-out row again from the nudged twin (one ulp at s, removals.py), measured against that nudged twin
(retest.parquet): each removal measured twice, on the twin and on a trajectory that differs from it by the smallest
possible difference, which chaos grows. The retest is scored as an estimator (:data:`RETEST`) in :func:`by_age`'s and
:func:`pooled`'s cells, the same resamples: ``retest`` (pooled ρ) and ``retest_within`` (ρ within queries) say how far
a removal's measured effect belongs to the row rather than to the one trajectory it was measured on, and
:func:`beside_ceiling` sets them beside every estimator's cell. ``bound`` = √retest (an interval's end ≤ 0 maps to 0):
read as two parallel measurements of a trajectory-free effect T (Δ_twin = T + e, Δ_nudged = T + e′, e and e′
uncorrelated with T and with each other), no predictor of T correlates with Δ_twin beyond √retest (the attenuation
bound, as stats.py reads the row invariance). It binds the predictors that do not see the twin's trajectory past s
(every estimator at θ_s); metagrad replays the twin's own run, where e is no noise (the bank is deterministic), and may
pass it. Spearman's ρ is not Pearson's r, so the bound is read approximately.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from seedlab.attribution.bank.removals import loo_name
from seedlab.attribution.analyses.stats import ALPHA, RESAMPLES, SEED, joint_draws, joint_gathers
from seedlab.stats import bootstrap_interval, slope_along, spearman_along

ALL = "all"
KEYS = ["seed", "step", "row", "query", "horizon"]
COLUMNS = ["estimator", "unit", "query_kind", "step", "horizon", "label", "age", "seeds", "rows", "queries", "n",
           "rho", "rho_low", "rho_high", "slope", "slope_low", "slope_high", "ratio", "ratio_low", "ratio_high",
           "mean_abs", "rho_within", "rho_within_low", "rho_within_high"]


def joined(loo: pd.DataFrame, scores: pd.DataFrame) -> pd.DataFrame:
    """loo.parquet's rows with every estimator's prediction (``predicted``; rowscores.py's ``value``) beside the
    measured effect: one row per estimator × seed × (step, row) × query × horizon both hold."""
    s = scores[["estimator", "unit", *KEYS, "value"]].rename(columns={"value": "predicted"})
    return loo.merge(s, on=KEYS, how="inner", validate="1:m")


def _cell(M: np.ndarray, P: np.ndarray, resamples: int, seed: int, alpha: float) -> dict:
    """The numbers of one cell: ``M``, ``P`` [S, R, Q] measured and predicted (NaN: absent)."""
    S = len(M)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rho_s = spearman_along(P.reshape(S, -1), M.reshape(S, -1))  # [S]
        rho = float(np.nanmean(rho_s)) if np.isfinite(rho_s).any() else math.nan
        within_s = np.nanmean(spearman_along(P.transpose(0, 2, 1), M.transpose(0, 2, 1)), axis=1)  # [S]
        within = float(np.nanmean(within_s)) if np.isfinite(within_s).any() else math.nan
        slope = float(slope_along(P.ravel(), M.ravel()))
        ok = np.isfinite(P) & np.isfinite(M) & (P != 0)
        ratio = float(np.median(M[ok] / P[ok])) if ok.any() else math.nan
        rhos, slopes, ratios, withins = [], [], [], []
        for at in joint_gathers(M.shape, 1, resamples, seed):
            Mb, Pb = M[at], P[at]  # [b, S, R, Q]
            b = len(Mb)
            rhos.append(np.nanmean(spearman_along(Pb.reshape(b, S, -1), Mb.reshape(b, S, -1)), axis=1))
            w = spearman_along(Pb.transpose(0, 1, 3, 2), Mb.transpose(0, 1, 3, 2))  # [b, S, Q]
            withins.append(np.nanmean(np.nanmean(w, axis=2), axis=1))
            slopes.append(slope_along(Pb.reshape(b, -1), Mb.reshape(b, -1)))
            okb = np.isfinite(Pb) & np.isfinite(Mb) & (Pb != 0)
            with np.errstate(invalid="ignore", divide="ignore"):
                ratios.append(np.nanmedian(np.where(okb, Mb / np.where(okb, Pb, 1.0), np.nan).reshape(b, -1), axis=1))
        (rl, rh), (sl_, sh), (ql, qh), (wl, wh) = (bootstrap_interval(np.concatenate(v), alpha)
                                                   for v in (rhos, slopes, ratios, withins))
    return {"rho": rho, "rho_low": float(rl), "rho_high": float(rh), "slope": slope, "slope_low": float(sl_),
            "slope_high": float(sh), "ratio": ratio, "ratio_low": float(ql), "ratio_high": float(qh),
            "n": int((np.isfinite(P) & np.isfinite(M)).sum()), "mean_abs": float(np.nanmean(np.abs(M))),
            "rho_within": within, "rho_within_low": float(wl), "rho_within_high": float(wh)}


def by_age(df: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`COLUMNS` per estimator × query kind (each, and :data:`ALL`) × (step, horizon) of :func:`joined`'s
    frame (module doc); sorted by estimator, kind, age."""
    out = []
    if not len(df):
        return pd.DataFrame(columns=COLUMNS)
    kinds = [*dict.fromkeys(df.query_kind), ALL] if df.query_kind.nunique() > 1 else list(dict.fromkeys(df.query_kind))
    for (e, t, h), g in df.groupby(["estimator", "step", "horizon"], sort=True):
        for kind in kinds:
            gk = g if kind == ALL else g[g.query_kind == kind]
            if not len(gk):
                continue
            seeds, rows, queries = (sorted(gk[c].unique()) for c in ("seed", "row", "query"))
            M = np.full((len(seeds), len(rows), len(queries)), np.nan)
            P = M.copy()
            si, ri, qi = (gk[c].map({v: j for j, v in enumerate(vals)}).to_numpy() for c, vals in
                          (("seed", seeds), ("row", rows), ("query", queries)))
            M[si, ri, qi], P[si, ri, qi] = gk.measured.to_numpy(), gk.predicted.to_numpy()
            out.append({"estimator": e, "unit": gk.unit.iloc[0], "query_kind": kind, "step": int(t), "horizon": int(h),
                        "label": gk.label.iloc[0], "age": int(h - t), "seeds": len(seeds), "rows": len(rows),
                        "queries": len(queries), **_cell(M, P, resamples, seed, alpha)})
    res = pd.DataFrame(out, columns=COLUMNS)
    return res.sort_values(["estimator", "query_kind", "age", "step"], kind="stable", ignore_index=True)


def pooled(df: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> pd.DataFrame:
    """The single-row numbers of :func:`by_age` with every leave-one-out step of a horizon pooled (``step`` = −1,
    ``age`` the mean age): per estimator × kind × horizon, Spearman over every (step, row, query) of a seed — the
    single-row ρ the LDS is set beside (lds.py ``contrast``). The bootstrap's unit is a (step, row)."""
    if not len(df):
        return pd.DataFrame(columns=COLUMNS)
    d = df.assign(row=df.step.astype(np.int64) * 1_000_000 + df.row, age_=df.horizon - df.step)
    ages = d.groupby(["estimator", "horizon"]).age_.mean()
    out = by_age(d.assign(step=d.horizon - 1).drop(columns="age_"), resamples=resamples, seed=seed, alpha=alpha)
    out["age"] = [float(ages[e, h]) for e, h in zip(out.estimator, out.horizon)]
    out["step"] = -1
    return out


def main_kind(table: pd.DataFrame) -> str | None:
    """The query kind a summary reads: :data:`ALL` where the table has several kinds, else its one kind."""
    kinds = list(dict.fromkeys(table.query_kind)) if len(table) else []
    return ALL if ALL in kinds else (kinds[0] if kinds else None)


def oldest(table: pd.DataFrame, estimator: str, kind: str | None = None, column: str = "rho") -> dict:
    """For ``estimator`` at the end of the run (its largest horizon in ``table``, a :func:`by_age` frame), by the
    rows' age (end − t) from the youngest: ``predicts`` — the ages whose ``column`` (``rho`` or ``rho_within``)
    interval lies above 0 before the first that does not; ``first_miss`` — that age (None: none misses); ``ages`` —
    every age there."""
    kind = kind or main_kind(table)
    g = table[(table.estimator == estimator) & (table.query_kind == kind)]
    if not len(g):
        return {"predicts": [], "first_miss": None, "ages": []}
    g = g[g.horizon == g.horizon.max()].sort_values("age")
    ok, miss = [], None
    for r in g.itertuples():
        if not (getattr(r, f"{column}_low") > 0):
            miss = int(r.age)
            break
        ok.append(int(r.age))
    return {"predicts": ok, "first_miss": miss, "ages": [int(a) for a in g.age]}


def unscored(loo: pd.DataFrame, scores: pd.DataFrame | None, estimator: str) -> list[int]:
    """The leave-one-out steps of ``loo`` that ``estimator`` scored no row of (metagrad run from a later t₀)."""
    have = set() if scores is None else set(scores[scores.estimator == estimator].step)
    return sorted(set(int(t) for t in loo.step) - have)


def analyse(loo: pd.DataFrame, scores: pd.DataFrame | None, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(:func:`by_age`, :func:`pooled`) of a bank's loo.parquet against its row scores (rowscores.py
    ``read_scores``; None: nothing to score, empty frames)."""
    if scores is None or not len(loo):
        return pd.DataFrame(columns=COLUMNS), pd.DataFrame(columns=COLUMNS)
    j = joined(loo, scores)
    return by_age(j, **kw), pooled(j, **kw)


# ---------------------------------------------------------------- the nudges' floor

NUDGE = "nudge"  # beside_nudges' kind of a nudge arm's row (its ``arm``: the tensor)
REMOVAL = "removal"  # ... of a leave-one-out row's (its ``arm``: removals.py ``loo_name``)
EVERY_STEP = -1  # nudge_floor's ``step`` of the row pooling every leave-one-out step before the horizon
BESIDE = ["seed", "kind", "arm", "step", "row", "query", "query_kind", "horizon", "label", "age", "measured", "abs"]
FLOOR = ["horizon", "label", "step", "age", "nudge_age", "seeds", "nudge_n", "nudge_median", "nudge_max", "removal_n",
         "removal_median", "ratio", "ratio_low", "ratio_high", "below_max", "worst_seed", "worst_seed_ratio"]


def beside_nudges(loo: pd.DataFrame, nudges: pd.DataFrame, s: int) -> pd.DataFrame:
    """The tidy table of the module doc (columns :data:`BESIDE`): every leave-one-out row of loo.parquet (kind
    :data:`REMOVAL`, ``arm`` loo.<t>.<i>) and every nudge run's Δ L_q = ``loss`` − ``twin_loss`` at the same step
    (``nudges``: rundir.py ``read_nudge_losses``; kind :data:`NUDGE`, ``arm`` the tensor, ``step`` s, ``row`` −1,
    ``age`` h − s) on loo.parquet's queries, at the horizons after s that loo.parquet holds; ``abs`` = |measured|."""
    kinds = dict(zip(loo["query"], loo.query_kind))
    labels = dict(zip(loo.horizon, loo.label))
    n = nudges[nudges.text.isin(kinds) & nudges.step.isin(labels) & (nudges.step > s)]
    nudged = pd.DataFrame({
        "seed": n.seed.to_numpy(), "kind": NUDGE, "arm": n.nudge.to_numpy(), "step": int(s), "row": -1,
        "query": n.text.to_numpy(), "query_kind": n.text.map(kinds).to_numpy(), "horizon": n.step.to_numpy(),
        "label": n.step.map(labels).to_numpy(), "age": (n.step - s).to_numpy(),
        "measured": (n.loss - n.twin_loss).to_numpy()})
    removed = loo.assign(kind=REMOVAL, arm=[loo_name(t, i) for t, i in zip(loo.step, loo.row)])
    out = pd.concat([nudged, removed[[c for c in BESIDE if c != "abs"]]], ignore_index=True)
    out["abs"] = out.measured.abs()
    return out.sort_values(["horizon", "kind", "seed", "step", "row", "arm", "query"], kind="stable",
                           ignore_index=True)[BESIDE]


def _per_seed(g: pd.DataFrame, seeds: list) -> np.ndarray:
    """``abs`` of ``g`` as [seeds, most values of a seed], NaN-padded (a seed without values: a NaN row).
    attribution/analyses/stats.py has no ragged-group helper; pandas' pivot is the padding."""
    if not len(g):
        return np.full((len(seeds), 1), np.nan)
    wide = g.assign(slot=g.groupby("seed").cumcount()).pivot(index="seed", columns="slot", values="abs")
    return wide.reindex(index=seeds).to_numpy(np.float64)


def nudge_floor(table: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED,
                alpha: float = ALPHA) -> pd.DataFrame:
    """Per horizon of :func:`beside_nudges`' table holding both kinds, the row pooling every leave-one-out step
    (``step`` :data:`EVERY_STEP`, ``age`` NaN), then one row per step t (``age`` h − t): columns :data:`FLOOR`
    (module doc; ``nudge_age`` h − s; ``nudge_n``, ``removal_n``: the |Δ| values behind each median). The seeds'
    resamples are shared by every row."""
    if not len(table):
        return pd.DataFrame(columns=FLOOR)
    seeds = sorted(table.seed.unique())
    slots = joint_draws(len(seeds), 1, resamples, seed)[0]  # [resamples, S]: the seeds with replacement
    out = []
    for h, g in table.groupby("horizon", sort=True):
        nudged, removed = g[g.kind == NUDGE], g[g.kind == REMOVAL]
        if not (len(nudged) and len(removed)):
            continue
        N = _per_seed(nudged, seeds)
        with warnings.catch_warnings():  # a resample of seeds none of which holds the kind: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            n_med = np.nanmedian(N[slots].reshape(resamples, -1), axis=1)
        nudge_median, nudge_max = float(nudged["abs"].median()), float(nudged["abs"].max())
        for t in [EVERY_STEP, *sorted(removed.step.unique())]:
            r = removed if t == EVERY_STEP else removed[removed.step == t]
            R = _per_seed(r, seeds)
            with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                ratios = np.nanmedian(R[slots].reshape(resamples, -1), axis=1) / n_med
                ratio = float(np.float64(r["abs"].median()) / nudge_median)
            lo, hi = bootstrap_interval(ratios, alpha)
            with np.errstate(divide="ignore", invalid="ignore"):
                per_seed = (r.groupby("seed")["abs"].median() / nudged.groupby("seed")["abs"].median()).dropna()
            out.append({"horizon": int(h), "label": g.label.iloc[0], "step": int(t),
                        "age": math.nan if t == EVERY_STEP else float(h - t), "nudge_age": int(nudged.age.iloc[0]),
                        "seeds": int(g.seed.nunique()), "nudge_n": len(nudged), "nudge_median": nudge_median,
                        "nudge_max": nudge_max, "removal_n": len(r), "removal_median": float(r["abs"].median()),
                        "ratio": ratio, "ratio_low": float(lo), "ratio_high": float(hi),
                        "below_max": float((r["abs"] <= nudge_max).mean()),
                        "worst_seed": int(per_seed.idxmin()) if len(per_seed) else -1,
                        "worst_seed_ratio": float(per_seed.min()) if len(per_seed) else math.nan})
    return pd.DataFrame(out, columns=FLOOR)


# ---------------------------------------------------------------- the retest ceiling

RETEST = "retest (nudged twin)"  # the removal measured again on the nudged twin, scored as an estimator
CEILING = ["query_kind", "step", "horizon", "retest_seeds", "retest_rows", "retest", "retest_low", "retest_high",
           "retest_within", "retest_within_low", "retest_within_high", "bound", "bound_low", "bound_high",
           "bound_within", "bound_within_low", "bound_within_high"]


def retest_pairs(retest: pd.DataFrame) -> pd.DataFrame:
    """retest.parquet's leave-one-out rows as :func:`joined`'s frame: ``measured`` on the twin, ``predicted`` the
    retest on the nudged twin, estimator :data:`RETEST`."""
    r = retest[retest.removal == "loo"]
    return pd.DataFrame({
        "seed": r.seed.to_numpy(), "step": r.step.to_numpy(np.int64), "row": r.row.to_numpy(np.int64),
        "query": r["query"].to_numpy(), "query_kind": r.query_kind.to_numpy(), "horizon": r.horizon.to_numpy(),
        "label": r.label.to_numpy(), "age": (r.horizon - r.step).to_numpy(), "measured": r.measured.to_numpy(),
        "estimator": RETEST, "unit": "nats/token", "predicted": r.retest.to_numpy()})


def _root(v: float) -> float:
    """√v, 0 for v ≤ 0 (no common part shown), NaN kept."""
    return v if math.isnan(v) else math.sqrt(v) if v > 0 else 0.0


def _ceiling_of(t: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"query_kind": t.query_kind, "step": t.step, "horizon": t.horizon, "retest_seeds": t.seeds,
                        "retest_rows": t.rows})
    for src, dst in (("rho", "retest"), ("rho_within", "retest_within")):
        for end in ("", "_low", "_high"):
            out[dst + end] = t[src + end].to_numpy(np.float64)
            out[dst.replace("retest", "bound") + end] = [_root(v) for v in t[src + end].to_numpy(np.float64)]
    return out[CEILING].reset_index(drop=True)


def ceiling(retest: pd.DataFrame | None, **kw) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per (step, horizon) cell, every step of a horizon pooled) :data:`CEILING` tables of a bank's retest.parquet
    (module doc); the cells and resamples of :func:`by_age` and :func:`pooled` (None or no leave-one-out retest:
    empty frames)."""
    j = pd.DataFrame() if retest is None or not len(retest) else retest_pairs(retest)
    if not len(j):
        return pd.DataFrame(columns=CEILING), pd.DataFrame(columns=CEILING)
    return _ceiling_of(by_age(j, **kw)), _ceiling_of(pooled(j, **kw))


def beside_ceiling(table: pd.DataFrame, ceiling_table: pd.DataFrame) -> pd.DataFrame:
    """:func:`by_age`'s (or :func:`pooled`'s) table with the matching :func:`ceiling` table's columns beside every
    estimator's cell (same query kind, step and horizon; NaN where the retest has none)."""
    keys = ["query_kind", "step", "horizon"]
    if not len(table) or not len(ceiling_table):
        return table.assign(**{c: np.nan for c in CEILING if c not in keys})
    ints = {"step": np.int64, "horizon": np.int64}
    return table.astype(ints).merge(ceiling_table.astype(ints), on=keys, how="left")
