"""The grid's words: what attribution/analyses/grid.py computed across the B × lr cells, as one markdown text
(:func:`grid_report`) — the cells, the cross-cell table per query kind, the law with ε_nl fixed from a reference,
and whether h* moves with B or with lr. It computes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from seedlab.attribution.analyses.grid import NA, Cell
from seedlab.attribution.analyses.horizon import UNROLL
from seedlab.attribution.analyses.stats import TANGENT
from seedlab.reporting import fmt_ci, level as _level, md_lines as _table, yes_no as _yes
from seedlab.reporting import fmt_num_ci as _num_ci


def _rate(x: float, low: float, high: float) -> str:
    if math.isnan(x):
        return "n/a"
    return f"{x:.3f}" + ("" if math.isnan(low) else f" [{low:.3f}, {high:.3f}]")


def _lr(v: float) -> str:
    return f"{v:g}"


def _after(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:g}"


def _updates(x: float) -> str:
    """A predicted number of updates: one decimal, ∞ / −∞ as such."""
    return ("∞" if x > 0 else "−∞") if math.isinf(x) else f"{x:.1f}"


def _star(r) -> str:
    """Unroll's h* with its joint interval: ``s+5 [s+2 .. s+10]``."""
    head = r.h_star_label if r.h_star_status == "reached" else r.h_star_status or "undefined"
    ends = f" [{r.h_star_low_label} .. {r.h_star_high_label}]" if r.h_star_low_label else ""
    return head + ends


def _bent(label: str, previous: float, after: float) -> str:
    """The first horizon with ē beyond the tolerance and its bracket; "none" (never), "n/a" (not measured)."""
    if label in ("", NA):
        return label or "none"
    return f"{label} (in ({_after(previous)}, {_after(after)}])"


def _horizon_labels(t: pd.DataFrame) -> list[str]:
    return [c.removeprefix("unroll@") for c in t.columns
            if c.startswith("unroll@") and not c.endswith(("_low", "_high"))]


def grid_report(cells: Sequence[Cell], table: pd.DataFrame, law: pd.DataFrame | None, effect: pd.DataFrame) -> str:
    """The grid's markdown (module doc) from grid.py's frames: ``table`` (grid.table), ``law`` (grid.law; None or
    empty: no reference was given), ``effect`` (grid.effect_of)."""
    alpha = cells[0].alpha if cells else 0.05
    level = _level(alpha)
    out = ["# The size axis through training: the B × lr grid", ""]
    if not cells:
        return "\n".join([*out, "No cell is summarised yet.", ""])
    tol = f"{100 * cells[0].tolerance:g}%"
    out += [f"{len(cells)} cell(s), each an attributed bank of presets/attribution/grid.yaml at rows per batch B and "
            "peak lr (a row is 1/B of its update). In every cell each candidate replaces row "
            "0 of the batch of step s at weight 1 (the swap).", ""]
    rows = []
    for c in cells:
        stages = ", ".join(f"{k} {v:.0f} s" for k, v in c.stages.items()) or "—"
        rows.append([c.name, str(c.batch_size), _lr(c.peak_lr), _lr(c.min_lr), f"{len(c.seeds)} "
                     f"({', '.join(map(str, c.seeds))})", str(c.injection_step), str(c.candidates), stages])
    out += _table(["cell", "B", "peak lr", "min lr", "seeds", "s", "candidates", "wall time"], rows)
    out += ["Columns: **λ** training's largest Lyapunov exponent per update from the nudge arms (the mean over seeds "
            f"with its {level} t interval; the fit's phase ends where a nudge first reaches a tenth of its maximum over "
            "the recorded steps, so it depends on how long the cell ran), then the straight fit over every step of "
            "the common window **s+1 .. s+20** (no saturation cut; comparable across cells); **ε** = ‖θ_c − θ_twin‖₂ of the candidates' arms at the first recorded step "
            f"after s (per seed the median over arms, then over seeds; {level} bootstrap interval over seeds); "
            f"**first ē > {tol}**: the first horizon at which the relative error ē = ‖measured − U0‖/‖U0‖ of the "
            f"w = 1 response against `{TANGENT}` (U0, the fully linear prediction) exceeds {tol}, the crossing in the "
            f"bracket shown; **h\\*** of `{UNROLL}`: the first horizon at which it no longer predicts the measured "
            "effect beyond every baseline (the report's rule), with its interval over joint resamples of seeds and "
            f"candidates; **ρ(measured, {UNROLL})** per horizon, within seed, with its {level} interval over "
            "candidates; **ρ_rep**: the row invariance Spearman(Δ(c@r), Δ(c@r′)) at the first and the last horizon, "
            "its ceiling √ρ_rep in parentheses; **best at the last horizon**: the estimator (not a reference, not a "
            "baseline) with the highest within-seed ρ there, and the best baseline.", ""]
    labels = _horizon_labels(table)
    for kind, g in table.groupby("query_kind", sort=False):
        out += [f"## {kind} queries", ""]
        rows = []
        for _, r in g.iterrows():  # not itertuples: the columns unroll@<label> are no identifiers
            d = r
            inv = [fmt_ci(d[f"invariance_{e}"], d[f"invariance_{e}_low"], d[f"invariance_{e}_high"])
                   + ("" if math.isnan(d[f"ceiling_{e}"]) else f" ({d[f'ceiling_{e}']:.2f})")
                   for e in ("first", "last")]
            best = (f"{r.best} {fmt_ci(r.best_rho, r.best_low, r.best_high)}" if r.best else "n/a")
            base = (f"{r.best_baseline} {fmt_ci(r.best_baseline_rho, r.best_baseline_low, r.best_baseline_high)}"
                    if r.best_baseline else "n/a")
            rows.append([r.cell, str(r.batch_size), _lr(r.peak_lr), _rate(r.rate, r.rate_low, r.rate_high),
                         _rate(r.rate_window, r.rate_window_low, r.rate_window_high), _num_ci(r.epsilon, r.epsilon_low, r.epsilon_high),
                         _bent(r.bent_label, r.bent_previous_after, r.bent_after), _star(r),
                         *(fmt_ci(d[f"unroll@{h}"], d[f"unroll@{h}_low"], d[f"unroll@{h}_high"]) for h in labels),
                         *inv, f"{best}; {base}"])
        first = g.first_label.iloc[0] or "first"
        last = g.last_label.iloc[0] or "last"
        window = int(g.window.iloc[0]) if len(g) and g.window.iloc[0] == g.window.iloc[0] else 20
        out += _table(["cell", "B", "lr", "λ /update", f"λ s+1 .. s+{window}", "ε", f"first ē > {tol}", f"h* of {UNROLL}",
                       *(f"ρ {h}" for h in labels), f"ρ_rep {first}", f"ρ_rep {last}",
                       f"best at {last}; best baseline"], rows)
    out += law_section(law)
    out += effect_section(effect)
    return "\n".join(out)


def law_section(law: pd.DataFrame | None) -> list[str]:
    """"## The law with a fixed ε_nl": per cell and query kind the predicted h − s beside the measured brackets."""
    out = ["## The law: h* − s ≈ after₀ + ln(ε_nl / ε)/λ, ε_nl fixed", ""]
    if law is None or not len(law):
        return [*out, "No reference size-axis bank was given (--reference), so ε_nl is not fixed and the law is not "
                      "evaluated. A cell's own ε_nl is not used: with one weight the size axis cannot place it, and at "
                      "w = 1 it would make the prediction circular.", ""]
    source = law.source.iloc[0] or "a reference"
    out += [f"ε_nl per query kind is fixed from {source} (the distance at which its response bends between two "
            "row weights), the same in every cell; λ and ε are each cell's own (λ fitted on the common window "
            "s+1 .. s+20 where the cell recorded it, so cells of different lengths compare). Predicted: the updates after s at "
            "which ε·e^{λ(h − s − after₀)} reaches ε_nl (interval: the extremes over the intervals of λ, ε and "
            "ε_nl). Consistent: the predicted interval meets the measured bracket — the first horizon with ē > "
            f"the tolerance (the criterion that defines ε_nl), and h* of {UNROLL} (a ranking criterion; may come "
            "later).", ""]
    rows = []
    for r in law.itertuples(index=False):
        star = (f"{r.h_star_label} (in ({_after(r.previous_after)}, {_after(r.h_star_after)}])"
                if r.status == "reached" else f"{r.status} (after {_after(r.last_after)})" if r.status ==
                "not reached" else r.status)
        bent = (f"none (after {_after(r.last_after)})" if not r.bent_label
                else _bent(r.bent_label, r.bent_previous_after, r.bent_after))
        ends = "" if math.isnan(r.predicted_low) else f" [{_updates(r.predicted_low)}, {_updates(r.predicted_high)}]"
        pred = "n/a" if math.isnan(r.predicted) else _updates(r.predicted) + ends
        rows.append([r.cell, r.query_kind, _num_ci(r.epsilon, r.epsilon_low, r.epsilon_high),
                     _num_ci(r.eps_nl, r.eps_nl_low, r.eps_nl_high), _rate(r.rate, r.rate_low, r.rate_high), pred,
                     bent, _yes(r.consistent_bent), star, _yes(r.consistent)])
    out += _table(["cell", "queries", "ε", "ε_nl (fixed)", "λ", "predicted h* − s", "first ē > tolerance",
                   "consistent", f"h* of {UNROLL}", "consistent"], rows)
    bent, star = law.consistent_bent.dropna(), law.consistent.dropna()
    out += [f"The prediction meets the bracket of the first ē beyond the tolerance in {int(bent.sum())} of "
            f"{len(bent)} (cell, query kind) rows, and that of h* in {int(star.sum())} of {len(star)}.", ""]
    return out


def _seq(r) -> str:
    return ", ".join(f"{r.along} {lv:g}: {lab}" for lv, lab in zip(r.levels, r.labels, strict=True))


ANSWER = {"1/B effect": "h* moves with B (the row's share of the update, 1/B), the same way at every lr, and not "
                        "with lr",
          "lr effect": "h* moves with the peak lr, the same way at every B, and not with B",
          "both": "h* moves with B and with lr",
          "neither": "h* moves monotonically with neither B nor lr",
          "n/a": "too few cells with a defined h* to say"}


def effect_section(effect: pd.DataFrame) -> list[str]:
    """"## Is h* a 1/B effect, an lr effect, or neither": per query kind h* of unroll along each axis."""
    out = [f"## Is h* of {UNROLL} a 1/B effect, an lr effect, or neither?", "",
           "Descriptive (no test): h* as an ordinal horizon (\"not reached\" after the last), along B at each lr and "
           "along lr at each B; later / earlier: h* moves monotonically as the level grows; flat: it does not move; "
           "censored: h* not reached in both cells (only bounded below: no direction).",
           ""]
    if not len(effect):
        return [*out, "No cell has h* to compare.", ""]
    for kind, g in effect.groupby("query_kind", sort=False):
        answer = g.answer.iloc[0]
        out += [f"**{kind} queries: {answer}** — {ANSWER.get(answer, answer)}.", ""]
        for r in g.itertuples(index=False):
            if isinstance(r.fixed, float) and math.isnan(r.fixed):
                out.append(f"- along {r.along}, over the rows with two or more defined h*: {r.direction}")
            else:
                other = "lr" if r.along == "B" else "B"
                out.append(f"- along {r.along} at {other} {r.fixed:g}: {_seq(r)} — {r.direction}")
        out.append("")
    return out
