"""The report's words for the linear-response horizon (attribution/analyses/horizon.py computes it): the
report's first sentence (:func:`horizon_sentence`) and its section (:func:`linear_response_section`).
Every number here is :func:`~seedlab.attribution.analyses.horizon.linear_response`'s or
:func:`~seedlab.attribution.analyses.stats.verdict`'s; this module only words and tabulates them.
"""

from __future__ import annotations

import math
from itertools import groupby

import pandas as pd

from seedlab.attribution.analyses.horizon import CEILING, MEASURED, NOT_REACHED, READOUT, RUN_IT, TANGENT, UNROLL, LinearResponse
from seedlab.attribution.analyses.stats import RELIABILITY, ROW_INVARIANCE, is_reference
from seedlab.reporting import fmt_ci, fmt_num_ci, level, md_table

#: what follows a row-free predictor's ceiling wherever it is stated (attribution/analyses/stats.py's module doc)
ONE_CAUSE = ("within a seed nothing is noise: to first order Δ(c@r) − Δ(c@r′) is the same constant for every "
             "candidate, so a row invariance below 1 and unroll's miss are two symptoms of one cause, the swap's "
             "non-linearity")


def _when(run: list) -> str:
    return f"at {run[0].label}" if len(run) == 1 else f"from {run[0].label} to {run[-1].label}"


def _predicted(verdict: pd.DataFrame, kind: str, references: list[str]) -> str:
    """Which estimator (the references left out) predicts the measured effect beyond every baseline,
    over runs of horizons with the same one (stats.verdict, within seed)."""
    g = verdict[(verdict.track == "within") & (verdict.query_kind == kind)].sort_values("horizon")

    def who(r) -> str:
        return next((e for e in [r.winner, *r.others] if e and e not in references and not is_reference(e)), "")

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


def _ceiling_at(s: pd.Series) -> str:
    """The row invariance and its ceiling at h*, and what they say."""
    if math.isnan(s.invariance):
        return "; no replicate was measured, so there is no row-invariance ceiling to set it against"
    return (f"; there the row invariance is {fmt_ci(s.invariance, s.invariance_low, s.invariance_high)}, so a predictor "
            f"that ranks a candidate the same whichever row it replaces (to first order every estimator at θ_s, and "
            f"{UNROLL}) can reach at most √ρ_rep = {fmt_ci(s.ceiling, s.ceiling_low, s.ceiling_high)} (a ceiling; and "
            f"ρ_rep < 1 has the same cause as {UNROLL}'s miss, the swap's non-linearity: within a seed nothing is noise)")


def _beaten(s: pd.Series) -> str:
    return " and ".join(s.unbeaten) or "every baseline"


def _star_of(lr: LinearResponse, kind: str, response: str = UNROLL) -> pd.Series | None:
    rows = lr.h_star[(lr.h_star.query_kind == kind) & (lr.h_star.response == response)]
    return rows.iloc[0] if len(rows) else None


def _until(lr: LinearResponse, kind: str, even: bool) -> str:
    """Until when the exact linear response predicts the measured effect beyond every baseline (h* of one
    query kind); ``even``: an estimator at θ_s does predict it somewhere."""
    what = f"the exact linear response ({UNROLL})"
    if not lr.ran:
        return f"{what} was not run on this bank (`{RUN_IT}` computes it)"
    s = _star_of(lr, kind)
    if s is None or s.status == "undefined":
        return f"ρ(measured, {UNROLL}) is undefined at every horizon, so there is no h*"
    ci = f"{level(lr.alpha)} interval {s.low_label} .. {s.high_label}, seeds and candidates resampled"
    if s.status == NOT_REACHED:
        return f"{what} predicts it beyond every baseline up to {s.last_label} (h* not reached; {ci})"
    if s.horizon == lr.table[lr.table.query_kind == kind].horizon.min():
        said = f"{what} does not predict it beyond every baseline even at {s.label}"
    else:
        said = f"{'even ' if even else ''}{what} stops predicting it beyond every baseline at {s.label}"
    return (f"{said} (h*: ρ(measured, {UNROLL}) {fmt_ci(s.rho, s.low, s.high)}, not clearly above {_beaten(s)}; {ci})"
            + _ceiling_at(s))


def horizon_sentence(lr: LinearResponse, verdict: pd.DataFrame) -> str:
    """The report's first sentence, per query kind: which estimator predicts a single row's effect
    beyond every baseline and when (stats.verdict, within seed; the reference estimators left out),
    and until when even the exact linear response does (h*, by the same rule, with its interval over
    seeds and candidates and the row invariance's ceiling there)."""
    kinds = list(dict.fromkeys([*verdict[verdict.track == "within"].query_kind, *lr.h_star.query_kind]))
    lines = []
    for kind in kinds:
        said = _predicted(verdict, kind, lr.references)
        text = f"{said}; {_until(lr, kind, even=not said.startswith('no estimator'))}"
        lines.append(f"**{kind} queries.** {text[0].upper()}{text[1:]}.")
    return "\n\n".join(lines) if lines else "Nothing to compare."


HELP = (
    "ρ(measured, {u}): the Spearman correlation across candidates between the exact first-order counterfactual "
    "({u}: the exact one-step change at s carried through the twin's actual steps to the horizon by JVPs, read out "
    "linearly, ⟨∇L_q(θ_h), Δθ_h⟩) and the measured effect. Where the bank has them: {r} reads the same Δθ_h out "
    "exactly, L_q(θ_h + Δθ_h) − L_q(θ_h), so ρ({u}, {r}) is the readout's curvature alone and ρ(measured, {r}) the "
    "propagation's error alone; {t} linearises the step at s too (per unit row weight, the w → 0 limit), so "
    "ρ({u}, {t}) is what the non-linearity of the step at s does. ρ({u}, e): each other estimator against {u} — what "
    "e loses to its own approximations. References: the row invariance ρ_rep = Spearman(Δ(c@r), Δ(c@r′)) within seed "
    "(the test–retest reliability of the target across the row it replaces) with its ceiling √ρ_rep, the most a "
    "predictor that ranks a candidate the same whichever row it replaces can reach ({one}); across seeds the "
    "reliability R of the seed-mean and √R. Cells: ρ [{level} bootstrap interval over candidates, the report's "
    "resamples] ±jackknife SE over seeds; baselines in italics. Scale: the OLS slope of the measured effect on the "
    "response and the median ratio measured / response, each [{level} interval over candidates] (1: the response "
    "has the effect's size; a ranking can hold while the size is off many-fold). h*: the first horizon at which the "
    "response no longer predicts the measured effect by the report's rule (its ρ's interval above 0 and above every "
    "baseline's, the kind baseline included), on intervals that resample seeds and then candidates within them, "
    "with the {level} interval of h* over those resamples. τ = {tau:g} (attribute.h_star_rho): descriptive only, "
    "the first horizon with ρ < τ.")


def _header(against: str, compared: str, baseline: bool) -> str:
    if against == MEASURED:
        return {ROW_INVARIANCE: "row invariance", RELIABILITY: "reliability R"}.get(compared) or (
            f"ρ(measured, {compared})")
    return f"ρ({against}, {'*' + compared + '*' if baseline else compared})"


def _table(g: pd.DataFrame, star: str | None) -> str:
    """Horizons (rows) × ρ(measured, response), the reference and its ceiling, ρ(unroll, e) (columns) of one
    track and kind."""
    track = g.track.iloc[0]
    keys = list(dict.fromkeys(zip(g.against, g.compared, strict=True)))
    first = [k for k in keys if k[0] == MEASURED and k[1] not in (ROW_INVARIANCE, RELIABILITY, CEILING)]
    refs = [k for k in keys if k[0] == MEASURED and k[1] in (ROW_INVARIANCE, RELIABILITY, CEILING)]
    rest = sorted((k for k in keys if k[0] != MEASURED), key=lambda k: k[1] not in (READOUT, TANGENT))
    cols = [*first, *refs, *rest]
    base = g.drop_duplicates(["against", "compared"]).set_index(["against", "compared"]).baseline
    ceiling = "ceiling √ρ_rep" if track == "within" else "√R"
    header = ["horizon", *(ceiling if c == CEILING else _header(a, c, bool(base[(a, c)])) for a, c in cols)]
    rows = []
    for h, gh in g.groupby("horizon", sort=True):
        cells = gh.set_index(["against", "compared"])
        label = f"{gh.label.iloc[0]} ({h})" + (" ← h*" if gh.label.iloc[0] == star else "")
        rows.append([label, *(_cell(cells.loc[k]) if k in cells.index else "" for k in cols)])
    return md_table(header, rows)


def _cell(r: pd.Series) -> str:
    se = "" if (isinstance(r.se_seeds, float) and math.isnan(r.se_seeds)) else f" ±{r.se_seeds:.2f}"
    return fmt_ci(r.rho, r.low, r.high) + se


def _scale_table(cal: pd.DataFrame, responses: list[str]) -> str:
    """Horizons (rows) × each response's slope and median ratio (one query kind)."""
    have = [r for r in responses if r in set(cal.estimator)]
    rows = []
    for h, gh in cal.groupby("horizon", sort=True):
        c = gh.set_index("estimator")
        rows.append([f"{gh.label.iloc[0]} ({h})",
                     *(f"slope {fmt_num_ci(c.loc[r].slope, c.loc[r].low, c.loc[r].high)}; ratio "
                       f"{fmt_num_ci(c.loc[r].ratio, c.loc[r].ratio_low, c.loc[r].ratio_high)}" if r in c.index else ""
                       for r in have)])
    return md_table(["horizon", *(f"measured on {r}" for r in have)], rows)


def linear_response_section(lr: LinearResponse, verdict: pd.DataFrame) -> str:
    """The report's section "## The linear-response horizon": :func:`horizon_sentence`, then per query
    kind the within-seed table, the responses' scale, the across-seed table, h* of each response with
    its interval and the descriptive τ crossing."""
    out = ["## The linear-response horizon", horizon_sentence(lr, verdict)]
    if not lr.ran:
        return "\n\n".join(out)
    lvl = level(lr.alpha)
    out.append(HELP.format(u=UNROLL, r=READOUT, t=TANGENT, level=lvl, tau=lr.threshold, one=ONE_CAUSE))
    for kind in dict.fromkeys(lr.table.query_kind):
        s = _star_of(lr, kind)
        star = s.label if s is not None and s.status == "reached" else None
        out.append(f"### {kind} queries")
        for track, name in (("within", "Within seed"), ("across", "Across seeds")):
            g = lr.table[(lr.table.track == track) & (lr.table.query_kind == kind)]
            if len(g):
                n = g.iloc[0]
                out.append(f"{name} ({n.seeds} seeds, {n.candidates} candidates, {n.queries} "
                           f"quer{'y' if n.queries == 1 else 'ies'}):\n\n" + _table(g, star))
            if track == "within" and len(lr.calibration):
                cal = lr.calibration[lr.calibration.query_kind == kind]
                if len(cal):
                    out.append("Scale (pooled over every seed, query and candidate of the kind):\n\n"
                               + _scale_table(cal, lr.responses))
        out.extend(_h_star_line(r, lr, kind, lvl) for r in lr.responses if _star_of(lr, kind, r) is not None)
    return "\n\n".join(out)


def _split_at(lr: LinearResponse, kind: str, h: int) -> str:
    """At horizon h: the readout's curvature and the propagation's error apart, where the bank has the readout."""
    g = lr.table[(lr.table.track == "within") & (lr.table.query_kind == kind) & (lr.table.horizon == h)]
    cells = g.set_index(["against", "compared"])
    parts = []
    if (UNROLL, READOUT) in cells.index and (MEASURED, READOUT) in cells.index:
        parts.append(f"the readout's curvature alone ρ({UNROLL}, {READOUT}) {fmt_ci(cells.loc[(UNROLL, READOUT)].rho)}, "
                     f"the propagation's error alone ρ(measured, {READOUT}) {fmt_ci(cells.loc[(MEASURED, READOUT)].rho)}")
    if (UNROLL, TANGENT) in cells.index:
        parts.append(f"the step at s linearised ρ({UNROLL}, {TANGENT}) {fmt_ci(cells.loc[(UNROLL, TANGENT)].rho)}")
    return f" There, {'; '.join(parts)}." if parts else ""


def _h_star_line(response: str, lr: LinearResponse, kind: str, lvl: str) -> str:
    s = _star_of(lr, kind, response)
    rule = f"h* of {response} (the first horizon where it no longer predicts beyond every baseline)"
    tau = (f" Descriptive: ρ(measured, {response}) first below τ = {lr.threshold:g} "
           + (f"at {s.tau_label} ({lvl} interval {s.tau_low_label} .. {s.tau_high_label})."
              if s.tau_label != NOT_REACHED else f"nowhere by {s.last_label}."))
    if s.status == "undefined":
        return f"{rule}: undefined (ρ(measured, {response}) is undefined at every horizon)."
    ci = (f"{lvl} interval {s.low_label} .. {s.high_label}, seeds and candidates resampled; reached in "
          f"{100 * s.reached:.0f}% of the resamples")
    if s.status == NOT_REACHED:
        return f"{rule}: not reached by {s.last_label} ({ci}).{tau}"
    ceiling = ("no replicate measured" if math.isnan(s.invariance) else
               f"row invariance {fmt_ci(s.invariance, s.invariance_low, s.invariance_high)}, ceiling √ρ_rep "
               f"{fmt_ci(s.ceiling, s.ceiling_low, s.ceiling_high)}")
    split = _split_at(lr, kind, s.horizon) if response == UNROLL else ""
    return (f"{rule}: **{s.label}** ({s.after:g} updates after s; ρ {fmt_ci(s.rho, s.low, s.high)}, not clearly above "
            f"{_beaten(s)}; {ci}); there, {ceiling}.{split}{tau}")
