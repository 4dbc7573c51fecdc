"""The grid over rows per batch B and peak lr: one summary per attributed bank, the table across
them, the law's prediction with a fixed ε_nl, and whether h* moves with B or with lr.

A grid cell (presets/attribution/grid.yaml with ``--set batch_size=B`` and, at lr 1e-3, ``--set peak_lr=1e-3
--set min_lr=1e-4``) has row weight 1 only, so no weighted.parquet; :func:`weight_one` builds that frame from
measured.parquet's (or attribution.parquet's) rows at w = 1, so attribution/analyses/size.py runs on it unchanged (with one
weight its convergence slope is NaN and its regime is "at least" or "below": both need two weights, and so does
its ε_nl, which interpolates between the regime's largest weight and the next — NaN for every grid cell).

**Per cell** (:func:`summarise`, one attributed bank folder; :class:`Cell`):

- the scalars: B (``batch_size``), ``peak_lr``, ``min_lr``, the attributed ``seeds``, s (``injection_step``);
  λ with its t interval over seeds (attribution/analyses/chaos.py ``cell_rate``); ε = ‖θ_c − θ_twin‖₂ at w = 1 at the first
  recorded step after s (``epsilon_after``; size.py ``epsilon``) with its seed-bootstrap interval;
- ``size`` (:data:`SIZE`), per query kind: size.py's h*(w = 1) row — ``bent_label, bent_after`` the first horizon
  with ē(1) = ‖measured/1 − U0‖/‖U0‖ > τ_e (``unroll-tangent`` as U0), ``bent_previous_after`` the horizon before
  it (0 for the first), ``last_after``; ``size_status, size_label, size_after`` h*(1) by size.py's rule (ρ̄ ≥ τ_ρ
  with its seed interval above 0); the cell's own ``eps_nl, eps_nl_low, eps_nl_high, eps_nl_horizons`` (size.py
  ``scales``: NaN with one weight); and ``eps_bent``, descriptive only: the w = 1 arms' distance D(1, h) (per seed
  the median over its candidates' arms, then the median over seeds) at which ē(1, h) crosses τ_e, ln ē interpolated
  linearly in ln D between the last horizon within and the first beyond (size.py ``crossing`` along the horizons;
  NaN when ē is beyond τ_e at the first horizon or never; no interval). Along horizons the distance grows at the
  cell's own rate, so the law with eps_bent in place of ε_nl would reproduce the bend by construction: eps_bent is
  for comparing the scale of the bend across cells, not for testing the law;
- ``errors`` (:data:`ERRORS`), per query kind × horizon: ē(1) with its seed interval, ρ̄(measured, U0) with its
  seed interval (size.py ``summary`` at w = 1) and ``distance`` D(1, h);
- ``responses`` (:data:`RESPONSES`): horizon.py's ``table`` — per track × query kind × horizon, ρ(measured, r) for
  every exact response r (``against`` = "measured", ``compared`` = r), the row invariance ρ_rep (``compared`` =
  "row invariance"; across seeds the reliability) and its ceiling √ρ_rep (``compared`` = "ceiling"), and ρ(unroll,
  e) for every other estimator (``against`` = "unroll"); ``rho, low, high`` (percentile interval over candidates),
  ``se_seeds`` (jackknife over seeds), ``baseline``;
- ``h_star`` (:data:`H_STAR`), per exact response × query kind: horizon.py's h* by the verdict's rule with its
  joint seed × candidate interval — ``status`` ("reached", "not reached", "undefined"), ``label, after`` ("" and
  NaN unless reached), ``previous_after`` (the horizon before h*, 0 for the first; the crossing lies in
  (previous_after, after]), ``ordinal`` (h*'s position among the horizons, ``horizons`` when not reached, NaN when
  undefined), ``rho, low, high`` there, ``unbeaten`` (what it does not clearly exceed, "; "-joined), ``low_label,
  high_label, low_after, high_after`` (the interval's ends), ``reached``, ``tau_label`` (the first horizon with
  ρ < τ), ``last_label, last_after``;
- ``estimators`` (:data:`ESTIMATORS`): stats.py ``correlations`` of every estimator with the measured effect (the
  kind baseline added) — per track × query kind × horizon × estimator ``rho, low, high, se_seeds, bound``,
  ``baseline`` and ``reference`` (stats.py ``is_reference``: the row invariance, the reliability, the responses).

:meth:`Cell.to_dir` keeps a cell as CSV files and ``cell.json`` (the scalars and each stage's wall time) so the
summary outlives its bank folder; :meth:`Cell.from_dir` reads it back exactly (seedlab/cells.py ``Summary``, the
mechanism the twins' scale cells share: this module declares the frames, their column types and the scalars).

**Across cells:**

- :func:`table` (:data:`TABLE_HEAD`): one row per cell × query kind — B, lr, λ, ε, the bend (``bent_*``), unroll's h*
  (``h_star_*``: status, label, its bracket and its joint interval's ends), ρ(measured, unroll) at every horizon
  (``unroll@<label>`` with ``_low``, ``_high``), ρ_rep and √ρ_rep at the first and the last horizon, and at the
  last horizon the best estimator that is neither a reference nor a baseline (``best``) and the best baseline
  (``best_baseline``), each with its ρ and interval;
- :func:`law` (:data:`LAW`): per cell × query kind the law of attribution/analyses/chaos.py, h_pred − s = after₀ +
  ln(ε_nl/ε)/λ, with its interval over the corners of the intervals of λ, ε and ε_nl (chaos.py ``prediction``),
  ε_nl **fixed** from a reference (a size-axis bank's ``scales``: :func:`scales_of`, :func:`read_reference`) —
  not the cell's own, which would be circular at w = 1 — beside the cell's bend bracket (bent_previous_after,
  bent_after] and unroll's h* bracket (previous_after, h*] ((last horizon, ∞) when not reached), and
  ``consistent_bent``, ``consistent`` exactly as chaos.py ``compare`` defines them (chaos.py ``meets``);
- :func:`effect_of` (:data:`EFFECT`): per query kind, unroll's h* as an ordinal horizon ("not reached" after the
  last) along B at each lr and along lr at each B, its ``direction`` ("later", "earlier", "flat" as the level
  grows, "not monotone", "n/a" with fewer than two defined; "censored" when the only neighbours are both "not
  reached", which is bounded below and so says nothing about the direction), and a summary row per kind and axis (``fixed`` NaN:
  the direction shared by every row of that axis, else "mixed"), with the kind's ``answer``: "1/B effect" (h*
  moves monotonically with B, the same way at every lr, and not with lr), "lr effect", "both", "neither" or
  "n/a". Descriptive: no test.

attribution/report/grid.py words the frames; experiments/attribution_grid.py runs the grid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from seedlab.attribution.analyses import chaos, horizon, size, stats
from seedlab.attribution.bank.config import AttributeConfig
from seedlab.attribution.bank.rundir import Attributed, CellSummaryDir, read_attributed
from seedlab.attribution.analyses.stats import ALPHA, RESAMPLES, ROW_INVARIANCE, SEED, TANGENT, UNROLL
from seedlab.cells import Columns, Summary
from seedlab.config import parse
from seedlab.errors import SeedlabError

NOT_REACHED = horizon.NOT_REACHED
#: measure.py's WEIGHTED_COLUMNS (size.py's copy: measure.py loads torch, this module does not)
WEIGHTED_COLUMNS = size.WEIGHTED
CEILING = horizon.CEILING
NA = "n/a"  # a string column's value where the number behind it was not measured (no unroll-tangent: no bend)
WEIGHT = 1.0  # the grid's only row weight
#: λ's common window s+1 .. s+WINDOW, every step of it (no saturation cut): the default fit ends where a nudge first
#: reaches a tenth of its maximum over the *recorded* steps, often after 3-10 points dominated by the nudge's first
#: jumps, so one prefix gave λ 0.44 over 100 recorded updates, 1.23 cut at s+20 and 1.66 in a 30-update cell; the
#: straight fit over s+1 .. s+20 gave 0.385 and 0.345 on that prefix (runs/attribution-size8 seeds 0-3, runs/grid/b8-lr1e-2)
WINDOW = 20

SIZE = ["query_kind", "bent_label", "bent_after", "bent_previous_after", "last_after", "size_status", "size_label",
        "size_after", "eps_nl", "eps_nl_low", "eps_nl_high", "eps_nl_horizons", "eps_bent"]
ERRORS = ["query_kind", "horizon", "label", "after", "error", "error_low", "error_high", "rho", "rho_low", "rho_high",
          "distance"]
RESPONSES = ["track", "query_kind", "horizon", "label", "after", "against", "compared", "baseline", "rho", "low",
             "high", "se_seeds"]
H_STAR = ["response", "query_kind", "status", "label", "after", "previous_after", "ordinal", "horizons", "rho", "low",
          "high", "unbeaten", "low_label", "high_label", "low_after", "high_after", "reached", "tau_label",
          "last_label", "last_after"]
ESTIMATORS = ["track", "query_kind", "horizon", "label", "after", "estimator", "baseline", "reference", "rho", "low",
              "high", "se_seeds", "bound"]
TOPICS = {"size": SIZE, "errors": ERRORS, "responses": RESPONSES, "h_star": H_STAR, "estimators": ESTIMATORS}
#: each topic's column types (the rest are float): what makes a CSV read back exactly
COLUMNS = Columns(strings=frozenset({"query_kind", "bent_label", "size_status", "size_label", "label", "track",
                                     "against", "compared", "response", "status", "unbeaten", "low_label",
                                     "high_label", "tau_label", "last_label", "estimator"}),
                  ints=frozenset({"eps_nl_horizons", "horizon", "horizons"}),
                  bools=frozenset({"baseline", "reference"}))
SCALARS = ["name", "batch_size", "peak_lr", "min_lr", "seeds", "injection_step", "candidates", "rate", "rate_low",
           "rate_high", "window", "rate_window", "rate_window_low", "rate_window_high", "epsilon", "epsilon_low", "epsilon_high", "epsilon_after", "alpha", "threshold", "tolerance",
           "source", "stages"]

TABLE_HEAD = ["cell", "batch_size", "peak_lr", "seeds", "query_kind", "rate", "rate_low", "rate_high", "window",
              "rate_window", "rate_window_low", "rate_window_high", "epsilon",
              "epsilon_low", "epsilon_high", "epsilon_after", "bent_label", "bent_previous_after", "bent_after",
              "h_star_status", "h_star_label", "h_star_previous_after", "h_star_after", "h_star_index",
              "h_star_low_label", "h_star_high_label", "horizons", "last_after", "first_label", "last_label",
              "invariance_first", "invariance_first_low", "invariance_first_high", "ceiling_first", "invariance_last",
              "invariance_last_low", "invariance_last_high", "ceiling_last", "best", "best_rho", "best_low",
              "best_high", "best_baseline", "best_baseline_rho", "best_baseline_low", "best_baseline_high"]
#: :func:`table`'s columns are TABLE_HEAD, then per horizon label in order ``unroll@<label>``, ``unroll@<label>_low``,
#: ``unroll@<label>_high``
LAW = ["cell", "batch_size", "peak_lr", "query_kind", "rate", "rate_low", "rate_high", "epsilon", "epsilon_low",
       "epsilon_high", "epsilon_after", "eps_nl", "eps_nl_low", "eps_nl_high", "source", "predicted", "predicted_low",
       "predicted_high", "bent_label", "bent_previous_after", "bent_after", "consistent_bent", "status",
       "h_star_label", "previous_after", "h_star_after", "consistent", "last_after"]
EFFECT = ["query_kind", "along", "fixed", "levels", "labels", "ordinals", "direction", "monotone", "answer"]


# ---------------------------------------------------------------- one cell


def weight_one(measured: pd.DataFrame) -> pd.DataFrame:
    """weighted.parquet's frame (measure.py :data:`~seedlab.attribution.bank.measure.WEIGHTED_COLUMNS`) of a bank whose
    only weight is 1: measured.parquet's rows (ordinary candidates and controls; attribution.parquet's frame does as
    well, one row per seed × candidate × query × horizon kept) with ``weight`` = 1.0."""
    need = [c for c in WEIGHTED_COLUMNS if c != "weight"]
    missing = [c for c in need if c not in measured]
    if missing:
        raise SeedlabError(f"measured.parquet: columns {missing} are missing")
    m = measured.drop_duplicates(["seed", "candidate", "query", "horizon"])
    return m.assign(weight=WEIGHT)[WEIGHTED_COLUMNS].reset_index(drop=True)


@dataclass
class Cell(Summary, scalars=SCALARS, frames=TOPICS, columns=COLUMNS, noun="kept grid cell summary"):
    """One attributed bank's summary (module doc; the frames' columns :data:`TOPICS`)."""

    name: str
    batch_size: int
    peak_lr: float
    min_lr: float
    seeds: list[int]
    injection_step: int
    candidates: int  # ordinary candidates
    rate: float  # λ per update, with its t interval over seeds
    rate_low: float
    rate_high: float
    window: int  # λ once more on every step of s+1 .. s+window (chaos.py ``last``, fraction 1): comparable across lengths
    rate_window: float
    rate_window_low: float
    rate_window_high: float
    epsilon: float  # ε(w = 1) at s + epsilon_after, with its seed-bootstrap interval
    epsilon_low: float
    epsilon_high: float
    epsilon_after: float
    alpha: float
    threshold: float  # τ of horizon.py's descriptive crossing (attribute.h_star_rho)
    tolerance: float  # τ_e of size.py
    size: pd.DataFrame
    errors: pd.DataFrame
    responses: pd.DataFrame
    h_star: pd.DataFrame
    estimators: pd.DataFrame
    source: str = ""  # the bank folder summarised
    stages: dict[str, float] = field(default_factory=dict)  # wall seconds per stage (the driver's)

    def eps_nl(self) -> dict[str, tuple[float, float, float]]:
        """This cell's own ε_nl per query kind, for :func:`law` when this cell is the reference (a kept summary of a
        size-axis bank); kinds without one left out."""
        return {r.query_kind: (r.eps_nl, r.eps_nl_low, r.eps_nl_high) for r in self.size.itertuples()
                if not math.isnan(r.eps_nl)}


def _float(v) -> float:
    return math.nan if v is None else float(v)


def _distance_at(distances: pd.DataFrame | None, seeds: list[int], horizons: list[int]) -> np.ndarray:
    """D(1, h) [H]: per seed the median over its candidates' arms at w = 1 of the distance at each horizon (size.py
    ``distance_at``), then the median over seeds; NaN without such arms."""
    if distances is None or not len(distances):
        return np.full(len(horizons), np.nan)
    d = distances[(distances.kind == "candidate") & (distances.weight == WEIGHT) & distances.seed.isin(seeds)]
    if not len(d):
        return np.full(len(horizons), np.nan)
    at = size.distance_at(d, horizons)
    per = at.groupby(["seed", "step"]).distance.median()
    return per.groupby("step").median().reindex(horizons).to_numpy(np.float64)


def summarise(a: Attributed, name: str, *, resamples: int = RESAMPLES, seed: int = SEED,
              alpha: float = ALPHA) -> Cell:
    """One attributed bank folder's :class:`Cell` (module doc). The bank's row weights beyond 1 (a size-axis bank)
    are used for its ε_nl; everything else is at w = 1."""
    df, c = a.df, a.config
    tau = parse(AttributeConfig, c.get("attribute", {}), "attribute").h_star_rho
    ordinary = df[df.candidate_kind != "control"]
    if not len(ordinary):
        raise SeedlabError(f"{a.dir.root}: attribution.parquet has no ordinary candidate")
    seeds = sorted(int(v) for v in ordinary.seed.unique())
    afters = ordinary.drop_duplicates("horizon").sort_values("horizon")
    horizons = list(afters.horizon.astype(int))
    after_of = dict(zip(horizons, afters.after, strict=True))
    lr = horizon.linear_response(df, threshold=tau, resamples=resamples, seed=seed, alpha=alpha)
    corr = stats.correlations(stats.Arrays.of(stats.with_kind_baseline(df)), resamples, seed, alpha)[0]
    dist = a.distances if a.distances is not None and len(a.distances) else None
    rate = windowed = (math.nan,) * 3
    if dist is not None and (dist.kind == "nudge").any():
        rate = chaos.analyse(dist, alpha=alpha).cell_rate
        if int(dist.after.max()) >= WINDOW:
            windowed = chaos.analyse(dist, alpha=alpha, last=WINDOW, fraction=1.0).cell_rate  # no saturation cut
    kinds = list(dict.fromkeys(ordinary.query_kind))
    size_rows, error_rows = [], []
    eps = (math.nan, math.nan, math.nan, math.nan)
    if (df.estimator == TANGENT).any():
        weighted = a.weighted if a.weighted is not None else weight_one(df)
        sz = size.analyse(weighted, df, dist, resamples=resamples, seed=seed, alpha=alpha)
        tolerance = sz.tolerance
        e = sz.epsilon[sz.epsilon.weight == WEIGHT]
        if len(e):
            eps = (float(e.epsilon.iloc[0]), float(e.low.iloc[0]), float(e.high.iloc[0]), float(e.after.iloc[0]))
        D = _distance_at(dist, seeds, horizons)
        scales = sz.scales.set_index("query_kind")
        for r in sz.h_star[sz.h_star.weight == WEIGHT].itertuples():
            s = sz.summary[(sz.summary.query_kind == r.query_kind) & (sz.summary.weight == WEIGHT)]
            s = s.set_index("horizon").reindex(horizons)
            err = s.error.to_numpy(np.float64)
            bent = float(size.crossing(err, D, tolerance)) if len(horizons) else math.nan
            n = scales.loc[r.query_kind] if r.query_kind in scales.index else None
            size_rows.append({"query_kind": r.query_kind, "bent_label": r.bent_label, "bent_after": r.bent_after,
                              "bent_previous_after": r.bent_previous_after, "last_after": r.last_after,
                              "size_status": r.status, "size_label": r.label, "size_after": r.after,
                              "eps_nl": math.nan if n is None else n.eps_nl,
                              "eps_nl_low": math.nan if n is None else n.low,
                              "eps_nl_high": math.nan if n is None else n.high,
                              "eps_nl_horizons": 0 if n is None else int(n.horizons), "eps_bent": bent})
            for i, h in enumerate(horizons):
                t = s.loc[h]
                error_rows.append({"query_kind": r.query_kind, "horizon": h, "label": t.label, "after": t.after,
                                   "error": t.error, "error_low": t.error_low, "error_high": t.error_high,
                                   "rho": t.rho, "rho_low": t.rho_low, "rho_high": t.rho_high, "distance": D[i]})
    else:
        tolerance = size.TOLERANCE
        if dist is not None:
            e = size.epsilon(dist, seeds, size.seed_draws(len(seeds), resamples, seed), alpha)
            e = e[e.weight == WEIGHT]
            if len(e):
                eps = (float(e.epsilon.iloc[0]), float(e.low.iloc[0]), float(e.high.iloc[0]), float(e.after.iloc[0]))
        size_rows = [{"query_kind": k, "bent_label": NA, "size_status": NA, "last_after": float(after_of[horizons[-1]]),
                      "eps_nl_horizons": 0} for k in kinds]  # no U0: no bend measured
    star_rows = []
    H = len(horizons)
    for r in lr.h_star.itertuples():
        i = horizons.index(int(r.horizon)) if r.status == "reached" else H if r.status == NOT_REACHED else math.nan
        previous = (float(after_of[horizons[i - 1]]) if i else 0.0) if r.status == "reached" else math.nan
        star_rows.append({"response": r.response, "query_kind": r.query_kind, "status": r.status, "label": r.label,
                          "after": r.after, "previous_after": previous, "ordinal": i, "horizons": H, "rho": r.rho,
                          "low": r.low, "high": r.high, "unbeaten": "; ".join(r.unbeaten), "low_label": r.low_label,
                          "high_label": r.high_label, "low_after": r.low_after, "high_after": r.high_after,
                          "reached": r.reached, "tau_label": r.tau_label, "last_label": r.last_label,
                          "last_after": float(after_of[horizons[-1]])})
    estimators = corr.assign(reference=corr.estimator.map(stats.is_reference))
    return Cell(name=name, batch_size=int(c["batch_size"]), peak_lr=float(c["peak_lr"]),
                min_lr=_float(c.get("min_lr")), seeds=seeds, injection_step=int(c["injection_step"]),
                candidates=int(ordinary.candidate.nunique()), rate=rate[0], rate_low=rate[1], rate_high=rate[2],
                window=WINDOW, rate_window=windowed[0], rate_window_low=windowed[1], rate_window_high=windowed[2],
                epsilon=eps[0], epsilon_low=eps[1], epsilon_high=eps[2], epsilon_after=eps[3], alpha=alpha,
                threshold=tau, tolerance=tolerance, size=COLUMNS.typed(pd.DataFrame(size_rows), SIZE),
                errors=COLUMNS.typed(pd.DataFrame(error_rows), ERRORS),
                responses=COLUMNS.typed(lr.table, RESPONSES), h_star=COLUMNS.typed(pd.DataFrame(star_rows), H_STAR),
                estimators=COLUMNS.typed(estimators, ESTIMATORS),
                source=str(a.dir.root))


# ---------------------------------------------------------------- across cells


def _one(frame: pd.DataFrame, **keys) -> pd.Series | None:
    m = np.ones(len(frame), dtype=bool)
    for k, v in keys.items():
        m &= (frame[k] == v).to_numpy()
    return frame[m].iloc[0] if m.any() else None


def _kinds(cell: Cell) -> list[str]:
    return list(dict.fromkeys([*cell.h_star.query_kind, *cell.size.query_kind, *cell.responses.query_kind]))


def _labels(cells: Sequence[Cell]) -> list[str]:
    """Every horizon label of the cells, in the order of its updates after s."""
    r = pd.concat([c.estimators[["label", "after"]] for c in cells] + [pd.DataFrame(columns=["label", "after"])])
    return list(r.sort_values("after", kind="stable").drop_duplicates("label").label)


def table(cells: Sequence[Cell]) -> pd.DataFrame:
    """The cross-cell table: one row per cell × query kind (module doc; columns :data:`TABLE_HEAD`, then
    ``unroll@<label>``, ``unroll@<label>_low``, ``unroll@<label>_high`` per horizon label in order)."""
    labels = _labels(cells)
    rows = []
    for c in cells:
        resp = c.responses[(c.responses.track == "within") & (c.responses.against == horizon.MEASURED)]
        est = c.estimators[c.estimators.track == "within"]
        order = est.drop_duplicates("horizon").sort_values("horizon")  # every horizon, unroll or not
        first, last = (order.iloc[0], order.iloc[-1]) if len(order) else (None, None)
        for kind in _kinds(c):
            row = {"cell": c.name, "batch_size": c.batch_size, "peak_lr": c.peak_lr, "seeds": len(c.seeds),
                   "query_kind": kind, "rate": c.rate, "rate_low": c.rate_low, "rate_high": c.rate_high,
                   "window": c.window, "rate_window": c.rate_window, "rate_window_low": c.rate_window_low,
                   "rate_window_high": c.rate_window_high,
                   "epsilon": c.epsilon, "epsilon_low": c.epsilon_low, "epsilon_high": c.epsilon_high,
                   "epsilon_after": c.epsilon_after}
            sz = _one(c.size, query_kind=kind)
            row.update(bent_label=NA if sz is None else sz.bent_label,
                       bent_previous_after=math.nan if sz is None else sz.bent_previous_after,
                       bent_after=math.nan if sz is None else sz.bent_after)
            st = _one(c.h_star, response=UNROLL, query_kind=kind)
            row.update(h_star_status="undefined" if st is None else st.status,
                       h_star_label="" if st is None else st.label,
                       h_star_previous_after=math.nan if st is None else st.previous_after,
                       h_star_after=math.nan if st is None else st.after,
                       h_star_index=math.nan if st is None else st.ordinal,
                       h_star_low_label="" if st is None else st.low_label,
                       h_star_high_label="" if st is None else st.high_label,
                       horizons=len(order), last_after=math.nan if last is None else float(last.after),
                       first_label="" if first is None else first.label, last_label="" if last is None else last.label)
            for end, h in (("first", first), ("last", last)):
                inv = None if h is None else _one(resp, query_kind=kind, horizon=h.horizon, compared=ROW_INVARIANCE)
                ceil = None if h is None else _one(resp, query_kind=kind, horizon=h.horizon, compared=CEILING)
                row.update({f"invariance_{end}": math.nan if inv is None else inv.rho,
                            f"invariance_{end}_low": math.nan if inv is None else inv.low,
                            f"invariance_{end}_high": math.nan if inv is None else inv.high,
                            f"ceiling_{end}": math.nan if ceil is None else ceil.rho})
            at = est[(est.query_kind == kind) & (est.horizon == (last.horizon if last is not None else -1))
                     & ~est.reference]
            for key, g in (("best", at[~at.baseline]), ("best_baseline", at[at.baseline])):
                g = g.sort_values("rho", ascending=False, na_position="last")
                top = g.iloc[0] if len(g) and not math.isnan(g.rho.iloc[0]) else None
                row.update({key: "" if top is None else top.estimator,
                            f"{key}_rho": math.nan if top is None else top.rho,
                            f"{key}_low": math.nan if top is None else top.low,
                            f"{key}_high": math.nan if top is None else top.high})
            for label in labels:
                u = _one(resp, query_kind=kind, compared=UNROLL, label=label)
                row.update({f"unroll@{label}": math.nan if u is None else u.rho,
                            f"unroll@{label}_low": math.nan if u is None else u.low,
                            f"unroll@{label}_high": math.nan if u is None else u.high})
            rows.append(row)
    columns = [*TABLE_HEAD, *(f"unroll@{label}{end}" for label in labels for end in ("", "_low", "_high"))]
    return pd.DataFrame(rows, columns=columns)


def scales_of(axis: size.SizeAxis) -> dict[str, tuple[float, float, float]]:
    """A size-axis bank's ε_nl per query kind (size.py ``scales``): {kind: (eps_nl, low, high)}, kinds without
    one left out."""
    return {r.query_kind: (r.eps_nl, r.low, r.high) for r in axis.scales.itertuples() if not math.isnan(r.eps_nl)}


def read_reference(path: str | Path) -> tuple[dict[str, tuple[float, float, float]], str]:
    """The fixed ε_nl of :func:`law` and where it came from: a kept cell summary (``cell.json``: its own ε_nl) or an
    attributed size-axis bank folder (weighted.parquet: size.analyse's ``scales``). One line when neither holds one."""
    p = Path(path)
    if CellSummaryDir(p).record.is_file():
        out, what = Cell.from_dir(p).eps_nl(), f"the kept summary {p}"
    else:
        a = read_attributed(p)
        if a.weighted is None:
            raise SeedlabError(f"{p}: no weighted.parquet (the reference must be a size-axis bank, with row weights)")
        out, what = scales_of(size.analyse(a.weighted, a.df, a.distances)), f"the size-axis bank {p}"
    if not out:
        raise SeedlabError(f"{p}: no ε_nl for any query kind (the size axis never bends between two weights there)")
    return out, what


def _law_rate(c: Cell, windowed: bool) -> tuple[float, float, float]:
    """λ of :func:`law`: the common-window fit when asked and measured, else the default one."""
    if windowed and not math.isnan(c.rate_window):
        return c.rate_window, c.rate_window_low, c.rate_window_high
    return c.rate, c.rate_low, c.rate_high


def law(cells: Sequence[Cell], eps_nl: Mapping[str, tuple[float, float, float]], source: str = "", *,
        windowed: bool = True) -> pd.DataFrame:
    """The law's prediction per cell × query kind with ε_nl fixed from ``eps_nl`` ({kind: (eps_nl, low, high)}, a
    reference's; a kind it lacks: NaN, consistent None), beside the cell's brackets (module doc; columns
    :data:`LAW`, ``source`` naming the reference). λ: the common-window fit (``rate_window``, comparable across
    cells of different lengths) where ``windowed`` and measured, else the cell's default fit; ``rate`` in the frame
    is the one used."""
    rows = []
    for c in cells:
        for kind in _kinds(c):
            n = eps_nl.get(kind, (math.nan,) * 3)
            lam = _law_rate(c, windowed)
            p, lo, hi = chaos.prediction(lam, (c.epsilon, c.epsilon_low, c.epsilon_high),
                                         tuple(float(v) for v in n), c.epsilon_after)
            sz, st = _one(c.size, query_kind=kind), _one(c.h_star, response=UNROLL, query_kind=kind)
            last = float(sz.last_after) if sz is not None else float(st.last_after) if st is not None else math.nan
            bent_prev, bent_after = (math.nan, math.nan) if sz is None else (sz.bent_previous_after, sz.bent_after)
            bent = None if sz is None or sz.bent_label == NA else chaos.bent_bracket(bent_prev, bent_after, last)
            status = "undefined" if st is None else st.status
            h = None if st is None else chaos.bracket(status, st.previous_after, st.after, st.last_after)
            rows.append({"cell": c.name, "batch_size": c.batch_size, "peak_lr": c.peak_lr, "query_kind": kind,
                         "rate": lam[0], "rate_low": lam[1], "rate_high": lam[2], "epsilon": c.epsilon,
                         "epsilon_low": c.epsilon_low, "epsilon_high": c.epsilon_high,
                         "epsilon_after": c.epsilon_after, "eps_nl": float(n[0]), "eps_nl_low": float(n[1]),
                         "eps_nl_high": float(n[2]), "source": source, "predicted": p, "predicted_low": lo,
                         "predicted_high": hi, "bent_label": NA if sz is None else sz.bent_label,
                         "bent_previous_after": bent_prev, "bent_after": bent_after,
                         "consistent_bent": chaos.meets((lo, hi), bent), "status": status,
                         "h_star_label": "" if st is None else st.label,
                         "previous_after": math.nan if st is None else st.previous_after,
                         "h_star_after": math.nan if st is None else st.after,
                         "consistent": chaos.meets((lo, hi), h), "last_after": last})
    return pd.DataFrame(rows, columns=LAW)


def direction(index: Sequence[float], censored: float | None = None) -> str:
    """How an ordinal h* moves as the level grows: "later", "earlier", "flat", "not monotone"; "n/a" with fewer than
    two defined values (NaN left out). ``censored``: the ordinal of "not reached" (h* after the last horizon, so
    only bounded below): two neighbours both censored say nothing about the direction (not "flat"), a censored one
    after a reached one is later, before it earlier; "censored" when no neighbouring pair is determined but some
    are both censored."""
    v = [x for x in index if not math.isnan(x)]
    if len(v) < 2:
        return "n/a"
    signs, both = [], False
    for a, b in zip(v[:-1], v[1:]):
        if censored is not None and a == censored and b == censored:
            both = True
            continue
        signs.append(float(np.sign(b - a)))
    if not signs:
        return "censored" if both else "n/a"
    if all(x == 0 for x in signs):
        return "flat"
    return "later" if all(x >= 0 for x in signs) else "earlier" if all(x <= 0 for x in signs) else "not monotone"


def _shared(directions: list[str]) -> str:
    known = [d for d in directions if d not in ("n/a", "censored")]
    if not known:
        return "n/a"
    return known[0] if len(set(known)) == 1 else "mixed"


def effect_of(t: pd.DataFrame) -> pd.DataFrame:
    """Is unroll's h* a 1/B effect, an lr effect, or neither (module doc): from :func:`table`'s frame, per query
    kind, h*'s ordinal along B at each lr and along lr at each B, and a summary row per axis (columns
    :data:`EFFECT`)."""
    rows = []
    for kind, g in t.groupby("query_kind", sort=False):
        summary = {}
        for along, col, other in (("B", "batch_size", "peak_lr"), ("lr", "peak_lr", "batch_size")):
            dirs = []
            for fixed, h in g.groupby(other, sort=True):
                h = h.sort_values(col)
                labels = tuple(r.h_star_label if r.h_star_status == "reached" else r.h_star_status
                               for r in h.itertuples())
                d = direction(list(h.h_star_index), float(h.horizons.max()) if "horizons" in h and len(h) else None)
                dirs.append(d)
                rows.append({"query_kind": kind, "along": along, "fixed": float(fixed),
                             "levels": tuple(h[col].tolist()), "labels": labels,
                             "ordinals": tuple(float(v) for v in h.h_star_index), "direction": d,
                             "monotone": d in ("later", "earlier", "flat")})
            summary[along] = _shared(dirs)
            rows.append({"query_kind": kind, "along": along, "fixed": math.nan, "levels": (), "labels": (),
                         "ordinals": (), "direction": summary[along], "monotone": summary[along] in ("later", "earlier",
                                                                                                   "flat")})
        moves = {k: v in ("later", "earlier") for k, v in summary.items()}
        answer = ("n/a" if all(v == "n/a" for v in summary.values()) else "both" if all(moves.values())
                  else "1/B effect" if moves["B"] else "lr effect" if moves["lr"] else "neither")
        for r in rows:
            if r["query_kind"] == kind:
                r["answer"] = answer
    return pd.DataFrame(rows, columns=EFFECT)
