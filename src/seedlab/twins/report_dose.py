"""The twins report's dose–response section (renders only): twins/dose.py's lines, residuals, dose record and the
own-text drop against the text's CE at s, as markdown, and its tables beside report.md (``dose-*.csv``).
twins/report.py places the section after "Is it the passage?" when the run's arms recorded their dose."""

from __future__ import annotations

import numpy as np

from seedlab.reporting import fmt_num, fmt_p, md_table, p_text
from seedlab.store import write_text
from seedlab.twins import dose
from seedlab.twins.dose import ABOVE, BELOW, SHOWN_NOT
from seedlab.twins.rundir import Measured


def write_dose_tables(d: Measured, dr) -> None:
    """The dose section's tables as twins/dose.py computed them, beside report.md (``dose-<name>.csv``, rundir's
    DOSE_TABLES): what a kept copy and the claims ledger quote."""
    frames = {"arms": dr.table, "lines": dr.line_rows, "residuals": dr.residuals, "fraction": dr.fraction,
              "ce-slope": dr.ce_slope}
    for name, frame in frames.items():
        write_text(d.dir.dose_table(name), frame.to_csv(index=False))



#: dose.MEASURES as the report names them
DOSE_NAMES = dose.LABELS


def _resid(r) -> str:
    """A residual with its interval: a factor of the line on log–log (×1.05 [0.98, 1.12]), else in the measure's units."""
    if not np.isfinite(r["resid"]):
        return "n/a"
    if r["scale"] == "log-log":
        return f"×{10 ** r['resid']:.3g} [{10 ** r['low']:.3g}, {10 ** r['high']:.3g}]"
    return f"{r['resid']:+.3g} [{r['low']:+.3g}, {r['high']:+.3g}]"


def _not_holm(r) -> bool:
    """A residual row whose Holm-adjusted p is not below 0.05 (False: it is, or no test)."""
    v = r["holm"]
    return v is not None and v == v and not bool(v)


def dose_in_words(dr) -> str:
    """Per passage (its weight-1 arm), the measures it lies above, below, or is not shown to differ from the line on."""
    res = dr.residuals
    parts = []
    for cond, g in res[(res.role == "passage") & (res.weight == 1.0)].groupby("condition", sort=False):
        said = []
        for word in (ABOVE, BELOW, SHOWN_NOT):
            on = [DOSE_NAMES.get(r.measure, r.measure) + (" (not after Holm)" if _not_holm(r) and word != SHOWN_NOT else "")
                  for _, r in g[g.verdict == word].iterrows()]
            if on:
                said.append(f"{word.removesuffix(' from the line').removesuffix(' the line')} on {', '.join(on)}")
        if said:
            parts.append(f"{cond}: " + "; ".join(said))
    n = int(res.n.max()) if len(res) else 0
    return ("each end measure fitted per seed against the dose at s (‖Δθ_{s+1}‖) through the ordinary rows; each "
            f"passage's residual from its own seed's line, 95% t interval over {n} seeds (exploratory): "
            + (" — ".join(parts) if parts else "no passage has a residual with an interval") + ".")


def dose_section(dr) -> str:
    """The ordinary rows' line per measure (its scale and the rule that chose it, its slope, or why there is no fit)
    and every passage's and null's residual from it, each verdict from its interval."""
    lines, res = dr.line_rows, dr.residuals
    fitted = lines[lines.fitted.astype(bool)]
    ordinary = dr.table[dr.table.role == "ordinary"]
    k = int(ordinary.groupby("seed").size().max()) if len(ordinary) else 0
    intro = ("Each arm's **dose** is the size of its perturbation at s: ‖θ_{s+1}(arm) − θ_{s+1}(twin)‖, the weights "
             "after the update that consumed the batch of s (dose.json, float64; every channel in the table below). An "
             "end measure that follows the dose alone puts every arm on one line. Per seed, that line is fitted (OLS) "
             f"through the seed's ordinary rows (up to {k} ordinary-row arms per seed, their row-weight arms included), "
             "on log–log scales where every dose and every value of the measure is positive (every arm and seed), else "
             "on linear ones — the rule is stated per measure. Each passage's and each null's residual from its own "
             "seed's line is averaged over seeds with a 95% t interval (the seed is the unit; the interval's coverage at "
             "4 seeds is checked by simulation in the tests): **above the line** / **below the line** where it excludes "
             "0, else **not shown to differ from the line** — which is not \"on the line\": no equivalence is tested "
             f"here. The words are each residual's own interval's; p: one-sample t over seeds, Holm-adjusted over the "
             f"{int(res.p.notna().sum())} residuals of the table as one family (\"not after Holm\": a word the "
             "adjusted p does not keep below 0.05). A residual on log–log is a factor of the line (×1 = on it); \"outside\" counts the seeds "
             "where the arm's dose lies beyond the ordinary rows' (the line extrapolated). Exploratory.")
    rows = []
    for _, r in lines.iterrows():
        name = DOSE_NAMES.get(r.measure, r.measure)
        if not r.fitted:
            rows.append([name, r.rule or "–", str(r.seeds), str(r.points), "–", "–", "–", r.note])
            continue
        per = "exponent " if r.scale == "log-log" else ""
        rows.append([name, r.rule, str(r.seeds), str(r.points),
                     f"{per}{r.slope:.3g} [{r.slope_low:.3g}, {r.slope_high:.3g}]",
                     f"{r.intercept:.3g} [{r.intercept_low:.3g}, {r.intercept_high:.3g}]", fmt_num(r.scatter), "–"])
    out = [intro, "**The ordinary rows' line** (slope and intercept: the mean of the seeds' with its 95% t interval, on "
           "the fit's scale, log10 on log–log; scatter: the residual sd about a seed's line, mean over seeds).",
           md_table(["measure", "scale (rule)", "seeds", "ordinary points", "slope [95% CI]", "intercept [95% CI]",
                     "scatter", "no fit because"], rows)]
    if not len(fitted):
        return "\n\n".join(out + ["*No measure has a line: no residual to test.*"])
    cells = [[DOSE_NAMES.get(r.measure, r.measure), f"`{r.condition}`", str(r.n), fmt_num(r.dose), fmt_num(r.value),
              fmt_num(r.line), _resid(r), fmt_p(r.p), fmt_p(r.p_holm), f"{r.outside} of {r.n}",
              r.verdict + (f" ({r.note})" if r.note else "")
              + ("; not after Holm" if _not_holm(r) and r.verdict != SHOWN_NOT else "")]
             for _, r in res.iterrows()]
    out += ["**Each passage and null against the line** (dose, value and the line at its dose: means over its seeds on "
            "the fit's scale, in the measure's units).",
            md_table(["measure", "arm", "seeds", "dose (mean)", "value (mean)", "the line there", "residual [95% CI]",
                      "p (t)", "p (Holm)", "outside", "verdict"], cells)]
    return "\n\n".join(out)


def dose_record_table(dr) -> str:
    """Every arm's dose at s in every channel (dose.json), mean over seeds: the record the line is read against."""
    t = dr.doses
    cells = [[f"`{r.condition}`", r.role, str(r.n), fmt_num(r.theta_l2),
              " / ".join(fmt_num(r[c]) for c in ("theta_q50", "theta_q90", "theta_q99", "theta_max")),
              fmt_num(r.changed_fraction), fmt_num(r.exp_avg_l2), fmt_num(r.exp_avg_sq_l2)] for _, r in t.iterrows()]
    return ("**Every arm's dose at s** (mean over seeds): ‖Δθ_{s+1}‖ (the dose), the per-coordinate profile (|Δθ_{s+1}|: "
            "median / 90% / 99% quantile / largest over coordinates, and the fraction of coordinates changed), and the "
            "change of AdamW's moments ‖Δm‖, ‖Δv‖ after the same update.\n\n"
            + md_table(["arm", "role", "seeds", "‖Δθ_{s+1}‖", "Δθ per coordinate, abs: median / 90% / 99% / max",
                        "changed", "‖Δm‖", "‖Δv‖"],
                       cells))


def text_fraction_section(dr) -> str:
    """The own-text drop as a fraction of the text's CE at s, per text group and row weight, and the drop against the
    CE at s across every text injected (a slope per seed, its mean with a t interval)."""
    f, c = dr.fraction, dr.ce_slope
    if not len(f):
        return "*No arm with a text of its own has its text's CE at s measured: no normalised drop.*"
    ci = lambda r, tag: (f"{r[f'frac_{tag}']:+.3g} [{r[f'frac_{tag}_low']:+.3g}, {r[f'frac_{tag}_high']:+.3g}]"
                         if np.isfinite(r[f"frac_{tag}_low"]) else fmt_num(r[f"frac_{tag}"]))
    cells = [[f"`{r.group}`" + ("" if r.weight == 1.0 else f" @w{r.weight:g}"), str(r.arms), str(r.n), fmt_num(r.ce_s),
              fmt_num(r.drop_s50), ci(r, "s50"), fmt_num(r.drop_final), ci(r, "final")] for _, r in f.iterrows()]
    slopes = []
    for _, r in c.iterrows():
        if np.isfinite(r.slope):
            slopes.append(f"at {r.when}, {r.slope:+.3g} [{r.slope_low:+.3g}, {r.slope_high:+.3g}] nats of drop per nat of "
                          f"CE at s ({p_text(r.p)}; {r.seeds} seeds, at least {r.texts} texts each)")
        else:
            slopes.append(f"at {r.when}, {r.note}")
    return ("**The own-text drop against how surprising the text was.** The drop (twin − arm on the arm's own text) as "
            "a fraction of that text's CE at s under the twin, per text (the ordinary rows pooled: per seed the mean "
            "over their arms), mean over seeds with its 95% t interval; a row-weight arm's text is its arm's.\n\n"
            + md_table(["text", "arms per seed", "seeds", "CE at s", "drop at s + 50", "drop / CE at s, s + 50 [95% CI]",
                        "drop at the end", "drop / CE at s, end [95% CI]"], cells)
            + "\n\nThe drop against the CE at s across every text injected at weight 1 (the passages, random characters "
            "and the ordinary rows in one frame; per seed an OLS slope, the mean over seeds with its 95% t interval): "
            + "; ".join(slopes) + ". Exploratory.")
