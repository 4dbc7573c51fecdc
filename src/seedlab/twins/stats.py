"""Statistics of a measured twins design (``measures.parquet`` and friends -> tables).

- ``comparisons``  paired comparisons across seeds, each labelled as pre-registered: fabricated vs
                   attested on every measure, and every injected condition vs its twin on its own
                   passage's CE (at s + 50 and at the end) and on held-out CE. Paired t-test, exact
                   sign-flip permutation test, 95% interval and the minimum detectable effect at 80%
                   power for this many seeds (seedlab.stats.paired / mde_paired).
- ``normalized``   per condition: barrier and distance to the twin as a percentage of the same measure
                   between twins of different seeds (the paper's 3.0% and 44.1%).
- ``time_course``  per condition: where the training-loss difference c − twin peaks, how it compares
                   with its value just after the injection and at the end; the distance at the
                   mid-point as a fraction of its final value (the paper's 92%).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from seedlab.stats import mde_paired, paired

FAB, ATT = "fluent-fabricated", "fluent-attested"
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
    res = paired(a, b)
    mde = mde_paired(res["n"], res["sd_diff"]) if res["n"] >= 2 else np.nan
    return {"comparison": name, "measure": measure, "outcome": outcome, "label": label, **res,
            "mde": mde, "diff_over_mde": res["diff"] / mde if mde and np.isfinite(mde) and mde > 0 else np.nan}


def comparisons(measures: pd.DataFrame, outcomes: dict[str, str]) -> pd.DataFrame:
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
            if f"passage_ce_{tag}" in g:
                rows.append(_row(f"{cond} vs twin, own passage at {when}", f"passage_ce_{tag}", "passage_ce",
                                 outcomes.get("passage_ce", "exploratory"), g[f"passage_ce_{tag}"], g[f"twin_passage_ce_{tag}"]))
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
    """Per condition: peak of the mean |loss difference| after the injection (rolling mean over
    ``smooth`` steps), its ratio to the mean over the ``just_after`` steps after the injected batch,
    the final value, and distance at the mid-point / at the end (config: measure.smooth_steps,
    measure.just_after_steps)."""
    s, mid, final = steps["injection"], steps["mid"], steps["final"]
    rows = []
    for cond, g in timecourse.groupby("condition"):
        curve = g.assign(absdiff=g["diff"].abs()).groupby("step").absdiff.mean()
        after = curve[curve.index > s]  # the injected batch's own loss (step s) is not a difference of models
        smoothed = after.rolling(smooth, min_periods=1, center=True).mean()
        just = after.iloc[:just_after].mean()
        c = checkpoints[checkpoints.condition == cond].pivot_table(index="seed", columns="step", values="distance")
        frac = (c[mid] / c[final]).mean() if mid in c and final in c else np.nan
        rows.append({
            "condition": cond, "peak_step": int(smoothed.idxmax()), "peak": float(smoothed.max()),
            "just_after": float(just), "peak_over_just_after": float(smoothed.max() / just) if just > 0 else np.nan,
            "final": float(smoothed.iloc[-1]), "distance_mid_frac": float(frac),
        })
    return pd.DataFrame(rows)
