"""attribution/analyses/additivity.py's numbers on synthetic additivity.parquet frames (seeds and pairs resampled, ≥ 30
overlapping pairs per seed) and attribution/report/additivity.py's words: the first horizon is theory's prediction,
later horizons are exploratory unless pre-registered. (The bank's own pairs: tests/attribution/test_pairs.py.)"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from seedlab.attribution.analyses.additivity import DIFF, PAIR, SWAPPED, additivity, summarise
from seedlab.attribution.bank.measure import PAIR_COLUMNS
from seedlab.attribution.report.additivity import additivity_section
from seedlab.attribution.analyses.stats import joint_draws
from seedlab.stats import bootstrap_interval, slope_along

HORIZONS = ((5, "s+1"), (14, "s+10"), (104, "end"))


def _frame(slopes, *, pairs: int = 30, candidates: int = 10, queries: int = 3, noise: float = 0.05, seed: int = 0):
    """additivity.parquet's columns: per seed k, measured_pair = slopes[k]·sum + noise (at every horizon), the
    swapped control = sum + noise; ``pairs`` distinct pairs of ``candidates`` (overlapping once 2·pairs exceeds
    them), the same pairs in every seed."""
    rng = np.random.default_rng(seed)
    names = [f"c{i}" for i in range(candidates)]
    chosen = list(itertools.combinations(names, 2))[:pairs]
    rows = []
    for k, b in enumerate(slopes):
        for (first, second), q, (h, label) in itertools.product(chosen, range(queries), HORIZONS):
            a, c = rng.normal(), rng.normal()
            f_other, s_other = a + noise * rng.normal(), c + noise * rng.normal()
            rows.append({"seed": k, "pair": f"pair.{first}..{second}", "first": first, "second": second,
                         "first_kind": "heldout", "second_kind": "heldout", "query": f"q{q}", "query_kind": "heldout",
                         "horizon": h, "after": h - 4, "label": label, "measured_pair": b * (a + c) + noise * rng.normal(),
                         "measured_first": a, "measured_second": c, "sum": a + c, "first_other_row": f_other,
                         "second_other_row": s_other, "swapped": f_other + s_other})
    df = pd.DataFrame(rows, columns=PAIR_COLUMNS)
    df["interaction"] = df.measured_pair - df["sum"]
    return df


def test_the_interval_resamples_seeds_then_pairs_by_hand():
    """Every resample: the seeds drawn with replacement, then the pairs anew within each drawn seed; the slope of
    each drawn seed over its drawn pairs × queries, the mean over the drawn seeds; the percentile interval."""
    df = _frame([0.7, 1.0, 1.3], pairs=8, queries=2)
    st = additivity(df, resamples=60, seed=3)
    row = st[(st.comparison == PAIR) & (st.horizon == 14)].iloc[0]
    g = df[df.horizon == 14]
    pairs = list(dict.fromkeys(g.pair))
    slots, idx = joint_draws(3, len(pairs), 60, 3)
    by = g.set_index(["seed", "pair"])
    values = []
    for k in range(60):
        per = []
        for j in range(3):
            drawn = by.loc[[(slots[k, j], pairs[i]) for i in idx[k, j]]]
            per.append(float(slope_along(drawn["sum"].to_numpy(), drawn.measured_pair.to_numpy())))
        values.append(np.mean(per))
    lo, hi = bootstrap_interval(np.array(values))
    assert (row.slope_low, row.slope_high) == pytest.approx((lo, hi), rel=1e-9)
    point = np.mean([slope_along(x["sum"].to_numpy(), x.measured_pair.to_numpy()) for _, x in g.groupby("seed")])
    assert row.slope == pytest.approx(point, rel=1e-12)


def test_seeds_that_disagree_widen_the_interval():
    """With 30 overlapping pairs per seed and little noise each seed's slope is nearly exact; seeds whose slopes
    differ (0.6 .. 1.2) give an interval that spans them, seeds that agree a narrow one."""
    spread = additivity(_frame([0.6, 0.8, 1.0, 1.2]), resamples=400)
    same = additivity(_frame([0.9, 0.9, 0.9, 0.9]), resamples=400)
    for st in (spread, same):
        assert set(st.pairs) == {30} and set(st.seeds) == {4}
    a = spread[(spread.comparison == PAIR) & (spread.horizon == 5)].iloc[0]
    b = same[(same.comparison == PAIR) & (same.horizon == 5)].iloc[0]
    assert a.slope == pytest.approx(0.9, abs=0.02) and b.slope == pytest.approx(0.9, abs=0.02)
    assert a.slope_low < 0.8 and a.slope_high > 1.0  # the seeds' spread, not the pairs'
    assert b.slope_high - b.slope_low < 0.05
    control = same[(same.comparison == SWAPPED) & (same.horizon == 5)].iloc[0]
    assert control.slope == pytest.approx(1.0, abs=0.02)
    diff = same[(same.comparison == DIFF) & (same.horizon == 5)].iloc[0]
    assert diff.slope == pytest.approx(b.slope - control.slope, abs=1e-12) and diff.slope_high < 0


def test_later_horizons_are_exploratory_unless_preregistered():
    a = summarise(_frame([0.9, 1.1]), resamples=200)
    text = additivity_section(a)
    answer = text.split("\n\n")[1]
    assert answer.startswith("Over 30 pair(s) and 2 seed(s), a pair's effect on the heldout queries departs from the "
                             "sum of its two single-row effects by a median relative interaction")
    first, later = answer.split(" Exploratory, the later horizons (no decision rule for them was fixed in advance): ")
    assert " at s+1 (against " in first and "s+10" not in first and "end" not in first
    assert " at s+10 … " in later and " at end" in later
    assert "| s+1 (5) | s+10 (14), exploratory | end (104), exploratory |" in text
    assert "resampled and then pairs within each drawn seed" in text
    pre = additivity_section(a, preregistered=["s+10"])
    assert "| s+1 (5) | s+10 (14), pre-registered | end (104), exploratory |" in pre
    first, later = pre.split("\n\n")[1].split(" Exploratory, the later horizons")
    assert " at s+1 … " in first and " at s+10 (against" in first and " at end" in later and "s+10" not in later
    one = additivity_section(summarise(_frame([1.0], pairs=4).query("horizon == 5"), resamples=50))
    assert "Exploratory" not in one.split("\n\n")[1] and "| s+1 (5) |\n" in one  # one horizon: nothing later
