"""Matched counterfactual pairs: a shortcut-consistent and an anti-shortcut sequence with the same label.

A pair ``(clean, corrupt)`` of one task (see :mod:`seedlab.shortcut.tasks`):

- ``clean`` is shortcut-consistent: ``shortcut(clean) == label(clean)``;
- ``corrupt`` is anti-shortcut with the SAME label: ``label(corrupt) == label(clean)`` and
  ``shortcut(corrupt) != label(corrupt)``;
- they differ in exactly :data:`PAIR_DISTANCE` = 2 positions (Hamming distance: same
  length, substituted tokens), the smallest number the construction allows (below).

Construction, with ``k`` the modulus and ``d = corrupt[p] - clean[p]``:

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

For a given clean sequence the corrupt partner is drawn uniformly among all its valid
partners (every ``(a, j, b)`` above); clean sequences are drawn uniformly, without
replacement, among the consistent ones (with a unique maximum for ``*-max``) that have at
least one valid partner. Sequences in ``exclude`` (e.g. the training split) are never used
on either side, so the pairs are held out like the val/adv splits. Everything is a pure
function of ``(task, n, length, vocab, seed, exclude)``; ``seed`` is the data seed, on a
stream of its own (the splits are not affected).

When is a pair possible at all (:func:`check_pairs_feasible`): ``length >= 2`` for every
task, and ``vocab >= k + 1`` for ``*-max`` (with integers ``0..k-1`` only, the new maximum
cannot take another residue and stay above the compensating token). Both conditions are
exact (tests enumerate small spaces).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seedlab.errors import SeedlabError
from seedlab.shortcut.tasks import _ENUMERATE_MAX, Task, _decode, get_task

#: Hamming distance between the two sequences of every pair, for every task
PAIR_DISTANCE = 2
#: the pairs' random stream: the data seed plus this tag (the splits use the seed without it)
_STREAM = 0x9A1C
#: clean sequences decoded at a time from the stream of candidates
_CHUNK = 4096


@dataclass
class Pairs:
    clean: np.ndarray  # [n, length] int64: shortcut-consistent
    corrupt: np.ndarray  # [n, length] int64: anti-shortcut, same label
    y: np.ndarray  # [n] int64: the shared label
    shortcut_corrupt: np.ndarray  # [n] int64: the corrupt sequence's shortcut feature (!= y)
    edited: np.ndarray  # [n, 2] int64: (position of the shortcut token, position of the compensating token)

    def __len__(self) -> int:
        return self.y.shape[0]


def check_pairs_feasible(task: str | Task, length: int, vocab: int) -> None:
    """A one-line :class:`SeedlabError` when no counterfactual pair exists for this length/vocabulary."""
    task = get_task(task) if isinstance(task, str) else task
    if length < 2:
        raise SeedlabError(
            f"length: counterfactual pairs for {task.name} need at least 2 integers per sequence, got {length}"
        )
    if task.shortcut == "max" and vocab <= task.modulus:
        raise SeedlabError(
            f"vocab: counterfactual pairs for {task.name} need at least {task.modulus + 1} integers"
            f" (0..{task.modulus}) so the maximum can change its residue and stay the maximum, got {vocab}"
        )


def partners(task: Task, x: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Every valid corrupt partner of one clean sequence ``x`` [length]: (sequences [m, length], edited [m, 2]).

    Empty when ``x`` is not consistent, or (``*-max``) has no unique maximum.
    """
    k, L = task.modulus, x.shape[0]
    empty = np.zeros((0, L), np.int64), np.zeros((0, 2), np.int64)
    if L < 2 or task.label(x) != task.shortcut_feature(x):
        return empty
    js = np.arange(L)
    if task.shortcut == "first":
        p, a = 0, np.arange(vocab)
        above = np.full(L, -1)  # the new first token may take any value...
        b_max = np.full(vocab, vocab)  # ...and so may the compensating token
    else:
        p = int(x.argmax())
        if (np.delete(x, p) == x[p]).any():  # the maximum is not unique
            return empty
        a = np.arange(vocab)
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
    out = np.repeat(x[None], ia.shape[0], axis=0)
    rows = np.arange(ia.shape[0])
    out[rows, p] = a[ia]
    out[rows, js[ij]] = b[ib]
    edited = np.stack([np.full(ia.shape, p), js[ij]], 1).astype(np.int64)
    return out, edited


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
    task: str | Task, n: int, *, length: int, vocab: int, seed: int, exclude: np.ndarray | None = None
) -> Pairs:
    """``n`` matched counterfactual pairs of ``task`` (see the module docstring), a pure function of the arguments.

    ``exclude`` ([m, length]) lists sequences neither side of a pair may be (e.g. the training
    split). Raises a one-line :class:`SeedlabError` when no pair exists for this length/vocab,
    or when fewer than ``n`` exist outside ``exclude``.
    """
    task = get_task(task) if isinstance(task, str) else task
    check_pairs_feasible(task, length, vocab)
    if n <= 0:
        raise SeedlabError(f"n: the number of counterfactual pairs must be a positive integer, got {n!r}")
    banned = set(_row_keys(exclude)) if exclude is not None and len(exclude) else set()
    rng = np.random.default_rng([seed, length, vocab, task.modulus, _STREAM])
    clean, corrupt, edited = [], [], []
    max_draws, draws = 64 * n + (1 << 20), 0
    for chunk in _candidates(rng, length, vocab):
        draws += _CHUNK
        consistent = task.label(chunk) == task.shortcut_feature(chunk)
        for x in chunk[consistent]:
            if x.tobytes() in banned:
                continue
            cand, ed = partners(task, x, vocab)
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
            f"n: only {len(clean)} counterfactual pairs of {task.name} {found} at length {length} and vocab"
            f" {vocab}{where}, {n} asked (lower n, or raise vocab or length)"
        )
    c, r = np.stack(clean).astype(np.int64), np.stack(corrupt).astype(np.int64)
    return Pairs(c, r, task.label(c), task.shortcut_feature(r), np.stack(edited))
