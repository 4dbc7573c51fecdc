"""Counterfactual pairs: same label, opposite consistency, exactly the minimal edit distance; exact feasibility."""

import itertools

import numpy as np
import pytest

from seedlab.errors import SeedlabError
from seedlab.shortcut.pairs import PAIR_DISTANCE, check_pairs_feasible, make_pairs, partners
from seedlab.shortcut.tasks import TASKS, make_splits


def _k(task):
    return 2 if task.startswith("sum2") else 3


def _label(task, x):  # recomputed from scratch, without the library's helpers
    return x.sum(-1) % _k(task)


def _shortcut(task, x):
    return (x.max(-1) if task.endswith("max") else x[..., 0]) % _k(task)


def _unique_argmax(x):
    """Position of the unique maximum of each row, -1 where the maximum is tied."""
    top = x.max(-1, keepdims=True)
    return np.where((x == top).sum(-1) == 1, x.argmax(-1), -1)


def _space(length, vocab):
    return np.array(list(itertools.product(range(vocab), repeat=length)), dtype=np.int64)


def _all_pairs(task, length, vocab):
    """Brute force: boolean [n, n] of (clean, corrupt) pairs meeting the constraints, and the Hamming distances."""
    X = _space(length, vocab)
    y, s = _label(task, X), _shortcut(task, X)
    ok = (y == s)[:, None] & (y[None, :] == y[:, None]) & (s != y)[None, :]
    if task.endswith("max"):  # the maximum stays the unique maximum at the same position
        p = _unique_argmax(X)
        ok &= (p[:, None] >= 0) & (p[:, None] == p[None, :])
    dist = (X[:, None, :] != X[None, :, :]).sum(-1)
    return X, ok, dist


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("length,vocab", [(5, 16), (3, 32), (2, 60), (7, 20)])  # 20^7 sequences: drawn, not enumerated
def test_every_pair_matches_labels_flips_consistency_at_distance_two(task, length, vocab):
    p = make_pairs(task, 300, length=length, vocab=vocab, seed=4)
    assert p.clean.shape == p.corrupt.shape == (300, length) and len(p) == 300
    np.testing.assert_array_equal(_label(task, p.clean), p.y)
    np.testing.assert_array_equal(_label(task, p.corrupt), p.y)  # the same label
    assert (_shortcut(task, p.clean) == p.y).all()  # clean: shortcut-consistent
    assert (_shortcut(task, p.corrupt) != p.y).all()  # corrupt: anti-shortcut
    np.testing.assert_array_equal(p.shortcut_corrupt, _shortcut(task, p.corrupt))
    diff = p.clean != p.corrupt
    assert (diff.sum(1) == PAIR_DISTANCE).all()
    rows = np.arange(300)[:, None]
    assert diff[rows, p.edited].all()  # the recorded positions are the edited ones
    if task.endswith("max"):
        np.testing.assert_array_equal(_unique_argmax(p.clean), p.edited[:, 0])
        np.testing.assert_array_equal(_unique_argmax(p.corrupt), p.edited[:, 0])
    else:
        assert (p.edited[:, 0] == 0).all()
    assert len({r.tobytes() for r in p.clean}) == 300  # distinct clean sequences
    assert 0 < vocab and p.clean.max() < vocab and p.corrupt.max() < vocab and p.corrupt.min() >= 0


@pytest.mark.parametrize("task", list(TASKS))
def test_distance_two_is_minimal_and_partners_are_all_valid_edits(task):
    """Over a whole small space: no valid partner at distance 1; partners() lists exactly those at distance 2."""
    length, vocab = 3, 5
    X, ok, dist = _all_pairs(task, length, vocab)
    assert not (ok & (dist < PAIR_DISTANCE)).any()  # nothing closer exists
    assert (ok & (dist == PAIR_DISTANCE)).any()
    from seedlab.shortcut.tasks import get_task

    t = get_task(task)
    for i, x in enumerate(X):
        cand, _ = partners(t, x, vocab)
        want = {X[j].tobytes() for j in np.flatnonzero(ok[i] & (dist[i] == PAIR_DISTANCE))}
        assert {c.tobytes() for c in cand} == want, x


def test_max_pairs_could_be_closer_only_by_moving_the_maximum():
    """The documented reason for the constraint: sum2-max has distance-1 pairs, all of which move the maximum."""
    X = _space(3, 5)
    y, s = _label("sum2-max", X), _shortcut("sum2-max", X)
    ok = (y == s)[:, None] & (y[None, :] == y[:, None]) & (s != y)[None, :]
    one = ok & ((X[:, None, :] != X[None, :, :]).sum(-1) == 1)
    assert one.any()
    i, j = np.nonzero(one)
    p = _unique_argmax(X)
    assert not ((p[i] >= 0) & (p[i] == p[j])).any()


@pytest.mark.parametrize("task", list(TASKS))
def test_feasibility_check_is_exact(task):
    for length, vocab in itertools.product([1, 2, 3], [2, 3, 4, 5]):
        _, ok, dist = _all_pairs(task, length, vocab)
        exists = bool((ok & (dist == PAIR_DISTANCE)).any())
        if exists:
            check_pairs_feasible(task, length, vocab)
            assert len(make_pairs(task, 1, length=length, vocab=vocab, seed=0)) == 1
        else:
            with pytest.raises(SeedlabError, match=r"^(length|vocab): counterfactual pairs"):
                check_pairs_feasible(task, length, vocab)


@pytest.mark.parametrize(
    "task,length,vocab,field",
    [("sum2-max", 5, 2, "vocab"), ("sum3-max", 5, 3, "vocab"), ("sum2-first", 1, 10, "length"), ("sum3-max", 1, 10, "length")],
)
def test_impossible_construction_is_a_one_line_error(task, length, vocab, field):
    with pytest.raises(SeedlabError, match=f"^{field}:") as e:
        make_pairs(task, 10, length=length, vocab=vocab, seed=0)
    assert "\n" not in str(e.value)


def test_too_many_pairs_asked_is_a_one_line_error():
    with pytest.raises(SeedlabError, match=r"^n: only \d+ counterfactual pairs"):
        make_pairs("sum2-first", 10_000, length=2, vocab=4, seed=0)
    with pytest.raises(SeedlabError, match="^n:"):
        make_pairs("sum2-first", 0, length=5, vocab=4, seed=0)


def test_fixed_by_the_data_seed_and_held_out_from_the_training_split():
    s = make_splits("sum2-max", 0.5, 2000, n_val=100, n_adv=100, length=4, vocab=8, seed=1)
    a = make_pairs("sum2-max", 200, length=4, vocab=8, seed=1, exclude=s["train"].x)
    b = make_pairs("sum2-max", 200, length=4, vocab=8, seed=1, exclude=s["train"].x)
    c = make_pairs("sum2-max", 200, length=4, vocab=8, seed=2, exclude=s["train"].x)
    np.testing.assert_array_equal(a.clean, b.clean)
    np.testing.assert_array_equal(a.corrupt, b.corrupt)
    assert not np.array_equal(a.clean, c.clean)
    train = {r.tobytes() for r in s["train"].x}
    assert not any(r.tobytes() in train for r in np.concatenate([a.clean, a.corrupt]))
    # without the exclusion some pair would touch the 2,000 training rows of the 4,096 sequences
    free = make_pairs("sum2-max", 200, length=4, vocab=8, seed=1)
    assert any(r.tobytes() in train for r in np.concatenate([free.clean, free.corrupt]))


def test_splits_are_unchanged():
    """The pairs live on a stream of their own: the splits are what they were before pairs existed."""
    import hashlib

    s = make_splits("sum3-first", 0.5, 500, n_val=50, n_adv=50, length=5, vocab=10, seed=0)
    digest = hashlib.sha256(b"".join(s[k].x.tobytes() for k in ("train", "val", "adv"))).hexdigest()
    assert digest == "22dbe336eae3b6ef59a5f2996f37576e65a658ff095551584dd099966e740934"
