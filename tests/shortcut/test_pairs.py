"""Counterfactual pairs, both kinds: opposite consistency, one feature kept, exactly the minimal edit distance;
exact feasibility."""

import itertools

import numpy as np
import pytest

from seedlab.errors import SeedlabError
from seedlab.shortcut.pairs import KINDS, PAIR_DISTANCE, check_pairs_feasible, make_pairs, partners
from seedlab.shortcut.tasks import TASKS, get_task, make_splits


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


def _all_pairs(task, length, vocab, kind="same_label"):
    """Brute force: boolean [n, n] of (clean, corrupt) pairs of ``kind`` meeting the constraints, and the Hamming distances."""
    X = _space(length, vocab)
    y, s = _label(task, X), _shortcut(task, X)
    ok = (y == s)[:, None] & (s != y)[None, :]  # clean consistent, corrupt anti-shortcut
    if kind == "same_label":
        ok &= y[None, :] == y[:, None]
    else:  # the shortcut token kept: the same first element, or the same unique maximum at the same position
        ok &= X[:, None, 0] == X[None, :, 0] if task.endswith("first") else X.max(-1)[:, None] == X.max(-1)[None, :]
    if task.endswith("max"):  # the maximum stays the unique maximum at the same position
        p = _unique_argmax(X)
        ok &= (p[:, None] >= 0) & (p[:, None] == p[None, :])
    dist = (X[:, None, :] != X[None, :, :]).sum(-1)
    return X, ok, dist


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("length,vocab", [(5, 16), (3, 32), (2, 60), (7, 20)])  # 20^7 sequences: drawn, not enumerated
def test_every_pair_keeps_one_feature_flips_consistency_at_the_minimal_distance(task, length, vocab, kind):
    p = make_pairs(task, 300, length=length, vocab=vocab, seed=4, kind=kind)
    assert p.kind == kind and p.clean.shape == p.corrupt.shape == (300, length) and len(p) == 300
    np.testing.assert_array_equal(_label(task, p.clean), p.y)
    np.testing.assert_array_equal(_label(task, p.corrupt), p.y_corrupt)
    assert (_shortcut(task, p.clean) == p.y).all()  # clean: shortcut-consistent
    assert (_shortcut(task, p.corrupt) != p.y_corrupt).all()  # corrupt: anti-shortcut
    np.testing.assert_array_equal(p.shortcut_corrupt, _shortcut(task, p.corrupt))
    if kind == "same_label":
        assert (p.y_corrupt == p.y).all()  # the same label, another shortcut feature
    else:
        assert (p.y_corrupt != p.y).all()  # another label...
        np.testing.assert_array_equal(_shortcut(task, p.corrupt), _shortcut(task, p.clean))  # ...the same shortcut feature
        if task.endswith("first"):  # the shortcut token itself is kept
            np.testing.assert_array_equal(p.corrupt[:, 0], p.clean[:, 0])
        else:
            np.testing.assert_array_equal(p.corrupt.max(1), p.clean.max(1))
    diff = p.clean != p.corrupt
    assert (diff.sum(1) == PAIR_DISTANCE[kind]).all()
    rows = np.arange(300)[:, None]
    assert p.edited.shape == (300, PAIR_DISTANCE[kind]) and diff[rows, p.edited].all()  # the recorded positions
    if task.endswith("max"):  # the unique maximum keeps its position
        np.testing.assert_array_equal(_unique_argmax(p.clean), _unique_argmax(p.corrupt))
        assert (_unique_argmax(p.clean) >= 0).all()
        if kind == "same_label":
            np.testing.assert_array_equal(_unique_argmax(p.clean), p.edited[:, 0])
    elif kind == "same_label":
        assert (p.edited[:, 0] == 0).all()
    assert len({r.tobytes() for r in p.clean}) == 300  # distinct clean sequences
    assert 0 < vocab and p.clean.max() < vocab and p.corrupt.max() < vocab and p.corrupt.min() >= 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("task", list(TASKS))
def test_the_distance_is_minimal_and_partners_are_all_valid_edits(task, kind):
    """Over a whole small space: no valid partner closer; partners() lists exactly those at the pair distance."""
    length, vocab = 3, 5
    X, ok, dist = _all_pairs(task, length, vocab, kind)
    assert not (ok & (dist < PAIR_DISTANCE[kind])).any()  # nothing closer exists
    assert (ok & (dist == PAIR_DISTANCE[kind])).any()
    t = get_task(task)
    for i, x in enumerate(X):
        cand, _ = partners(t, x, vocab, kind)
        want = {X[j].tobytes() for j in np.flatnonzero(ok[i] & (dist[i] == PAIR_DISTANCE[kind]))}
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


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("task", list(TASKS))
def test_feasibility_check_is_exact(task, kind):
    for length, vocab in itertools.product([1, 2, 3], [2, 3, 4, 5]):
        _, ok, dist = _all_pairs(task, length, vocab, kind)
        exists = bool((ok & (dist == PAIR_DISTANCE[kind])).any())
        if exists:
            check_pairs_feasible(task, length, vocab, kind)
            assert len(make_pairs(task, 1, length=length, vocab=vocab, seed=0, kind=kind)) == 1
        else:
            with pytest.raises(SeedlabError, match=r"^(length|vocab): counterfactual pairs"):
                check_pairs_feasible(task, length, vocab, kind)


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


@pytest.mark.parametrize("kind", KINDS)
def test_fixed_by_the_data_seed_and_held_out_from_the_training_split(kind):
    s = make_splits("sum2-max", 0.5, 2000, n_val=100, n_adv=100, length=4, vocab=8, seed=1)
    a, b, c = (make_pairs("sum2-max", 200, length=4, vocab=8, seed=seed, exclude=s["train"].x, kind=kind) for seed in (1, 1, 2))
    np.testing.assert_array_equal(a.clean, b.clean)
    np.testing.assert_array_equal(a.corrupt, b.corrupt)
    assert not np.array_equal(a.clean, c.clean)
    train = {r.tobytes() for r in s["train"].x}
    assert not any(r.tobytes() in train for r in np.concatenate([a.clean, a.corrupt]))
    # without the exclusion some pair would touch the 2,000 training rows of the 4,096 sequences
    free = make_pairs("sum2-max", 200, length=4, vocab=8, seed=1, kind=kind)
    assert any(r.tobytes() in train for r in np.concatenate([free.clean, free.corrupt]))


def test_splits_are_unchanged():
    """The pairs live on a stream of their own: the splits are what they were before pairs existed."""
    import hashlib

    s = make_splits("sum3-first", 0.5, 500, n_val=50, n_adv=50, length=5, vocab=10, seed=0)
    digest = hashlib.sha256(b"".join(s[k].x.tobytes() for k in ("train", "val", "adv"))).hexdigest()
    assert digest == "22dbe336eae3b6ef59a5f2996f37576e65a658ff095551584dd099966e740934"


def test_same_label_pairs_are_unchanged_and_the_kinds_draw_apart():
    """Adding label-changing pairs left the same-label ones as they were (digest from before the change)."""
    import hashlib

    h = hashlib.sha256()
    for task in TASKS:
        for length, vocab in ((5, 16), (3, 32), (7, 20)):
            p = make_pairs(task, 200, length=length, vocab=vocab, seed=3)
            for a in (p.clean, p.corrupt, p.y, p.shortcut_corrupt, p.edited):
                h.update(np.ascontiguousarray(a).tobytes())
    assert h.hexdigest() == "37899325d47b5d7c7371671b0e5aeeb53cd68532cbc3f11cbe99b0c792bee3ad"
    same = make_pairs("sum3-max", 50, length=5, vocab=16, seed=3)
    changing = make_pairs("sum3-max", 50, length=5, vocab=16, seed=3, kind="label_changing")
    assert not np.array_equal(same.clean, changing.clean)  # a stream of its own
    with pytest.raises(ValueError, match="kind"):
        make_pairs("sum3-max", 5, length=5, vocab=16, seed=3, kind="both")
