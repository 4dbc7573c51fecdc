"""Is it the passage? as a dose–response: every arm's end measures against the size of its perturbation at s.

Each arm's run folder holds ``dose.json`` (written by the fork loop; read back by twins/rundir.py
``Measured.doses``): the arm's state minus its twin's after the update that consumed the batch of s, in every
channel — the weights (‖Δθ_{s+1}‖, the per-coordinate profile: quantiles of |Δθ| and the fraction of coordinates
changed) and AdamW's moments (‖Δm‖, ‖Δv‖), in float64. The **dose** of an arm is ‖Δθ_{s+1}‖.

- :func:`arm_table`: per seed × arm (the twin left out) its dose, its end measures (:data:`MEASURES`) and its own
  text's CE at s under the twin (an arm with a text of its own: the passages, random characters, the ordinary rows
  and their row-weight arms ``<arm>@w<weight>``, twins/variants.py ``split_weight``).
- :func:`fit_lines` + :func:`residuals`: the test. Per measure the **ordinary rows' line**: per seed an OLS line of
  the measure on the dose through that seed's ordinary-row arms (``ordinary-row.<i>`` and their row-weight arms,
  which may be different texts on every seed), on log10–log10 scales when every dose and every value of the
  measure in the table is positive (the ordinary rows, the passages and the nulls, every seed: :func:`scale_of`,
  the rule recorded with the fit as ``scale`` and ``rule``), else on linear scales. Each passage's and each null's
  residual from *its own seed's* line, r_k = y_k − (a_k + b_k x_k) on the fit's scale, is the unit: its mean over
  seeds with a t interval on n − 1 degrees of freedom (:func:`t_interval`) and the two-sided one-sample t-test's p.
  The seeds are independent, so their residuals are; each seed's own intercept and slope absorb how the lines
  differ between seeds, so no model of that is needed. The interval's coverage at 4 seeds is checked by simulation
  (tests/twins/test_dose.py). A line needs :data:`MIN_ARMS` ordinary arms of distinct dose on a seed (a seed with
  fewer is left out) and :data:`MIN_SEEDS` such seeds (else **no fit**, ``note`` says why); a residual needs the arm
  on :data:`MIN_SEEDS` of the fitted seeds. The line's slope and intercept are the mean of the seeds' with the same
  t interval, its band at a dose (:func:`band`) the mean of the seeds' lines there with its t interval.
  **Words** (``verdict``): "above the line" / "below the line" where the 95% interval excludes 0, else "not shown
  to differ from the line": no equivalence is tested here, so never "on the line" or "the same". The words are
  each residual's own; the p-values of every residual of the table are Holm-adjusted as one family (``p_holm``;
  ``holm``: still below α after it). ``outside`` counts the seeds where the arm's dose lies outside the ordinary
  rows' (the residual is then an extrapolation of the line).
- :func:`text_fraction`: the own-text drop (twin − arm on the arm's own text, at s + 50 and at the end) as a
  fraction of that text's CE at s, per arm group and row weight (the ordinary rows pooled: per seed the mean over
  their arms), each with its t interval over seeds.
- :func:`ce_slope`: the drop against the text's CE at s across every text injected at weight 1 (the passages,
  random characters, the ordinary rows): per seed an OLS slope, the mean over seeds with its t interval.

:func:`summarize` computes them all from a measured run (None when no arm has a dose.json: a run trained before
the fork loop recorded it). Everything here is exploratory. twins/report.py words the tables, twins/figures.py
draws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats as sps

from seedlab.twins.config import is_ordinary
from seedlab.twins.rundir import Measured
from seedlab.twins.stats import ALPHA, holm, with_current_names, with_derived
from seedlab.twins.variants import VARIANTS, variant_of
from seedlab.twins.variants import split_weight

#: a residual's words (``verdict``), from its 95% interval; one that holds 0 is never "on the line" (no equivalence
#: is tested here)
ABOVE, BELOW, SHOWN_NOT = "above the line", "below the line", "not shown to differ from the line"
#: the fewest ordinary arms (of distinct dose) a seed's line is fitted through
MIN_ARMS = 3
#: the fewest seeds a line (and a residual) rests on
MIN_SEEDS = 3
#: the end measures regressed on the dose: measures.parquet column (or derived) -> what it is
MEASURES = {
    "distance": "weight distance to the twin at the end",
    "distance_aligned": "weight distance to the twin at the end after permutation alignment",
    "barrier": "interpolation barrier to the twin at the end (nats)",
    "heldout_ce_diff": "held-out CE − twin's at the end (nats)",
    "own_drop_s50": "own text's CE drop, twin − arm, at s + 50 (nats)",
    "own_drop_final": "own text's CE drop, twin − arm, at the end (nats)",
}
#: each measure as the report and the figure name it
LABELS = {"distance": "distance to the twin", "distance_aligned": "aligned distance to the twin", "barrier": "barrier",
          "heldout_ce_diff": "held-out CE − twin's", "own_drop_s50": "own-text drop at s + 50",
          "own_drop_final": "own-text drop at the end"}
#: why a measure may have no value for the arms at all
NOT_MEASURED = {"distance_aligned": "measures.parquet has the aligned distance only between twins of different seeds"}
#: dose.json's numbers as columns of :attr:`Measured.doses` (the dose is ``theta_l2``)
DOSE = "theta_l2"
DOSE_COLUMNS = ["theta_l2", "theta_q50", "theta_q90", "theta_q99", "theta_max", "changed_fraction", "exp_avg_l2",
                "exp_avg_sq_l2"]
LINES = ["measure", "scale", "rule", "fitted", "seeds", "points", "slope", "slope_low", "slope_high", "intercept",
         "intercept_low", "intercept_high", "scatter", "note"]
RESIDUALS = ["measure", "condition", "group", "role", "weight", "scale", "n", "outside", "dose", "value", "line",
             "resid", "low", "high", "p", "p_holm", "holm", "verdict", "note"]


def own_text(arm: str, texts) -> str | None:
    """The name of ``arm``'s own text among ``texts`` (inputs.json's passages): its own name, else the arm it weights
    (a row-weight arm injects that arm's text); None for an arm without a text (a null of the gradient or weights)."""
    if arm in texts:
        return arm
    base = split_weight(arm)[0]
    return base if base in texts else None


def role_of(arm: str) -> tuple[str, str]:
    """(role, group) of a run's condition: ("ordinary", "ordinary-rows") for the ordinary rows and their weight arms;
    else its variant's role (passage, null) and name; ("other", the arm) for an arm no variant owns."""
    base = split_weight(arm)[0]
    if is_ordinary(base):
        return "ordinary", VARIANTS["ordinary-row"].group
    v = variant_of(base)
    return (v.role, v.name) if v is not None else ("other", base)


def _order(arm: str) -> tuple:
    """Registry order (twins/variants.py), an ordinary row by its index, the weight-1 arm first then by weight."""
    base, w = split_weight(arm)
    v = variant_of(base)
    at = list(VARIANTS).index(v.name) if v is not None else len(VARIANTS)
    i = base.rpartition(".")[2]
    return at, int(i) if i.isdigit() else -1, base, -w


# ---------------------------------------------------------------- the table the fits read


def arm_table(measures: pd.DataFrame, checkpoints: pd.DataFrame, doses: pd.DataFrame, injection: int) -> pd.DataFrame:
    """Per seed × arm with a dose (the twin left out): seed, condition, base (the arm it weights, or itself), weight,
    role, group, the dose channels (:data:`DOSE_COLUMNS`; ``dose`` = ‖Δθ_{s+1}‖), every measure of :data:`MEASURES`
    (NaN where not measured: a null has no text of its own) and ``ce_s``, the own text's CE at s under the twin
    (checkpoints.parquet at the injection step)."""
    m = with_derived(measures[measures.kind == "injected"])
    out = pd.DataFrame({"seed": m.seed.astype(int), "condition": m.condition})
    for col in MEASURES:
        src = {"own_drop_s50": "passage_gain_s50", "own_drop_final": "passage_gain_final"}.get(col, col)
        out[col] = m[src].to_numpy(dtype=float) if src in m else np.nan
    at_s = checkpoints[checkpoints.step == injection] if len(checkpoints) else checkpoints
    if len(at_s) and "twin_passage_ce" in at_s:
        ce = at_s.set_index(["seed", "condition"]).twin_passage_ce
        out["ce_s"] = ce.reindex(pd.MultiIndex.from_frame(out[["seed", "condition"]])).to_numpy(dtype=float)
    else:
        out["ce_s"] = np.nan
    d = doses[["seed", "condition", *[c for c in DOSE_COLUMNS if c in doses]]] if len(doses) else pd.DataFrame(
        columns=["seed", "condition", *DOSE_COLUMNS])
    out = out.merge(d.astype({"seed": int}), on=["seed", "condition"], how="inner")
    for c in DOSE_COLUMNS:
        if c not in out:
            out[c] = np.nan
    out["dose"] = out[DOSE].astype(float)
    out = out[np.isfinite(out.dose)]
    parts = [split_weight(a) for a in out.condition]
    roles = [role_of(a) for a in out.condition]
    out = out.assign(base=[p[0] for p in parts], weight=[p[1] for p in parts], role=[r[0] for r in roles],
                     group=[r[1] for r in roles])
    keys = out.condition.map(_order)
    out = out.assign(_k=keys).sort_values(["_k", "seed"], kind="stable").drop(columns="_k")
    return out.reset_index(drop=True)


# ---------------------------------------------------------------- the statistics (vectorised: the tests simulate them)


class Interval(NamedTuple):
    """A mean over seeds with its two-sided t interval and the one-sample t-test's p (arrays when vectorised)."""

    mean: float
    low: float
    high: float
    sd: float
    n: int
    p: float


def t_interval(values, alpha: float = ALPHA) -> Interval:
    """The mean of ``values`` over the last axis (the seeds) ± t_{n−1, 1−α/2} · sd/√n, and the two-sided one-sample
    t-test's p of mean 0 (NaN when every value is equal); NaN with fewer than 2 values."""
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[-1]
    mean = v.mean(axis=-1) if n else np.full(v.shape[:-1], np.nan)
    if n < 2:
        nan = np.full(np.shape(mean), np.nan)
        return Interval(mean, nan, nan, nan, n, nan)
    sd = v.std(axis=-1, ddof=1)
    se = sd / math.sqrt(n)
    q = float(sps.t.ppf(1 - alpha / 2, n - 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(sd > 0, 2 * sps.t.sf(np.abs(mean / se), n - 1), np.nan)[()]  # a scalar for one set of seeds
    return Interval(mean, mean - q * se, mean + q * se, sd, n, p)


def seed_line(x, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The OLS line of ``y`` on ``x`` along the last axis (one seed's points): (slope, intercept, residual sd on
    n − 2 degrees of freedom; NaN with 2 points)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = x.shape[-1]
    xm, ym = x.mean(axis=-1, keepdims=True), y.mean(axis=-1, keepdims=True)
    b = ((x - xm) * (y - ym)).sum(axis=-1) / ((x - xm) ** 2).sum(axis=-1)
    a = ym[..., 0] - b * xm[..., 0]
    sse = ((y - a[..., None] - b[..., None] * x) ** 2).sum(axis=-1)
    sd = np.sqrt(sse / (n - 2)) if n > 2 else np.full(np.shape(b), np.nan)
    return b, a, sd


def line_residuals(x_ord, y_ord, x_arm, y_arm, alpha: float = ALPHA) -> Interval:
    """The test on arrays (seeds on the second-to-last axis of the ordinary points, the last of the arm's): each seed's
    line through its ordinary points (``[..., seeds, arms]``), the arm's residual from it on that seed
    (``[..., seeds]``), and :func:`t_interval` over the seeds. The fit's scale is the caller's."""
    b, a, _ = seed_line(x_ord, y_ord)
    return t_interval(np.asarray(y_arm, dtype=np.float64) - (a + b * np.asarray(x_arm, dtype=np.float64)), alpha)


# ---------------------------------------------------------------- the ordinary rows' line


def scale_of(dose, value) -> tuple[str, str]:
    """(scale, rule): "log-log" when every finite dose and value is positive, else "linear"; the rule in words."""
    x, y = np.asarray(dose, dtype=np.float64), np.asarray(value, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    bad_y, bad_x = int((y <= 0).sum()), int((x <= 0).sum())
    if not len(x):
        return "", "no value measured"
    if not bad_x and not bad_y:
        return "log-log", f"log–log: every dose and value positive ({len(x)} points, every arm and seed)"
    why = ", ".join(w for w in (f"{bad_y} of {len(y)} values" if bad_y else "", f"{bad_x} doses" if bad_x else "") if w)
    return "linear", f"linear: {why} ≤ 0 (log–log needs every one positive)"


def _on(v, scale: str):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(np.asarray(v, dtype=np.float64)) if scale == "log-log" else np.asarray(v, dtype=np.float64)


def _back(v, scale: str):
    return np.power(10.0, v) if scale == "log-log" else v


@dataclass
class DoseLine:
    """One measure's ordinary-rows line (module doc): per fitted seed its slope, intercept and scatter (residual sd)
    on the fit's scale, and the ordinary doses' range there; ``note``: why there is no fit (empty when fitted)."""

    measure: str
    scale: str
    rule: str
    seeds: list[int] = field(default_factory=list)
    slopes: np.ndarray = field(default_factory=lambda: np.empty(0))
    intercepts: np.ndarray = field(default_factory=lambda: np.empty(0))
    scatter: np.ndarray = field(default_factory=lambda: np.empty(0))
    lo: dict[int, float] = field(default_factory=dict)
    hi: dict[int, float] = field(default_factory=dict)
    points: int = 0
    note: str = ""

    @property
    def fitted(self) -> bool:
        return not self.note and len(self.seeds) >= MIN_SEEDS

    def at(self, seed: int, dose) -> float:
        """Seed ``seed``'s line at ``dose`` on the fit's scale."""
        i = self.seeds.index(seed)
        return float(self.intercepts[i] + self.slopes[i] * _on(dose, self.scale))


def fit_lines(table: pd.DataFrame) -> dict[str, DoseLine]:
    """Per measure of :data:`MEASURES` a :class:`DoseLine` through the ordinary rows of ``table`` (:func:`arm_table`)."""
    out = {}
    for k in MEASURES:
        scale, rule = scale_of(table.dose, table[k])
        line = DoseLine(k, scale, rule)
        out[k] = line
        ordn = table[(table.role == "ordinary") & np.isfinite(table[k]) & np.isfinite(table.dose)]
        if not len(ordn):
            line.note = f"not measured for the ordinary rows ({NOT_MEASURED.get(k, 'no finite value')})"
            continue
        short = []
        slopes, intercepts, scatter = [], [], []
        for seed, g in ordn.groupby("seed"):
            x, y = _on(g.dose, scale), _on(g[k], scale)
            if len(g) < MIN_ARMS or np.unique(x).size < 2:
                short.append(f"seed {seed}: {len(g)}")
                continue
            b, a, sd = seed_line(x, y)
            line.seeds.append(int(seed))
            slopes.append(float(b))
            intercepts.append(float(a))
            scatter.append(float(sd))
            line.lo[int(seed)], line.hi[int(seed)] = float(g.dose.min()), float(g.dose.max())
            line.points += len(g)
        line.slopes, line.intercepts, line.scatter = np.array(slopes), np.array(intercepts), np.array(scatter)
        if len(line.seeds) < MIN_SEEDS:
            few = f"; too few ordinary arms on {', '.join(short)} (a seed's line needs {MIN_ARMS} of distinct dose)" if short else ""
            line.note = (f"no fit: {len(line.seeds)} seed(s) with a line, the fit needs {MIN_SEEDS}{few}")
    return out


def line_rows(lines: dict[str, DoseLine], alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`LINES`: per measure its scale and rule, the fitted seeds and ordinary points, the mean slope (the
    exponent on log–log) and intercept over seeds with their t intervals, the mean scatter about a seed's line
    (residual sd, the fit's scale), or the note saying why there is no fit."""
    rows = []
    for k, ln in lines.items():
        if ln.fitted:
            b, a = t_interval(ln.slopes, alpha), t_interval(ln.intercepts, alpha)
            rows.append([k, ln.scale, ln.rule, True, len(ln.seeds), ln.points, float(b.mean), float(b.low),
                         float(b.high), float(a.mean), float(a.low), float(a.high), float(np.nanmean(ln.scatter)), ""])
        else:
            rows.append([k, ln.scale, ln.rule, False, len(ln.seeds), ln.points, *[math.nan] * 7, ln.note])
    return pd.DataFrame(rows, columns=LINES)


def _verdict(low: float, high: float) -> str:
    if low > 0:
        return ABOVE
    if high < 0:
        return BELOW
    return SHOWN_NOT


def residuals(table: pd.DataFrame, lines: dict[str, DoseLine], alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`RESIDUALS`: per fitted measure and arm that is not an ordinary row (the passages and their weight arms,
    the nulls), its residual from its own seed's line (module doc) with its t interval over seeds, p and Holm's p
    (every row of the table one family), the verdict in words; the arm's mean dose and value and the line's value at
    its dose (means over its seeds on the fit's scale, back on the measure's). An arm on fewer than
    :data:`MIN_SEEDS` fitted seeds has no interval (``note``)."""
    rows = []
    arms = table[table.role != "ordinary"]
    for k, ln in lines.items():
        if not ln.fitted:
            continue
        for cond, g in arms.groupby("condition", sort=False):
            g = g[g.seed.isin(ln.seeds) & np.isfinite(g[k])]
            if ln.scale == "log-log":
                g = g[(g[k] > 0) & (g.dose > 0)]
            if not len(g):
                continue
            fit = np.array([ln.at(int(s), x) for s, x in zip(g.seed, g.dose)])
            r = _on(g[k], ln.scale) - fit
            outside = int(sum(not ln.lo[int(s)] <= x <= ln.hi[int(s)] for s, x in zip(g.seed, g.dose)))
            head = [k, cond, g.group.iloc[0], g.role.iloc[0], float(g.weight.iloc[0]), ln.scale, len(g), outside,
                    float(_back(np.mean(_on(g.dose, ln.scale)), ln.scale)), float(_back(np.mean(_on(g[k], ln.scale)), ln.scale)),
                    float(_back(fit.mean(), ln.scale))]
            if len(g) < MIN_SEEDS:
                rows.append([*head, math.nan, math.nan, math.nan, math.nan, math.nan, None, "no interval",
                             f"measured on {len(g)} of the line's seeds (needs {MIN_SEEDS})"])
                continue
            ci = t_interval(np.asarray(r), alpha)
            rows.append([*head, float(ci.mean), float(ci.low), float(ci.high), float(ci.p), math.nan, None,
                         _verdict(float(ci.low), float(ci.high)), ""])
    out = pd.DataFrame(rows, columns=RESIDUALS)
    if len(out):
        tested = out.verdict != "no interval"
        out.loc[tested, "p_holm"] = holm(out.loc[tested, "p"].to_numpy(dtype=float))
        out["holm"] = pd.Series([None if not t else bool(q < alpha) for t, q in zip(tested, out.p_holm)], index=out.index,
                                dtype=object)
    return out


def band(line: DoseLine, n: int = 40, alpha: float = ALPHA) -> pd.DataFrame:
    """The line where the ordinary rows lie (from the smallest to the largest ordinary dose over the fitted seeds):
    per dose the mean of the seeds' lines and its t interval, back on the measure's scale (dose, mean, low, high)."""
    if not line.fitted:
        return pd.DataFrame(columns=["dose", "mean", "low", "high"])
    lo, hi = min(line.lo.values()), max(line.hi.values())
    x = np.geomspace(lo, hi, n) if line.scale == "log-log" or lo > 0 else np.linspace(lo, hi, n)
    per_seed = line.intercepts[None, :] + line.slopes[None, :] * _on(x, line.scale)[:, None]  # [doses, seeds]
    ci = t_interval(per_seed, alpha)
    return pd.DataFrame({"dose": x, "mean": _back(ci.mean, line.scale), "low": _back(ci.low, line.scale),
                         "high": _back(ci.high, line.scale)})


# ---------------------------------------------------------------- the own-text drop against the text's CE at s


FRACTION = ["group", "weight", "role", "arms", "n", "ce_s", "drop_s50", "frac_s50", "frac_s50_low", "frac_s50_high",
            "drop_final", "frac_final", "frac_final_low", "frac_final_high"]
CE_SLOPE = ["when", "seeds", "texts", "slope", "slope_low", "slope_high", "p", "intercept", "intercept_low",
            "intercept_high", "note"]


def text_fraction(table: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`FRACTION`: per arm group and row weight with a text of its own (the passages, random characters, the
    ordinary rows pooled), per seed the mean over its arms of the drop and of drop / CE at s, then the mean over
    seeds of each, the fraction's with its t interval (``arms``: how many arms per seed, at most)."""
    t = table[np.isfinite(table.ce_s) & (table.ce_s > 0)]
    t = t.assign(frac_s50=t.own_drop_s50 / t.ce_s, frac_final=t.own_drop_final / t.ce_s)
    rows = []
    for (group, w), g in t.groupby(["group", "weight"], sort=False):
        per = g.groupby("seed")[["ce_s", "own_drop_s50", "own_drop_final", "frac_s50", "frac_final"]].mean()
        s50, fin = (t_interval(per[c].dropna().to_numpy(), alpha) for c in ("frac_s50", "frac_final"))
        rows.append([group, float(w), g.role.iloc[0], int(g.groupby("seed").size().max()), len(per),
                     float(per.ce_s.mean()), float(per.own_drop_s50.mean()), float(s50.mean), float(s50.low),
                     float(s50.high), float(per.own_drop_final.mean()), float(fin.mean), float(fin.low),
                     float(fin.high)])
    return pd.DataFrame(rows, columns=FRACTION)


def ce_slope(table: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`CE_SLOPE`: at s + 50 and at the end, the own-text drop against the text's CE at s across every text
    injected at weight 1: per seed the OLS slope (nats of drop per nat of CE at s) through its texts (at least
    :data:`MIN_ARMS` of distinct CE), the mean slope and intercept over seeds (at least :data:`MIN_SEEDS`) with t
    intervals and the slope's p; ``texts``: the fewest texts on a seed fitted."""
    rows = []
    t = table[(table.weight == 1.0) & np.isfinite(table.ce_s)]
    for when, col in (("s + 50", "own_drop_s50"), ("the end", "own_drop_final")):
        slopes, intercepts, counts = [], [], []
        for _, g in t[np.isfinite(t[col])].groupby("seed"):
            if len(g) < MIN_ARMS or g.ce_s.nunique() < 2:
                continue
            b, a, _ = seed_line(g.ce_s.to_numpy(), g[col].to_numpy())
            slopes.append(float(b))
            intercepts.append(float(a))
            counts.append(len(g))
        if len(slopes) < MIN_SEEDS:
            rows.append([when, len(slopes), min(counts, default=0), *[math.nan] * 7,
                         f"no fit: {len(slopes)} seed(s) with {MIN_ARMS} texts or more, the fit needs {MIN_SEEDS}"])
            continue
        b, a = t_interval(slopes, alpha), t_interval(intercepts, alpha)
        rows.append([when, len(slopes), min(counts), float(b.mean), float(b.low), float(b.high), float(b.p),
                     float(a.mean), float(a.low), float(a.high), ""])
    return pd.DataFrame(rows, columns=CE_SLOPE)


def dose_record(table: pd.DataFrame) -> pd.DataFrame:
    """Per arm (in registry order), over its seeds: how many, and the mean of every dose channel (:data:`DOSE_COLUMNS`)."""
    g = table.groupby("condition", sort=False)
    out = g[DOSE_COLUMNS].mean()
    out.insert(0, "n", g.size())
    out.insert(0, "role", g.role.first())
    return out.reset_index()


# ---------------------------------------------------------------- a measured run


@dataclass
class DoseResponse:
    """Everything the report's dose section prints and its figure draws (:func:`summarize`)."""

    table: pd.DataFrame  # arm_table: per seed x arm
    lines: dict[str, DoseLine]
    line_rows: pd.DataFrame  # LINES
    residuals: pd.DataFrame  # RESIDUALS
    fraction: pd.DataFrame  # FRACTION
    ce_slope: pd.DataFrame  # CE_SLOPE
    doses: pd.DataFrame  # dose_record
    alpha: float = ALPHA


def dose_response(table: pd.DataFrame, alpha: float = ALPHA) -> DoseResponse:
    """Every table of the module from an :func:`arm_table`."""
    lines = fit_lines(table)
    return DoseResponse(table, lines, line_rows(lines, alpha), residuals(table, lines, alpha),
                        text_fraction(table, alpha), ce_slope(table, alpha), dose_record(table), alpha)


def summarize(d: Measured, alpha: float = ALPHA) -> DoseResponse | None:
    """The dose–response of the measured run ``d``; None when no arm has a dose.json (nothing to fit)."""
    doses = d.doses
    if not len(doses):
        return None
    measures, checkpoints = (with_current_names(t, ("condition",)) for t in (d.measures, d.checkpoints))
    return dose_response(arm_table(measures, checkpoints, doses, d.steps["injection"]), alpha)
