"""The report's words for the linear-response horizon (attribution/horizon.py computes it): the
report's first sentence (:func:`horizon_sentence`) and its section (:func:`linear_response_section`).
Every number here is :func:`~seedlab.attribution.horizon.linear_response`'s or
:func:`~seedlab.attribution.stats.verdict`'s; this module only words and tabulates them.
"""

from __future__ import annotations

import math
from itertools import groupby

import pandas as pd

from seedlab.attribution.horizon import MEASURED, RUN_IT, UNROLL, LinearResponse
from seedlab.attribution.stats import REFERENCES, RELIABILITY, REPLICATE
from seedlab.reporting import fmt_ci, md_table


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
