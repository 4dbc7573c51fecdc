"""The report's words and figure for the size axis and for chaos: what attribution/analyses/size.py
and attribution/analyses/chaos.py computed, as markdown lines (:func:`size_section`, :func:`chaos_section`, each a list
of lines to join with newlines) and one figure (:func:`size_figure`). It computes nothing.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from seedlab.attribution.analyses.chaos import ALL, Chaos
from seedlab.attribution.bank.rundir import BankDir
from seedlab.attribution.analyses.size import TANGENT, SizeAxis
from seedlab.reporting import Fig, fmt_ci, fmt_num, new_figure, save_figure
from seedlab.reporting import fmt_num_ci as _num_ci, level as _level, md_lines as _table, yes_no as _yes


def _w(w: float) -> str:
    return f"{w:g}"


def _regime(status: str, largest: float, smallest: float, biggest: float) -> str:
    return {"at least": f"≥ {_w(biggest)}", "below": f"< {_w(smallest)}"}.get(status, _w(largest))


def _end(x: float, smallest: float) -> str:
    return "n/a" if math.isnan(x) else f"< {_w(smallest)}" if x == 0 else _w(x)


def size_section(size: SizeAxis) -> list[str]:
    """"## The size axis: a row's loss weight": per query kind the relative error ē(w) and ρ(measured(w), U0)
    per horizon and weight, the convergence check and the linear regime's size per horizon, h*(w) per weight;
    then ε(w) and the scale ε_nl where the response bends."""
    level, tol = _level(size.alpha), f"{100 * size.tolerance:g}%"
    ws = sorted(size.weights, reverse=True)
    lo_w, hi_w = min(ws), max(ws)
    out = ["## The size axis: a row's loss weight", "",
           f"Each candidate was also injected at loss weights w < 1 (the batch loss (Σ_{{i≠r}} ℓ_i + (1 − w)·ℓ_r + "
           f"w·ℓ_c)/N; w = 1 the swap). U0 is `{TANGENT}`, the w → 0 limit of measured(w)/w (every step linearized). "
           f"Per seed, query kind and horizon, ē(w) = ‖measured(w)/w − U0‖ / ‖U0‖ over the kind's candidate × query "
           f"cells, and ρ = Spearman(measured(w), U0) over candidates, per query, averaged over the kind's queries; "
           f"then the means over {size.seeds} seeds with {level} bootstrap intervals over seeds. If unroll's "
           f"propagation is right, ē(w) falls to 0 as w → 0 at every horizon (slope 1 of ln ē on ln w when the "
           f"rest is O(w²)). The linear regime: the largest w with ē ≤ {tol} there and at every smaller weight. "
           f"h*(w): the first horizon at which U0 no longer predicts measured(w) "
           + (f"(the seed interval of ρ reaches 0 or ρ < {size.threshold:g})." if not math.isnan(size.threshold)
              else "(by the report's rule)."), ""]
    for kind in dict.fromkeys(size.summary.query_kind):
        s = size.summary[size.summary.query_kind == kind]
        n = s.iloc[0]
        out += [f"### {kind} queries ({n.candidates} candidates, {n.queries} "
                f"quer{'y' if n.queries == 1 else 'ies'})", ""]
        hs = s.drop_duplicates("horizon").sort_values("horizon")
        cell = s.set_index(["horizon", "weight"])
        out += ["Relative error ē(w) of measured(w)/w against U0:", ""]
        out += _table(["horizon", *(f"w = {_w(w)}" for w in ws)],
                      [[f"{h.label} ({h.horizon})", *(_num_ci(*cell.loc[(h.horizon, w), ["error", "error_low",
                                                                                       "error_high"]])
                                                       for w in ws)] for h in hs.itertuples()])
        out += ["ρ(measured(w), U0):", ""]
        out += _table(["horizon", *(f"w = {_w(w)}" for w in ws)],
                      [[f"{h.label} ({h.horizon})", *(fmt_ci(*cell.loc[(h.horizon, w), ["rho", "rho_low", "rho_high"]])
                                                       for w in ws)] for h in hs.itertuples()])
        conv = size.convergence[size.convergence.query_kind == kind].set_index("horizon")
        reg = size.regime[size.regime.query_kind == kind].set_index("horizon")
        bend = size.bend[size.bend.query_kind == kind].set_index("horizon") if len(size.bend) else None
        rows = []
        for h in hs.itertuples():
            c, r = conv.loc[h.horizon], reg.loc[h.horizon]
            rows.append([f"{h.label} ({h.horizon})", _num_ci(c.slope, c.low, c.high),
                         "yes" if c.closest else "no",
                         _regime(r.status, r.largest, lo_w, hi_w)
                         + ("" if math.isnan(r.low) else f" [{_end(r.low, lo_w)}, {_end(r.high, lo_w)}]"),
                         "—" if bend is None else _num_ci(*bend.loc[h.horizon, ["distance", "low", "high"]])])
        out += ["Convergence and the linear regime per horizon:", ""]
        out += _table(["horizon", "slope of ln ē on ln w", f"smallest w ({_w(lo_w)}) closest",
                       f"linear regime: largest w with ē ≤ {tol}", "ε_nl(h): distance where ē crosses " + tol], rows)
        hstar = size.h_star[size.h_star.query_kind == kind].sort_values("weight", ascending=False)
        out += ["h*(w), the first horizon at which U0 no longer predicts measured(w):", ""]
        out += _table(["w", "h*(w)", f"{level} interval", "ρ there", f"first horizon with ē > {tol}"],
                      [[_w(r.weight), r.label if r.status == "reached" else r.status,
                        f"{r.low_label} .. {r.high_label}", fmt_ci(r.rho),
                        r.bent_label if isinstance(r.bent_label, str) else "none"]
                       for r in hstar.itertuples()])
        sc = size.scales[size.scales.query_kind == kind]
        if len(sc):
            r = sc.iloc[0]
            out += [f"The response bends at ε_nl = {_num_ci(r.eps_nl, r.low, r.high)} (‖Δθ‖₂, the median over the "
                    f"{r.horizons} horizons where ē crosses {tol}; {level} interval over seeds).", ""]
    if len(size.epsilon):
        after = int(size.epsilon.after.iloc[0])
        out += [f"The perturbation's size ε(w) = ‖θ_w − θ_twin‖₂ at s+{after} (per seed the median over its "
                f"candidates' arms, then the median over seeds, {level} interval over seeds):", ""]
        out += _table(["w", "ε(w)", "seeds", "arms"],
                      [[_w(r.weight), _num_ci(r.epsilon, r.low, r.high), str(r.seeds), str(r.arms)]
                       for r in size.epsilon.sort_values("weight", ascending=False).itertuples()])
    else:
        out += ["No distances.parquet: the perturbations' sizes ε(w) and the bend ε_nl are not measured.", ""]
    return out


def chaos_section(chaos: Chaos, comparison: pd.DataFrame | None = None) -> list[str]:
    """"## Chaos: training's largest Lyapunov exponent": the cell's λ with its interval, per nudge, the growth
    rates of the rows' own perturbations beside it, and (``comparison``: chaos.compare's frame) the law's
    predicted h*(w) against the measured one."""
    level = _level(chaos.alpha)
    out = ["## Chaos: training's largest Lyapunov exponent", ""]
    if not len(chaos.lyapunov):
        out += ["No nudge arms in this bank (chaos.nudges: []), so λ is not measured.", ""]
    else:
        rate, lo, hi = chaos.cell_rate
        cell = chaos.lyapunov.set_index("nudge").loc[ALL]
        efold = f"; an e-fold every {1 / rate:.1f} updates" if rate > 0 else ""
        ci = "" if math.isnan(lo) else f" [{lo:.3f}, {hi:.3f}]"
        value = "n/a (no fit: too few points in the growth phase)" if math.isnan(rate) else f"{rate:.3f} per update"
        out += [f"λ = {value}{ci} ({level} t interval over {int(cell.seeds)} seeds{efold}): "
                f"the slope of ln ‖θ_nudge − θ_twin‖₂ on the step over the growth phase, from s+{chaos.start} to the "
                f"first step at {chaos.fraction:g} of the curve's later maximum; per seed the mean over its nudges.",
                ""]
        out += _table(["nudge", "λ per update", "seeds", "median R²", "saturated"],
                      [[r.nudge, f"{r.rate:.3f}" + ("" if math.isnan(r.low) else f" [{r.low:.3f}, {r.high:.3f}]"),
                        str(r.seeds), f"{r.r2:.3f}", f"{100 * r.saturated:.0f}%"]
                       for r in chaos.lyapunov.itertuples()])
        if len(chaos.rates):
            out += ["The same fit on every arm's distance to the twin (candidates at w = 1, weighted rows, "
                    "replicates, pairs, nudges): how fast the rows' own perturbations grow beside λ.", ""]
            out += _table(["arm kind", "w", "growth rate per update", "seeds", "arms"],
                          [[r.kind, "—" if math.isnan(r.weight) else _w(r.weight),
                            f"{r.rate:.3f}" + ("" if math.isnan(r.low) else f" [{r.low:.3f}, {r.high:.3f}]"),
                            str(r.seeds), str(r.arms)] for r in chaos.rates.itertuples()])
    if comparison is None or not len(comparison):
        return out
    out += ["### The law: h* − s ≈ after₀ + ln(ε_nl / ε)/λ", "",
            "A perturbation of size ε (read at s+after₀) grows as ε·e^{λ(h − s − after₀)} and stays linear until it "
            "reaches ε_nl, the distance at which the response bends. Predicted: that crossing in updates after s "
            "(interval: the extremes over the intervals of λ, ε and ε_nl). Measured: h*(w), whose crossing lies "
            "between the horizon before it and h*(w) itself; consistent: the predicted interval meets that bracket. "
            "Beside it the same test against the first horizon at which ē(w) exceeds the tolerance (the criterion "
            "that defines ε_nl: the law's own mechanics; h*(w) is a ranking criterion and may come later).",
            ""]
    rows = []
    for r in comparison.itertuples():
        meas = (f"{r.measured_label} (in ({fmt_num(r.previous_after)}, {fmt_num(r.measured)}])"
                if r.status == "reached" else r.status)
        rows.append([str(r.cell), r.query_kind, _w(r.weight), fmt_num(r.epsilon), fmt_num(r.eps_nl),
                     f"{r.rate:.3f}", f"{r.predicted:.1f} [{r.predicted_low:.1f}, {r.predicted_high:.1f}]", meas,
                     _yes(r.consistent), "none" if math.isnan(r.bent_after) else f"s+{r.bent_after:g}",
                     _yes(r.consistent_bent)])
    out += _table(["cell", "queries", "w", "ε", "ε_nl", "λ", "predicted h* − s", "measured h*(w)", "consistent",
                   "first ē > tolerance", "consistent"], rows)
    known, bent = comparison.consistent.dropna(), comparison.consistent_bent.dropna()
    out += [f"The law's prediction meets the bracket of h*(w) in {int(known.sum())} of {len(known)} (cell, query "
            f"kind, weight) rows, and that of the first ē(w) beyond the tolerance in {int(bent.sum())} of "
            f"{len(bent)}.", ""]
    return out


def size_figure(size: SizeAxis, chaos: Chaos | None, rd: BankDir) -> Fig:
    """ē(w) against w on log-log axes, one line per horizon (its seed interval as bars; the tolerance dotted),
    one panel per query kind; and ln distance against the step for every nudge (each seed's fitted growth
    phase drawn over it), when ``chaos`` holds nudges. Saved as size_axis.png."""
    title = "The size axis and chaos"
    s = size.summary[size.summary.error > 0]
    if not len(s):
        return Fig(title, None, "no positive relative error to draw (no weighted rows with a U0?)")
    kinds = list(dict.fromkeys(s.query_kind))
    curves = chaos is not None and len(chaos.curves) > 0
    fig, axes = new_figure(1, len(kinds) + curves, w=4.2, h=3.4)
    hs = sorted(s.horizon.unique())
    colors = dict(zip(hs, [f"C{i % 10}" for i in range(len(hs))]))
    for ax, kind in zip(axes, kinds):
        g = s[s.query_kind == kind]
        for h, gh in g.groupby("horizon"):
            gh = gh.sort_values("weight")
            err = np.vstack([gh.error - gh.error_low, gh.error_high - gh.error])
            ax.errorbar(gh.weight, gh.error, yerr=np.nan_to_num(np.clip(err, 0, None)), marker="o", ms=3, capsize=2,
                        color=colors[h], label=str(gh.label.iloc[0]))
        ax.axhline(size.tolerance, color="k", lw=0.8, ls=":", label=f"{100 * size.tolerance:g}%")
        ax.set(xscale="log", yscale="log", xlabel="loss weight w", ylabel="ē(w) = ‖measured(w)/w − U0‖ / ‖U0‖",
               title=f"{kind} queries")
        ax.legend(fontsize=5)
    if curves:
        ax = axes[-1]
        c = chaos.curves[chaos.curves.distance > 0]
        fits = chaos.growth.set_index(["seed", "arm"])
        arms = sorted(c.arm.unique())
        for (seed, arm), g in c.groupby(["seed", "arm"]):
            col = f"C{arms.index(arm) % 10}"
            ax.plot(g.after, g.distance, color=col, lw=0.8, alpha=0.7, label=arm if seed == c.seed.min() else None)
            f = fits.loc[(seed, arm)]
            if not math.isnan(f.rate):
                t = np.array([f.first_after, f.last_after])
                ax.plot(t, np.exp(f.intercept + f.rate * t), color="k", lw=0.6, ls="--")
        ax.set(yscale="log", xlabel="updates after s", ylabel="‖θ_nudge − θ_twin‖₂",
               title=f"nudges (λ = {chaos.cell_rate[0]:.3f} per update)")
        ax.legend(fontsize=5)
    path = save_figure(fig, rd.figure("size_axis.png"))
    return Fig(title, path, "First (a panel per query kind): the relative error of measured(w)/w against the w → 0 limit U0 "
                            f"({TANGENT}), the mean over seeds with its bootstrap interval over seeds, one line per "
                            "horizon; it must fall toward 0 as w → 0 (slope 1 on these axes when the rest is O(w²)); "
                            "dotted: the tolerance that defines the linear regime. "
                            + ("Last: every nudge arm's distance to the twin per step (one line per seed), dashed: "
                               "the fitted growth phase, whose slope is λ." if curves else ""))
