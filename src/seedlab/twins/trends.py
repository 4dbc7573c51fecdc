"""The twins' scale axis across cells: each measure's trend along each scale axis, what the trends say at the
paper's scale (exploratory), and the one prediction a confirmatory run tests (the cells and their table:
twins/scale.py).

- :func:`trends` (:data:`TRENDS`): per group × measure × axis, along the **family** of cells that differ in that
  axis only (:func:`families`: the most levels; the cells must agree on what :data:`FAMILIES` holds fixed for the
  axis, named in ``held``), the levels it rests on (``points``) and, with at least :data:`MIN_LEVELS` distinct levels, an OLS fit of log10(value) on log10(level) —
  a power law, ``kind = "power"``, slope = the exponent — when every cell's value of that group and measure is
  positive, else of the value on log10(level) (``kind = "log-linear"``, slope per decade). With fewer levels there
  is **no fit** (``fitted`` False, no slope, ``note`` says why): a line through two points is the
  points, and one through three non-monotone levels (the distance along B: 5.4 → 0.94 → 1.14) describes nothing.
  The slope's interval is the OLS t interval on its residuals (``df`` = levels − 2), so a curve that bends widens
  it. ``at_paper``: the fit at the paper's level of that axis with its t interval (outside the measured levels:
  an extrapolation, never a claim);
- :func:`paper_extrapolation` (:data:`PAPER_TABLE`): the B fit at B = 256, moved along the other axes' fits by their
  slopes to the paper's level (log10 v* = y_B(256) + Σ b_a Δlog10 a for a power law; the same sums on the value
  for log-linear): 9,336 updates after s, a decay over all of them (the ``run`` axis, steps and decay as one, where
  it has a fit; else the steps and schedule axes added, and with a steps family of stretched decay the schedule
  moves with it and is not added again), peak lr 6e-4 (from the rate the width move
  left: along a width family whose rate follows 1/width, d 768's) and d 768, assuming the axes do not interact
  (each slope was measured at one level of the others) and leaving the paper's 12 layers out (the width axis is d
  alone); none (``note`` says why) unless every axis with a family has a fit. **Exploratory**, an extrapolation;
- :func:`predict` + :func:`preregistration_text`: the confirmatory step. The measure the fit says moves most
  (of the focal passage, along one axis: among the fitted power laws whose slope interval excludes 0, the largest
  fitted change across the measured range, |slope| × Δlog10 level; a log-linear measure has no scale-free
  change and is not chosen), its value predicted at a level not yet run, and the interval a fresh-seed cell
  should fall in: on the fit's scale, prediction ± t(df)·√(se_fit² + se_cell²), se_fit the fit's standard error
  at that level, se_cell the family cells' mean jackknife standard error scaled by √(their seeds / the new
  seeds). Refused along an axis without a fit (fewer than :data:`MIN_LEVELS` levels). :func:`confirm` reads the
  verdict off the new cell.

twins/report_scale.py words and draws the frames; experiments/twins_scale.py runs the cells.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from seedlab.errors import SeedlabError
from seedlab.twins.scale import ALPHA, FOCAL, LABELS, MEASURES, Cell, Draws, interval

#: the fewest distinct levels a trend is fitted through (no power law through fewer than four)
MIN_LEVELS = 4
#: the scale axes (twins/scale.py ``Cell.label`` reads each off a cell) and what each is
AXES = {"batch_size": "rows per batch B", "after": "updates after the injection",
        "schedule": "updates from s to the decay's end", "run": "updates after s, the decay over all of them",
        "rate": "peak learning rate", "n_embd": "residual width d"}
#: the paper's scale on each axis: B = 256, 9,536 − 200 updates after s on a cosine that ends with the run (not
#: stated; nanoGPT's lr_decay_iters = max_iters), peak lr 6e-4, GPT-2 small's d
PAPER_SCALE = {"batch_size": 256, "after": 9336, "schedule": 9336, "run": 9336, "rate": 6e-4, "n_embd": 768}
#: each axis in a formula (the pre-registration's power law)
SYMBOL = {"batch_size": "B", "after": "T", "schedule": "D", "run": "T", "rate": "lr", "n_embd": "d"}


def _but(*moved: str, held: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every label of twins/scale.py's :data:`LABELS` but ``moved``, and ``held``."""
    return tuple(k for k in LABELS if k not in moved) + held


#: steps and the decay's end moved together, the updates after the decay's end (``tail``) held
_STRETCHED = _but("after", "decay_after", held=("tail",))
#: per axis, held labels a family's cells must have at one value, not only agree on: along ``run`` the decay ends
#: with the run (a family of cells whose decay ends 800 updates before it would be another axis)
PINNED: dict[str, dict[str, int]] = {"run": {"tail": 0}}

#: per axis, what a family along it holds fixed (twins/scale.py ``Cell.label``'s names), and that in words: the
#: first entry with a family of two levels or more is the axis's; a later one is the fallback a table without such
#: cells falls back on, with the confound it lets move named (``held``)
FAMILIES: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "batch_size": [(_but("batch_size"), "everything else")],
    "after": [(_but("after"), "the schedule: the decay ends at the same step"),
              (_STRETCHED, "the decay stretched with the run: steps and the summed rate move together")],
    "schedule": [(_but("decay_after"), "the run's length")],
    # the paper's shape (its cosine ends with its run): steps and the decay's length move as one, tail pinned at 0
    "run": [(_STRETCHED, "the decay ends with the run: steps and the summed rate move together")],
    "rate": [(_but("peak_lr", "min_lr", held=("min_ratio",)), "min_lr / peak_lr and everything else")],
    "n_embd": [(_but("n_embd", "peak_lr", "min_lr", held=("lr_x_width", "min_ratio")),
                "the head count; the rate ∝ 1/width (peak_lr × d)"),
               (_but("n_embd", "n_head", held=("head_size",)),
                "the head size: the head count grows with the width, the rate fixed (heads and rate confounded)")],
}
TRENDS = ["group", "measure", "axis", "kind", "cells", "levels", "values", "points", "fitted", "slope", "low", "high",
          "intercept", "df", "paper_level", "at_paper", "at_paper_low", "at_paper_high", "note", "held", "label"]
PAPER_TABLE = ["group", "measure", "kind", "axes", "predicted", "low", "high", "df", "paper", "paper_note", "note",
               "label"]




def family_of(cells: Sequence[Cell], axis: str) -> tuple[list[Cell], int] | None:
    """The family along ``axis`` and which of :data:`FAMILIES`' entries holds it (0: the axis's own; more: a
    fallback), or None: for the first entry with one, of the groups of cells agreeing on what it holds, the one with
    the most distinct levels (at least two; ties: the group with the smallest held values), ordered by level; a cell
    off the axis's :data:`PINNED` values is in none. A
    cell whose level was not recorded (None: a summary older than the label) is in none; a held value not recorded
    agrees with another not recorded. Two cells at one level: the first by name."""
    def order(key: tuple) -> tuple:
        return tuple((v is not None, 0 if v is None else v) for v in key)

    for i, (held, _) in enumerate(FAMILIES[axis]):
        by: dict[tuple, dict] = {}
        for c in sorted(cells, key=lambda c: c.name):
            if any(c.label(h) != v for h, v in PINNED.get(axis, {}).items()):
                continue
            key, level = tuple(c.label(h) for h in held), c.label(axis)
            if level is not None:
                by.setdefault(key, {}).setdefault(level, c)
        best = sorted(by.items(), key=lambda kv: (-len(kv[1]), order(kv[0])))
        if best and len(best[0][1]) >= 2:
            return [best[0][1][lv] for lv in sorted(best[0][1])], i
    return None


def families(cells: Sequence[Cell]) -> dict[str, list[Cell]]:
    """Per axis of :data:`AXES`, the cells that differ in that axis alone (:func:`family_of`), ordered by their
    level; an axis without one is left out."""
    return {axis: f[0] for axis in AXES if (f := family_of(cells, axis)) is not None}


def kind_of(dr: Draws, group: str, measure: str) -> str:
    """"power" when every cell's point value of ``group`` × ``measure`` is positive and finite, else "log-linear"
    (a value that reaches 0 or below has no power law; it is fitted on log10 of the level instead)."""
    pts = [v[0] for (c, g, k), v in dr.values.items() if g == group and k == measure]
    return "power" if pts and all(np.isfinite(p) and p > 0 for p in pts) else "log-linear"


def _fit_scale(v: np.ndarray, kind: str) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.nan) if kind == "power" else v


def _back(y: np.ndarray | float, kind: str):
    return np.power(10.0, y) if kind == "power" else y


def fit_line(levels: Sequence[float], y: np.ndarray) -> tuple[float, float, float, float, int]:
    """The OLS line of ``y`` on x = log10(levels): (slope, intercept, the slope's standard error, the residual sd,
    its degrees of freedom k − 2); the errors NaN with fewer than 3 points."""
    x = np.log10(np.asarray(levels, dtype=np.float64))
    y = np.asarray(y, dtype=np.float64)
    xc = x - x.mean()
    sxx = float((xc * xc).sum())
    b = float((xc * (y - y.mean())).sum() / sxx)
    a = float(y.mean() - b * x.mean())
    df = len(x) - 2
    if df < 1:
        return b, a, math.nan, math.nan, df
    s = math.sqrt(float(((y - a - b * x) ** 2).sum()) / df)
    return b, a, s / math.sqrt(sxx), s, df


@dataclass
class Trend:
    """One group × measure along one axis (:data:`TRENDS`' columns): the family's levels, its point values, each
    cell's standard error on the fit's scale, and, with at least :data:`MIN_LEVELS` distinct levels, the OLS fit
    on the fit's scale (log10 value for a power law); without one ``slope`` is NaN and ``note`` says why."""

    group: str
    measure: str
    axis: str
    kind: str  # the fit's scale: "power" (every cell's value positive: log10 value) or "log-linear" (the value)
    cells: list[str]
    levels: list[int]
    values: np.ndarray  # [levels] the point values
    se_cells: np.ndarray  # [levels] each cell's jackknife standard error on the fit's scale (NaN: none)
    held: str = ""  # what the family holds fixed (:data:`FAMILIES`)
    variant: int = 0  # which of the axis's FAMILIES entries: 0 its own, more a fallback with a confound
    slope: float = math.nan
    intercept: float = math.nan
    slope_se: float = math.nan
    resid_sd: float = math.nan
    df: float = math.nan
    note: str = ""

    @property
    def points(self) -> int:
        """The distinct levels the trend rests on."""
        return len(set(self.levels))

    @property
    def fitted(self) -> bool:
        return math.isfinite(self.slope)

    def t(self, alpha: float = ALPHA) -> float:
        """The two-sided t quantile on the fit's residual degrees of freedom (NaN without a fit)."""
        return float(sps.t.ppf(1 - alpha / 2, self.df)) if self.fitted else math.nan

    def at(self, level: float) -> tuple[float, float]:
        """(the fit at ``level``, its standard error) on the fit's scale; NaN without a fit."""
        if not self.fitted:
            return math.nan, math.nan
        x = np.log10(np.asarray(self.levels, dtype=np.float64))
        x0 = math.log10(level)
        sxx = float(((x - x.mean()) ** 2).sum())
        return (self.intercept + self.slope * x0,
                self.resid_sd * math.sqrt(1 / len(x) + (x0 - float(x.mean())) ** 2 / sxx))


def trend_objects(dr: Draws) -> list[Trend]:
    """Every group × measure × axis with a family (:func:`families`) whose cells all have that group; fitted where
    the family has at least :data:`MIN_LEVELS` distinct levels and every value is finite on the fit's scale."""
    fams = {axis: f for axis in AXES if (f := family_of(list(dr.cells.values()), axis)) is not None}
    out = []
    groups = list(dict.fromkeys(g for (_, g, _) in dr.values))
    for g in groups:
        for k in MEASURES:
            kind = kind_of(dr, g, k)
            for axis, (fam, variant) in fams.items():
                vs = [dr.get(c.name, g, k) for c in fam]
                if any(v is None for v in vs):
                    continue
                levels = [c.label(axis) for c in fam]
                se = np.array([interval(_fit_scale(v, kind))[3] for v in vs])
                t = Trend(g, k, axis, kind, [c.name for c in fam], levels, np.array([v[0] for v in vs]), se,
                          held=FAMILIES[axis][variant][1], variant=variant)
                y = _fit_scale(t.values, kind)
                if t.points < MIN_LEVELS:
                    t.note = (f"{t.points} levels ({', '.join(map(str, levels))}): no fit through fewer than "
                              f"{MIN_LEVELS}")
                elif not np.isfinite(y).all():
                    t.note = "a level's value is not finite on the fit's scale: no fit"
                else:
                    t.slope, t.intercept, t.slope_se, t.resid_sd, t.df = fit_line(levels, y)
                out.append(t)
    return out


def trends(dr: Draws, alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`TRENDS`: per trend the levels it rests on and, where fitted, the slope (the exponent of a power law;
    per decade of the level for log-linear) with its OLS t interval, the intercept, the residual degrees of
    freedom, and the fit at the paper's level of the axis with its t interval (value scale); where not fitted, no
    slope and the note saying why. Labelled exploratory."""
    rows = []
    for t in trend_objects(dr):
        q = t.t(alpha)
        y0, se0 = t.at(PAPER_SCALE[t.axis])
        rows.append([t.group, t.measure, t.axis, t.kind, ",".join(t.cells), ",".join(map(str, t.levels)),
                     ",".join(f"{v:.6g}" for v in t.values), t.points, t.fitted, t.slope, t.slope - q * t.slope_se,
                     t.slope + q * t.slope_se, t.intercept, t.df, PAPER_SCALE[t.axis], float(_back(y0, t.kind)),
                     float(_back(y0 - q * se0, t.kind)), float(_back(y0 + q * se0, t.kind)), t.note, t.held,
                     "exploratory"])
    return pd.DataFrame(rows, columns=TRENDS)


def paper_extrapolation(dr: Draws, alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`PAPER_TABLE`: per group × measure the B fit at the paper's B, moved along the other axes' fits to the
    paper's level of each (module doc), with its t interval (the fits' variances added, on the fewest residual
    degrees of freedom among them). Needs the B family; the axes used are named (``axes``); none, with a note,
    unless every one of them has a fit. Exploratory."""
    by = {(t.group, t.measure, t.axis): t for t in trend_objects(dr)}
    rows = []
    for (g, k, axis), tb in by.items():
        if axis != "batch_size":
            continue
        base = dr.cells[tb.cells[0]]
        run = by.get((g, k, "run"))
        if run is not None and run.fitted:  # the paper's shape in one fit: steps with the decay over all of them
            used = [tb, run] + [by[(g, k, o)] for o in ("rate", "n_embd") if (g, k, o) in by]
        else:
            used = [tb] + [by[(g, k, o)] for o in ("after", "schedule", "rate", "n_embd") if (g, k, o) in by]
            after = by.get((g, k, "after"))
            if after is not None and after.variant:  # the decay stretched with the steps: the schedule moved too
                used = [t for t in used if t.axis != "schedule"]
        m = MEASURES[k]
        head = [g, k, tb.kind, ",".join(t.axis for t in used)]
        refused = [t for t in used if not t.fitted]
        if refused:
            note = "no fit along " + "; ".join(f"{AXES[t.axis]}: {t.note}" for t in refused)
            rows.append([*head, math.nan, math.nan, math.nan, math.nan, m.paper, m.paper_note, note, "exploratory"])
            continue
        y, se = tb.at(PAPER_SCALE["batch_size"])
        var = se * se
        width = next((t for t in used if t.axis == "n_embd"), None)
        unknown = [t for t in used[1:] if base.label(t.axis) is None]
        if unknown:
            rows.append([*head, math.nan, math.nan, math.nan, math.nan, m.paper, m.paper_note,
                         f"{base.name} has no {unknown[0].axis} recorded", "exploratory"])
            continue
        for t in used[1:]:
            start = base.label(t.axis)
            if t.axis == "rate" and width is not None and width.variant == 0:  # the width move rescaled the rate
                start = start * base.n_embd / PAPER_SCALE["n_embd"]
            step = math.log10(PAPER_SCALE[t.axis]) - math.log10(start)
            y += t.slope * step
            var += (t.slope_se * step) ** 2
        df = min(t.df for t in used)
        half = float(sps.t.ppf(1 - alpha / 2, df)) * math.sqrt(var)
        rows.append([*head, float(_back(y, tb.kind)), float(_back(y - half, tb.kind)), float(_back(y + half, tb.kind)),
                     df, m.paper, m.paper_note, "an extrapolation beyond the measured levels", "exploratory"])
    return pd.DataFrame(rows, columns=PAPER_TABLE)


# ---------------------------------------------------------------- the confirmatory prediction


@dataclass
class Prediction:
    """A pre-registered prediction of one measure at a level not yet run (:func:`predict`)."""

    measure: str
    group: str
    axis: str
    at: int | float  # a float on the rate axis
    kind: str
    cells: list[str]
    levels: list[int | float]
    values: list[float]  # the family's point values
    slope: float
    slope_low: float
    slope_high: float
    trend_shown: bool  # the slope's interval excludes 0
    moved: float  # |slope| × Δlog10 level over the family: the fitted change across the measured range (decades)
    predicted: float
    fit_low: float  # the trend's own interval at ``at`` (the fitted cells' seed noise)
    fit_high: float
    low: float  # where a fresh-seed cell should fall: the trend's and the new cell's noise together
    high: float
    seeds: list[int]
    alpha: float
    preset: str  # the family cell the confirmatory cell is run from
    sets: list[str]  # its --set overrides
    label: str = "confirmatory"

    def to_json(self, path: str | Path) -> Path:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")
        return Path(path)

    @classmethod
    def from_json(cls, path: str | Path) -> Prediction:
        if not Path(path).is_file():
            raise SeedlabError(f"{path}: no such prediction (write one with predict first)")
        return cls(**json.loads(Path(path).read_text()))


def predict(dr: Draws, axis: str, at: int, seeds: Sequence[int], *, measure: str | None = None,
            group: str = FOCAL, alpha: float = ALPHA) -> Prediction:
    """The confirmatory prediction (module doc): along ``axis`` at the unrun level ``at`` on the fresh ``seeds``,
    of ``measure`` (None: the one the fit says moves most). Bad input — an axis without a family, a level
    already run, seeds already used by a family cell, a family of fewer than :data:`MIN_LEVELS` levels (no fit to
    predict from), no fitted power law to choose from, a width axis (a new width is a new model preset) — is a
    one-line error. The cell's ``--set`` overrides keep what the family holds: along the steps with the decay
    fixed, its ``decay_steps``; along the rate, min_lr the family's fraction of the peak."""
    if axis not in AXES:
        raise SeedlabError(f"axis: must be one of {', '.join(AXES)}, got {axis!r}")
    if axis == "n_embd":
        raise SeedlabError("axis: n_embd cannot be predicted for a confirmatory run (a new width needs a model preset)")
    cand = [t for t in trend_objects(dr) if t.axis == axis and t.group == group]
    if not cand:
        raise SeedlabError(f"axis: no family of cells varies {axis} alone with {group} measured (need two levels)")
    if at <= 0 or at in cand[0].levels:
        raise SeedlabError(f"at: {axis} = {at} must be a positive level not yet run (run: {cand[0].levels})")
    fam = [dr.cells[n] for n in cand[0].cells]
    used = sorted({s for c in fam for s in c.seeds} & set(seeds))
    if not seeds or used:
        raise SeedlabError(f"seeds: a confirmatory run needs fresh seeds, got {list(seeds)} "
                           f"({'none' if not seeds else f'{used} used by the fitted cells'})")
    if cand[0].points < MIN_LEVELS:
        raise SeedlabError(f"axis: no fit along {axis} to predict from: {cand[0].note}")
    span = math.log10(max(cand[0].levels)) - math.log10(min(cand[0].levels))

    def moved(t: Trend) -> float:
        return abs(t.slope) * span

    def interval(t: Trend) -> tuple[float, float]:
        q = t.t(alpha)
        return t.slope - q * t.slope_se, t.slope + q * t.slope_se

    def shown(t: Trend) -> bool:
        lo, hi = interval(t)
        return bool(np.isfinite(lo) and (lo > 0 or hi < 0))

    if measure is None:
        power = [t for t in cand if t.kind == "power" and t.fitted]
        if not power:
            raise SeedlabError(f"measure: no measure of {group} is a fitted power law along {axis}; name one")
        pick = [t for t in power if shown(t)] or power
        t = max(pick, key=moved)
    else:
        match = [t for t in cand if t.measure == measure]
        if not match:
            raise SeedlabError(f"measure: must be one of {', '.join(MEASURES)}, got {measure!r}")
        t = match[0]
        if not t.fitted:
            raise SeedlabError(f"measure: {measure} has no fit along {axis} to predict from: {t.note}")
    slo, shi = interval(t)
    q = t.t(alpha)
    pred, se_fit = t.at(at)
    n_old = float(np.mean([len(c.seeds) for c in fam]))
    se_cell = float(np.nanmean(t.se_cells)) * math.sqrt(n_old / len(seeds))
    flo, fhi = pred - q * se_fit, pred + q * se_fit
    half = q * math.sqrt(se_fit ** 2 + (se_cell if np.isfinite(se_cell) else 0.0) ** 2)
    near = min(fam, key=lambda c: (abs(math.log10(c.label(axis)) - math.log10(at)), c.label(axis)))
    s = near.injection_step
    if axis == "batch_size":
        sets = [f"batch_size={at}"]
    elif axis == "schedule":
        sets = [f"decay_steps={s + at}"]
    elif axis == "rate":
        sets = [f"peak_lr={at:g}", f"min_lr={at * near.label('min_ratio'):.6g}"]
    elif axis == "run":  # the decay over the whole run: decay_steps left unset (null: the run's end)
        sets = [f"steps={s + at}"]
    else:  # the steps: the decay where the family holds it (fixed; or stretched, ``tail`` updates before the end)
        sets = [f"steps={s + at}"]
        if t.variant == 0:
            sets.append(f"decay_steps={s + near.label('decay_after')}")
        elif near.label("tail"):
            sets.append(f"decay_steps={s + at - near.label('tail')}")
    sets.append(f"seeds=[{','.join(map(str, seeds))}]")
    return Prediction(measure=t.measure, group=group, axis=axis, at=float(at) if axis == "rate" else int(at), kind=t.kind, cells=list(t.cells),
                      levels=list(t.levels), values=[float(v) for v in t.values],
                      slope=t.slope, slope_low=slo, slope_high=shi, trend_shown=shown(t), moved=moved(t),
                      predicted=float(_back(pred, t.kind)), fit_low=float(_back(flo, t.kind)),
                      fit_high=float(_back(fhi, t.kind)), low=float(_back(pred - half, t.kind)),
                      high=float(_back(pred + half, t.kind)), seeds=list(map(int, seeds)), alpha=alpha,
                      preset=near.preset or near.name, sets=sets)


def preregistration_text(p: Prediction) -> str:
    """The prediction as the text ``seedlab twins run --preregistration`` keeps before the first step."""
    m = MEASURES[p.measure]
    level = int((1 - p.alpha) * 100)
    law = (f"a power law, {p.measure} ∝ {SYMBOL[p.axis]}^b, b = {p.slope:.3g} [{p.slope_low:.3g}, "
           f"{p.slope_high:.3g}]" if p.kind == "power" else
           f"linear in log10 {p.axis}, {p.slope:.3g} [{p.slope_low:.3g}, {p.slope_high:.3g}] per decade")
    fam = ", ".join(f"{c} ({p.axis} {lv}: {v:.4g})" for c, lv, v in zip(p.cells, p.levels, p.values))
    shown = ("its interval excludes 0" if p.trend_shown else
             "its interval does NOT exclude 0: the trend is not shown, so this prediction is weak")
    return "\n".join([
        f"# Confirmatory prediction: {p.measure} at {p.axis} = {p.at}",
        "",
        "Written from the exploratory scale table before this run started (twins/scale.py ``predict``); kept by "
        "`seedlab twins run --preregistration` with its SHA-256 before the first step.",
        "",
        f"- **Measure**: {p.measure} — {m.what} ({m.unit}), of {p.group}, with its nulls beside it as in the table.",
        f"- **Why this one**: of {p.group}'s power-law trends along {AXES[p.axis]} the one that moves most over "
        f"the measured range ({p.moved:.3g} decades){'' if p.trend_shown else ' (no trend there is shown)'}.",
        f"- **Trend** (exploratory, {len(p.cells)} cells: {fam}): {law}; {shown}.",
        f"- **Design**: the preset {p.preset} with " + " ".join(f"--set {s}" for s in p.sets) +
        f": {p.axis} = {p.at}, fresh seeds {p.seeds}, nothing else changed.",
        f"- **Prediction**: {p.predicted:.4g} (the trend's own {level}% interval [{p.fit_low:.4g}, {p.fit_high:.4g}]).",
        f"- **Decision rule**: confirmed when the new cell's {p.measure} lies in [{p.low:.4g}, {p.high:.4g}], the "
        f"{level}% interval of a fresh {len(p.seeds)}-seed cell (the fit's standard error at that level and the new "
        "cell's own, the fitted cells' jackknife standard errors scaled to its seeds, on the fit's t); otherwise "
        "refuted. Secondary: the change from the nearest fitted cell has the slope's sign.",
        "",
    ])


def confirm(p: Prediction, dr: Draws, cell: str) -> dict:
    """The verdict on the new cell ``cell`` of ``dr``: its value (and interval), inside the pre-registered
    interval or not, and whether its change from the nearest fitted cell has the slope's sign (the fitted cells'
    values are the pre-registration's)."""
    v = dr.get(cell, p.group, p.measure)
    if v is None:
        raise SeedlabError(f"{cell}: no {p.group} {p.measure} measured")
    point, lo, hi, _, _ = interval(v, p.alpha)
    i = min(range(len(p.levels)), key=lambda j: abs(math.log10(p.levels[j]) - math.log10(p.at)))
    toward = np.sign(p.slope) * np.sign(math.log10(p.at) - math.log10(p.levels[i]))
    moved = np.sign(point - p.values[i])
    inside = bool(p.low <= point <= p.high)
    return {"cell": cell, "measure": p.measure, "value": point, "low": lo, "high": hi, "predicted": p.predicted,
            "interval_low": p.low, "interval_high": p.high, "inside": inside, "direction": bool(toward == moved),
            "verdict": "confirmed" if inside else "refuted"}
