"""Statistics of a measured twins design (``measures.parquet`` and friends -> tables).

- ``comparisons``  paired comparisons across seeds, each labelled as pre-registered: fabricated vs
                   attested on every measure, and every injected condition vs its twin on its own
                   passage's CE (at s + 50 and at the end) and on held-out CE. Every row has two
                   p-values from two tests, named by their columns: ``p_t`` (two-sided paired
                   t-test) and ``p_perm`` (two-sided sign-flip permutation test, exact for n <= 20
                   seeds, whose smallest possible value is ``p_perm_min`` = 2/2ⁿ, 0.0078 for 8 seeds:
                   a p below it can only be the t-test's); the 95% t interval; the minimum
                   detectable effect at 80% power (two-sided paired t, α = 0.05) for this many
                   seeds (seedlab.stats.paired / mde_paired). The end-of-run passage rows (the
                   "lost" claim) also carry an equivalence test: TOST (two one-sided paired t-tests,
                   seedlab.stats.tost_paired) against ±``margin``, the margin being ``margin_frac``
                   × |the same condition's mean effect at s + 50| (see ``DEFAULT_MARGIN_FRAC``),
                   its p (``p_tost``), the 90% t interval it is equivalent to and ``equivalent``.
- ``verdict``      what an end-of-run row allows one to say: lost, kept, smaller than the margin but
                   not zero, or inconclusive.
- ``normalized``   per condition: barrier and distance to the twin as a percentage of the same measure
                   between twins of different seeds (the paper's 3.0% and 44.1%).
- ``time_course``  per condition: where the smoothed training-loss difference |c − twin| peaks, its
                   smoothed trough between the injection and the peak, the peak / trough ratio (the
                   paper's "two orders of magnitude above its value just after injection"), the mean
                   of the raw first steps after the injection, the value at the end; the distance at
                   the mid-point as a fraction of its final value (the paper's 92%), and the barrier
                   to the twin at the mid-point and its largest value over the checkpoints.
- ``checkpoint_course`` per condition and checkpoint step: mean distance, barrier and rise at α = 0.5.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from seedlab.stats import mde_paired, paired, sign_flip_floor, tost_paired
from seedlab.twins.config import MeasureConfig

FAB, ATT = "fluent-fabricated", "fluent-attested"
#: the equivalence margin of a "lost" claim, as a fraction of the same condition's mean passage
#: effect at s + 50: "lost" means that with 90% confidence less than half of what was learned
#: 50 steps after the injection is left at the end (MeasureConfig.equivalence_frac when set)
DEFAULT_MARGIN_FRAC = MeasureConfig.model_fields["equivalence_frac"].default
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
    res = paired(a, b, alpha=ALPHA)
    mde = mde_paired(res["n"], res["sd_diff"], alpha=ALPHA) if res["n"] >= 2 else np.nan
    return {"comparison": name, "measure": measure, "outcome": outcome, "label": label, **res,
            "p_perm_min": sign_flip_floor(res["n"]),
            "mde": mde, "diff_over_mde": res["diff"] / mde if mde and np.isfinite(mde) and mde > 0 else np.nan}


def _equivalence(a, b, margin: float) -> dict:
    """The TOST columns of a row: margin, p_tost, ci90_low/high, equivalent (nan / None without a margin)."""
    if not (np.isfinite(margin) and margin > 0):
        return {"margin": np.nan, "p_tost": np.nan, "ci90_low": np.nan, "ci90_high": np.nan, "equivalent": None}
    t = tost_paired(a, b, margin, alpha=ALPHA)
    return {"margin": margin, "p_tost": t["p"], "ci90_low": t["ci_low"], "ci90_high": t["ci_high"], "equivalent": t["equivalent"]}


def verdict(r) -> str:
    """What the end-of-run row ``r`` (of ``comparisons``) allows one to say about the passage effect,
    from the paired t-test (p_t < 0.05: an effect is left) and the TOST against ±margin."""
    if r.get("equivalent") is None or (isinstance(r.get("equivalent"), float) and np.isnan(r["equivalent"])):
        return "no margin (needs the s + 50 effect)"
    sig, eq = bool(r["p_t"] < ALPHA), bool(r["equivalent"])
    if eq:
        return "smaller than the margin, but not zero" if sig else "lost (equivalent to 0 within the margin)"
    return "kept (not shown below the margin)" if sig else "inconclusive (neither an effect nor equivalence shown)"


def comparisons(measures: pd.DataFrame, outcomes: dict[str, str], *, margin_frac: float = DEFAULT_MARGIN_FRAC) -> pd.DataFrame:
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
        learned = np.nan  # |mean effect at s + 50|: the scale of the equivalence margin at the end
        for tag, when in (("s50", "s + 50"), ("final", "end")):
            if f"passage_ce_{tag}" in g:
                a, b = g[f"passage_ce_{tag}"], g[f"twin_passage_ce_{tag}"]
                row = _row(f"{cond} vs twin, own passage at {when}", f"passage_ce_{tag}", "passage_ce",
                           outcomes.get("passage_ce", "exploratory"), a, b)
                if tag == "s50":
                    learned = abs(row["diff"])
                else:
                    row |= _equivalence(a, b, margin_frac * learned)
                rows.append(row)
        rows.append(_row(f"{cond} vs twin, held-out", "heldout_ce", "heldout_ce", outcomes.get("heldout_ce", "exploratory"),
                         g["heldout_ce"], g["heldout_ce_b"]))
    return pd.DataFrame(rows)


def normalized(measures: pd.DataFrame) -> pd.DataFrame:
    """Per condition: mean barrier / distance to the twin, and as % of the inter-seed mean."""
    inj, seed = measures[measures.kind == "injected"], measures[measures.kind == "seed"]
    sb, sd = (seed.barrier.mean(), seed.distance.mean()) if len(seed) else (np.nan, np.nan)
    g = inj.groupby("condition").agg(n=("seed", "size"), barrier=("barrier", "mean"), rise_mid=("rise_mid", "mean"),
                                     distance=("distance", "mean"))
    g["seed_barrier"], g["seed_distance"] = sb, sd
    g["barrier_pct"] = 100 * g.barrier / sb if sb and sb > 0 else np.nan
    g["distance_pct"] = 100 * g.distance / sd if sd and sd > 0 else np.nan
    return g.reset_index()


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
    for cond, g in timecourse.groupby("condition"):
        curve = g.assign(absdiff=g["diff"].abs()).groupby("step").absdiff.mean()
        after = curve[curve.index > s]  # the injected batch's own loss (step s) is not a difference of models
        smoothed = after.rolling(smooth, min_periods=1, center=True).mean()
        peak_step, peak = int(smoothed.idxmax()), float(smoothed.max())
        rising = smoothed.loc[:peak_step]
        trough_step, trough = int(rising.idxmin()), float(rising.min())
        just = float(after.iloc[:just_after].mean())
        ck = checkpoints[checkpoints.condition == cond]
        c = ck.pivot_table(index="seed", columns="step", values="distance")
        frac = (c[mid] / c[final]).mean() if mid in c and final in c else np.nan
        barrier = ck.groupby("step").barrier.mean() if "barrier" in ck else pd.Series(dtype=float)
        rows.append({
            "condition": cond, "peak_step": peak_step, "peak": peak,
            "trough_step": trough_step, "trough": trough, "peak_over_trough": peak / trough if trough > 0 else np.nan,
            "just_after": just, "peak_over_just_after": peak / just if just > 0 else np.nan,
            "final": float(smoothed.iloc[-1]), "distance_mid_frac": float(frac),
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
