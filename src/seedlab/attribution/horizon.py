"""The linear-response horizon (issue 20 §1): how far the exact first-order counterfactual carries.

The estimator :data:`UNROLL` (``unroll``, label "reference", nats/token) is the exact first-order
response to the candidate: the one-step change of the weights at s carried through the twin's
actual steps s+1 .. h with forward-mode JVPs, read out on the query's loss at h — so, unlike the
estimators at θ_s, its estimate differs per horizon. It splits what an estimator loses against the
measured effect in two:

- ρ(measured, unroll) (``compared`` = :data:`MEASURED`): what is lost to nonlinearity and chaos,
  which no first-order method recovers;
- ρ(unroll, e) (``compared`` = e) for every other estimator e in the frame (baselines included,
  the derived kind baseline not): what e loses to its own approximations — the Spearman of e's
  estimate with unroll's over candidates;

beside the reference of the track, which does not involve unroll: the replicate floor
Spearman(measured, measured_replicate) within seed and the Spearman–Brown reliability R of the
seed-mean measured effect across seeds (attribution/stats.py :data:`~seedlab.attribution.stats.REPLICATE`,
:data:`~seedlab.attribution.stats.RELIABILITY`).

Both tracks are attribution/stats.py's, computed by its :func:`~seedlab.attribution.stats.correlations`
(ρ(unroll, e) on :meth:`Arrays.against <seedlab.attribution.stats.Arrays.against>`: unroll's
estimate in the place of the measured effect): within seed, per seed, query and horizon the
Spearman over the ordinary candidates (own-row controls left out), averaged over the kind's
queries and then the seeds; across seeds, the Spearman of the two seed-means per query and
horizon, averaged over the kind's queries. Intervals: the percentile interval of the same seeded
bootstrap resamples of candidates as stats.py's (same count, same seed: every number here is
paired with every other and with the report's correlations); ``se_seeds`` the jackknife over seeds
(none for the reliability).

**h\\*.** Per query kind, on the within-seed track: h* = the first horizon h (in order) with
ρ(measured, unroll)(h) < τ, τ = ``attribute.h_star_rho`` fixed before looking; horizons where ρ is
undefined (a constant side, too few candidates) are skipped; "not reached" when no horizon is
below τ, "undefined" when ρ is defined at none. Its interval: h* of every bootstrap resample (the
resample's ρ at every horizon, one resample of candidates for all horizons), "not reached" ranked
after the last horizon, and the α/2 and 1 − α/2 quantiles of that ordinal distribution by the
inverted empirical CDF (each end a horizon or "not reached", never between two). At h* the
replicate floor (with its interval) says how much of the measured effect is reproducible at all:
a floor above τ means the linear response fails while the effect is still the candidate's; a
floor below τ means nothing at that horizon is predictable from the candidate alone.

:func:`linear_response` computes all of it, :func:`horizon_sentence` words the answer and
:func:`linear_response_section` the report's section (figure: attribution/figures.py
``linear_response_figure``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby

import numpy as np
import pandas as pd

from seedlab.attribution.stats import (
    ALPHA,
    REFERENCES,
    RELIABILITY,
    REPLICATE,
    RESAMPLES,
    SEED,
    Arrays,
    correlations,
)
from seedlab.errors import SeedlabError
from seedlab.reporting import fmt_ci, md_table

UNROLL = "unroll"  # the exact first-order counterfactual's estimator name in attribution.parquet
MEASURED = "measured"  # ``compared`` of ρ(measured, unroll)
RUN_IT = "seedlab attribution attribute DIR --estimator unroll --add"
COLUMNS = ["track", "query_kind", "horizon", "label", "after", "compared", "baseline", "rho", "low", "high",
           "se_seeds", "seeds", "candidates", "queries"]
H_STAR = ["query_kind", "status", "horizon", "label", "after", "rho", "low_label", "high_label", "low_after",
          "high_after", "reached", "floor", "floor_low", "floor_high", "last_label"]


@dataclass
class LinearResponse:
    """What :func:`linear_response` found (empty frames when the frame holds no :data:`UNROLL` rows)."""

    threshold: float  # τ of h*
    alpha: float
    ran: bool  # the frame holds unroll rows
    references: list[str]  # the frame's reference estimators (unroll; any other labelled "reference")
    table: pd.DataFrame  # columns COLUMNS: per track × query kind × horizon × compared
    h_star: pd.DataFrame  # columns H_STAR: per query kind, within seed


def linear_response(df: pd.DataFrame, *, threshold: float = 0.5, resamples: int = RESAMPLES, seed: int = SEED,
                    alpha: float = ALPHA) -> LinearResponse:
    """From attribution.parquet's frame: ``table`` — per track × query kind × horizon, ρ(measured,
    unroll) (``compared`` = :data:`MEASURED`), the track's reference (``compared`` = REPLICATE or
    RELIABILITY) and ρ(unroll, e) for every other estimator e (``compared`` = e), each with ``rho,
    low, high, se_seeds`` (module doc), ``baseline`` (e is a baseline), ``label, after, seeds,
    candidates, queries``; and ``h_star`` — per query kind (:func:`h_star`). ``threshold``: τ, in (0, 1)."""
    if not 0 < threshold < 1:
        raise SeedlabError(f"h_star_rho: the threshold must lie in (0, 1), got {threshold!r}")
    labelled = df.estimator_label == "reference" if "estimator_label" in df else pd.Series(False, index=df.index)
    references = list(dict.fromkeys([*([UNROLL] if (df.estimator == UNROLL).any() else []),
                                     *df.estimator[labelled]]))
    if UNROLL not in references:
        return LinearResponse(threshold, alpha, False, references, pd.DataFrame(columns=COLUMNS),
                              pd.DataFrame(columns=H_STAR))
    a = Arrays.of(df)
    corr, samples = correlations(a.only([UNROLL]), resamples, seed, alpha)
    frames = [corr.assign(compared=corr.estimator.replace({UNROLL: MEASURED}))]
    if len(a.estimators) > 1:
        other = correlations(a.against(UNROLL), resamples, seed, alpha)[0]
        frames.append(other[~other.estimator.isin(REFERENCES)].assign(compared=other.estimator))
    table = pd.concat(frames, ignore_index=True)[COLUMNS]
    stars = [h_star(a, table, samples[("within", kind)][..., 0], kind, threshold, alpha)
             for kind in dict.fromkeys(a.kinds)]
    return LinearResponse(threshold, alpha, True, references, table, pd.DataFrame(stars, columns=H_STAR))


def first_below(rho: np.ndarray, threshold: float) -> np.ndarray:
    """Per row of ``rho`` [..., H] (ρ at the horizons in order): the index of the first horizon with
    ρ < ``threshold`` (undefined ρ skipped); H where none is ("not reached"); NaN where no ρ is defined."""
    rho = np.asarray(rho, dtype=np.float64)
    below = rho < threshold  # NaN compares False: skipped
    first = np.where(below.any(axis=-1), below.argmax(axis=-1), rho.shape[-1]).astype(np.float64)
    return np.where(np.isnan(rho).all(axis=-1), np.nan, first)


def h_star(a: Arrays, table: pd.DataFrame, boot: np.ndarray, kind: str, threshold: float,
           alpha: float = ALPHA) -> dict:
    """One query kind's h* (module doc) from ``table`` (:func:`linear_response`'s) and ``boot`` [b, H],
    the bootstrap resamples of the within-seed ρ(measured, unroll). ``status``: "reached", "not
    reached" or "undefined"; ``horizon, label, after, rho`` at h* (None/NaN unless reached);
    ``low_label, high_label`` (and ``low_after, high_after``, NaN for "not reached") the interval's
    ends; ``reached`` the fraction of resamples (with a defined h*) in which h* is reached;
    ``floor, floor_low, floor_high`` the replicate floor at h*; ``last_label`` the last horizon."""
    g = table[(table.track == "within") & (table.query_kind == kind)]
    rho = g[g.compared == MEASURED].set_index("horizon").rho.reindex(a.horizons).to_numpy(dtype=np.float64)
    H = len(a.horizons)
    point, resampled = first_below(rho, threshold), first_below(boot, threshold)
    resampled = resampled[~np.isnan(resampled)]

    def end(i: float) -> tuple[str, float]:
        return ("not reached", math.nan) if i >= H else a.labels[a.horizons[int(i)]]

    if len(resampled):
        lo, hi = np.quantile(resampled, [alpha / 2, 1 - alpha / 2], method="inverted_cdf")
        (low_label, low_after), (high_label, high_after) = end(lo), end(hi)
    else:
        low_label = high_label = "undefined"
        low_after = high_after = math.nan
    row = {"query_kind": kind, "status": "undefined" if np.isnan(point) else "not reached" if point >= H else "reached",
           "horizon": None, "label": None, "after": math.nan, "rho": math.nan, "low_label": low_label,
           "high_label": high_label, "low_after": low_after, "high_after": high_after,
           "reached": float(np.mean(resampled < H)) if len(resampled) else math.nan,
           "floor": math.nan, "floor_low": math.nan, "floor_high": math.nan, "last_label": a.labels[a.horizons[-1]][0]}
    if row["status"] == "reached":
        h = a.horizons[int(point)]
        row.update(a.at(h), rho=float(rho[int(point)]))
        f = g[(g.compared == REPLICATE) & (g.horizon == h)]
        if len(f):
            row.update(floor=float(f.rho.iloc[0]), floor_low=float(f.low.iloc[0]), floor_high=float(f.high.iloc[0]))
    return row


# ---------------------------------------------------------------- words


def _level(alpha: float) -> str:
    return f"{100 * (1 - alpha):g}%"


def _when(run: list) -> str:
    return f"at {run[0].label}" if len(run) == 1 else f"from {run[0].label} to {run[-1].label}"


def _predicted(verdict: pd.DataFrame, kind: str, references: list[str]) -> str:
    """Which estimator (the references left out) predicts the measured effect beyond every baseline,
    over runs of horizons with the same one (stats.verdict, within seed)."""
    g = verdict[(verdict.track == "within") & (verdict.query_kind == kind)].sort_values("horizon")

    def who(r) -> str:
        return next((e for e in [r.winner, *r.others] if e and e not in references), "")

    runs = [(w, list(run)) for w, run in groupby(g.itertuples(), key=who)]
    winners = list(dict.fromkeys(w for w, _ in runs if w))
    no = " or ".join(_when(run) for w, run in runs if not w)
    if not winners:
        return "no estimator predicts the measured effect of a single row beyond every baseline at any horizon"
    if len(winners) == 1:
        return (f"**{winners[0]}** predicts the measured effect of a single row beyond every baseline "
                + " and ".join(_when(run) for w, run in runs if w) + (f" (no estimator {no})" if no else ""))
    return ("the measured effect of a single row is predicted beyond every baseline by "
            + " and by ".join(f"**{w}** {_when(run)}" for w, run in runs if w) + (f" (by none {no})" if no else ""))


def _floor_at(s: pd.Series, threshold: float) -> str:
    if math.isnan(s.floor):
        return ("; no replicate was measured, so a failing linear response cannot be told from an irreproducible "
                "effect")
    if s.floor_low >= threshold:
        why = "the effect itself is still reproducible there: it is the linear response that fails"
    elif s.floor_high < threshold:
        why = f"below {threshold:g} as well: little of the effect is reproducible there at all"
    else:
        why = (f"its interval holds {threshold:g}: a failing linear response and an irreproducible effect cannot be "
               "told apart there")
    return f", where the replicate floor is {fmt_ci(s.floor, s.floor_low, s.floor_high)} ({why})"


def _until(lr: LinearResponse, kind: str, even: bool) -> str:
    """Until when the exact linear response predicts the measured effect (h* of one query kind);
    ``even``: an estimator at θ_s does predict it somewhere."""
    what = f"the exact linear response ({UNROLL})"
    if not lr.ran:
        return f"{what} was not run on this bank (`{RUN_IT}` computes it)"
    rows = lr.h_star[lr.h_star.query_kind == kind]
    if not len(rows) or rows.status.iloc[0] == "undefined":
        return f"ρ(measured, {UNROLL}) is undefined at every horizon, so there is no h*"
    s = rows.iloc[0]
    ci = f"{_level(lr.alpha)} interval {s.low_label} .. {s.high_label}"
    if s.status == "not reached":
        return f"{what} stays at ρ ≥ {lr.threshold:g} up to {s.last_label} (h* not reached; {ci})"
    if s.horizon == lr.table[lr.table.query_kind == kind].horizon.min():
        said = f"{what} is below ρ = {lr.threshold:g} already at {s.label}"
    else:
        said = f"{'even ' if even else ''}{what} stops predicting it at {s.label}"
    return f"{said} (h*: ρ(measured, {UNROLL}) {s.rho:.2f} < {lr.threshold:g}; {ci})" + _floor_at(s, lr.threshold)


def horizon_sentence(lr: LinearResponse, verdict: pd.DataFrame) -> str:
    """The report's first sentence, per query kind: which estimator predicts a single row's effect
    beyond every baseline and when (stats.verdict, within seed; the reference estimators left out),
    and until when even the exact linear response does (h*, with its interval and the replicate floor there)."""
    kinds = list(dict.fromkeys([*verdict[verdict.track == "within"].query_kind, *lr.h_star.query_kind]))
    lines = []
    for kind in kinds:
        said = _predicted(verdict, kind, lr.references)
        text = f"{said}; {_until(lr, kind, even=not said.startswith('no estimator'))}"
        lines.append(f"**{kind} queries.** {text[0].upper()}{text[1:]}.")
    return "\n\n".join(lines) if lines else "Nothing to compare."


HELP = (
    "ρ(measured, {u}): the Spearman correlation across candidates between the exact first-order counterfactual "
    "({u}: the one-step change at s carried through the twin's actual steps to the horizon) and the measured effect — "
    "what is lost to nonlinearity and chaos. ρ({u}, e): the same between each other estimator and {u} — what e loses "
    "to its own approximations. Reference: the replicate floor (within seed) or the reliability R of the seed-mean "
    "(across seeds). Cells: ρ [{level} bootstrap interval over candidates, the report's resamples] ±jackknife SE over "
    "seeds; baselines in italics. h*: the first horizon at which the within-seed ρ(measured, {u}) falls below "
    "{t:g} (attribute.h_star_rho, fixed in advance), with the {level} interval of h* over the resamples.")


def _table(g: pd.DataFrame, reference: str, star: str | None) -> str:
    """Horizons (rows) × ρ(measured, unroll), the reference, ρ(unroll, e) (columns) of one track and kind."""
    cols = [MEASURED, reference, *(c for c in dict.fromkeys(g.compared) if c not in (MEASURED, *REFERENCES))]
    head = {MEASURED: f"ρ(measured, {UNROLL})", REPLICATE: "replicate floor", RELIABILITY: "reliability R"}
    base = g.drop_duplicates("compared").set_index("compared").baseline
    header = ["horizon", *(head.get(c) or f"ρ({UNROLL}, {'*' + c + '*' if base[c] else c})" for c in cols)]
    rows = []
    for h, gh in g.groupby("horizon", sort=True):
        cells = gh.set_index("compared")
        label = f"{gh.label.iloc[0]} ({h})" + (" ← h*" if gh.label.iloc[0] == star else "")
        rows.append([label, *(_cell(cells.loc[c]) if c in cells.index else "" for c in cols)])
    return md_table(header, rows)


def _cell(r: pd.Series) -> str:
    return fmt_ci(r.rho, r.low, r.high) + ("" if math.isnan(r.se_seeds) else f" ±{r.se_seeds:.2f}")


def linear_response_section(lr: LinearResponse, verdict: pd.DataFrame) -> str:
    """The report's section "## The linear-response horizon": :func:`horizon_sentence`, then per query
    kind the within-seed and across-seed tables (:func:`linear_response`'s) and h* with its interval."""
    out = ["## The linear-response horizon", horizon_sentence(lr, verdict)]
    if not lr.ran:
        return "\n\n".join(out)
    level = _level(lr.alpha)
    out.append(HELP.format(u=UNROLL, level=level, t=lr.threshold))
    for kind in dict.fromkeys(lr.table.query_kind):
        s = lr.h_star.set_index("query_kind").loc[kind]
        star = s.label if s.status == "reached" else None
        out.append(f"### {kind} queries")
        for track, reference, name in (("within", REPLICATE, "Within seed"), ("across", RELIABILITY, "Across seeds")):
            g = lr.table[(lr.table.track == track) & (lr.table.query_kind == kind)]
            if len(g):
                n = g.iloc[0]
                out.append(f"{name} ({n.seeds} seeds, {n.candidates} candidates, {n.queries} "
                           f"quer{'y' if n.queries == 1 else 'ies'}):\n\n" + _table(g, reference, star))
        out.append(_h_star_line(s, lr.threshold, level))
    return "\n\n".join(out)


def _h_star_line(s: pd.Series, threshold: float, level: str) -> str:
    if s.status == "undefined":
        return f"h*: undefined (ρ(measured, {UNROLL}) is undefined at every horizon)."
    ci = f"{level} interval {s.low_label} .. {s.high_label}; reached in {100 * s.reached:.0f}% of the resamples"
    if s.status == "not reached":
        return f"h* (ρ(measured, {UNROLL}) < {threshold:g}): not reached by {s.last_label} ({ci})."
    floor = "no replicate measured" if math.isnan(s.floor) else f"replicate floor {fmt_ci(s.floor, s.floor_low, s.floor_high)}"
    return (f"h* (ρ(measured, {UNROLL}) < {threshold:g}): **{s.label}** ({s.after:g} updates after s; ρ {s.rho:.2f}; "
            f"{ci}); there, {floor}.")
