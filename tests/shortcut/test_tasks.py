"""The MPSP data: exact ratios, independently recomputed labels, disjoint fixed splits."""

import itertools

import numpy as np
import pytest

from seedlab.errors import SeedlabError
from seedlab.shortcut.tasks import TASKS, count_sequences, make_splits, n_consistent


def _label(task, row):  # recomputed from scratch, without the library's helpers
    k = 2 if task.startswith("sum2") else 3
    return sum(int(v) for v in row) % k


def _shortcut(task, row):
    k = 2 if task.startswith("sum2") else 3
    return (max(int(v) for v in row) if task.endswith("max") else int(row[0])) % k


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("ratio", [0.0, 0.15, 0.3, 0.5, 0.9, 1.0])
def test_exact_ratio_and_labels(task, ratio):
    n = 1000
    s = make_splits(task, ratio, n, n_val=200, n_adv=200, length=5, vocab=10, seed=3)
    tr = s["train"]
    assert tr.x.shape == (n, 5) and tr.x.min() >= 0 and tr.x.max() <= 9
    y = np.array([_label(task, r) for r in tr.x])
    sc = np.array([_shortcut(task, r) for r in tr.x])
    np.testing.assert_array_equal(tr.y, y)
    np.testing.assert_array_equal(tr.shortcut, sc)
    assert int((y == sc).sum()) == round(ratio * n)  # exact, not approximately
    for split, want in (("val", True), ("adv", False)):
        x = s[split].x
        cons = np.array([_label(task, r) == _shortcut(task, r) for r in x])
        assert cons.all() if want else not cons.any()


def test_round_half_up():
    assert n_consistent(0.5, 3) == 2 and n_consistent(0.25, 2) == 1 and n_consistent(0.9, 16384) == 14746
    assert n_consistent(0.29, 50) == 15  # 0.29 * 50 is 14.499999999999998 in floats


def test_splits_disjoint_distinct_and_fixed_by_seed():
    a = make_splits("sum2-max", 0.9, 2000, n_val=300, n_adv=300, length=5, vocab=8, seed=1)
    b = make_splits("sum2-max", 0.9, 2000, n_val=300, n_adv=300, length=5, vocab=8, seed=1)
    c = make_splits("sum2-max", 0.9, 2000, n_val=300, n_adv=300, length=5, vocab=8, seed=2)
    for k in a:
        np.testing.assert_array_equal(a[k].x, b[k].x)
    assert not np.array_equal(a["train"].x, c["train"].x)
    rows = [tuple(r) for k in a for r in a[k].x]
    assert len(rows) == len(set(rows))  # distinct within and across splits
    # the test splits do not depend on the training ratio
    d = make_splits("sum2-max", 0.5, 1500, n_val=300, n_adv=300, length=5, vocab=8, seed=1)
    np.testing.assert_array_equal(a["val"].x, d["val"].x)
    np.testing.assert_array_equal(a["adv"].x, d["adv"].x)


@pytest.mark.parametrize("task", list(TASKS))
def test_count_sequences_matches_enumeration(task):
    t = TASKS[task]
    x = np.array(list(itertools.product(range(6), repeat=4)))
    cons = int((t.label(x) == t.shortcut_feature(x)).sum())
    assert count_sequences(t, 4, 6) == (cons, len(x) - cons)


def test_uniform_within_group():
    """No bias beyond the conditioning: first-element values are uniform among consistent samples."""
    s = make_splits("sum2-first", 1.0, 20000, n_val=10, n_adv=10, length=5, vocab=10, seed=0)
    counts = np.bincount(s["train"].x[:, 0], minlength=10)
    from scipy.stats import chisquare

    assert chisquare(counts).pvalue > 1e-3


def test_rejection_path_large_space():
    s = make_splits("sum3-max", 0.15, 3000, n_val=100, n_adv=100, length=7, vocab=20, seed=0)  # 20^7 > enumeration limit
    tr = s["train"]
    assert int(tr.consistent.sum()) == 450
    assert len({tuple(r) for r in tr.x}) == 3000


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(ratio=1.2), "ratio"),
        (dict(ratio=-0.1), "ratio"),
        (dict(task="sum4-max"), "task"),
        (dict(n_train=0), "n_train"),
        (dict(vocab=2, length=3), "vocab"),
    ],
)
def test_bad_input(kw, field):
    args = dict(task="sum2-max", ratio=0.5, n_train=100, n_val=10, n_adv=10, length=5, vocab=10, seed=0) | kw
    task = args.pop("task")
    with pytest.raises(SeedlabError, match=f"^{field}:"):
        make_splits(task, args.pop("ratio"), args.pop("n_train"), **args)
