"""Statistics of a measured twins design (``measures.parquet`` and friends -> tables).

- ``comparisons``  paired comparisons across seeds, each labelled as pre-registered: fabricated vs
                   attested on every measure, and every injected condition vs its twin on its own
                   passage's CE (at s + 50 and at the end) and on held-out CE. Every row has two
                   p-values from two tests, named by their columns: ``p_t`` (two-sided paired
                   t-test) and ``p_perm`` (two-sided sign-flip permutation test, exact for n <= 20
                   seeds, whose smallest possible value is ``p_perm_min`` = 2/2ⁿ, 0.0078 for 8 seeds:
                   a p below it can only be the t-test's); the 95% t interval; the minimum
                   detectable effect at 80% power (two-sided paired t, α = 0.05) for this many
                   seeds (seedlab.measures.paired.paired_row). ``gain`` = b − a (for a condition vs
                   its twin on its passage: twin − injected, what was learned). The end-of-run passage rows (the
                   "lost" claim) also carry the ``lost_*`` columns of :func:`lost_test`: per seed,
                   d = end effect − ``lost_frac`` × s + 50 effect (see ``DEFAULT_LOST_FRAC``), tested
                   one-sided (H1: mean d < 0) by a paired t-test and the exact sign-flip test, with
                   its MDE; both effects are per-seed measurements, so both uncertainties enter.
- ``verdict``      what an end-of-run row allows one to say: lost (less than ``lost_frac`` × the
                   s + 50 effect left; also whether something is left), not shown lost (an end effect is
                   still there), or inconclusive. No test here shows an effect kept, so none says "kept".
- ``normalized``   per condition: barrier and distance to the twin as a percentage of the same measure
                   between twins of different seeds (the paper's 3.0% and 44.1%); the distance also
                   against the inter-seed distance after weight matching (lm/align.py).
- ``time_course``  per condition: where the smoothed training-loss difference |c − twin| peaks, its
                   smoothed trough between the injection and the peak, the peak / trough ratio (the
                   paper's "two orders of magnitude above its value just after injection";
                   ``peak_trough_windows``: the same under several window widths), the mean
                   of the raw first steps after the injection, the value at the end; the distance at
                   the mid-point as a fraction of its final value (the paper's 92%), and the barrier
                   to the twin at the mid-point and its largest value over the checkpoints.
- ``checkpoint_course`` per condition and checkpoint step: mean distance, barrier and rise at α = 0.5.
- ``null_contrasts`` "Is it the passage?": every passage condition against every null, paired over seeds, at the
                   end and at every checkpoint: the ordinary rows as a distribution (per seed their mean, the
                   passage's rank among them, and equivalence only by a TOST with the pre-registered relative
                   margin ``measure.ordinary_margin``: :func:`ordinary_tost`), matched-gradient, weight-kick and
                   the nudge; every p-value of the table Holm-corrected as one family (:func:`with_holm`), its size
                   counted from the rows tested (:func:`null_family`).

The report's data (the numbers ``seedlab twins report`` prints and the figures draw, computed once from a
run's files) are twins/report_data.py's; the paper's own numbers twins/paper.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps
from statsmodels.stats.power import TTestPower

from seedlab.measures.paired import one_sided_sign_flip, paired_row
from seedlab.twins.config import MeasureConfig, is_ordinary
from seedlab.twins.variants import ATT, FAB, VARIANTS, current_names, names, null_groups

#: the fraction of the s + 50 passage effect a "lost" claim tests the end effect against, seed by
#: seed: "lost" means the end effect is shown (one-sided, α = 0.05) to be smaller than half of what
#: was learned 50 steps after the injection (MeasureConfig.equivalence_frac when set)
DEFAULT_LOST_FRAC = MeasureConfig.model_fields["equivalence_frac"].default
ALPHA = 0.05
#: measures.parquet column -> (outcome it belongs to, what it is)
MEASURES = {
    "barrier": ("barrier", "interpolation barrier to the twin (nats)"),
    "rise_mid": ("barrier", "rise above the chord at α = 0.5 (nats)"),
    "heldout_ce_diff": ("heldout_ce", "held-out CE − twin's (nats)"),
    "distance": ("distance", "weight distance to the twin"),
    "cka_mean": ("cka", "CKA with the twin, mean over layers"),
    "passage_gain_s50": ("passage_ce", "passage CE: twin − injected at s + 50 (nats)"),
    "passage_gain_final": ("passage_ce", "passage CE: twin − injected at the end (nats)"),
}


def with_derived(measures: pd.DataFrame) -> pd.DataFrame:
    """Add the mean CKA over layers and the passage gains (twin − injected: positive = learned)."""
    m = measures.copy()
    cka = [c for c in m.columns if c.startswith("cka.")]
    m["cka_mean"] = m[cka].mean(axis=1) if cka else np.nan
    for tag in ("s50", "final"):
        if f"passage_ce_{tag}" in m:
            m[f"passage_gain_{tag}"] = m[f"twin_passage_ce_{tag}"] - m[f"passage_ce_{tag}"]
    return m


def _row(name: str, measure: str, outcome: str, label: str, a, b) -> dict:
    return {"comparison": name, "measure": measure, "outcome": outcome, "label": label, **paired_row(a, b, alpha=ALPHA)}


def lost_test(end, s50, frac: float, *, alpha: float = ALPHA, power: float = 0.8) -> dict:
    """Is the passage effect lost by the end? A paired per-seed test of d_i = end_i − frac · s50_i.

    ``end``, ``s50``: per seed (aligned; a seed with a NaN in either is dropped), the passage effect
    = twin's CE − injected run's CE on the passage (nats/token, positive: learned) at the end and at
    s + 50. Hypotheses on the mean of d over seeds:

    - H0: mean(d) >= 0, at least ``frac`` of the s + 50 effect is left at the end (not lost);
    - H1: mean(d) < 0, the end effect is smaller than ``frac`` × the s + 50 effect ("lost").

    Both effects are measured on the same seeds, so the uncertainty of both enters sd(d) (a margin of
    frac × the mean s + 50 effect, treated as known, leaves the s + 50 effect's own out). Tests:
    one-sided paired t-test (t = mean(d) / (sd(d)/√n), p = P(T_{n−1} <= t), as scipy ``ttest_1samp``
    with ``alternative="less"``) and the one-sided sign-flip permutation test (exact for n <= 20, its
    floor 1/2ⁿ: 0.0039 for 8 seeds, 0.0625 for 4, so with fewer than 5 seeds it cannot reach 0.05).
    MDE: the smallest true shortfall −mean(d) the one-sided t-test detects with ``power`` at ``alpha``
    (statsmodels ``TTestPower``, × sd(d)).

    Returns ``lost_n, lost_frac, lost_end, lost_s50`` (mean effects), ``lost_d`` (mean d), ``lost_sd``,
    ``lost_t, lost_df, lost_p_t``, ``lost_ci_high`` (one-sided 1 − alpha upper bound of mean d),
    ``lost_p_perm, lost_perm_exact, lost_p_perm_min``, ``lost_mde`` and ``lost`` = p_t < alpha (None
    with fewer than 2 seeds; when every d_i is equal the t-test is undefined, p_t is nan and ``lost``
    says whether that d is below 0)."""
    e, f = np.asarray(end, dtype=np.float64).ravel(), np.asarray(s50, dtype=np.float64).ravel()
    if e.shape != f.shape:
        raise ValueError(f"lost_test: end and s50 need the same length, got {len(e)} and {len(f)}")
    keep = np.isfinite(e) & np.isfinite(f)
    e, f = e[keep], f[keep]
    n = len(e)
    out = {"lost_n": n, "lost_frac": float(frac), "lost_end": float(e.mean()) if n else np.nan,
           "lost_s50": float(f.mean()) if n else np.nan}
    nan = dict.fromkeys(("lost_d", "lost_sd", "lost_t", "lost_df", "lost_p_t", "lost_ci_high", "lost_p_perm",
                         "lost_perm_exact", "lost_p_perm_min", "lost_mde"), np.nan)
    if n < 2:
        return out | nan | {"lost": None}
    d = e - frac * f
    mean, sd, df = float(d.mean()), float(d.std(ddof=1)), n - 1
    se = sd / math.sqrt(n)
    if np.all(d == d[0]):
        t = p_t = math.nan
        lost = bool(mean < 0)
    else:
        t = mean / se
        p_t = float(sps.t.cdf(t, df))
        lost = bool(p_t < alpha)
    p_perm, exact, floor = one_sided_sign_flip(d)
    effect = float(np.squeeze(TTestPower().solve_power(nobs=n, alpha=alpha, power=power, alternative="larger")))
    return out | {"lost_d": mean, "lost_sd": sd, "lost_t": t, "lost_df": df, "lost_p_t": p_t,
                  "lost_ci_high": mean + float(sps.t.ppf(1 - alpha, df)) * se, "lost_p_perm": p_perm,
                  "lost_perm_exact": exact, "lost_p_perm_min": floor, "lost_mde": effect * sd, "lost": lost}


def verdict(r) -> str:
    """What the end-of-run row ``r`` (of ``comparisons``) allows one to say about the passage effect: "lost"
    from :func:`lost_test` (the end effect shown below ``lost_frac`` × the s + 50 effect, one-sided paired
    t, α = 0.05), and whether an effect is still there from the row's two-sided paired t-test (p_t)."""
    lost = r.get("lost")
    if lost is None or (isinstance(lost, float) and np.isnan(lost)):
        return "no test (needs both effects, at s + 50 and at the end, on at least 2 seeds)"
    if not r["lost_s50"] > 0:
        return "nothing to lose (the mean effect at s + 50 is not above 0)"
    frac = f"{r['lost_frac']:g} × the s + 50 effect"
    sig = bool(r["p_t"] < ALPHA)  # an end effect is there (two-sided); diff = injected − twin, so effect = −diff
    if lost:
        if sig and r["diff"] > 0:
            return "lost and reversed (the twin predicts the passage better at the end)"
        return f"lost below {frac}, but not zero" if sig else f"lost (less than {frac} left)"
    return (f"not shown lost (an end effect is still there, two-sided paired t; not shown below {frac})" if sig else
            f"inconclusive (neither an effect nor a loss below {frac} shown)")


def comparisons(measures: pd.DataFrame, outcomes: dict[str, str], *, lost_frac: float = DEFAULT_LOST_FRAC) -> pd.DataFrame:
    """One row per paired comparison (seeds are the pairs); see the module docstring."""
    m = with_derived(measures[measures.kind == "injected"])
    rows = []
    by = {c: g.set_index("seed") for c, g in m.groupby("condition")}
    if FAB in by and ATT in by:
        seeds = by[FAB].index.intersection(by[ATT].index)
        for col, (outcome, _) in MEASURES.items():
            if col in m:
                rows.append(_row("fabricated vs attested", col, outcome, outcomes.get(outcome, "exploratory"),
                                 by[FAB].loc[seeds, col], by[ATT].loc[seeds, col]))
    for cond, g in by.items():
        for tag, when in (("s50", "s + 50"), ("final", "end")):
            if f"passage_ce_{tag}" in g and (g[f"passage_ce_{tag}"].notna() & g[f"twin_passage_ce_{tag}"].notna()).sum() >= 2:
                a, b = g[f"passage_ce_{tag}"], g[f"twin_passage_ce_{tag}"]  # (a condition without a passage has none)
                row = _row(f"{cond} vs twin, own passage at {when}", f"passage_ce_{tag}", "passage_ce",
                           outcomes.get("passage_ce", "exploratory"), a, b)
                if tag == "final" and "passage_gain_s50" in g:  # "lost": end − frac × s + 50, seed by seed
                    row |= lost_test(g["passage_gain_final"], g["passage_gain_s50"], lost_frac)
                rows.append(row)
        rows.append(_row(f"{cond} vs twin, held-out", "heldout_ce", "heldout_ce", outcomes.get("heldout_ce", "exploratory"),
                         g["heldout_ce"], g["heldout_ce_b"]))
    out = pd.DataFrame(rows)
    return out.assign(gain=-out["diff"]) if len(out) else out


def normalized(measures: pd.DataFrame) -> pd.DataFrame:
    """Per condition: mean barrier / distance to the twin, and as % of the inter-seed mean; the distance
    also as % of the inter-seed distance after weight matching (``seed_distance_aligned``,
    ``distance_aligned_pct``: nan without a ``distance_aligned`` column)."""
    inj, seed = measures[measures.kind == "injected"], measures[measures.kind == "seed"]
    sb, sd = (seed.barrier.mean(), seed.distance.mean()) if len(seed) else (np.nan, np.nan)
    g = inj.groupby("condition").agg(n=("seed", "size"), barrier=("barrier", "mean"), rise_mid=("rise_mid", "mean"),
                                     distance=("distance", "mean"))
    g["seed_barrier"], g["seed_distance"] = sb, sd
    g["barrier_pct"], g["distance_pct"] = percent(g.barrier, sb), percent(g.distance, sd)
    # the inter-seed distance after weight matching (measure's distance_aligned; nan in older files)
    sda = seed.distance_aligned.mean() if len(seed) and "distance_aligned" in seed else np.nan
    g["seed_distance_aligned"] = sda
    g["distance_aligned_pct"] = percent(g.distance, sda)
    return g.reset_index()


def percent(x, base: float):
    """``x`` (a number or a Series) as a percentage of ``base``; nan where there is no positive finite base
    (no seed pair measured)."""
    return 100 * x / base if base and np.isfinite(base) and base > 0 else x * np.nan


def abs_diff_curves(timecourse: pd.DataFrame, injection: int) -> dict[str, pd.Series]:
    """Per condition, the unsmoothed time course: the mean over seeds of |training loss − twin's| at each
    step after the injected batch (step s itself is left out: its loss is on different batches, not a
    difference of models), indexed by step."""
    out = {}
    for cond, g in timecourse.groupby("condition"):
        curve = g.assign(absdiff=g["diff"].abs()).groupby("step").absdiff.mean()
        out[cond] = curve[curve.index > injection]
    return out


def smoothed(curve: pd.Series, window: int) -> pd.Series:
    """A centred rolling mean over ``window`` steps, truncated at the ends (measure.smooth_steps)."""
    return curve.rolling(window, min_periods=1, center=True).mean()


def peak_trough(curve: pd.Series, window: int) -> dict:
    """Of ``curve`` (one condition's :func:`abs_diff_curves`) smoothed over ``window`` steps: the peak (the
    largest smoothed value), the trough (the smallest smoothed value between s + 1 and the peak) and
    peak / trough (nan when the trough is 0)."""
    sm = smoothed(curve, window)
    peak_step, peak = int(sm.idxmax()), float(sm.max())
    rising = sm.loc[:peak_step]
    trough_step, trough = int(rising.idxmin()), float(rising.min())
    return {"window": int(window), "peak_step": peak_step, "peak": peak, "trough_step": trough_step, "trough": trough,
            "peak_over_trough": peak / trough if trough > 0 else np.nan}


def peak_trough_windows(timecourse: pd.DataFrame, injection: int, windows: list[int]) -> pd.DataFrame:
    """One row per condition and window width (in the order given, repeats dropped): :func:`peak_trough`,
    so the paper's peak / trough ratio can be read under more than one smoothing (measure.smooth_steps,
    measure.smooth_steps_alt): a narrower window lowers the trough and raises the peak."""
    rows = [{"condition": cond, **peak_trough(curve, w)}
            for cond, curve in abs_diff_curves(timecourse, injection).items() for w in dict.fromkeys(windows)]
    cols = ["condition", "window", "peak_step", "peak", "trough_step", "trough", "peak_over_trough"]
    return pd.DataFrame(rows, columns=cols)


def time_course(timecourse: pd.DataFrame, checkpoints: pd.DataFrame, steps: dict[str, int], *,
                smooth: int, just_after: int) -> pd.DataFrame:
    """Per condition, from the mean over seeds of |training loss − twin's| per step after the
    injected batch (step s itself is left out: its loss is on different batches, not a difference
    of models), smoothed by a centred rolling mean over ``smooth`` steps (truncated at the ends):

    - ``peak_step, peak``      where the smoothed curve is largest, and its value;
    - ``trough_step, trough``  where the smoothed curve is smallest between s + 1 and the peak
                               (the value "just after the injection" the paper compares the
                               peak with), and its value; ``peak_over_trough`` = peak / trough;
    - ``just_after``           the unsmoothed mean over the first ``just_after`` steps after the
                               injected batch, and ``peak_over_just_after`` (kept for comparison:
                               while the difference is still growing this mean is not a trough);
    - ``final``                the smoothed value at the last step;
    - ``distance_mid_frac``    mean over seeds of distance at the mid-point / at the end;
    - ``barrier_mid, barrier_max, barrier_max_step``  the barrier to the twin (mean over seeds) at
                               the mid-point, and its largest value over the checkpoints and where
                               (nan when checkpoints.parquet has no barrier column).

    Config: measure.smooth_steps, measure.just_after_steps."""
    s, mid, final = steps["injection"], steps["mid"], steps["final"]
    rows = []
    for cond, after in abs_diff_curves(timecourse, s).items():
        pt = peak_trough(after, smooth)
        peak_step, peak, trough_step, trough = pt["peak_step"], pt["peak"], pt["trough_step"], pt["trough"]
        just = float(after.iloc[:just_after].mean())
        ck = checkpoints[checkpoints.condition == cond]
        c = ck.pivot_table(index="seed", columns="step", values="distance")
        frac = (c[mid] / c[final]).mean() if mid in c and final in c else np.nan
        barrier = ck.groupby("step").barrier.mean() if "barrier" in ck else pd.Series(dtype=float)
        rows.append({
            "condition": cond, "peak_step": peak_step, "peak": peak,
            "trough_step": trough_step, "trough": trough, "peak_over_trough": pt["peak_over_trough"],
            "just_after": just, "peak_over_just_after": peak / just if just > 0 else np.nan,
            "final": float(smoothed(after, smooth).iloc[-1]), "distance_mid_frac": float(frac),
            "barrier_mid": float(barrier.get(mid, np.nan)),
            "barrier_max": float(barrier.max()) if len(barrier) else np.nan,
            "barrier_max_step": int(barrier.idxmax()) if barrier.notna().any() else np.nan,
        })
    return pd.DataFrame(rows)


def checkpoint_course(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per condition and checkpoint step: the mean over seeds of the distance, barrier and rise at
    α = 0.5 to the twin, and n (seeds). Barrier columns are nan when checkpoints.parquet predates them."""
    c = checkpoints.copy()
    for col in ("barrier", "rise_mid"):
        if col not in c:
            c[col] = np.nan
    g = c.groupby(["condition", "step"]).agg(n=("seed", "size"), distance=("distance", "mean"),
                                             barrier=("barrier", "mean"), rise_mid=("rise_mid", "mean"))
    return g.reset_index()


# --------------------------------------------------------------------------- is it the passage? (the nulls)

#: the passage conditions and the null arms each is compared with, as registered when seedlab was imported
#: (twins/variants.py; the functions below read the registry when called, so a variant registered later counts)
PASSAGE_CONDITIONS = tuple(names("passage"))
#: the ordinary-row null as a distribution: per seed, the mean over its ordinary-row.<i> arms (and each arm's rank)
ORDINARY_ROWS = VARIANTS["ordinary-row"].pooled
NULL_CONDITIONS = tuple(null_groups())
#: the measures every passage condition is compared with every null on (measures.parquet columns, and
#: the time course's per-seed summary)
NULL_MEASURES = ("barrier", "rise_mid", "heldout_ce_diff", "distance", "cka_mean", "tc_mean_absdiff")
#: the hypotheses of "Is it the passage?" (:func:`null_family`): a difference at the end, at a checkpoint, an equivalence
KINDS = ("end", "checkpoint", "equivalence")


def time_course_per_seed(timecourse: pd.DataFrame, injection: int) -> pd.DataFrame:
    """Per seed and condition, ``tc_mean_absdiff``: the mean of |training loss − twin's| over the steps
    after the injected batch (the whole time course as one number per seed, to pair across seeds)."""
    after = timecourse[timecourse.step > injection]
    g = after.assign(a=after["diff"].abs()).groupby(["seed", "condition"]).a.mean()
    return g.rename("tc_mean_absdiff").reset_index()


def effect_scale(measure: str, values):
    """The size of an effect on ``measure`` from its values against the twin: 1 − CKA for the CKA (a similarity,
    1 = the twin's), |value| for every other measure (a difference from the twin, 0 = none)."""
    return 1 - values if measure == "cka_mean" else np.abs(values)


def ordinary_rank(passage: pd.Series, ordinary: pd.DataFrame) -> dict:
    """Where the passage's value lies among the ordinary rows', seed by seed: ``passage`` per seed, ``ordinary``
    seeds x ordinary-row arms (NaN: not measured). Per seed the passage's rank among its K + 1 values, from the
    smallest (1) to the largest (K + 1), ties counted half; returns ``rank_k`` (the most ordinary rows a seed
    has), ``rank_mean`` (the mean rank over seeds), ``rank_expected`` ((K + 2) / 2, its mean if the passage were
    one more ordinary row), ``above_all`` / ``below_all`` (seeds whose passage exceeds / falls below every one
    of its ordinary rows) and ``rank_seeds``. Descriptive: no p-value."""
    o = ordinary.reindex(passage.index)
    ok = passage.notna() & o.notna().any(axis=1)
    p, o = passage[ok], o[ok]
    k = int(o.notna().sum(axis=1).max()) if len(o) else 0
    below, ties = o.lt(p, axis=0).sum(axis=1), o.eq(p, axis=0).sum(axis=1)
    rank = 1 + below + 0.5 * ties
    n = o.notna().sum(axis=1)
    return {"rank_k": k, "rank_mean": float(rank.mean()) if len(rank) else np.nan, "rank_expected": (k + 2) / 2,
            "above_all": int((below == n).sum()), "below_all": int(((below + ties) == 0).sum()), "rank_seeds": int(len(rank))}


def ordinary_tost(passage, ordinary_mean, scale, margin: float | None, *, alpha: float = ALPHA) -> dict:
    """Is the passage's effect the ordinary rows'? Equivalence by two one-sided paired t-tests (TOST) seed by
    seed, with a margin relative to the ordinary rows' own effect.

    ``passage``, ``ordinary_mean`` (the mean over a seed's ordinary rows), ``scale`` (their effect's size,
    :func:`effect_scale`): per seed, aligned (a seed with a NaN is dropped). With d_i = passage_i − ordinary_i
    and the bound b_i = ``margin`` × scale_i, the hypotheses on the means over seeds are

    - H0: mean(d − b) >= 0 or mean(d + b) <= 0 (the passage differs by at least the margin);
    - H1: mean(d − b) < 0 and mean(d + b) > 0 (|passage − ordinary| is within the margin: equivalent).

    Both are per-seed measurements, so the uncertainty of the bound enters as well (as :func:`lost_test`'s).
    ``tost_p_high`` = P(T_{n−1} <= t of d − b), ``tost_p_low`` = P(T_{n−1} >= t of d + b), ``tost_p`` = the larger
    (the TOST's p: both must be below alpha). Returns ``tost_n, tost_margin`` (the relative margin),
    ``tost_bound`` (the mean bound b, the measure's units), ``tost_d`` (mean d), ``tost_p_low, tost_p_high,
    tost_p`` and ``tost_equivalent`` (p < alpha, before any correction; None: no margin, or fewer than 2 seeds;
    when either statistic is undefined, every value equal, its p is nan and the sign of that value decides)."""
    a, o, sc = (np.asarray(v, dtype=np.float64).ravel() for v in (passage, ordinary_mean, scale))
    keep = np.isfinite(a) & np.isfinite(o) & np.isfinite(sc)
    a, o, sc = a[keep], o[keep], sc[keep]
    n = len(a)
    out = {"tost_n": n, "tost_margin": np.nan if margin is None else float(margin), "tost_bound": np.nan,
           "tost_d": float((a - o).mean()) if n else np.nan, "tost_p_low": np.nan, "tost_p_high": np.nan,
           "tost_p": np.nan, "tost_equivalent": None}
    if margin is None or n < 2:
        return out
    d, b, df = a - o, float(margin) * sc, n - 1

    def one_sided(v: np.ndarray, upper: bool) -> tuple[float, bool]:
        """(p, shown) of H1: mean(v) < 0 (``upper``) or mean(v) > 0."""
        if np.all(v == v[0]):
            return math.nan, bool(v[0] < 0) if upper else bool(v[0] > 0)
        t = float(v.mean()) / (float(v.std(ddof=1)) / math.sqrt(n))
        p = float(sps.t.cdf(t, df)) if upper else float(sps.t.sf(t, df))
        return p, p < alpha

    p_high, hi = one_sided(d - b, upper=True)
    p_low, lo = one_sided(d + b, upper=False)
    p = max(p_low, p_high) if np.isfinite(p_low) and np.isfinite(p_high) else math.nan
    return out | {"tost_bound": float(b.mean()), "tost_p_low": p_low, "tost_p_high": p_high, "tost_p": p,
                  "tost_equivalent": bool(hi and lo)}


def null_sizes(perturbations: pd.DataFrame) -> pd.DataFrame:
    """How well each gradient-channel null matches its passage in size, per channel: per condition, over seeds, the
    median (min, max) of its raw-gradient norm / the passage's batch-gradient difference (``grad_ratio``: 1 by
    construction) and of its update at s / the passage's (``update_ratio``: ‖θ_{s+1}(null) − θ_{s+1}(twin)‖ /
    ‖θ_{s+1}(passage) − θ_{s+1}(twin)‖, both from this seed's θ_s), and cos(δ, Δg) where recorded. A null of
    the passage's size has both ratios ≈ 1; AdamW divides each coordinate by √v, so a norm-matched isotropic
    direction need not be (forks/arms.py ``matched_gradient``, ``sign_gradient``). Rows: conditions that
    record both update norms (the weight kick matches the update by construction, the nudge has no size)."""
    need = {"like_norm", "norm", "update_norm", "like_update_norm"}
    if perturbations.empty or not need <= set(perturbations.columns):
        return pd.DataFrame(columns=["condition", "seeds", "grad_ratio", "update_ratio", "update_min", "update_max", "cosine"])
    p = perturbations.dropna(subset=sorted(need))
    p = p.assign(grad=p.norm / p.like_norm, upd=p.update_norm / p.like_update_norm)
    rows = []
    for c, g in p.groupby("condition", sort=True):
        rows.append({"condition": c, "seeds": len(g), "grad_ratio": float(g.grad.median()),
                     "update_ratio": float(g.upd.median()), "update_min": float(g.upd.min()),
                     "update_max": float(g.upd.max()),
                     "cosine": float(g.cosine.median()) if "cosine" in g and g.cosine.notna().any() else np.nan})
    return pd.DataFrame(rows)


def holm(p) -> np.ndarray:
    """Holm's step-down adjusted p-values of ``p`` (statsmodels ``multipletests(method="holm")``), one family.
    A NaN p (a test that gave none: every difference equal) counts in the family as p = 1 and stays NaN."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(p, dtype=np.float64)
    if not len(p):
        return p
    adjusted = multipletests(np.where(np.isfinite(p), p, 1.0), alpha=ALPHA, method="holm")[1]
    return np.where(np.isfinite(p), adjusted, np.nan)


def null_contrasts(measures: pd.DataFrame, checkpoints: pd.DataFrame, timecourse: pd.DataFrame,
                   outcomes: dict[str, str], injection: int, *, margin: float | None = None) -> pd.DataFrame:
    """Every passage condition P against every null N, paired over seeds (P − N per seed, each against
    its own seed's twin): on every measure of :data:`NULL_MEASURES` at the end, and on the barrier and
    the distance at every checkpoint after s. The ordinary rows are one null, :data:`ORDINARY_ROWS`: per seed
    the mean of its ordinary-row arms; at the end their rows also carry the passage's rank among them
    (:func:`ordinary_rank`) and the equivalence test (:func:`ordinary_tost`, relative ``margin``; None: none).
    Rows as :func:`comparisons` (``comparison`` = "P vs N"), plus ``passage``, ``null``, ``step``, ``kind``
    ("end" or "checkpoint"), and the Holm-adjusted p-values of the whole table (:func:`with_holm`)."""
    m = with_derived(measures[measures.kind == "injected"])
    m = m.merge(time_course_per_seed(timecourse, injection), on=["seed", "condition"], how="left")
    final = int(m.step.max()) if len(m) else 0
    rows = []
    for p, n, a, b, ordinary in _null_pairs(m):
        for col in NULL_MEASURES:
            if col in a and a[col].notna().sum() >= 2 and b[col].notna().sum() >= 2:
                row = (_row(f"{p} vs {n}", col, MEASURES.get(col, ("time_course",))[0],
                            outcomes.get(MEASURES.get(col, ("exploratory",))[0], "exploratory"), a[col], b[col])
                       | {"passage": p, "null": n, "step": final, "kind": "end"})
                if n == ORDINARY_ROWS:
                    row |= ordinary_rank(a[col], ordinary[col]) | ordinary_tost(
                        a[col], b[col], effect_scale(col, b[col]), margin)
                rows.append(row)
    c = checkpoints[(checkpoints.step > injection) & (checkpoints.step < final)]
    for t, ck in c.groupby("step"):
        for p, n, a, b, _ in _null_pairs(ck):
            for col in ("barrier", "distance"):
                if col in a and a[col].notna().sum() >= 2:
                    rows.append(_row(f"{p} vs {n}", col, col, outcomes.get(col, "exploratory"), a[col], b[col])
                                | {"passage": p, "null": n, "step": int(t), "kind": "checkpoint"})
    return with_holm(pd.DataFrame(rows))


def _null_pairs(frame: pd.DataFrame):
    """(passage, null, its rows, the null's rows, the pooled null's arms) on their common seeds, for every pair
    present with >= 2 seeds, passages and nulls in registry order (twins/variants.py). A pooled null's rows
    (:data:`ORDINARY_ROWS`: the ordinary rows) are the mean over each seed's arms (numeric columns), and the last
    item is then ``{column: seeds x its arms}`` (None for the other nulls)."""
    by = {c: g.set_index("seed") for c, g in frame.groupby("condition")}
    numeric = [col for col in frame.columns if col not in ("seed", "condition") and pd.api.types.is_numeric_dtype(frame[col])]
    nulls, wide = {}, {}
    for v in VARIANTS.values():
        if v.role != "null":
            continue
        if v.count:
            arms = sorted((c for c in by if v.owns(c)), key=lambda c: (len(c), c))
            if arms:
                wide[v.group] = {col: pd.DataFrame({c: by[c][col] for c in arms if col in by[c]}) for col in numeric}
                nulls[v.group] = pd.DataFrame({col: w.mean(axis=1) for col, w in wide[v.group].items()})
        elif v.name in by:
            nulls[v.name] = by[v.name]
    for p in names("passage"):
        for n in nulls:
            if p in by:
                seeds = by[p].index.intersection(nulls[n].index)
                if len(seeds) >= 2:
                    extra = {col: w.reindex(seeds) for col, w in wide[n].items()} if n in wide else None
                    yield p, n, by[p].loc[seeds], nulls[n].loc[seeds], extra


def with_holm(nulls: pd.DataFrame) -> pd.DataFrame:
    """"Is it the passage?"'s p-values corrected as one family (Holm, :func:`holm`): every difference row's
    paired t-test (end and checkpoints) and every equivalence test (``tost_p``, where a margin was given) together
    (``p_t_holm``, ``tost_p_holm``); the sign-flip p's of the same difference hypotheses Holm-adjusted among
    themselves (``p_perm_holm``). ``differs``: p_t_holm < ALPHA; ``equivalent``: tost_p_holm < ALPHA (None
    without a test); :func:`null_family` counts them."""
    out = nulls.copy()
    if not len(out):
        return out
    if "tost_p" not in out:
        out["tost_p"] = np.nan
    if "tost_equivalent" not in out:
        out["tost_equivalent"] = None
    tost = out.tost_equivalent.notna() if "tost_equivalent" in out else pd.Series(False, index=out.index)
    family = np.concatenate([out.p_t.to_numpy(dtype=float), out.tost_p[tost].to_numpy(dtype=float)])
    adjusted = holm(family)
    out["p_t_holm"] = adjusted[:len(out)]
    out["tost_p_holm"] = np.nan
    out.loc[tost, "tost_p_holm"] = adjusted[len(out):]
    out["p_perm_holm"] = holm(out.p_perm.to_numpy(dtype=float))
    out["differs"] = out.p_t_holm < ALPHA
    out["equivalent"] = [None if not t else bool(q < ALPHA) for t, q in zip(tost, out.tost_p_holm)]
    return out


@dataclass
class NullFamily:
    """The hypotheses "Is it the passage?" tested, as counted for the Holm correction (:func:`with_holm`): the
    difference tests at the end (``end``) and at the checkpoints (``checkpoint``), the equivalence tests
    (``equivalence``), all of them (``tests``: the family's size), and the difference hypotheses alone
    (``perm``: the sign-flip p's family)."""

    end: int
    checkpoint: int
    equivalence: int
    tests: int
    perm: int


def null_family(nulls: pd.DataFrame) -> NullFamily:
    """What :func:`with_holm` corrected, counted from the rows tested."""
    if not len(nulls):
        return NullFamily(0, 0, 0, 0, 0)
    end, ck = int((nulls.kind == "end").sum()), int((nulls.kind == "checkpoint").sum())
    eq = int(nulls.tost_equivalent.notna().sum()) if "tost_equivalent" in nulls else 0
    return NullFamily(end, ck, eq, end + ck + eq, end + ck)


def passage_matrix(passages: pd.DataFrame, steps: list[int]) -> pd.DataFrame:
    """The cross-passage matrix at each of ``steps``: per condition and text, the mean over seeds of the
    drop in that text's CE (twin − condition: positive = the run predicts the text better than its twin)."""
    x = passages[passages.step.isin(steps)]
    g = x.assign(drop=-x["diff"]).groupby(["step", "condition", "text"]).drop.mean()
    return g.reset_index()


def specificity(passages: pd.DataFrame, steps: dict[str, int], outcomes: dict[str, str]) -> pd.DataFrame:
    """"Learned" as *this* passage, paired over seeds, at s + 50 and at the end. For each fluent condition c:

    - ``own``          c's drop on its own passage (twin − c, CE) against 0;
    - ``specificity``  c's drop on its own passage against its drop on the other fluent passage (own − other:
                       what is learned of this text beyond what transfers to a text of the same kind);
    - ``vs ordinary rows``  c's drop on its own passage against the ordinary-row arms' mean drop on that same
                       passage, per seed (what injecting *this* text adds over injecting an ordinary row).
    Rows as :func:`comparisons`, plus ``condition``, ``what``, ``step``."""
    label = outcomes.get("passage_ce", "exploratory")
    drop = passages.assign(drop=-passages["diff"]).pivot_table(index=["step", "seed", "text"], columns="condition",
                                                              values="drop")
    rows = []
    for tag, when in (("s50", "s + 50"), ("final", "end")):
        t = steps[tag]
        if t not in drop.index.get_level_values("step"):
            continue
        at = drop.xs(t, level="step")
        for c, other in ((FAB, ATT), (ATT, FAB)):
            if c not in at.columns or c not in at.index.get_level_values("text"):
                continue
            own = at[c].xs(c, level="text")
            checks = [("own", f"{c}: own passage at {when}, drop vs 0", own, own * 0.0)]
            if other in at.index.get_level_values("text"):
                checks.append(("specificity", f"{c}: own passage vs {other}'s at {when}", own, at[c].xs(other, level="text")))
            ordinary = [a for a in at.columns if is_ordinary(a)]
            if ordinary:  # per seed, the mean over its ordinary rows of their drop on this passage
                checks.append(("vs ordinary rows", f"{c}: own passage, {c} vs the ordinary rows (mean) at {when}", own,
                               at[ordinary].mean(axis=1).xs(c, level="text")))
            for what, name, a, b in checks:
                a, b = a.align(b, join="inner")
                if a.notna().sum() >= 2:
                    rows.append(_row(name, f"passage_drop_{tag}", "passage_ce", label, a, b)
                                | {"condition": c, "what": what, "step": t})
    return pd.DataFrame(rows)


def exposure_effect(passages: pd.DataFrame, attestation: dict, step: int) -> pd.DataFrame:
    """Per seed: the attested passage's own drop at ``step`` beside the seed's exposure to the attested
    subject before the injection (inputs.json), and their Spearman correlation over seeds (``rho``, ``p``;
    nan with fewer than 3 seeds or no variation): does a seed that saw the subject more learn the passage
    more (or less)?"""
    att = attestation.get(ATT) if attestation else None
    x = passages[(passages.condition == ATT) & (passages.text == ATT) & (passages.step == step)]
    if att is None or not len(x):
        return pd.DataFrame(columns=["seed", "exposure_before", "drop", "rho", "p"])
    before = {int(e["seed"]): e["before"] for e in att.get("exposure", [])}
    df = pd.DataFrame({"seed": x.seed.astype(int), "drop": -x["diff"].to_numpy()})
    df["exposure_before"] = df.seed.map(before)
    ok = df.dropna()
    rho = p = np.nan
    if len(ok) >= 3 and ok.exposure_before.nunique() > 1 and ok["drop"].nunique() > 1:
        rho, p = (float(v) for v in sps.spearmanr(ok.exposure_before, ok["drop"]))
    return df.assign(rho=rho, p=p)[["seed", "exposure_before", "drop", "rho", "p"]]


def with_current_names(frame: pd.DataFrame, columns=("condition", "text")) -> pd.DataFrame:
    """A measured table with the conditions (and texts) measured by an older seedlab under today's names
    (twins/variants.py ``current_names``: the weight kick was "matched-noise", the one ordinary row "ordinary-row",
    and the former names of every variant registered)."""
    out = frame.copy()
    renamed = current_names()
    for col in columns:
        if col in out and len(out):
            out[col] = out[col].replace(renamed)
    return out
