"""The twins' scale axis (issue 32 §3): one summary per measured cell, the table of every measure across cells
beside its nulls, each measure's trend along each scale axis, what the trends say at the paper's scale
(exploratory), and the one prediction a confirmatory run tests.

A **cell** is a measured twins run folder (``seedlab twins run`` + ``seedlab twins measure``; the presets
``twins/scale-*``) labelled by its scale: rows per batch B (``batch_size``; one row is 1/B of its update),
updates after the injection (``after`` = steps − s) and the model's residual width d (``n_embd``; its layers
``n_layer``). The paper: B = 256, 9,336 updates after s, GPT-2 small (d 768, 12 layers): :data:`PAPER_SCALE`.

**Per cell** (:func:`summarise`, one measured folder; :class:`Cell`, kept as a small folder by
:meth:`Cell.to_dir` and read back exactly by :meth:`Cell.from_dir`: seedlab/cells.py ``Summary``, the mechanism the
attribution grid's cells share, twins/rundir.py ``ScaleCellDir``) the per-seed numbers every measure is computed from:

- ``per_seed`` (:data:`PER_SEED`): per seed × arm against the seed's twin at the end (measures.parquet):
  ``distance``, ``barrier``, ``rise_mid``, ``heldout_ce_diff``; from the cross-passage matrix (passages.parquet)
  at s + 50 and at the end the drop (twin's CE − the arm's, nats/token: positive = the run predicts it better) on
  the arm's own text (``own_s50``, ``own_final``) and the mean drop on every other text measured (``others_s50``,
  ``others_final``: the other passages and the ordinary rows' texts). An arm without a text of its own
  (``nudge``, ``matched-gradient``, ``sign-gradient``, ``weight-kick``) has the **focal passage's** text (:data:`FOCAL`,
  fluent-fabricated) as its "own": its drop there is what the passage's CE does when no passage was seen, the
  null of the own-passage drop. ``group``: the arm's condition, every ``ordinary-row.<i>`` in one group
  :data:`ORDINARY_ROWS` (the ordinary-row distribution);
- ``pairs`` (:data:`PAIRS`): per pair of seeds, their twins' ``distance``, ``distance_aligned`` (after weight
  matching, lm/align.py; NaN when measured before it) and ``barrier``;
- ``curves`` (:data:`CURVES`): per seed × group × step after s, ``absdiff`` = |training loss − twin's| (the
  mean over the group's arms), rounded to 9 significant digits (float32's precision) so the kept CSV is exact.

**The measures** (:data:`MEASURES`), per cell and group, each a function of the per-seed numbers, so every one
has the same interval, a t interval over the cell's seeds (issue 46 §3: one that holds at 4 seeds, which a 4-seed
percentile bootstrap does not): the point estimate ± t(n − 1, 1 − α/2) × its jackknife standard error, from the n
leave-one-seed-out replicates (:func:`seed_weights`; the seed-pair baselines keep the pairs of the seeds left in).
For a mean over seeds (the drops, the specificity) that is exactly the t interval of the per-seed values,
sd/√n; for the ratios (distance and barrier over the seeds' own) and peak / trough (of the mean curve) it is the
jackknife's approximation of it, a rough one for peak / trough, whose peak may move between steps when a seed is
left out. No interval where a replicate is not finite or the cell has fewer than 2 seeds:

- ``distance_pct``          mean distance to the twin, % of the mean inter-seed distance (paper 44.1%);
- ``distance_aligned_pct``  the same distance, % of the mean inter-seed distance after weight matching (the part
                            of the gauge freedom permutations remove taken out of the baseline; paper: not
                            measured). The run–twin distance itself is not aligned: a twin shares its run's basis;
- ``barrier_pct``           mean barrier to the twin, % of the mean inter-seed barrier (paper 3.0%);
- ``own_drop_s50``          the own-passage drop at s + 50, nats/token (paper 0.0389 for the fabricated passage);
- ``specificity_s50``       own drop − the mean drop on the other texts at s + 50: what is learned of *this* text
                            beyond what moves on text the run did not see. twins.stats.specificity's "own − the
                            other fluent passage" needs fluent-attested, which the scale presets leave out for
                            cost; the texts here are the other passages and the ordinary rows' held-out stretches;
- ``peak_over_trough``      of the mean over seeds of |loss − twin's| after s, smoothed by a centred rolling mean
                            over ``measure.smooth_steps``: the peak over the smallest value between s + 1 and the
                            peak (twins.stats.peak_trough, the paper's "two orders of magnitude", ~100);
- ``end_drop``              the own-passage drop at the end, nats/token (the paper's end effect: not significant,
                            p = 0.25, no size given);
- ``retained``              end drop / s + 50 drop (ratio of the means; NaN where the s + 50 drop is not positive):
                            the end effect in units of what was learned, comparable across B where the drops
                            themselves shrink with 1/B.

Every measure is computed by twins/measure.py's files as they are; none is new.

**Across cells:**

- :func:`table` (:data:`TABLE`): per cell × group × measure the value, its interval and its jackknife standard
  error ``se``; for the ordinary-row distribution also ``arm_min``/``arm_max``, the measure of each ordinary row
  alone;
- :func:`trends` (:data:`TRENDS`): per group × measure × axis, along the **family** of cells that differ in that
  axis only (:func:`families`: the most levels; the cells must agree on the other labels), the levels it rests on
  (``points``) and, with at least :data:`MIN_LEVELS` distinct levels, an OLS fit of log10(value) on log10(level) —
  a power law, ``kind = "power"``, slope = the exponent — when every cell's value of that group and measure is
  positive, else of the value on log10(level) (``kind = "log-linear"``, slope per decade). With fewer levels there
  is **no fit** (``fitted`` False, no slope, ``note`` says why; issue 46 §3): a line through two points is the
  points, and one through three non-monotone levels (the distance along B: 5.4 → 0.94 → 1.14) describes nothing.
  The slope's interval is the OLS t interval on its residuals (``df`` = levels − 2), so a curve that bends widens
  it. ``at_paper``: the fit at the paper's level of that axis with its t interval (outside the measured levels:
  an extrapolation, never a claim);
- :func:`paper_extrapolation` (:data:`PAPER_TABLE`): the B fit at B = 256, moved along the steps and width fits
  by their slopes to 9,336 updates after s and d 768 (log10 v* = y_B(256) + b_T Δlog10 T + b_d Δlog10 d for a
  power law; the same sums on the value for log-linear), assuming the axes do not interact (each slope was
  measured at one level of the others) and leaving the paper's 12 layers out (the width axis is d alone); none
  (``note`` says why) unless every axis with a family has a fit. **Exploratory**, an extrapolation;
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from seedlab.cells import Columns, Summary
from seedlab.errors import SeedlabError
from seedlab.lm.gptconfig import PRESETS
from seedlab.stats import jackknife_se
from seedlab.twins.config import is_ordinary
from seedlab.twins.rundir import Measured
from seedlab.twins.stats import LEGACY_NAMES, PAPER, with_current_names

#: the passage the scale table is about, and whose text the text-less nulls' "own" drop is read on
FOCAL = "fluent-fabricated"
#: every ordinary-row.<i> arm in one group: the ordinary-row distribution
ORDINARY_ROWS = "ordinary-rows"
#: the nulls set beside the passage, in the table's order (any other arm measured is kept as its own group)
NULLS = (ORDINARY_ROWS, "matched-gradient", "sign-gradient", "nudge")
#: arms with no text of their own: their "own" drop is on the focal passage's text
TEXTLESS = ("nudge", "matched-gradient", "sign-gradient", "weight-kick")
ALPHA = 0.05
#: the fewest distinct levels a trend is fitted through (issue 46 §3: no power law through fewer than four)
MIN_LEVELS = 4
#: the scale axes, as a cell labels them, and what each is
AXES = {"batch_size": "rows per batch B", "after": "updates after the injection", "n_embd": "residual width d"}
#: the paper's scale on each axis: B = 256, 9,536 − 200 updates after s, GPT-2 small's d
PAPER_SCALE = {"batch_size": 256, "after": 9336, "n_embd": 768}
#: the cells' labels that define a family along an axis (the other labels must agree)
LABELS = ("batch_size", "after", "n_embd", "n_layer", "block_size")


@dataclass(frozen=True)
class Measure:
    """One measure of the scale table: what it is, its unit, the paper's value (NaN: not stated)."""

    what: str
    unit: str
    paper: float
    paper_note: str = ""


MEASURES: dict[str, Measure] = {
    "distance_pct": Measure("distance to the twin, % of the inter-seed distance", "%", PAPER["distance_pct"]),
    "distance_aligned_pct": Measure("distance to the twin, % of the inter-seed distance after weight matching", "%",
                                    math.nan, "not measured"),
    "barrier_pct": Measure("barrier to the twin, % of the inter-seed barrier", "%", PAPER["barrier_pct"]),
    "own_drop_s50": Measure("own-passage CE drop at s + 50 (twin − run)", "nats", PAPER["gain_s50"][FOCAL]),
    "specificity_s50": Measure("own-passage drop − mean drop on the other texts, s + 50", "nats", math.nan, "not stated"),
    "peak_over_trough": Measure("peak / trough of the smoothed |loss − twin's|", "×", 100.0,
                                "\"two orders of magnitude\""),
    "end_drop": Measure("own-passage CE drop at the end", "nats", math.nan, "not significant (p = 0.25)"),
    "retained": Measure("end drop / s + 50 drop", "fraction", math.nan, "not stated"),
}

PER_SEED = ["seed", "arm", "group", "distance", "barrier", "rise_mid", "heldout_ce_diff", "own_s50", "others_s50",
            "own_final", "others_final"]
PAIRS = ["seed", "seed_b", "distance", "distance_aligned", "barrier"]
CURVES = ["seed", "group", "step", "absdiff"]
FRAMES = {"per_seed": PER_SEED, "pairs": PAIRS, "curves": CURVES}
#: the frames' column types (the rest are float): what makes a CSV read back exactly
COLUMNS = Columns(strings=frozenset({"arm", "group"}), ints=frozenset({"seed", "seed_b", "step"}))
SCALARS = ["name", "preset", "batch_size", "steps", "injection_step", "after", "model", "n_embd", "n_layer",
           "block_size", "seeds", "arms", "smooth_steps", "s50", "final", "source", "stages"]
TABLE = ["cell", "batch_size", "after", "n_embd", "n_layer", "n", "group", "measure", "value", "low", "high", "se",
         "valid", "arm_min", "arm_max"]
TRENDS = ["group", "measure", "axis", "kind", "cells", "levels", "values", "points", "fitted", "slope", "low", "high",
          "intercept", "df", "paper_level", "at_paper", "at_paper_low", "at_paper_high", "note", "label"]
PAPER_TABLE = ["group", "measure", "kind", "axes", "predicted", "low", "high", "df", "paper", "paper_note", "note",
               "label"]


def group_of(arm: str) -> str:
    """The table's group of an arm: every ordinary row in :data:`ORDINARY_ROWS`, any other arm its own name."""
    arm = LEGACY_NAMES.get(arm, arm)
    return ORDINARY_ROWS if is_ordinary(arm) else arm


# ---------------------------------------------------------------- one cell


@dataclass
class Cell(Summary, scalars=SCALARS, frames=FRAMES, columns=COLUMNS, noun="kept scale-cell summary"):
    """One measured cell's per-seed numbers and labels (module doc; frames :data:`FRAMES`)."""

    name: str
    preset: str  # the config the cell was run from (a preset name or a file), "" when not known
    batch_size: int
    steps: int
    injection_step: int
    after: int  # steps − injection_step
    model: str
    n_embd: int
    n_layer: int
    block_size: int
    seeds: list[int]
    arms: list[str]  # every arm measured against its twin (ordinary rows by name)
    smooth_steps: int  # measure.smooth_steps: the rolling window of peak / trough
    s50: int
    final: int
    per_seed: pd.DataFrame
    pairs: pd.DataFrame
    curves: pd.DataFrame
    source: str = ""  # the run folder summarised
    stages: dict[str, float] = field(default_factory=dict)  # wall seconds per stage (the driver's)

    def label(self, axis: str) -> int:
        return int(getattr(self, axis))


def _r9(x) -> np.ndarray:
    """Rounded to 9 significant digits (float32's precision), so a CSV written with repr reads back exactly."""
    return np.array([float(f"{v:.9g}") for v in np.asarray(x, dtype=np.float64)])


def summarise(d: Measured, name: str, *, preset: str = "") -> Cell:
    """One measured twins folder's :class:`Cell` (module doc)."""
    c, steps = d.config, d.steps
    s, s50, final = int(steps["injection"]), int(steps["s50"]), int(steps["final"])
    measures = with_current_names(d.measures, ("condition",))
    inj, seed_rows = measures[measures.kind == "injected"], measures[measures.kind == "seed"]
    if not len(inj):
        raise SeedlabError(f"{d.dir.root}: measures.parquet has no run measured against its twin")
    x = with_current_names(d.passages)
    if not len(x):
        raise SeedlabError(f"{d.dir.root}: no passages.parquet (measured by an older seedlab: measure it again)")
    x = x.assign(gain=-x["diff"])
    rows = []
    for r in inj.itertuples():
        own_text = FOCAL if r.condition in TEXTLESS else r.condition
        row = {"seed": int(r.seed), "arm": r.condition, "group": group_of(r.condition), "distance": r.distance,
               "barrier": r.barrier, "rise_mid": getattr(r, "rise_mid", np.nan),
               "heldout_ce_diff": r.heldout_ce - r.heldout_ce_b}
        for tag, t in (("s50", s50), ("final", final)):
            at = x[(x.seed == r.seed) & (x.condition == r.condition) & (x.step == t)].set_index("text")["gain"]
            others = [v for k, v in at.items() if k != own_text]
            row[f"own_{tag}"] = float(at.get(own_text, np.nan))
            row[f"others_{tag}"] = float(np.mean(others)) if others else np.nan
        rows.append(row)
    per_seed = COLUMNS.typed(pd.DataFrame(rows), PER_SEED)
    aligned = seed_rows["distance_aligned"] if "distance_aligned" in seed_rows else pd.Series(np.nan, index=seed_rows.index)
    pairs = COLUMNS.typed(pd.DataFrame({"seed": seed_rows.seed, "seed_b": seed_rows.seed_b,
                                        "distance": seed_rows.distance, "distance_aligned": aligned,
                                        "barrier": seed_rows.barrier}), PAIRS)
    tc = with_current_names(d.timecourse, ("condition",))
    tc = tc[tc.step > s]
    tc = tc.assign(group=tc.condition.map(group_of), absdiff=tc["diff"].abs())
    g = tc.groupby(["seed", "group", "step"]).absdiff.mean().reset_index()
    curves = COLUMNS.typed(g.assign(absdiff=_r9(g.absdiff)), CURVES)
    model = str(c["model"])
    gpt = PRESETS[model]
    seeds = sorted({int(v) for v in inj.seed} | {int(v) for v in seed_rows.seed} | {int(v) for v in seed_rows.seed_b})
    return Cell(name=name, preset=preset, batch_size=int(c["batch_size"]), steps=int(c["steps"]), injection_step=s,
                after=int(c["steps"]) - s, model=model, n_embd=gpt.n_embd, n_layer=gpt.n_layer,
                block_size=int(c.get("block_size") or gpt.block_size), seeds=seeds,
                arms=sorted(set(inj.condition), key=lambda a: (group_of(a) != FOCAL, a)),
                smooth_steps=int(d.settings.smooth_steps), s50=s50, final=final, per_seed=per_seed, pairs=pairs,
                curves=curves, source=str(d.dir.root), stages={})


# ---------------------------------------------------------------- the measures, on leave-one-seed-out replicates


def seed_weights(cell: Cell) -> np.ndarray:
    """[1 + seeds, seeds]: row 0 every seed once (the point estimate), then row 1 + i every seed but the i-th (the
    jackknife's leave-one-seed-out replicates)."""
    n = len(cell.seeds)
    return np.vstack([np.ones((1, n)), 1 - np.eye(n)]).astype(np.float64)


def _per_seed(cell: Cell, frame: pd.DataFrame, column: str) -> np.ndarray:
    """[seeds]: ``column`` per seed of the cell (NaN where absent), the mean over the rows of a seed."""
    v = frame.groupby("seed")[column].mean() if len(frame) else pd.Series(dtype=float)
    return v.reindex(cell.seeds).to_numpy(np.float64)


def _wmean(W: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[draws]: the W-weighted mean of x over seeds, NaN entries left out (NaN where no weight is left)."""
    ok = np.isfinite(x)
    w = W * ok
    total = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (w * np.where(ok, x, 0.0)).sum(axis=1) / total, np.nan)


def _pair_mean(cell: Cell, W: np.ndarray, column: str) -> np.ndarray:
    """[draws]: the mean of the seed pairs' ``column``, each pair weighted by the product of its seeds' counts."""
    p = cell.pairs[np.isfinite(cell.pairs[column])]
    if not len(p):
        return np.full(len(W), np.nan)
    idx = {k: i for i, k in enumerate(cell.seeds)}
    a, b = p.seed.map(idx).to_numpy(), p.seed_b.map(idx).to_numpy()
    w = W[:, a] * W[:, b]
    total = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (w * p[column].to_numpy(np.float64)).sum(axis=1) / total, np.nan)


def smooth_rows(curves: np.ndarray, window: int) -> np.ndarray:
    """A centred rolling mean over ``window`` steps along the last axis, truncated at the ends (pandas'
    ``rolling(window, min_periods=1, center=True)``: position i averages i − window//2 .. i + (window − 1)//2)."""
    T = curves.shape[-1]
    c = np.concatenate([np.zeros(curves.shape[:-1] + (1,)), np.cumsum(curves, axis=-1)], axis=-1)
    i = np.arange(T)
    lo, hi = np.maximum(i - window // 2, 0), np.minimum(i + (window - 1) // 2, T - 1) + 1
    return (c[..., hi] - c[..., lo]) / (hi - lo)


def peak_over_trough_rows(curves: np.ndarray, window: int) -> np.ndarray:
    """Per row of ``curves`` [draws, steps]: twins.stats.peak_trough's peak / trough (the smoothed maximum over
    the smallest smoothed value from the first step up to it; NaN where that is not positive or a step is NaN)."""
    sm = smooth_rows(curves, window)
    top = np.argmax(np.where(np.isfinite(sm), sm, -np.inf), axis=1)
    peak = sm[np.arange(len(sm)), top]
    before = np.where(np.arange(sm.shape[1])[None, :] <= top[:, None], sm, np.inf)
    trough = before.min(axis=1)
    bad = ~np.isfinite(sm).all(axis=1) | ~(trough > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(bad, np.nan, peak / trough)


def _curve_matrix(cell: Cell, group: str) -> np.ndarray:
    """[seeds, steps after s]: the group's |loss − twin's| per seed (NaN rows for seeds without it)."""
    g = cell.curves[cell.curves.group == group]
    if not len(g):
        return np.zeros((len(cell.seeds), 0))
    return g.pivot_table(index="seed", columns="step", values="absdiff").reindex(cell.seeds).to_numpy(np.float64)


def measure_draws(cell: Cell, frame: pd.DataFrame, group: str, W: np.ndarray) -> dict[str, np.ndarray]:
    """Every measure of :data:`MEASURES` for the arms in ``frame`` (per_seed rows; a group, or one ordinary row)
    and the curves of ``group``, on each row of the seed weights ``W`` (module doc)."""
    m = {col: _wmean(W, _per_seed(cell, frame, col)) for col in ("distance", "barrier", "own_s50", "own_final")}
    spec = frame.assign(spec=frame.own_s50 - frame.others_s50)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {
            "distance_pct": 100 * m["distance"] / _pair_mean(cell, W, "distance"),
            "distance_aligned_pct": 100 * m["distance"] / _pair_mean(cell, W, "distance_aligned"),
            "barrier_pct": 100 * m["barrier"] / _pair_mean(cell, W, "barrier"),
            "own_drop_s50": m["own_s50"],
            "specificity_s50": _wmean(W, _per_seed(cell, spec, "spec")),
            "end_drop": m["own_final"],
            "retained": np.where(m["own_s50"] > 0, m["own_final"] / m["own_s50"], np.nan),
        }
    C = _curve_matrix(cell, group)
    if C.shape[1]:
        ok = np.isfinite(C).all(axis=1)
        w = W * ok
        total = w.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(total > 0, w @ np.where(ok[:, None], C, 0.0) / total, np.nan)
        out["peak_over_trough"] = peak_over_trough_rows(mean, cell.smooth_steps)
    else:
        out["peak_over_trough"] = np.full(len(W), np.nan)
    return {k: out[k] for k in MEASURES}


def groups_of(cell: Cell) -> list[str]:
    """The cell's groups in the table's order: the focal passage, the nulls, then any other arm."""
    present = list(dict.fromkeys(cell.per_seed.group))
    first = [g for g in (FOCAL, *NULLS) if g in present]
    return first + sorted(g for g in present if g not in first)


@dataclass
class Draws:
    """Per (cell, group, measure): the point estimate (index 0) and the leave-one-seed-out values (module doc)."""

    values: dict[tuple[str, str, str], np.ndarray]
    arms: dict[tuple[str, str, str], tuple[float, float]]  # ordinary rows: the measure's min and max over the arms
    cells: dict[str, Cell]

    def get(self, cell: str, group: str, measure: str) -> np.ndarray | None:
        return self.values.get((cell, group, measure))


def draws(cells: Sequence[Cell]) -> Draws:
    """Every cell's measures on its seed weights (:func:`seed_weights`), for every group; and each ordinary row's
    point estimate alone. Cell names must be distinct."""
    names = [c.name for c in cells]
    if len(set(names)) != len(names):
        raise SeedlabError(f"cells: names must be distinct, got {names}")
    values, arms = {}, {}
    for c in cells:
        W = seed_weights(c)
        for g in groups_of(c):
            for k, v in measure_draws(c, c.per_seed[c.per_seed.group == g], g, W).items():
                values[(c.name, g, k)] = v
            if g == ORDINARY_ROWS:
                one = W[:1]
                per_arm = [measure_draws(c, c.per_seed[c.per_seed.arm == a], g, one)
                           for a in sorted(set(c.per_seed.arm[c.per_seed.group == g]))]
                for k in MEASURES:
                    v = np.array([p[k][0] for p in per_arm if k != "peak_over_trough"], dtype=np.float64)
                    v = v[np.isfinite(v)]
                    arms[(c.name, g, k)] = (float(v.min()), float(v.max())) if len(v) else (math.nan, math.nan)
    return Draws(values, arms, {c.name: c for c in cells})


def _interval(v: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float, float, float]:
    """(point, low, high, se, valid share) of a replicates vector (index 0 the point estimate, then the n
    leave-one-seed-out values): point ± t(n − 1, 1 − α/2) × the jackknife standard error. No interval (NaN) with
    fewer than 2 seeds or where the point or a replicate is not finite (``valid``: the finite replicates' share)."""
    point, loo = float(v[0]), np.asarray(v[1:], dtype=np.float64)
    n = len(loo)
    if not n:
        return point, math.nan, math.nan, math.nan, math.nan
    ok = np.isfinite(loo)
    if n < 2 or not ok.all() or not math.isfinite(point):
        return point, math.nan, math.nan, math.nan, float(ok.mean())
    se = jackknife_se(loo)
    half = float(sps.t.ppf(1 - alpha / 2, n - 1)) * se
    return point, point - half, point + half, se, 1.0


def table(dr: Draws, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per cell × group × measure (:data:`TABLE`): the value, its t interval over the seeds (:func:`_interval`),
    its jackknife standard error and the valid share of its replicates; the ordinary rows' min and max over their
    arms (NaN for other groups and for peak / trough, which is of the group's mean curve)."""
    rows = []
    for (name, g, k), v in dr.values.items():
        c = dr.cells[name]
        point, lo, hi, se, valid = _interval(v, alpha)
        amin, amax = dr.arms.get((name, g, k), (math.nan, math.nan))
        n = int(c.per_seed[c.per_seed.group == g].seed.nunique())
        rows.append([name, c.batch_size, c.after, c.n_embd, c.n_layer, n, g, k, point, lo, hi, se, valid, amin, amax])
    return pd.DataFrame(rows, columns=TABLE)


# ---------------------------------------------------------------- trends along the axes


def families(cells: Sequence[Cell]) -> dict[str, list[Cell]]:
    """Per axis of :data:`AXES`, the cells that differ in that axis alone, ordered by their level: of the groups
    of cells agreeing on every other label (:data:`LABELS`), the one with the most distinct levels (at least two;
    ties: the group with the smallest other labels); an axis without one is left out. Two cells at one level: the
    first by name."""
    out = {}
    for axis in AXES:
        others = [lab for lab in LABELS if lab != axis]
        by: dict[tuple, dict[int, Cell]] = {}
        for c in sorted(cells, key=lambda c: c.name):
            by.setdefault(tuple(c.label(o) for o in others), {}).setdefault(c.label(axis), c)
        best = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        if best and len(best[0][1]) >= 2:
            out[axis] = [best[0][1][lv] for lv in sorted(best[0][1])]
    return out


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
    fams = families(list(dr.cells.values()))
    out = []
    groups = list(dict.fromkeys(g for (_, g, _) in dr.values))
    for g in groups:
        for k in MEASURES:
            kind = kind_of(dr, g, k)
            for axis, fam in fams.items():
                vs = [dr.get(c.name, g, k) for c in fam]
                if any(v is None for v in vs):
                    continue
                levels = [c.label(axis) for c in fam]
                se = np.array([_interval(_fit_scale(v, kind))[3] for v in vs])
                t = Trend(g, k, axis, kind, [c.name for c in fam], levels, np.array([v[0] for v in vs]), se)
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
                     float(_back(y0 - q * se0, t.kind)), float(_back(y0 + q * se0, t.kind)), t.note, "exploratory"])
    return pd.DataFrame(rows, columns=TRENDS)


def paper_extrapolation(dr: Draws, alpha: float = ALPHA) -> pd.DataFrame:
    """:data:`PAPER_TABLE`: per group × measure the B fit at the paper's B, moved along the steps and width fits to
    the paper's steps after s and width (module doc), with its t interval (the fits' variances added, on the
    fewest residual degrees of freedom among them). Needs the B family; the axes used are named (``axes``); none,
    with a note, unless every one of them has a fit. Exploratory."""
    by = {(t.group, t.measure, t.axis): t for t in trend_objects(dr)}
    rows = []
    for (g, k, axis), tb in by.items():
        if axis != "batch_size":
            continue
        base = dr.cells[tb.cells[0]]
        used = [tb] + [by[(g, k, o)] for o in ("after", "n_embd") if (g, k, o) in by]
        m = MEASURES[k]
        head = [g, k, tb.kind, ",".join(t.axis for t in used)]
        refused = [t for t in used if not t.fitted]
        if refused:
            note = "no fit along " + "; ".join(f"{AXES[t.axis]}: {t.note}" for t in refused)
            rows.append([*head, math.nan, math.nan, math.nan, math.nan, m.paper, m.paper_note, note, "exploratory"])
            continue
        y, se = tb.at(PAPER_SCALE["batch_size"])
        var = se * se
        for t in used[1:]:
            step = math.log10(PAPER_SCALE[t.axis]) - math.log10(base.label(t.axis))
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
    at: int
    kind: str
    cells: list[str]
    levels: list[int]
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
    one-line error."""
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
    if axis == "batch_size":
        sets = [f"batch_size={at}"]
    else:
        sets = [f"steps={near.injection_step + at}"]
    sets.append(f"seeds=[{','.join(map(str, seeds))}]")
    return Prediction(measure=t.measure, group=group, axis=axis, at=int(at), kind=t.kind, cells=list(t.cells),
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
    law = (f"a power law, {p.measure} ∝ {AXES[p.axis].split()[-1]}^b, b = {p.slope:.3g} [{p.slope_low:.3g}, "
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
    point, lo, hi, _, _ = _interval(v, p.alpha)
    i = min(range(len(p.levels)), key=lambda j: abs(math.log10(p.levels[j]) - math.log10(p.at)))
    toward = np.sign(p.slope) * np.sign(math.log10(p.at) - math.log10(p.levels[i]))
    moved = np.sign(point - p.values[i])
    inside = bool(p.low <= point <= p.high)
    return {"cell": cell, "measure": p.measure, "value": point, "low": lo, "high": hi, "predicted": p.predicted,
            "interval_low": p.low, "interval_high": p.high, "inside": inside, "direction": bool(toward == moved),
            "verdict": "confirmed" if inside else "refuted"}
