"""The twins report's data: every number ``seedlab twins report`` prints and every curve its figures draw,
computed once from a measured run's files (``twins.rundir.Measured``) with the statistics of twins/stats.py.

- ``summarize``  -> :class:`Summary`: the tables of twins/stats.py, the headline's numbers beside the paper's
                 (:class:`Headline`, twins/paper.py), the nulls' answer (:class:`NullVerdict`), the
                 cross-passage matrix, the gradmatch rows, the dose–response (twins/dose.py, where the arms
                 recorded their dose); twins/report.py only words and tabulates it.
- the figures' data (twins/figures.py draws them): the loss-difference curves (:func:`loss_diff_course`), each
  seed's distance and barrier against the inter-seed ones (:func:`seed_scaled`), CKA per layer
  (:func:`cka_means`), the courses over the checkpoints (:func:`mean_sd_course`,
  :func:`distance_fraction_course`, :func:`barrier_course`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from seedlab.stats import sign_flip_floor
from seedlab.twins import dose
from seedlab.twins.dose import DoseResponse
from seedlab.twins.config import MeasureConfig
from seedlab.twins.rundir import Measured
from seedlab.twins.stats import (ALPHA, NullFamily, abs_diff_curves, checkpoint_course, comparisons, exposure_effect,
                                 normalized, null_contrasts, null_family, null_sizes, passage_matrix, peak_trough_windows,
                                 percent, smoothed, specificity, time_course, with_current_names)
from seedlab.twins.variants import FLUENT, names, null_groups

@dataclass
class Headline:
    """The headline's numbers of the two fluent conditions pooled (nan / None where not measured): the
    barrier and distance to the twin as % of the inter-seed ones (``None``: no fluent condition), the
    distance as % of the aligned inter-seed distance (``aligned_measured`` False: measures.parquet
    predates it), the mid-point distance in % of the end's, the largest barrier at any checkpoint in % of
    the inter-seed barrier at the end (``None`` without a barrier course), and the time course: how many
    steps after the injection the loss difference peaks (mean over the fluent conditions) and the
    peak / trough ratio under each window (``(window, mean ratio)``, measure.smooth_steps first)."""

    barrier_pct: float | None
    distance_pct: float | None
    distance_aligned_pct: float | None
    aligned_measured: bool
    distance_mid_pct: float | None
    barrier_max_pct: float | None
    peak_after: float | None
    peak_ratios: list[tuple[int, float]]
    seeds: int  # the most seeds any comparison has (0: none)
    sign_flip_floor: float | None  # 2/2^seeds: the smallest two-sided sign-flip p with that many


def aligned_measured(norm: pd.DataFrame) -> bool:
    """False when measures.parquet has the raw inter-seed distance but predates its aligned one."""
    return not (len(norm) and np.isfinite(norm.seed_distance.iloc[0]) and not np.isfinite(norm.seed_distance_aligned.iloc[0]))


def headline(comp: pd.DataFrame, norm: pd.DataFrame, course: pd.DataFrame, windows: pd.DataFrame,
             injection: int) -> Headline:
    """The pooled fluent numbers of the headline (see :class:`Headline`); ``windows``: :func:`peak_trough_windows`."""
    inj = norm[norm.condition.isin(FLUENT)]
    fl = course[course.condition.isin(FLUENT)]
    sb = inj.seed_barrier.iloc[0] if len(inj) else np.nan
    ratios = windows[windows.condition.isin(list(fl.condition))]
    n = int(comp.n.max()) if len(comp) else 0
    return Headline(
        barrier_pct=percent(inj.barrier.mean(), sb) if len(inj) else None,
        distance_pct=percent(inj.distance.mean(), inj.seed_distance.iloc[0]) if len(inj) else None,
        distance_aligned_pct=percent(inj.distance.mean(), inj.seed_distance_aligned.iloc[0]) if len(inj) else None,
        aligned_measured=aligned_measured(inj),
        distance_mid_pct=100 * fl.distance_mid_frac.mean() if len(fl) else None,
        barrier_max_pct=percent(fl.barrier_max.max(), sb) if len(fl) and len(inj) and fl.barrier_max.notna().any() else None,
        peak_after=fl.peak_step.mean() - injection if len(fl) else None,
        peak_ratios=[(int(k), float(g.peak_over_trough.mean())) for k, g in ratios.groupby("window", sort=False)],
        seeds=n, sign_flip_floor=sign_flip_floor(n) if n else None,
    )


@dataclass
class NullVerdict:
    """One passage condition against one null at the end: how many measures were compared, the rows of those
    that differ (two-sided paired t, Holm-adjusted over the whole table: ``p_t_holm`` < ALPHA) and, against the
    ordinary rows, those shown equivalent (TOST, Holm-adjusted: ``tost_p_holm`` < ALPHA; none without a margin)."""

    passage: str
    null: str
    tests: int
    differ: pd.DataFrame
    equivalent: pd.DataFrame


def null_answer(nulls: pd.DataFrame) -> tuple[list[NullVerdict], int, NullFamily]:
    """The first answer, from :func:`null_contrasts`: per passage (in the table's order) and null (in the
    registry's order, twins/variants.py) a :class:`NullVerdict` at the end; the most seeds; what was tested
    (:func:`null_family`: the count the Holm correction used)."""
    if not len(nulls):
        return [], 0, null_family(nulls)
    end = nulls[nulls.kind == "end"]
    out = []
    for p, g in end.groupby("passage", sort=False):
        for n in null_groups():
            h = g[g.null == n]
            if len(h):
                out.append(NullVerdict(p, n, len(h), h[h.differs.astype(bool)], h[h.equivalent.map(lambda v: v is True)]))
    return out, int(end.n.max()) if len(end) else 0, null_family(nulls)


def ordinary_margin(preregistration: dict | None) -> float | None:
    """The TOST margin of "is it any row's?" as pre-registered: ``measure.ordinary_margin`` of the
    preregistration.json written before training; None (no equivalence test: "not shown") when there is no
    pre-registration, when it predates the field, or when it is null."""
    value = ((preregistration or {}).get("measure") or {}).get("ordinary_margin")
    return None if value is None else float(value)


def passage_matrix_wide(passages: pd.DataFrame, steps: list[int]) -> dict[int, pd.DataFrame]:
    """:func:`passage_matrix` as one table per step: conditions (rows) x texts (columns), the mean drop."""
    mat = passage_matrix(passages, steps)
    return {t: mat[mat.step == t].pivot_table(index="condition", columns="text", values="drop") for t in steps}


def gradmatch_rows(g: pd.DataFrame) -> pd.DataFrame:
    """gradmatch.parquet's rows for the run's own passages (per seed, and the mean: seed nan), with the
    two relative size differences in percent (``delta_pct``, ``update_pct``: nan in files that predate the
    AdamW one) and the cosine of the gradient deltas."""
    g = g[g.fabricated.str.startswith("inputs.json") & g.attested.str.startswith("inputs.json")]
    update = g["adam_rel_norm_diff"] if "adam_rel_norm_diff" in g else pd.Series(np.nan, index=g.index)
    return pd.DataFrame({"seed": g["seed"], "delta_pct": 100 * g["rel_norm_diff"], "update_pct": 100 * update,
                         "cosine": g["cosine"]})


def shown(row: pd.Series | None, value: str) -> bool | None:
    """Whether a comparison row shows ``row[value]`` above 0: its two-sided paired t-test below ALPHA with a
    positive value (True), a test that does not (False), or no test (None: no row, or no p)."""
    if row is None or not np.isfinite(row["p_t"]):
        return None
    return bool(row["p_t"] < ALPHA and row[value] > 0)


@dataclass
class PassageFinding:
    """What the tests say of one passage condition, for the report's answer: learned at s + 50 (its own
    passage's CE below its twin's: ``learned`` row of ``comparisons``, ``gain`` = twin − injected), more than an
    ordinary row in its place and more than on the other fluent passage (``beyond_ordinary``, ``beyond_other``:
    rows of ``specificity`` at s + 50, ``diff`` = own drop − the other's), and lost by the end (``end``: the
    ``comparisons`` row carrying :func:`~seedlab.twins.stats.lost_test`). Each ``*_shown`` is :func:`shown`'s
    answer (``lost``: the lost test's); None: no test."""

    passage: str
    learned: pd.Series | None
    learned_shown: bool | None
    beyond_ordinary: pd.Series | None
    beyond_ordinary_shown: bool | None
    beyond_other: pd.Series | None
    beyond_other_shown: bool | None
    end: pd.Series | None
    lost: bool | None


def _one(frame: pd.DataFrame, **match) -> pd.Series | None:
    if not len(frame):
        return None
    keep = np.logical_and.reduce([frame[k] == v for k, v in match.items()])
    rows = frame[keep]
    return rows.iloc[0] if len(rows) else None


def passage_findings(comp: pd.DataFrame, spec: pd.DataFrame, s50: int) -> list[PassageFinding]:
    """One :class:`PassageFinding` per passage condition measured, in registry order (twins/variants.py)."""
    out = []
    for p in names("passage"):
        learned = _one(comp, comparison=f"{p} vs twin, own passage at s + 50", measure="passage_ce_s50")
        end = _one(comp, comparison=f"{p} vs twin, own passage at end", measure="passage_ce_final")
        if learned is None and end is None:
            continue
        ordinary = _one(spec, condition=p, what="vs ordinary rows", step=s50)
        other = _one(spec, condition=p, what="specificity", step=s50)
        lost = None if end is None or end.get("lost") is None or pd.isna(end.get("lost")) else bool(end["lost"])
        out.append(PassageFinding(p, learned, shown(learned, "gain"), ordinary, shown(ordinary, "diff"), other,
                                  shown(other, "diff"), end, lost))
    return out


@dataclass
class Summary:
    """Every number ``seedlab twins report`` prints, computed once from the measured files (:func:`summarize`)."""

    seeds: list[int]  # every seed measured (an injected condition's or a seed-vs-seed row's)
    conditions: list[str]  # the injected conditions measured, sorted
    injected_seeds: int  # how many seeds have an injected condition measured
    last_before: int  # the last step before the injection, s − 1
    lost_frac: float
    comp: pd.DataFrame  # comparisons
    norm: pd.DataFrame  # normalized
    course: pd.DataFrame  # time_course
    windows: pd.DataFrame  # peak_trough_windows, every condition, measure.smooth_steps and smooth_steps_alt
    ckpt: pd.DataFrame | None  # checkpoint_course (+ barrier_pct, of the inter-seed barrier at the end); None: no checkpoints
    nulls: pd.DataFrame  # null_contrasts (Holm-adjusted over the whole table)
    null_verdicts: list[NullVerdict]
    null_seeds: int
    null_family: NullFamily  # what was tested there: the count of the Holm correction
    ordinary_margin: float | None  # the pre-registered TOST margin (None: none, so no equivalence is shown)
    headline: Headline
    aligned_share: float  # the aligned inter-seed distance as % of the raw one
    matrix: dict[int, pd.DataFrame]  # passage_matrix_wide at s + 50 and at the end (empty: no passages.parquet)
    specificity: pd.DataFrame
    exposure: pd.DataFrame  # exposure_effect at s + 50
    gradmatch: pd.DataFrame | None  # gradmatch_rows; None: gradmatch.parquet absent
    null_sizes: pd.DataFrame = field(default_factory=pd.DataFrame)  # null_sizes: each gradient null's size per channel
    findings: list[PassageFinding] = field(default_factory=list)  # passage_findings: the answer's tests
    dose: DoseResponse | None = None  # twins/dose.py summarize: the dose–response; None: no arm has a dose.json


def summarize(d: Measured) -> Summary:
    """Every table and number of the report of the measured run ``d``."""
    outcomes = d.meta["preregistration"]["outcomes"]
    m, steps = d.settings, d.steps
    measures, checkpoints, timecourse = (with_current_names(t, ("condition",)) for t in (d.measures, d.checkpoints, d.timecourse))
    frac = lost_frac(m)
    comp = comparisons(measures, outcomes, lost_frac=frac)
    norm = normalized(measures)
    course = time_course(timecourse, checkpoints, steps, smooth=m.smooth_steps, just_after=m.just_after_steps)
    windows = peak_trough_windows(timecourse, steps["injection"], [m.smooth_steps, m.smooth_steps_alt])
    ckpt = checkpoint_course(checkpoints) if len(checkpoints) else None
    if ckpt is not None:
        ckpt["barrier_pct"] = percent(ckpt.barrier, norm.seed_barrier.iloc[0] if len(norm) else np.nan)
    margin = ordinary_margin(d.record("preregistration"))
    nulls = null_contrasts(measures, checkpoints, timecourse, outcomes, steps["injection"], margin=margin)
    verdicts, null_seeds, family = null_answer(nulls)
    inj, x = measures[measures.kind == "injected"], with_current_names(d.passages)
    raw, al = (norm.seed_distance.iloc[0], norm.seed_distance_aligned.iloc[0]) if len(norm) else (np.nan, np.nan)
    att = (d.record("inputs") or {}).get("attestation") or {}
    has_passages = bool(len(x))
    spec = specificity(x, steps, outcomes) if has_passages else pd.DataFrame()
    return Summary(
        seeds=sorted(set(inj.seed) | set(measures[measures.kind == "seed"].seed)),
        conditions=sorted(set(inj.condition)), injected_seeds=inj.seed.nunique(), last_before=steps["injection"] - 1,
        lost_frac=frac, comp=comp, norm=norm, course=course, windows=windows, ckpt=ckpt, nulls=nulls,
        null_verdicts=verdicts, null_seeds=null_seeds, null_family=family, ordinary_margin=margin,
        headline=headline(comp, norm, course, windows, steps["injection"]), aligned_share=percent(al, raw),
        matrix=passage_matrix_wide(x, [steps["s50"], steps["final"]]) if has_passages else {},
        specificity=spec, exposure=exposure_effect(x, att, steps["s50"]) if has_passages else pd.DataFrame(),
        gradmatch=None if d.gradmatch is None else gradmatch_rows(d.gradmatch),
        null_sizes=null_sizes(d.perturbations), findings=passage_findings(comp, spec, steps["s50"]),
        dose=dose.summarize(d),
    )


def lost_frac(settings: MeasureConfig) -> float:
    """The fraction of each seed's s + 50 effect that a "lost" claim shows the end effect below
    (:func:`lost_test`): the pre-registered ``measure.equivalence_frac`` (files measured before it
    existed: its default; before this test it set a TOST margin, with the same value)."""
    return settings.equivalence_frac


# --------------------------------------------------------------------------- what the figures draw


@dataclass
class LossDiffCourse:
    """The loss-difference figure's curves (:func:`abs_diff_curves`): per condition with a nonzero step,
    the unsmoothed curve without its exact zeros (a log axis cannot show them) and the curve smoothed over
    each window; ``zeros``: how many steps were left out; ``flat``: the conditions whose difference is 0 at
    every step."""

    raw: dict[str, pd.Series]
    smooth: dict[str, dict[int, pd.Series]]
    zeros: int
    flat: list[str]
    smooth_zeros: int = 0  # smoothed points of exactly 0 (a window of zeros), left out of the smoothed curves


def loss_diff_course(timecourse: pd.DataFrame, injection: int, windows: list[int]) -> LossDiffCourse:
    """See :class:`LossDiffCourse`; ``windows`` in the order given, repeats dropped."""
    out = LossDiffCourse({}, {}, 0, [])
    for cond, curve in abs_diff_curves(timecourse, injection).items():
        shown = curve[curve > 0]
        if not len(shown):
            out.flat.append(cond)
            continue
        out.zeros += len(curve) - len(shown)
        out.raw[cond] = shown
        sm = {w: smoothed(curve, w) for w in dict.fromkeys(windows)}
        out.smooth[cond] = {w: c[c > 0] for w, c in sm.items()}  # a log axis: a window of exact zeros is left out
        out.smooth_zeros += sum(int((c <= 0).sum()) for c in sm.values())
    return out


@dataclass
class SeedScaled:
    """Each seed's injected run against its twin at the end with its distance and barrier as multiples of
    the inter-seed ones (``distance_rel``, ``barrier_rel``), the pairs with a positive barrier only (a log
    axis); ``dropped``: how many pairs have a barrier of exactly 0; ``flat``: the conditions with no
    positive barrier on any seed."""

    points: pd.DataFrame
    dropped: int
    flat: list[str]


def seed_scaled(measures: pd.DataFrame) -> SeedScaled | None:
    """See :class:`SeedScaled`; None without an injected condition or a positive inter-seed barrier."""
    seed, inj = measures[measures.kind == "seed"], measures[measures.kind == "injected"]
    sb, sd = seed.barrier.mean(), seed.distance.mean()
    if not len(seed) or not len(inj) or not sb > 0:
        return None
    shown = inj[inj.barrier > 0]
    points = shown.assign(distance_rel=shown.distance / sd, barrier_rel=shown.barrier / sb)
    return SeedScaled(points, len(inj) - len(shown), sorted(set(inj.condition) - set(shown.condition)))


def cka_means(measures: pd.DataFrame) -> pd.DataFrame:
    """Per injected condition (sorted) and then "seed" (twins of different seeds): the mean linear CKA of
    each layer (``cka.*`` columns) over seeds; a group without rows is left out."""
    cols = [c for c in measures.columns if c.startswith("cka.")]
    m = measures
    groups = [(c, g) for c, g in m[m.kind == "injected"].groupby("condition")] + [("seed", m[m.kind == "seed"])]
    return pd.DataFrame({name: g[cols].mean() for name, g in groups if len(g)}, index=cols).T


def mean_sd_course(checkpoints: pd.DataFrame, values: pd.Series) -> pd.DataFrame:
    """Per condition and checkpoint step: the mean and sd over seeds of ``values`` (aligned with the
    checkpoints' rows; sd 0 where one seed)."""
    rows = []
    for cond, g in checkpoints.assign(v=values).groupby("condition"):
        per = g.v.groupby(g.step)
        rows.append(pd.DataFrame({"condition": cond, "mean": per.mean(), "sd": per.std().fillna(0)}))
    return pd.concat(rows).rename_axis("step").reset_index() if rows else pd.DataFrame(columns=["step", "condition", "mean", "sd"])


def distance_fraction_course(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per condition and checkpoint step: the mean distance to the twin over seeds as a fraction of its value at the last step."""
    rows = []
    for cond, g in checkpoints.groupby("condition"):
        mean = g.groupby("step").distance.mean()
        rows.append(pd.DataFrame({"condition": cond, "frac": mean / mean.iloc[-1]}))
    return pd.concat(rows).rename_axis("step").reset_index()


@dataclass
class BarrierCourse:
    """The barrier to the twin over the checkpoints, for a log axis: ``course``, per condition and step the mean
    and sd over seeds (:func:`mean_sd_course`) where the mean is positive; ``points``, every seed's positive
    barrier (condition, step, seed, barrier); ``flat``: the conditions whose mean is 0 at every checkpoint;
    ``zero_steps``: the steps where some drawn condition's mean is exactly 0 (the injection step: identical
    weights); ``seed_barrier``: the inter-seed barrier at the end (nan: no seed pair)."""

    course: pd.DataFrame
    points: pd.DataFrame
    flat: list[str]
    zero_steps: list[int]
    seed_barrier: float


def barrier_course(checkpoints: pd.DataFrame, measures: pd.DataFrame) -> BarrierCourse | None:
    """See :class:`BarrierCourse`; None when checkpoints.parquet has no barrier (an older seedlab)."""
    if "barrier" not in checkpoints or not checkpoints.barrier.notna().any():
        return None
    means = checkpoints.groupby(["condition", "step"]).barrier.mean()
    flat = [k for k, v in means.groupby(level="condition") if not (v > 0).any()]
    seed = measures[measures.kind == "seed"]
    kept = checkpoints[~checkpoints.condition.isin(flat)]
    course = mean_sd_course(kept, kept.barrier)
    points = kept.loc[kept.barrier > 0, ["condition", "step", "seed", "barrier"]].reset_index(drop=True)
    return BarrierCourse(course[course["mean"] > 0].reset_index(drop=True), points, flat,
                         sorted({int(t) for t in course.step[~(course["mean"] > 0)]}),
                         seed.barrier.mean() if len(seed) else np.nan)


@dataclass
class PathCourse:
    """The interpolation figure's curves: ``seeds``, each pair of different seeds' twins' held-out CE along the
    straight line between them (alpha, loss; one frame per pair); ``rise``, per injected condition a frame indexed
    by α with one column per seed (its rise above the chord to its twin) and ``mean`` over them."""

    seeds: list[pd.DataFrame]
    rise: dict[str, pd.DataFrame]


def path_course(paths: pd.DataFrame) -> PathCourse:
    """See :class:`PathCourse` (paths.parquet)."""
    seeds = [g[["alpha", "loss"]].reset_index(drop=True) for _, g in paths[paths.kind == "seed"].groupby(["seed", "seed_b"])]
    rise = {}
    for cond, g in paths[paths.kind == "injected"].groupby("condition"):
        wide = g.pivot_table(index="alpha", columns="seed", values="rise")
        rise[cond] = wide.assign(mean=wide.mean(axis=1))
    return PathCourse(seeds, rise)


@dataclass
class CkaGap:
    """1 − CKA per layer (how far each layer's representation moved), mean CKA over seeds (:func:`cka_means`),
    per injected condition and "seed" (twins of different seeds): ``values`` groups x layers; ``zero``: the groups
    whose 1 − CKA is 0 or below (float rounding of an unmoved representation) at every layer."""

    values: pd.DataFrame
    zero: list[str]


def cka_gap(measures: pd.DataFrame) -> CkaGap:
    """See :class:`CkaGap`."""
    gap = 1 - cka_means(measures)
    return CkaGap(gap, [g for g, row in gap.iterrows() if not (row > 0).any()])


@dataclass
class PassageCourse:
    """The passage figure's course: per condition with a passage of its own and step, the mean and sd over seeds
    of twin's CE − the run's CE on it (:func:`mean_sd_course`); ``textless``: the conditions that inject no text
    of their own (no passage CE to draw)."""

    course: pd.DataFrame
    textless: list[str]


def passage_course(checkpoints: pd.DataFrame) -> PassageCourse:
    """See :class:`PassageCourse`."""
    course = mean_sd_course(checkpoints, checkpoints.twin_passage_ce - checkpoints.passage_ce)
    has = course.groupby("condition")["mean"].apply(lambda v: v.notna().any())
    textless = sorted(has.index[~has])
    return PassageCourse(course[~course.condition.isin(textless)].reset_index(drop=True), textless)
