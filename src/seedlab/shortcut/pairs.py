"""Matched counterfactual pairs: a shortcut-consistent and an anti-shortcut sequence, two kinds.

A pair ``(clean, corrupt)`` of one task (see :mod:`seedlab.shortcut.tasks`) always has a
shortcut-consistent ``clean`` (``shortcut(clean) == label(clean)``) and an anti-shortcut
``corrupt``. The two kinds (:data:`KINDS`) change one of the two features and keep the other:

- ``same_label``: ``label(corrupt) == label(clean)``, the shortcut feature changes; the pair
  differs in exactly 2 positions (:data:`PAIR_DISTANCE`). A model that follows the shortcut
  treats the two sides differently, one that follows the rule alike.
- ``label_changing``: the shortcut TOKEN is kept (the same first element for ``*-first``; the
  same maximum, same value at the same position and still the unique maximum, for ``*-max``),
  so ``shortcut(corrupt) == shortcut(clean)``, and ``label(corrupt) != label(clean)``; the pair
  differs in exactly 1 position. A model that follows the rule treats the two sides
  differently, one that follows the shortcut alike: patching on these pairs sees the rule
  circuit, which same-label pairs cannot.

Same-label construction, with ``k`` the modulus and ``d = corrupt[p] - clean[p]``:

- ``*-first``: change the first token ``x[0]`` to any value ``a`` with ``a != x[0] (mod k)``
  (``p = 0``), and one other token ``x[j]`` (``j >= 1``) to any value ``b`` with
  ``b = x[j] - d (mod k)``: the sum keeps its residue, the first token's residue moves.
  Distance 2 is the minimum over ALL sequences: one substitution at position 0 moves the
  label and the shortcut together (consistency is ``sum(x[1:]) = 0 mod k``, unchanged);
  one at ``j >= 1`` by ``d != 0 (mod k)`` changes the label.
- ``*-max``: the clean sequence has a unique maximum ``m`` at position ``p``; change it to
  any ``a`` with ``a != m (mod k)`` and one other token ``x[j]`` to any value ``b`` with
  ``b = x[j] - d (mod k)``, such that ``a`` stays the unique maximum: ``b < a`` and ``a`` above
  every token but those two.
  The maximum keeps its position in both sequences, so a head that attends to the maximum
  attends to the same position in both; only what it reads there differs. Distance 2 is the
  minimum over pairs in which the maximum stays the unique maximum at the same position (a
  single substitution by ``d != 0 (mod k)`` moves the label; by ``d = 0`` at ``p`` it keeps the
  maximum's residue, and elsewhere, below the maximum, it keeps the maximum). Without that constraint a single substitution can suffice by MOVING
  the maximum, e.g. sum2-max ``(3, 2, 0) -> (3, 4, 0)``: those pairs are not built.

Label-changing construction: change one token ``x[j]`` other than the shortcut token (``j >= 1``
for ``*-first``; ``j != p``, the maximum's position, for ``*-max``) to any value ``b`` with
``b != x[j] (mod k)``, below the maximum ``m`` for ``*-max`` (``b < m``). The sum's residue moves
by ``b - x[j]``, the shortcut token is untouched: distance 1, the least any label change takes.

For a given clean sequence the corrupt partner is drawn uniformly among all its valid
partners of the kind; clean sequences are drawn uniformly, without replacement, among the
consistent ones (with a unique maximum for ``*-max``) that have at least one valid partner.
Sequences in ``exclude`` (e.g. the training split) are never used on either side, so the
pairs are held out like the val/adv splits. Everything is a pure function of ``(task, n,
length, vocab, seed, exclude, kind)``; ``seed`` is the data seed, on a stream of its own per
kind (the splits are not affected, and the same-label pairs are what they were before
label-changing pairs existed).

When is a pair possible at all (:func:`check_pairs_feasible`): ``length >= 2`` for every
task and kind; for ``*-max``, ``vocab >= k + 1`` for same-label pairs (with integers
``0..k-1`` only, the new maximum cannot take another residue and stay above the
compensating token) and ``vocab >= 3`` for label-changing ones (a token below the maximum
needs two values to choose from). The conditions are exact (tests enumerate small spaces).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seedlab.errors import SeedlabError
from seedlab.shortcut.tasks import _ENUMERATE_MAX, Task, _decode, get_task

#: the two kinds of pairs (see the module docstring)
KINDS = ("same_label", "label_changing")
#: Hamming distance between the two sequences of every pair of a kind, for every task
PAIR_DISTANCE = {"same_label": 2, "label_changing": 1}
#: each kind's random stream: the data seed plus these tags (the splits use the seed without them)
_STREAMS = {"same_label": (0x9A1C,), "label_changing": (0x9A1C, 1)}
#: clean sequences decoded at a time from the stream of candidates
_CHUNK = 4096


@dataclass
class Pairs:
    kind: str  # one of KINDS
    clean: np.ndarray  # [n, length] int64: shortcut-consistent
    corrupt: np.ndarray  # [n, length] int64: anti-shortcut
    y: np.ndarray  # [n] int64: the clean sequence's label
    y_corrupt: np.ndarray  # [n] int64: the corrupt sequence's label (== y for same-label pairs, != y otherwise)
    shortcut_corrupt: np.ndarray  # [n] int64: the corrupt sequence's shortcut feature (!= y_corrupt)
    # [n, PAIR_DISTANCE[kind]] int64, the edited positions: same-label (the shortcut token's, the compensating
    # token's); label-changing (the changed token's,)
    edited: np.ndarray

    def __len__(self) -> int:
        return self.y.shape[0]


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")


def check_pairs_feasible(task: str | Task, length: int, vocab: int, kind: str = "same_label") -> None:
    """A one-line :class:`SeedlabError` when no counterfactual pair of ``kind`` exists for this length/vocabulary."""
    _check_kind(kind)
    task = get_task(task) if isinstance(task, str) else task
    if length < 2:
        raise SeedlabError(
            f"length: counterfactual pairs for {task.name} need at least 2 integers per sequence, got {length}"
        )
    need, why = (task.modulus + 1, "the maximum can change its residue and stay the maximum") if kind == "same_label" \
        else (3, "a token below the maximum can change its residue")
    if task.shortcut == "max" and vocab < need:
        raise SeedlabError(
            f"vocab: counterfactual pairs for {task.name} need at least {need} integers"
            f" (0..{need - 1}) so {why}, got {vocab}"
        )


def _substitute(x: np.ndarray, positions: list[np.ndarray], values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Copies of ``x``, copy i with ``x[positions[e][i]] = values[e][i]`` for each edit e: (sequences, edited [m, edits])."""
    out = np.repeat(x[None], len(values[0]), axis=0)
    rows = np.arange(len(out))
    for pos, val in zip(positions, values, strict=True):
        out[rows, pos] = val
    return out, np.stack(positions, 1).astype(np.int64)


def partners(task: Task, x: np.ndarray, vocab: int, kind: str = "same_label") -> tuple[np.ndarray, np.ndarray]:
    """Every valid corrupt partner of ``kind`` of one clean sequence ``x`` [length]: (sequences [m, length], edited).

    ``edited`` is [m, PAIR_DISTANCE[kind]] (see :class:`Pairs`). Empty when ``x`` is not
    consistent, or (``*-max``) has no unique maximum.
    """
    _check_kind(kind)
    k, L = task.modulus, x.shape[0]
    empty = np.zeros((0, L), np.int64), np.zeros((0, PAIR_DISTANCE[kind]), np.int64)
    if L < 2 or task.label(x) != task.shortcut_feature(x):
        return empty
    p = 0 if task.shortcut == "first" else int(x.argmax())
    if task.shortcut == "max" and (np.delete(x, p) == x[p]).any():  # the maximum is not unique
        return empty
    js = np.arange(L)
    if kind == "label_changing":
        js = js[js != p]
        b = np.arange(vocab if task.shortcut == "first" else x[p])  # max: below the maximum, which stays unique
        ij, ib = np.nonzero((b - x[js][:, None]) % k != 0)  # [J, B] -> the (j, b) that move the sum's residue
        return _substitute(x, [js[ij]], [b[ib]])
    a = np.arange(vocab)
    if task.shortcut == "first":
        above = np.full(L, -1)  # the new first token may take any value...
        b_max = np.full(vocab, vocab)  # ...and so may the compensating token
    else:
        # the new maximum stays above every token but the compensating one, which goes below it
        above = np.array([np.delete(x, [p, j]).max(initial=-1) for j in js])
        b_max = a
    js = js[js != p]
    a = a[(a - x[p]) % k != 0]
    d = (a - x[p])[:, None, None]  # [A, 1, 1]
    b = np.arange(vocab)
    ok = (
        ((b - x[js][:, None] + d) % k == 0)  # the sum keeps its residue
        & (b < b_max[a][:, None, None])
        & (a[:, None, None] > above[js][None, :, None])
    )
    ia, ij, ib = np.nonzero(ok)  # [A, J, B] -> the valid (a, j, b)
    return _substitute(x, [np.full(ia.shape, p), js[ij]], [a[ia], b[ib]])


def _row_keys(x: np.ndarray) -> list[bytes]:
    return [r.tobytes() for r in np.ascontiguousarray(x, dtype=np.int64)]


def _candidates(rng: np.random.Generator, length: int, vocab: int):
    """Chunks of candidate clean sequences, each sequence at most once, in a seeded random order.

    Enumerable spaces are one permutation of all sequences (the stream ends); larger ones are
    uniform draws with repeats dropped (the stream does not end).
    """
    total = vocab**length
    if total <= _ENUMERATE_MAX:
        order = rng.permutation(total)
        for i in range(0, total, _CHUNK):
            yield _decode(order[i : i + _CHUNK], length, vocab)
        return
    seen: set[int] = set()
    while True:
        codes = rng.integers(0, total, size=_CHUNK, dtype=np.int64)
        fresh = np.array([c not in seen and not seen.add(c) for c in codes.tolist()])
        yield _decode(codes[fresh], length, vocab)


def make_pairs(
    task: str | Task, n: int, *, length: int, vocab: int, seed: int, exclude: np.ndarray | None = None,
    kind: str = "same_label",
) -> Pairs:
    """``n`` matched counterfactual pairs of ``kind`` of ``task`` (see the module docstring), a pure function of the arguments.

    ``exclude`` ([m, length]) lists sequences neither side of a pair may be (e.g. the training
    split). Raises a one-line :class:`SeedlabError` when no pair exists for this length/vocab,
    or when fewer than ``n`` exist outside ``exclude``.
    """
    task = get_task(task) if isinstance(task, str) else task
    check_pairs_feasible(task, length, vocab, kind)
    if n <= 0:
        raise SeedlabError(f"n: the number of counterfactual pairs must be a positive integer, got {n!r}")
    banned = set(_row_keys(exclude)) if exclude is not None and len(exclude) else set()
    rng = np.random.default_rng([seed, length, vocab, task.modulus, *_STREAMS[kind]])
    clean, corrupt, edited = [], [], []
    max_draws, draws = 64 * n + (1 << 20), 0
    for chunk in _candidates(rng, length, vocab):
        draws += _CHUNK
        consistent = task.label(chunk) == task.shortcut_feature(chunk)
        for x in chunk[consistent]:
            if x.tobytes() in banned:
                continue
            cand, ed = partners(task, x, vocab, kind)
            if banned and len(cand):
                keep = np.array([key not in banned for key in _row_keys(cand)], dtype=bool)
                cand, ed = cand[keep], ed[keep]
            if not len(cand):
                continue
            i = int(rng.integers(len(cand)))
            clean.append(x)
            corrupt.append(cand[i])
            edited.append(ed[i])
            if len(clean) == n:
                break
        if len(clean) == n or draws >= max_draws:
            break
    if len(clean) < n:
        where = " outside the excluded (training) sequences" if banned else ""
        found = "exist" if vocab**length <= _ENUMERATE_MAX else f"were found in {draws} draws"
        raise SeedlabError(
            f"n: only {len(clean)} counterfactual pairs ({kind.replace('_', '-')}) of {task.name} {found} at length {length} and vocab"
            f" {vocab}{where}, {n} asked (lower n, or raise vocab or length)"
        )
    c, r = np.stack(clean).astype(np.int64), np.stack(corrupt).astype(np.int64)
    return Pairs(kind, c, r, task.label(c), task.label(r), task.shortcut_feature(r), np.stack(edited))
