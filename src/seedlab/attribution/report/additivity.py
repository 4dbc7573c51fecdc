"""The report's section on additivity (attribution/analyses/additivity.py computes it): :func:`additivity_section`
words an :class:`~seedlab.attribution.analyses.additivity.Additivity`; every number is its.

The first horizon is where first-order theory makes the prediction (a batch's gradient is exactly
additive in its rows); the later horizons are marked **exploratory** unless their labels are passed
as ``preregistered`` (a decision rule for them fixed before the bank ran: docs/results.md's rule on
exploratory and confirmatory). Nothing in a bank records a pre-registration, so the report passes none.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import pandas as pd

from seedlab.attribution.analyses.additivity import ALL, DIFF, METRICS, PAIR, SWAPPED, Additivity
from seedlab.reporting import fmt_num, md_table

TITLE = "## Additivity: two rows at once"
NAMES = {"pearson": "Pearson", "spearman": "Spearman", "slope": "slope (1: additive)",
         "interaction": "median relative interaction"}
HELP = (
    "A pair carries two candidates in one batch, c₁ in row r and c₂ in row r′; its effect Δ(c₁ and c₂) is set against "
    "Δ(c₁ at r) + Δ(c₂ at r′) (the candidate run and the replicate, which displace the same two rows) on the shared "
    "queries (a candidate's own text is not measured by the other's run). Per seed over pairs × queries, then the mean "
    "over seeds: Pearson and Spearman of the pair's Δ against the sum, the OLS slope of the pair's Δ on the sum, and the "
    "median of |Δ(pair) − sum| / (|Δ(c₁)| + |Δ(c₂)|). **swapped**, the control: the same numbers for Δ(c₁ at r′) + "
    "Δ(c₂ at r) against the sum — equal to it to first order, as the pair is — i.e. how far two single-row "
    "measurements that linearity calls equal move apart. **pair − swapped**: the difference (positive interaction: "
    "the pair departs from additivity more than swapping rows does). Cells: value [95% bootstrap interval, seeds "
    "resampled and then pairs within each drawn seed]. Horizons after the first are exploratory unless "
    "pre-registered (their column says so).")


def _cell(r, m: str) -> str:
    v, lo, hi = r[m], r[f"{m}_low"], r[f"{m}_high"]
    if math.isnan(v):
        return "n/a"
    return fmt_num(v) + ("" if math.isnan(lo) else f" [{fmt_num(lo)}, {fmt_num(hi)}]")


def _table(g: pd.DataFrame, preregistered: Collection[str]) -> str:
    hs = g.drop_duplicates("horizon").sort_values("horizon")
    rows = []
    for m in METRICS:
        for c in (PAIR, SWAPPED, DIFF):
            gc = g[g.comparison == c].set_index("horizon")
            rows.append([NAMES[m] if c == PAIR else "", c, *(_cell(gc.loc[h], m) for h in hs.horizon)])
    n = g.iloc[0]
    first = hs.horizon.iloc[0]
    head = [f"{r.label} ({r.horizon})" + ("" if r.horizon == first else ", pre-registered" if r.label in preregistered
                                          else ", exploratory") for r in hs.itertuples()]
    return (f"{n.seeds} seed(s), {n.pairs} pair(s), {n.queries} quer{'y' if n.queries == 1 else 'ies'}.\n\n"
            + md_table(["", "comparison", *head], rows))


def _span(g: pd.DataFrame, m: str) -> str:
    """The metric at the first horizon of ``g``, and at its last when there are several."""
    first, last = g.iloc[0], g.iloc[-1]
    if len(g) == 1:
        return f"{fmt_num(first[m])} at {first.label}"
    return f"{fmt_num(first[m])} at {first.label} … {fmt_num(last[m])} at {last.label}"


def _verdict(diff: pd.DataFrame, every: str) -> str:
    above = list(diff[diff.interaction_low > 0].label)
    if not above:
        return (f"not clearly more than the two candidates swapping rows moves the sum (the 95% interval of the "
                f"difference reaches 0 {every})")
    if len(above) == len(diff):
        return "more than the two candidates swapping rows moves the sum" + ("" if len(diff) == 1 else f" {every}")
    return (f"more than the two candidates swapping rows moves the sum at {', '.join(above)}, not clearly more at the "
            "other horizons")


def _numbers(g: pd.DataFrame) -> tuple[str, str]:
    pair, swapped = (g[g.comparison == c] for c in (PAIR, SWAPPED))
    return (f"{_span(pair, 'interaction')} (against {_span(swapped, 'interaction')} for the sum with the two "
            f"candidates' rows swapped; slope of the pair's Δ on the sum {_span(pair, 'slope')})",
            _verdict(g[g.comparison == DIFF], "at every horizon" if g.horizon.nunique() > 1 else "there"))


def answer(stats: pd.DataFrame, preregistered: Collection[str] = ()) -> str:
    """The answer: over every shared query, the median relative interaction of the pair beside the swapped
    control and whether the difference's interval lies above 0 — at the first horizon (first-order theory's
    prediction) and any pre-registered one, then the other later horizons, marked exploratory."""
    kind = ALL if (stats.query_kind == ALL).any() else stats.query_kind.iloc[0]
    g = stats[stats.query_kind == kind].sort_values("horizon")
    first = g.horizon.iloc[0]
    held = g[(g.horizon == first) | g.label.isin(list(preregistered))]
    rest = g[~g.index.isin(held.index)]
    what = "the shared queries" if kind == ALL else f"the {kind} queries"
    n = g.iloc[0]
    numbers, verdict = _numbers(held)
    text = (f"Over {n.pairs} pair(s) and {n.seeds} seed(s), a pair's effect on {what} departs from the sum of its two "
            f"single-row effects by a median relative interaction |Δ(pair) − sum| / (|Δ(c₁)| + |Δ(c₂)|) of "
            f"{numbers}: {verdict}.")
    if len(rest):
        numbers, verdict = _numbers(rest)
        text += (f" Exploratory, the later horizons (no decision rule for them was fixed in advance): {numbers}: "
                 f"{verdict}.")
    return text


def additivity_section(a: Additivity, preregistered: Collection[str] = ()) -> str:
    """The report's section (markdown, its own ``##`` title first): the answer, the exact own-row pairs,
    then per query kind the table of the numbers by horizon. ``preregistered``: the labels of later
    horizons whose additivity a pre-registration decides (the others after the first are exploratory)."""
    if not a.rows:
        return f"{TITLE}\n\nNo pair run finished: nothing to compare."
    out = [TITLE]
    stats = a.numbers
    out.append(answer(stats, preregistered) if len(stats) else
               "Every pair holds the own-row control: no ordinary pair to compare.")
    if a.own_row:
        out.append(f"Own-row pairs ({', '.join(a.own_row)}): with row r replaced by itself the pair is "
                   f"its second's replicate, so Δ(pair) = Δ(c₂ at r′) and the interaction is exactly 0 at every seed, "
                   f"query and horizon: {'yes' if a.own_row_exact else 'NO'}.")
    if len(stats):
        out.append(HELP)
        for kind, g in stats.groupby("query_kind", sort=False):
            out.append(f"### {'every shared query' if kind == ALL else f'{kind} queries'}\n\n{_table(g, preregistered)}")
    return "\n\n".join(out)
