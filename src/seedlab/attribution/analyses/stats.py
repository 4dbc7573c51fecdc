"""Agreement of estimates with measured effects, on two tracks, against baselines and the target's own reliability.

Every correlation is computed *across candidates* for one query and horizon (Spearman; own-row
controls, measured 0 by construction, left out), then averaged over the queries of a kind.

**Within seed** — each seed is its own ground truth (its runs are deterministic, so the measured
Δ has no run-to-run noise):

- ``rho``: per seed, query and horizon, Spearman(estimate, measured) over candidates; the mean
  over the kind's queries, then over seeds.
- the **row invariance** ρ_rep (estimator :data:`ROW_INVARIANCE`): the same with
  ``measured_replicate`` in place of the estimate — Spearman(Δ(c@r), Δ(c@r′)), the same candidate
  injected at another row r′ of the batch: the test–retest reliability of the target across the
  row it replaces, i.e. how far "the effect of this candidate" is defined beyond the row it
  happened to displace. Only where the column is present (NaN entries are left out pairwise).
  Within a seed there is no noise: to first order in the swap Δ(c@r) − Δ(c@r′) is the difference
  of the two displaced rows' own first-order effects, the same constant for every candidate, which
  no Spearman over candidates sees; ρ_rep < 1 is the candidate × row interaction of second and
  higher order, the same non-linearity that makes the exact first-order response (``unroll``)
  miss: the two are symptoms of one cause, not a target's noise against a method's error. ``bound`` =
  √ρ_rep (ρ_rep > 0) is its **ceiling**: read as two parallel measurements of a row-free effect T
  (Δ(c@r) = T + e_r, the row's parts uncorrelated with T and with each other), no predictor that
  ranks a candidate the same whichever row it replaces (every estimator at θ_s, and to first
  order unroll) correlates with Δ(c@r) beyond corr(T, Δ(c@r)) = √ρ_rep (the attenuation bound).
  It is not a floor.

**Across seeds** — what is common to seeds:

- ``rho``: Spearman(seed-mean estimate, seed-mean measured) over candidates (the means over the
  seeds, candidate by candidate), per query and horizon; the mean over the kind's queries.
- the **reliability** of the seed-mean (estimator :data:`RELIABILITY`): Spearman–Brown
  R = k·r̄ / (1 + (k − 1)·r̄), r̄ the mean over pairs of seeds of Spearman(measured_a, measured_b)
  over candidates, k the seeds (per query, then the mean over the kind's queries). ``bound`` = √R
  is the correlation of the seed-mean with its common part: what a perfect predictor of what is
  common to seeds would reach.

**Intervals.** ``low``/``high``: the percentile interval of :data:`RESAMPLES` seeded bootstrap
resamples of the candidates (with replacement; one set of resamples shared by every estimator,
query, horizon and seed, so differences between estimators are paired). ``se_seeds``: the
jackknife standard error over seeds (every number recomputed with one seed left out; none for the
reliability, which depends on k). A resample weights each candidate by how often it was drawn
(``seedlab.stats.spearman_along``: exactly the Spearman of the expanded resample, ties averaged,
without a sort per resample); the kind baseline is not recomputed inside a resample.
:func:`within_joint` resamples seeds and candidates jointly instead (the seeds with replacement,
then the candidates anew within each drawn seed: :func:`joint_draws`), for statements about
training rather than about these seeds (attribution/analyses/horizon.py's h*, additivity.py);
:func:`joint_gathers` indexes an array at those draws, chunk by chunk (lds.py's subsets, loo.py's rows).

**Baselines.** The registry's baseline estimators (random, loss at s, ‖∇ℓ_c‖, length: see
:func:`is_baseline`) and :data:`KIND`, the candidate's kind: the leave-one-out mean of the
measured effect over the seed's other candidates of the same kind (same query and horizon; only
when the candidates come in ≥ 2 kinds — with one kind it would be a decreasing function of the
candidate's own effect, Spearman −1; with several kinds it keeps some of that pull, so it is a
conservative baseline). An estimator *predicts* at a horizon when the bootstrap interval of its ρ
lies above 0 and the interval of ρ − ρ_baseline lies above 0 for every baseline whose ρ is defined
(:func:`verdict`). The references (:func:`is_reference`: the row invariance, the reliability and
the exact responses :data:`RESPONSES` — unroll, its exact readout, its tangent) are never winners.

Further: :func:`decay` (per-seed within-seed ρ at the first horizon against each later one,
``seedlab.stats.paired`` over seeds), :func:`sign_agreement` (weighted by |Δ|, beside the
base rate of always predicting the |Δ|-weighted majority sign), :func:`calibration` (OLS slope
of measured on estimate and the median ratio measured/estimate, each with its bootstrap interval,
nats/token estimators only), the within-seed track within each candidate kind of
≥ :data:`MIN_KIND` candidates, and :func:`effects` (the size of the measured effects).
:func:`analyse` runs them all. What the report states of the bank itself: :func:`design` (seeds,
candidates, queries, horizons, estimators), :func:`integrity` (its controls) and
:func:`seconds_per_seed`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from seedlab.attribution.estimators.registry import ESTIMATORS
from seedlab.stats import bootstrap_interval, jackknife_se, mean_ci, paired, slope_along, spearman_along, spearman_brown

ALPHA = 0.05
RESAMPLES = 2000
SEED = 0
MIN_KIND = 4  # candidates a kind needs for its own correlations
KIND = "kind"  # the derived baseline: the leave-one-out kind-mean of the measured effect
ROW_INVARIANCE = "row invariance"  # within track: Spearman(measured, measured_replicate), ρ_rep
RELIABILITY = "reliability"  # across track: Spearman–Brown reliability of the seed-mean measured effect
REFERENCES = (ROW_INVARIANCE, RELIABILITY)
UNROLL = "unroll"  # the exact first-order response: ⟨∇L_q(θ_h), Δθ_h⟩, Δθ_h the one-step change at s propagated
READOUT = "unroll-readout"  # the same Δθ_h read out exactly: L_q(θ_h + Δθ_h) − L_q(θ_h)
TANGENT = "unroll-tangent"  # the w → 0 limit per unit row weight: the step at s linearised too
RESPONSES = (UNROLL, READOUT, TANGENT)  # the exact responses, references like the row invariance
TRACKS = ("within", "across")
UNIT = "nats/token"
_BLOCK = 1_000_000  # values gathered per bootstrap chunk (memory)


def is_baseline(name: str) -> bool:
    """A baseline: the kind predictor, or an estimator the registry labels "baseline" (random, loss,
    gradnorm, length; a plug-in, not in the registry, never is)."""
    return name == KIND or (name in ESTIMATORS and ESTIMATORS[name].label == "baseline")


def is_reference(name: str) -> bool:
    """Not an estimator under test: the row invariance and the reliability, the exact responses
    :data:`RESPONSES` (unroll, its exact readout and its tangent: what the estimators approximate,
    whether or not this registry has them), or an estimator the registry labels "reference"."""
    return name in REFERENCES or name in RESPONSES or (name in ESTIMATORS and ESTIMATORS[name].label == "reference")


def _ordinary(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.candidate_kind != "control"]


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (seed, candidate, query, horizon): the measured effect (and its replicate)."""
    return _ordinary(df).drop_duplicates(["seed", "candidate", "query", "horizon"])


def _nanmean(v: np.ndarray, axis) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices stay NaN
        return np.nanmean(v, axis=axis)


def with_kind_baseline(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with the :data:`KIND` predictor's rows added (module doc; unchanged with < 2 candidate kinds)."""
    m = _measured(df)
    if m.candidate_kind.nunique() < 2:
        return df
    g = m.groupby(["seed", "query", "horizon", "candidate_kind"]).measured
    total, n = g.transform("sum"), g.transform("count")
    loo = ((total - m.measured) / (n - 1)).where(n > 1)
    return pd.concat([df, m.assign(estimator=KIND, estimator_label="baseline", estimate=loo, unit=UNIT)],
                     ignore_index=True)


# ---------------------------------------------------------------- the frame as arrays


@dataclass
class Arrays:
    """Ordinary rows as arrays over [query, horizon, (estimator,) seed, candidate]; NaN where absent."""

    queries: list[str]
    kinds: np.ndarray  # the query kind of each query
    horizons: list[int]
    labels: dict[int, tuple[str, int]]  # horizon -> (label, after)
    estimators: list[str]
    seeds: list[int]
    candidates: list[str]
    X: np.ndarray  # estimates [Q, H, E, S, C]
    M: np.ndarray  # measured [Q, H, S, C]
    R: np.ndarray | None  # measured_replicate [Q, H, S, C]; None when the frame has none
    Xbar: np.ndarray = field(init=False)  # seed-means [Q, H, E, C]
    Mbar: np.ndarray = field(init=False)  # [Q, H, C]

    def __post_init__(self):
        self.Xbar, self.Mbar = _nanmean(self.X, -2), _nanmean(self.M, -2)

    @classmethod
    def of(cls, df: pd.DataFrame, candidates=None) -> Arrays:
        d = _ordinary(df)
        if candidates is not None:
            d = d[d.candidate.isin(candidates)]
        q, h = list(dict.fromkeys(d["query"])), sorted(int(v) for v in d.horizon.unique())
        e, c = list(dict.fromkeys(d.estimator)), sorted(d.candidate.unique())
        s = sorted(int(v) for v in d.seed.unique())
        m = d.drop_duplicates(["seed", "candidate", "query", "horizon"])

        def grid(frame: pd.DataFrame, keys: list[str], levels: list[list], col: str) -> np.ndarray:
            wide = frame.set_index([*keys, "candidate"])[col].unstack("candidate")
            wide = wide.reindex(index=pd.MultiIndex.from_product(levels, names=keys), columns=c)
            return wide.to_numpy(dtype=np.float64).reshape(*map(len, levels), len(c))

        rep = "measured_replicate" in m and m.measured_replicate.notna().any()
        kinds = d.drop_duplicates("query").set_index("query").query_kind
        labels = {int(r.horizon): (r.label, int(r.after)) for r in d.drop_duplicates("horizon").itertuples()}
        return cls(q, kinds.loc[q].to_numpy(), h, labels, e, s, c,
                   grid(d, ["query", "horizon", "estimator", "seed"], [q, h, e, s], "estimate"),
                   grid(m, ["query", "horizon", "seed"], [q, h, s], "measured"),
                   grid(m, ["query", "horizon", "seed"], [q, h, s], "measured_replicate") if rep else None)

    def at(self, h: int, prefix: str = "") -> dict:
        """The horizon ``h`` as columns: ``{prefix}horizon, {prefix}label, {prefix}after``."""
        label, after = self.labels[h]
        return {f"{prefix}horizon": h, f"{prefix}label": label, f"{prefix}after": after}

    def only(self, names: list[str]) -> Arrays:
        """The estimators ``names`` alone (in that order), beside the measured effects as they are."""
        j = [self.estimators.index(n) for n in names]
        return Arrays(self.queries, self.kinds, self.horizons, self.labels, list(names), self.seeds, self.candidates,
                      self.X[:, :, j], self.M, self.R)

    def against(self, name: str) -> Arrays:
        """The other estimators with estimator ``name``'s estimates in place of the measured effect
        and no replicate: every correlation "with the measured effect" becomes one with ``name`` —
        within seed Spearman(e, name) per seed, query and horizon; across seeds Spearman of the two
        seed-means; the reliability that of ``name``'s seed-mean."""
        j = self.estimators.index(name)
        rest = [i for i in range(len(self.estimators)) if i != j]
        return Arrays(self.queries, self.kinds, self.horizons, self.labels, [self.estimators[i] for i in rest],
                      self.seeds, self.candidates, self.X[:, :, rest], self.X[:, :, j], None)

    def without_seed(self, i: int) -> Arrays:
        keep = [j for j in range(len(self.seeds)) if j != i]
        return Arrays(self.queries, self.kinds, self.horizons, self.labels, self.estimators,
                      [self.seeds[j] for j in keep], self.candidates, self.X[..., keep, :], self.M[..., keep, :],
                      None if self.R is None else self.R[..., keep, :])


def _take(v: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """[..., C] gathered at candidate positions idx [b, C'] -> [b, ..., C']."""
    return np.moveaxis(np.take(v, idx, axis=-1), -2, 0)


def _values(a: Arrays, counts: np.ndarray | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Per query kind, for every resample (``counts`` [b, C]: how often each candidate was drawn;
    None: the candidates as they are, no resample axis): ``within`` [(b,) H, E, S] and ``invariance``
    [(b,) H, S] (means over the kind's queries, per seed), ``across`` [(b,) H, E] and ``reliability`` [(b,) H]."""
    M = a.M[:, :, None]  # [Q, H, 1, S, C]
    within = spearman_along(a.X, M, counts)  # [(b,) Q, H, E, S]
    invariance = (spearman_along(a.R, a.M, counts) if a.R is not None
                  else np.full(within.shape[:-2] + (len(a.seeds),), np.nan))
    across = spearman_along(a.Xbar, a.Mbar[:, :, None], counts)  # [(b,) Q, H, E]
    k = len(a.seeds)
    i, j = np.triu_indices(k, 1)
    pairs = spearman_along(a.M[..., :, None, :], a.M[..., None, :, :], counts)[..., i, j]  # [(b,) Q, H, pairs]
    reliability = spearman_brown(_nanmean(pairs, -1), k) if len(i) else np.full(pairs.shape[:-1], np.nan)
    q0 = 0 if counts is None else 1  # the query axis
    return {kind: {"within": _nanmean(within.compress(q, q0), q0),
                   "invariance": _nanmean(invariance.compress(q, q0), q0),
                   "across": _nanmean(across.compress(q, q0), q0),
                   "reliability": _nanmean(reliability.compress(q, q0), q0)}
            for kind in dict.fromkeys(a.kinds) for q in [a.kinds == kind]}


def _counts(n: int, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``resamples`` seeded bootstrap resamples of n candidates: the draws [resamples, n] and how often
    each candidate was drawn [resamples, n]."""
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    counts = np.bincount((idx + n * np.arange(resamples)[:, None]).ravel(), minlength=resamples * n)
    return idx, counts.reshape(resamples, n)


def _resampled(a: Arrays, resamples: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """:func:`_values` over ``resamples`` seeded bootstrap resamples of the candidates (in chunks)."""
    counts = _counts(len(a.candidates), resamples, seed)[1]
    chunk = max(1, _BLOCK // max(a.X.size, 1))
    parts = [_values(a, counts[i:i + chunk]) for i in range(0, resamples, chunk)]
    return {k: {n: np.concatenate([p[k][n] for p in parts]) for n in parts[0][k]} for k in parts[0]}


def within_rho(a: Arrays) -> dict[str, np.ndarray]:
    """Per query kind, the within-seed ρ of every estimator [H, E] (:func:`correlations`' point values)."""
    return {k: _nanmean(v["within"], -1) for k, v in _values(a).items()}


def joint_draws(seeds: int, units: int, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``resamples`` seeded two-level bootstrap draws: the seeds with replacement ([resamples, seeds],
    each slot a seed's index), then within each drawn slot ``units`` units (candidates, pairs) anew with
    replacement ([resamples, seeds, units], indices). A seed drawn twice gets two independent draws."""
    rng = np.random.default_rng([seed, 2])
    return rng.integers(0, seeds, size=(resamples, seeds)), rng.integers(0, units, size=(resamples, seeds, units))


JOINT_CHUNK = 250  # joint resamples gathered at once (memory)


def joint_gathers(shape: tuple[int, ...], axis: int, resamples: int, seed: int,
                  chunk: int = JOINT_CHUNK) -> Iterator[tuple[np.ndarray, ...]]:
    """:func:`joint_draws` applied to an array of ``shape`` — the seeds on axis 0, the units (subsets, rows) on
    ``axis`` ≥ 1 — as index tuples, ``chunk`` resamples at a time: ``x[at]`` is [b, *shape], its slot j in resample
    k the drawn seed ``slots[k, j]`` with its units drawn anew along ``axis`` (every other axis whole). The draws
    depend on (shape[0], shape[axis], resamples, seed) only, so two arrays of one design are resampled alike
    (paired: lds.py's estimators, loo.py's)."""
    if not 1 <= axis < len(shape):
        raise ValueError(f"the units' axis must be one of 1 .. {len(shape) - 1}, got {axis}")
    slots, idx = joint_draws(shape[0], shape[axis], resamples, seed)

    def placed(v: np.ndarray, i: int) -> np.ndarray:  # the slots [b, S]: as they are; [b | 1, S | 1, d]: d on axis i
        return v.reshape(*v.shape[:2], *(v.shape[-1] if j == i else 1 for j in range(1, len(shape))))

    whole = {i: np.arange(d)[None, None, :] for i, d in enumerate(shape) if i not in (0, axis)}
    for c in range(0, resamples, chunk):
        drawn = {0: slots[c:c + chunk], axis: idx[c:c + chunk]}  # [b, S], [b, S, K]
        yield tuple(placed(drawn[i] if i in drawn else whole[i], i) for i in range(len(shape)))


def within_joint(a: Arrays, resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, np.ndarray]:
    """Per query kind, the within-seed ρ of every estimator [resamples, H, E] in :func:`joint_draws`'s
    resamples: per drawn seed slot, the Spearman over its drawn candidates (weighted by how often each
    was drawn) per query and horizon, the mean over the kind's queries, then the mean over the slots
    (the point value is :func:`correlations`' within-seed ``rho``)."""
    S, C, (_, H, E, _, _) = len(a.seeds), len(a.candidates), a.X.shape
    slots, idx = joint_draws(S, C, resamples, seed)
    counts = np.zeros((resamples, S, C))
    np.add.at(counts, (np.arange(resamples)[:, None, None], np.arange(S)[None, :, None], idx), 1.0)
    kinds = {k: a.kinds == k for k in dict.fromkeys(a.kinds)}
    out = {k: np.full((resamples, S, H, E), np.nan) for k in kinds}
    chunk = max(1, _BLOCK // max(a.X[..., 0, :].size, 1))
    for s in range(S):
        rows, cols = np.nonzero(slots == s)
        X, M = a.X[..., s, :], a.M[:, :, None, s, :]  # [Q, H, E, C], [Q, H, 1, C]
        for i in range(0, len(rows), chunk):
            r, c = rows[i:i + chunk], cols[i:i + chunk]
            rho = spearman_along(X, M, counts[r, c])  # [n, Q, H, E]
            for k, q in kinds.items():
                out[k][r, c] = _nanmean(rho[:, q], 1)
    return {k: _nanmean(v, 1) for k, v in out.items()}


def _tracks(v: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per kind's values -> the two tracks' numbers [(b,) H, E + references]: the per-seed values
    averaged over seeds, the row invariance and the reliability appended as the last estimators."""
    within = np.concatenate([_nanmean(v["within"], -1), _nanmean(v["invariance"], -1)[..., None]], axis=-1)
    across = np.concatenate([v["across"], v["reliability"][..., None]], axis=-1)
    return {"within": within, "across": across}


# ---------------------------------------------------------------- the analysis


@dataclass
class Analysis:
    """What the report shows (each frame's columns in :func:`analyse`)."""

    correlations: pd.DataFrame
    versus: pd.DataFrame
    verdict: pd.DataFrame
    decay: pd.DataFrame
    sign: pd.DataFrame
    calibration: pd.DataFrame
    by_candidate_kind: pd.DataFrame
    effects: pd.DataFrame


def analyse(df: pd.DataFrame, *, resamples: int = RESAMPLES, seed: int = SEED, alpha: float = ALPHA) -> Analysis:
    """Everything the report shows, from attribution.parquet's frame:

    - ``correlations``: per track × query kind × horizon × estimator (the references
      :data:`ROW_INVARIANCE` / :data:`RELIABILITY` as estimators; their ``bound`` the ceiling
      √ρ_rep / √R): ``rho, low, high, se_seeds, bound,
      baseline, seeds, candidates, queries, label, after``;
    - ``versus``: per track × query kind × horizon × estimator × baseline: ``diff`` = ρ − ρ_baseline
      and its bootstrap ``low, high``;
    - ``verdict``, ``decay``, ``sign``, ``calibration``: see those functions;
    - ``by_candidate_kind``: ``correlations`` within each candidate kind of ≥ :data:`MIN_KIND`
      candidates (column ``candidate_kind``; the kind baseline left out; empty with one kind);
    - ``effects``: :func:`effects`."""
    full = with_kind_baseline(df)
    a = Arrays.of(full)
    corr, samples = correlations(a, resamples, seed, alpha)
    vs = versus(corr, samples, a, alpha)
    cands = _measured(df).drop_duplicates("candidate")
    plain = full[full.estimator != KIND]
    by_kind = [correlations(Arrays.of(plain, candidates=g.candidate), resamples, seed, alpha)[0]
               .assign(candidate_kind=k)
               for k, g in cands.groupby("candidate_kind") if len(g) >= MIN_KIND and cands.candidate_kind.nunique() > 1]
    return Analysis(corr, vs, verdict(corr, vs), decay(a), sign_agreement(a, alpha),
                    calibration(a, full, resamples, seed, alpha),
                    pd.concat(by_kind, ignore_index=True) if by_kind else pd.DataFrame(), effects(df))


def correlations(a: Arrays, resamples: int = RESAMPLES, seed: int = SEED,
                 alpha: float = ALPHA) -> tuple[pd.DataFrame, dict]:
    """Both tracks' correlations with their intervals (the ``correlations`` frame of :func:`analyse`)
    and the bootstrap samples {(track, kind): [b, H, E + 1]} (the track's reference last)."""
    point = {k: _tracks(v) for k, v in _values(a).items()}
    boot = {k: _tracks(v) for k, v in _resampled(a, resamples, seed).items()}
    loo = ([{k: _tracks(v) for k, v in _values(a.without_seed(i)).items()} for i in range(len(a.seeds))]
           if len(a.seeds) > 1 else [])
    names = [*a.estimators, None]  # None: the track's reference
    rows, samples = [], {}
    for kind in point:
        nq = int((a.kinds == kind).sum())
        for track in TRACKS:
            p, b = point[kind][track], boot[kind][track]
            samples[(track, kind)] = b
            lo, hi = bootstrap_interval(b, alpha)
            ref = ROW_INVARIANCE if track == "within" else RELIABILITY
            for j, e in enumerate(names):
                for i, h in enumerate(a.horizons):
                    if e is None and (np.isnan(p[i, j]) or (track == "within" and a.R is None)):
                        continue  # no replicate in this bank / one seed: no reliability
                    rho = float(p[i, j])
                    jk = bool(loo) and not (e is None and track == "across")  # the reliability depends on k
                    rows.append({"track": track, "query_kind": kind, **a.at(h), "estimator": e or ref,
                                 "baseline": e is not None and is_baseline(e), "rho": rho,
                                 "low": float(lo[i, j]), "high": float(hi[i, j]),
                                 "se_seeds": jackknife_se([x[kind][track][i, j] for x in loo]) if jk else math.nan,
                                 "bound": math.sqrt(rho) if e is None and rho > 0 else math.nan,
                                 "seeds": len(a.seeds), "candidates": len(a.candidates), "queries": nq})
    return pd.DataFrame(rows), samples


def versus(corr: pd.DataFrame, samples: dict, a: Arrays, alpha: float = ALPHA) -> pd.DataFrame:
    """Per track × query kind × horizon × estimator (not a baseline) × baseline (``against``):
    ``diff`` = ρ − ρ_baseline and the bootstrap interval of the difference (``low``, ``high``; the
    same resamples on both sides)."""
    base = [j for j, e in enumerate(a.estimators) if is_baseline(e)]
    rows = []
    for (track, kind), b in samples.items():
        point = corr[(corr.track == track) & (corr.query_kind == kind)].set_index(["horizon", "estimator"]).rho
        for j, e in enumerate(a.estimators):
            if is_baseline(e):
                continue
            for k in base:
                lo, hi = bootstrap_interval(b[..., j] - b[..., k], alpha)
                for i, h in enumerate(a.horizons):
                    rows.append({"track": track, "query_kind": kind, **a.at(h), "estimator": e,
                                 "against": a.estimators[k], "diff": point[(h, e)] - point[(h, a.estimators[k])],
                                 "low": float(lo[i]), "high": float(hi[i])})
    cols = ["track", "query_kind", "horizon", "label", "after", "estimator", "against", "diff", "low", "high"]
    return pd.DataFrame(rows, columns=cols)


def verdict(corr: pd.DataFrame, vs: pd.DataFrame) -> pd.DataFrame:
    """Per track × query kind × horizon: which estimators *predict* the measured effect — the
    bootstrap interval of ρ above 0 and of ρ − ρ_b above 0 for every baseline b. Columns: ``winner``
    (the one with the highest ρ; "" when none), ``others`` (the rest that predict), ``best`` (the
    winner, else the non-baseline estimator with the highest ρ), its ``rho, low, high`` and
    ``unbeaten`` (the baselines it does not clearly exceed), ``reference`` (the row invariance /
    reliability) and ``ceiling`` (its bound √ρ_rep / √R), ``best_baseline``, ``baseline_rho``,
    ``label``, ``after``."""
    rows = []
    for (track, kind, h), g in corr.groupby(["track", "query_kind", "horizon"], sort=False):
        est = g[~g.baseline & ~g.estimator.map(is_reference)].sort_values("rho", ascending=False, na_position="last")
        bl = g[g.baseline].sort_values("rho", ascending=False, na_position="last")
        v = vs[(vs.track == track) & (vs.query_kind == kind) & (vs.horizon == h)]
        lost = set(v[v.low <= 0].estimator)  # estimators some baseline is not clearly below (undefined ρ: no rival)
        win = est[(est.low > 0) & ~est.estimator.isin(lost)]
        top = win.iloc[0] if len(win) else (est.iloc[0] if len(est) else None)
        ref = g[g.estimator.isin(REFERENCES)]
        rows.append({"track": track, "query_kind": kind, "horizon": h, "label": g.label.iloc[0],
                     "after": g.after.iloc[0],
                     "winner": win.estimator.iloc[0] if len(win) else "", "others": list(win.estimator.iloc[1:]),
                     "best": None if top is None else top.estimator,
                     "unbeaten": [] if top is None else list(v[(v.estimator == top.estimator) & (v.low <= 0)].against),
                     **{k: (math.nan if top is None else float(top[k])) for k in ("rho", "low", "high")},
                     "reference": float(ref.rho.iloc[0]) if len(ref) else math.nan,
                     "ceiling": float(ref.bound.iloc[0]) if len(ref) else math.nan,
                     "best_baseline": bl.estimator.iloc[0] if len(bl) else None,
                     "baseline_rho": float(bl.rho.iloc[0]) if len(bl) else math.nan})
    return pd.DataFrame(rows)


def decay(a: Arrays) -> pd.DataFrame:
    """Per query kind × estimator (the row invariance included): the per-seed within-seed ρ at the
    first horizon against each later one, paired over seeds (``seedlab.stats.paired``: ``diff`` =
    mean ρ(first) − ρ(later), positive when it decays; ``ci_low, ci_high`` its t interval; ``p_t``
    and the sign-flip ``p_perm``). Pairs need both values; fewer than 2 seeds: no row."""
    rows = []
    names = [*a.estimators, ROW_INVARIANCE]
    for kind, v in _values(a).items():
        per_seed = np.concatenate([v["within"], v["invariance"][:, None]], axis=1)  # [H, E + 1, S]
        for j, e in enumerate(names):
            for i in range(1, len(a.horizons)):
                x, y = per_seed[0, j], per_seed[i, j]
                if np.count_nonzero(~(np.isnan(x) | np.isnan(y))) < 2:
                    continue
                t = paired(x, y)
                rows.append({"query_kind": kind, "estimator": e, "baseline": is_baseline(e),
                             **a.at(a.horizons[0], "from_"), **a.at(a.horizons[i], "to_"),
                             **{k: t[k] for k in ("n", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_t",
                                                  "p_perm")}})
    return pd.DataFrame(rows)


def sign_agreement(a: Arrays, alpha: float = ALPHA) -> pd.DataFrame:
    """Per query kind × horizon × estimator: the |Δ|-weighted sign agreement Σ|Δ|·[sign(est) =
    sign(Δ)] / Σ|Δ| over the (candidate, query) pairs of the kind in one seed (pairs where the
    estimate is 0 or missing left out; Δ = 0 weighs nothing), its mean over seeds (``sign``, with
    the t interval ``sign_low``, ``sign_high``), and ``base``: the same for always predicting the
    |Δ|-weighted majority sign of those pairs, max(Σ|Δ|·[Δ > 0], Σ|Δ|·[Δ < 0]) / Σ|Δ|."""
    X, M = a.X, a.M[:, :, None]  # [Q, H, E, S, C], [Q, H, 1, S, C]
    w = np.where(np.isnan(X) | (X == 0) | np.isnan(M), 0.0, np.abs(np.nan_to_num(M)))
    agree, up, down = (w * (np.sign(X) == np.sign(M)), w * (M > 0), w * (M < 0))
    rows = []
    for kind in dict.fromkeys(a.kinds):
        q = a.kinds == kind
        tot, hit = w[q].sum(axis=(0, -1)), agree[q].sum(axis=(0, -1))  # [H, E, S]
        with np.errstate(invalid="ignore", divide="ignore"):
            sign = np.where(tot > 0, hit / tot, np.nan)
            base = np.where(tot > 0, np.maximum(up[q].sum(axis=(0, -1)), down[q].sum(axis=(0, -1))) / tot, np.nan)
        for i, h in enumerate(a.horizons):
            for j, e in enumerate(a.estimators):
                m, lo, hi, n = mean_ci(sign[i, j], alpha)
                rows.append({"query_kind": kind, **a.at(h), "estimator": e, "baseline": is_baseline(e), "sign": m,
                             "sign_low": max(lo, 0.0), "sign_high": min(hi, 1.0), "base": mean_ci(base[i, j])[0],
                             "seeds": n})
    return pd.DataFrame(rows)


def calibration(a: Arrays, df: pd.DataFrame, resamples: int = RESAMPLES, seed: int = SEED,
                alpha: float = ALPHA) -> pd.DataFrame:
    """Per query kind × horizon × estimator whose unit is nats/token (not a baseline): ``slope``,
    the OLS slope of measured on estimate over every (seed, query of the kind, candidate), with the
    bootstrap interval over candidates (``low``, ``high``; 1 = the estimate's scale is the effect's);
    ``ratio``: the median of measured / estimate over those pairs (estimate ≠ 0), with its interval
    on the same resamples (``ratio_low``, ``ratio_high``); ``n`` the pairs. A ranking can survive
    while the magnitude is off many-fold: these say by how much."""
    units = df.drop_duplicates("estimator").set_index("estimator").unit
    idx = _counts(len(a.candidates), resamples, seed)[0]
    rows = []
    for j, e in enumerate(a.estimators):
        if is_baseline(e) or units.get(e) != UNIT:
            continue
        for kind in dict.fromkeys(a.kinds):
            q = a.kinds == kind
            for i, h in enumerate(a.horizons):
                x, m = a.X[q, i, j], a.M[q, i]  # [Qk, S, C]
                xb, mb = _take(x, idx).reshape(resamples, -1), _take(m, idx).reshape(resamples, -1)
                lo, hi = bootstrap_interval(slope_along(xb, mb), alpha)
                ok = ~np.isnan(x) & ~np.isnan(m) & (x != 0)
                with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a resample without a pair: NaN
                    ratios = np.nanmedian(np.where(~np.isnan(xb) & (xb != 0), mb / xb, np.nan), axis=-1)
                r_lo, r_hi = bootstrap_interval(ratios, alpha)
                rows.append({"query_kind": kind, **a.at(h), "estimator": e,
                             "slope": float(slope_along(x.ravel(), m.ravel())), "low": float(lo), "high": float(hi),
                             "ratio": float(np.median(m[ok] / x[ok])) if ok.any() else math.nan,
                             "ratio_low": float(r_lo), "ratio_high": float(r_hi), "n": int(ok.sum())})
    return pd.DataFrame(rows, columns=["query_kind", "horizon", "label", "after", "estimator", "slope", "low", "high",
                                       "ratio", "ratio_low", "ratio_high", "n"])


def effects(df: pd.DataFrame) -> pd.DataFrame:
    """Per horizon × query kind: mean |measured|, its median, the fraction of negative effects
    (the query's loss went down), over every ordinary (seed, candidate, query)."""
    m = _measured(df)
    g = m.assign(abs=m.measured.abs(), neg=m.measured < 0).groupby(["query_kind", "horizon", "label", "after"])
    return g.agg(mean_abs=("abs", "mean"), median_abs=("abs", "median"), negative=("neg", "mean"),
                 n=("measured", "size")).reset_index()


# ---------------------------------------------------------------- the design and its checks


@dataclass
class Design:
    """What attribution.parquet holds (:func:`design`)."""

    seeds: list[int]
    candidates: dict[str, int]  # ordinary candidates per kind, the most numerous first
    queries: dict[str, int]  # queries per kind, the candidates' own texts (self) left out
    self_queries: bool  # each candidate's own text is a query
    horizons: list[tuple[str, int]]  # (label, updates completed), in order
    estimators: list[str]  # in the frame's order


def design(df: pd.DataFrame) -> Design:
    """The seeds, candidates, queries, horizons and estimators of attribution.parquet's frame."""
    cands = _ordinary(df).drop_duplicates(["candidate"]).candidate_kind.value_counts()
    queries = df[df.query_kind != "self"].drop_duplicates(["query"]).query_kind.value_counts()
    hs = df.drop_duplicates("horizon").sort_values("horizon")
    return Design([int(s) for s in sorted(df.seed.unique())], {k: int(n) for k, n in cands.items()},
                  {k: int(n) for k, n in queries.items()}, bool((df.query_kind == "self").any()),
                  [(r.label, int(r.horizon)) for r in hs.itertuples()], list(dict.fromkeys(df.estimator)))


@dataclass
class Integrity:
    """What the bank showed of itself (:func:`integrity`)."""

    replica_seeds: list[str]  # seeds whose replica control ran
    replica_steps: tuple[int, int, int] | None  # the first such seed's steps compared: (how many, first, last)
    own_row_seeds: list[str]  # seeds whose own-row control ran
    control_measured_zero: bool  # every own-row control's measured effect is exactly 0 (False: none in the frame)
    control_estimates_zero: bool  # and every estimate of it
    stacked: dict | None = None  # how the runs trained in stacks (forks/stacked.py): arm_batch, the replica's position, the solo check; None: serially


def integrity(record: dict, df: pd.DataFrame) -> Integrity:
    """integrity.json's ``record`` (the bank's checks: replica and own-row controls, per seed) and,
    in attribution.parquet's frame, whether the own-row control's effect and estimates are exactly 0."""
    seeds = record.get("seeds", {})
    rep = [k for k, v in seeds.items() if "replica" in v]
    steps = seeds[rep[0]]["replica"]["steps_compared"] if rep else None
    ctrl = df[df.candidate_kind == "control"]
    stacked = None
    if str(record.get("arms", "")).startswith("stacked"):
        stacks = [v.get("stack", {}) for v in seeds.values()]
        stacked = {"arm_batch": max((s.get("arm_batch", 0) for s in stacks), default=0),
                   "replica_position": seeds[rep[0]]["replica"].get("position") if rep else None,
                   "solo_check": next((s["solo_check"] for s in stacks if "solo_check" in s), None)}
    return Integrity(rep, (len(steps), steps[0], steps[-1]) if steps else None,
                     [k for k, v in seeds.items() if "own_row" in v],
                     bool(len(ctrl)) and bool((ctrl.measured == 0).all()),
                     bool(len(ctrl)) and bool((ctrl.estimate == 0).all()), stacked)


def seconds_per_seed(seconds: dict[str, dict[str, float]]) -> dict[str, float]:
    """attribution.json's ``seconds`` ({estimator: {seed: seconds}}): each estimator's mean seconds
    per seed (an estimator without a timing left out)."""
    return {e: sum(per.values()) / len(per) for e, per in seconds.items() if per}
