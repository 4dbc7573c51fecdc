"""How robust a verdict is: the fragility of Fisher verdicts and of the flip verdict, each checked by brute force."""

from __future__ import annotations

import itertools
from collections import Counter

import pandas as pd
import pytest
from helpers import summary_of_cells
from scipy import stats

from seedlab.shortcut.stats import FlipFragility, flip_answer, flip_fragility, ratio_contrasts, simple_slopes
from seedlab.stats import fisher, fisher_fragility

# ---------------------------------------------------------------- Fisher


def brute_fisher_fragility(k1: int, n1: int, k2: int, n2: int) -> int | None:
    """Every table of these sizes, its p from scipy: the fewest single-outcome changes to one with the other verdict."""
    significant = stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue < 0.05
    best = None
    for a in range(n1 + 1):
        for b in range(n2 + 1):
            if (stats.fisher_exact([[a, n1 - a], [b, n2 - b]]).pvalue < 0.05) != significant:
                d = abs(a - k1) + abs(b - k2)
                best = d if best is None else min(best, d)
    return best


def one_cell_fragility(k1: int, n1: int, k2: int, n2: int) -> int | None:
    """The restricted search the fragility is not: changes in one group only."""
    significant = fisher(k1, n1, k2, n2)[1] < 0.05
    ds = [abs(a - k1) for a in range(n1 + 1) if (fisher(a, n1, k2, n2)[1] < 0.05) != significant]
    ds += [abs(b - k2) for b in range(n2 + 1) if (fisher(k1, n1, b, n2)[1] < 0.05) != significant]
    return min(ds, default=None)


def test_fisher_fragility_of_a_significant_verdict():
    f = fisher_fragility(8, 8, 0, 8)
    assert f["significant"] and f["p"] == pytest.approx(2 / 12870)  # 2 / C(16, 8)
    assert f["fragility"] == brute_fisher_fragility(8, 8, 0, 8) == 4
    # the table it names is at that distance, and its verdict is the other one
    a, b = f["table"]
    assert abs(a - 8) + abs(b - 0) == 4
    assert f["p_after"] == pytest.approx(stats.fisher_exact([[a, 8 - a], [b, 8 - b]]).pvalue) and f["p_after"] >= 0.05
    # 3 changes are never enough: every table at distance 3 is still significant
    assert all(fisher(8 + d1, 8, 0 + d2, 8)[1] < 0.05 for d1 in range(-3, 1) for d2 in range(0, 4) if -d1 + d2 == 3)


def test_reverse_fragility_needs_changes_in_both_groups():
    f = fisher_fragility(4, 8, 4, 8)
    assert not f["significant"] and f["p"] == pytest.approx(1.0)
    assert f["fragility"] == brute_fisher_fragility(4, 8, 4, 8) == 5
    assert f["p_after"] < 0.05
    # no table reached by changing one group only is significant (8/8 vs 4/8: p = 0.077), so a one-group search
    # (Walsh's original index changes one group) finds nothing
    assert one_cell_fragility(4, 8, 4, 8) is None
    a, b = f["table"]
    assert a != 4 and b != 4


@pytest.mark.parametrize("table", [(7, 10, 0, 10), (3, 10, 0, 10), (0, 10, 0, 10), (5, 7, 1, 9), (1, 3, 2, 4)])
def test_fisher_fragility_equals_brute_force(table):
    assert fisher_fragility(*table)["fragility"] == brute_fisher_fragility(*table)


def test_a_verdict_no_table_can_reverse():
    f = fisher_fragility(1, 1, 0, 1)  # no 1-vs-1 table is significant
    assert not f["significant"] and f["fragility"] is None and f["table"] is None
    with pytest.raises(ValueError, match="need 0 <= k <= n"):
        fisher_fragility(3, 2, 0, 2)


def test_one_sided_fisher():
    assert fisher(7, 10, 0, 10, alternative="greater")[1] == pytest.approx(
        stats.fisher_exact([[7, 3], [0, 10]], alternative="greater").pvalue)
    assert fisher(0, 10, 3, 10, alternative="less")[1] == pytest.approx(
        stats.fisher_exact([[0, 10], [3, 7]], alternative="less").pvalue)


def test_ratio_contrasts_with_fragility():
    df = pd.concat([summary_of_cells([(2, 0.5, 0, 10), (2, 0.9, 7, 10)]), summary_of_cells([(1, 0.5, 3, 10), (1, 0.9, 0, 10)])])
    plain = ratio_contrasts(df)
    c = ratio_contrasts(df, fragility=True)
    assert list(c.columns) == [*plain.columns, "fragility"]
    pd.testing.assert_frame_equal(c[plain.columns], plain)
    two, one = c[c.layers == 2].iloc[0], c[c.layers == 1].iloc[0]
    assert two.fragility == brute_fisher_fragility(0, 10, 7, 10) == 2  # 1/10 vs 6/10: p = 0.057
    assert one.fragility == brute_fisher_fragility(3, 10, 0, 10) == 2  # 5/10 vs 0/10: p = 0.033 (reverse)


# ---------------------------------------------------------------- the flip


def changed(df: pd.DataFrame, net: dict[tuple[int, float], int]) -> pd.DataFrame | None:
    """``df`` with, per (layers, ratio) cell, m more members generalized (m > 0) or |m| fewer; None when the cell has
    too few members to change."""
    d = df.copy()
    for (layers, ratio), m in net.items():
        cell = d[(d.layers == layers) & (d.ratio == ratio)]
        pool = cell.index[~cell.generalized] if m > 0 else cell.index[cell.generalized]
        if len(pool) < abs(m):
            return None
        d.loc[pool[: abs(m)], "generalized"] = m > 0
    return d


def p_flip(df: pd.DataFrame) -> float | None:
    try:
        return simple_slopes(df)["p_flip"]
    except ValueError:
        return None


def brute_flip_fragility(df: pd.DataFrame, up_to: int) -> int | None:
    """Every multiset of up to ``up_to`` (cell, direction) changes, each refitted with simple_slopes on the changed
    frame: the smallest size that reverses the flip verdict."""
    shown = simple_slopes(df)["flip"]
    cells = sorted(set(zip(df.layers, df.ratio)))
    units = [(cell, s) for cell in cells for s in (1, -1)]
    for size in range(1, up_to + 1):
        for combo in itertools.combinations_with_replacement(units, size):
            count = Counter(combo)
            if any(count[(cell, 1)] and count[(cell, -1)] for cell in cells):
                continue  # one member changed up and another down in a cell: a smaller multiset's outcomes
            d = changed(df, {cell: count[(cell, 1)] - count[(cell, -1)] for cell in cells})
            if d is None:
                continue
            p = p_flip(d)
            if (p is not None and p < 0.05) != shown:
                return size
    return None


FLIPS = {
    # shown, maximum likelihood: three fewer 1L members generalizing at r = 0.5 reverse it
    "shown": [(1, 0.5, 10, 16), (1, 0.9, 3, 16), (2, 0.5, 3, 16), (2, 0.9, 10, 16)],
    # not shown (p = 0.12): the smallest reversal changes two cells
    "not shown": [(1, 0.5, 6, 16), (1, 0.9, 3, 16), (2, 0.5, 3, 16), (2, 0.9, 7, 16)],
    # separated (0% cells): Firth's regression
    "separated": [(1, 0.5, 5, 10), (1, 0.9, 0, 10), (2, 0.5, 0, 10), (2, 0.9, 7, 10)],
}


@pytest.mark.parametrize("name", FLIPS)
def test_flip_fragility_equals_brute_force_with_simple_slopes(name):
    df = summary_of_cells(FLIPS[name])
    base = simple_slopes(df)
    f = flip_fragility(df)
    assert isinstance(f, FlipFragility) and f.shown == base["flip"] and f.p_flip == base["p_flip"]
    assert f.reached and f.fragility >= 2  # not a trivial one-change case
    assert brute_flip_fragility(df, f.fragility) == f.fragility
    # the changes it names reverse the verdict, and p_after is simple_slopes' p_flip after them
    assert sum(abs(m) for *_, m in f.changes) == f.fragility
    after = changed(df, {(layers, ratios[0]): m for layers, ratios, m in f.changes})
    assert f.p_after == pytest.approx(p_flip(after), rel=1e-6)
    assert (f.p_after < 0.05) != f.shown
    if name == "separated":
        assert base["1L"]["method"] == "firth-profile-lr"
    if name == "not shown":
        assert not f.shown and len(f.changes) == 2


def test_flip_fragility_beyond_the_cap():
    df = summary_of_cells(FLIPS["shown"])  # fragility 3
    f = flip_fragility(df, max_changes=2)
    assert not f.reached and f.fragility is None and f.max_changes == 2 and f.changes == ()
    assert brute_flip_fragility(df, 2) is None


def test_flip_fragility_of_four_cells_of_32_is_quick():
    """A robust verdict: the whole search to six changes (1,288 states) runs, in a few seconds at most."""
    import time

    df = summary_of_cells([(1, 0.5, 20, 32), (1, 0.9, 4, 32), (2, 0.5, 4, 32), (2, 0.9, 20, 32)])
    start = time.perf_counter()
    f = flip_fragility(df)
    assert time.perf_counter() - start < 20  # about 1 s alone; generous on a loaded machine
    assert f.shown and not f.reached and f.max_changes == 6


def test_flip_answer_carries_fragility_and_one_sided_fisher():
    df = summary_of_cells(FLIPS["separated"], retained=True)
    a = flip_answer(df)
    assert a.verdict == "shown" and a.flip_fragility == flip_fragility(df)
    two, one = a.moves[2], a.moves[1]
    assert two.p_one_sided == pytest.approx(stats.fisher_exact([[7, 3], [0, 10]], alternative="greater").pvalue)
    assert one.p_one_sided == pytest.approx(stats.fisher_exact([[0, 10], [5, 5]], alternative="less").pvalue)
    assert two.fragility == fisher_fragility(7, 10, 0, 10) and two.fragility["fragility"] == brute_fisher_fragility(7, 10, 0, 10)
    assert one.fragility["fragility"] == brute_fisher_fragility(0, 10, 5, 10)
