"""The twins' scale axis: one summary per measured cell and the table of every measure across cells beside its
nulls (each measure's trend along each axis, what it says at the paper's scale and the one prediction a
confirmatory run tests: twins/trends.py).

A **cell** is a measured twins run folder (``seedlab twins run`` + ``seedlab twins measure``; the presets
``twins/scale-*``) labelled by its scale: rows per batch B (``batch_size``; one row is 1/B of its update),
updates after the injection (``after`` = steps − s), the schedule apart from them (``decay_after``: updates from s
to where the cosine reaches min_lr, the config's ``decay_steps`` − s, or ``after`` when it decays to the run's end),
the peak learning rate (``peak_lr``, and its floor ``min_lr``) and the model's residual width d (``n_embd``; its
heads ``n_head``, each ``n_embd / n_head`` wide; its layers ``n_layer``). The paper: B = 256, 9,336 updates after s
on a decay to its end, peak lr 6e-4, GPT-2 small (d 768, 12 heads of 64, 12 layers): twins/trends.py
``PAPER_SCALE``.

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
has the same interval, a t interval over the cell's seeds (one that holds at 4 seeds, which a 4-seed percentile
bootstrap does not): the point estimate ± t(n − 1, 1 − α/2) × its jackknife standard error, from the n
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

The trends across cells, the paper-scale extrapolation and the prediction: twins/trends.py.

twins/report_scale.py words and draws the frames; experiments/twins_scale.py runs the cells.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as sps

from seedlab.cells import Columns, Summary
from seedlab.errors import SeedlabError
from seedlab.lm.gptconfig import PRESETS
from seedlab.stats import jackknife_se
from seedlab.twins.config import is_ordinary
from seedlab.twins.rundir import Measured
from seedlab.twins.paper import PAPER
from seedlab.twins.stats import with_current_names
from seedlab.twins.variants import VARIANTS, current_names

#: the passage the scale table is about, and whose text the text-less nulls' "own" drop is read on
FOCAL = "fluent-fabricated"
#: every ordinary-row.<i> arm in one group: the ordinary-row distribution (twins/variants.py)
ORDINARY_ROWS = VARIANTS["ordinary-row"].pooled
#: the nulls set beside the passage, in the table's order (any other arm measured is kept as its own group)
NULLS = (ORDINARY_ROWS, "matched-gradient", "sign-gradient", "nudge")
#: arms with no text of their own (the registry's nulls without one): their "own" drop is on the focal passage's text
TEXTLESS = tuple(v.name for v in VARIANTS.values() if v.role == "null" and v.text is None)
ALPHA = 0.05
#: the cells' labels that define a family along an axis (the other labels must agree; twins/trends.py ``FAMILIES``
#: says, per axis, which of them and of the quantities :meth:`Cell.label` derives from them are held)
LABELS = ("batch_size", "after", "decay_after", "peak_lr", "min_lr", "n_embd", "n_head", "n_layer", "block_size")


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
SCALARS = ["name", "preset", "batch_size", "steps", "injection_step", "after", "decay_after", "peak_lr", "min_lr",
           "model", "n_embd", "n_head", "n_layer", "block_size", "seeds", "arms", "smooth_steps", "s50", "final",
           "source", "stages"]
TABLE = ["cell", "batch_size", "after", "decay_after", "peak_lr", "n_embd", "n_head", "n_layer", "n", "group", "measure",
         "value", "low", "high", "se", "valid", "arm_min", "arm_max"]


def group_of(arm: str) -> str:
    """The table's group of an arm (its name as measured by an older seedlab read as today's): every ordinary row
    in :data:`ORDINARY_ROWS`, any other arm its own name."""
    arm = current_names().get(arm, arm)
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
    # labels a summary written before they were recorded lacks (seedlab/cells.py: the defaults):
    decay_after: int | None = None  # updates from s to the decay's end; None: ``after`` (then every run decayed to its end)
    peak_lr: float | None = None  # None: not recorded
    min_lr: float | None = None  # None: not recorded
    n_head: int | None = None  # None: the model preset's

    def label(self, name: str) -> int | float | None:
        """A label of :data:`LABELS`, an axis of twins/trends.py (``schedule``: ``decay_after``; ``run``: ``after``;
        ``rate``: ``peak_lr``), or a quantity derived from them that a family may hold instead: ``tail`` (updates after the
        decay's end: after − decay_after, negative when the run ends on the way down), ``head_size`` (n_embd /
        n_head), ``lr_x_width`` (peak_lr × n_embd) and ``min_ratio`` (min_lr / peak_lr), the last two to 9
        significant digits; None where a learning rate was not recorded."""
        name = {"schedule": "decay_after", "rate": "peak_lr", "run": "after"}.get(name, name)
        heads = self.n_head if self.n_head is not None else PRESETS[self.model].n_head
        decay = self.decay_after if self.decay_after is not None else self.after
        lr = None if self.peak_lr is None else float(self.peak_lr)
        derived = {
            "decay_after": decay, "n_head": heads, "tail": self.after - decay, "head_size": self.n_embd // heads,
            "lr_x_width": None if lr is None else float(f"{lr * self.n_embd:.9g}"),
            "min_ratio": None if lr is None or self.min_lr is None else float(f"{self.min_lr / lr:.9g}"),
            "peak_lr": lr, "min_lr": None if self.min_lr is None else float(self.min_lr)}
        if name in derived:
            return derived[name]
        return int(getattr(self, name))

    def description(self) -> str:
        """The cell's scale in words: B, updates after s, where the decay ends, the peak rate, and the width with its
        head count and head size."""
        decay = self.label("decay_after")
        sched = "decay to the end" if decay == self.after else f"decay to s + {decay}"
        rate = "lr n/a" if self.peak_lr is None else f"lr {self.peak_lr:g}"
        return (f"B {self.batch_size}, {self.after} after s ({sched}), {rate}, d {self.n_embd} "
                f"({self.label('n_head')} heads of {self.label('head_size')})")


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
    decay = c.get("decay_steps")
    return Cell(name=name, preset=preset, batch_size=int(c["batch_size"]), steps=int(c["steps"]), injection_step=s,
                after=int(c["steps"]) - s, decay_after=int(decay if decay is not None else c["steps"]) - s,
                peak_lr=float(c["peak_lr"]), min_lr=float(c["min_lr"]), model=model, n_embd=gpt.n_embd,
                n_head=gpt.n_head, n_layer=gpt.n_layer,
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


def interval(v: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float, float, float]:
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
    """One row per cell × group × measure (:data:`TABLE`): the value, its t interval over the seeds (:func:`interval`),
    its jackknife standard error and the valid share of its replicates; the ordinary rows' min and max over their
    arms (NaN for other groups and for peak / trough, which is of the group's mean curve)."""
    rows = []
    for (name, g, k), v in dr.values.items():
        c = dr.cells[name]
        point, lo, hi, se, valid = interval(v, alpha)
        amin, amax = dr.arms.get((name, g, k), (math.nan, math.nan))
        n = int(c.per_seed[c.per_seed.group == g].seed.nunique())
        lr = math.nan if c.peak_lr is None else c.peak_lr
        rows.append([name, c.batch_size, c.after, c.label("decay_after"), lr, c.n_embd, c.label("n_head"), c.n_layer, n,
                     g, k, point, lo, hi, se, valid, amin, amax])
    return pd.DataFrame(rows, columns=TABLE)


# ---------------------------------------------------------------- trends along the axes
