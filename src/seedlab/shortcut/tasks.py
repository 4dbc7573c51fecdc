"""The MPSP task family and its three fixed splits.

A sample is a sequence ``x`` of ``length`` integers drawn from ``0 .. vocab-1``.
Its true label is ``sum(x) mod k``; its shortcut feature is ``max(x) mod k`` (the
magnitude shortcut) or ``x[0] mod k`` (the positional shortcut). A sample is
*shortcut-consistent* when the two agree and *anti-shortcut* otherwise.

| task        | label        | shortcut      | classes |
|-------------|--------------|---------------|---------|
| sum2-max    | sum mod 2    | max mod 2     | 2       |  (MPSP)
| sum2-first  | sum mod 2    | first mod 2   | 2       |
| sum3-max    | sum mod 3    | max mod 3     | 3       |
| sum3-first  | sum mod 3    | first mod 3   | 3       |

Splits (fixed by the data seed):
- ``train``: ``n_train`` samples, exactly ``round_half_up(r * n_train)`` consistent;
- ``val``: all consistent (r = 1) -- measures the shortcut;
- ``adv``: all anti-shortcut (r = 0) -- measures the true rule.

Within each group (consistent / anti) sequences are uniform over all sequences of
that group: we draw *distinct* sequences without replacement, and the three splits
are disjoint, so the adversarial split measures the rule, not memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from seedlab.errors import SeedlabError

#: the three splits of an experiment, in order
SPLITS = ("train", "val", "adv")
#: sequence spaces at most this large are enumerated; larger ones are rejection-sampled
_ENUMERATE_MAX = 1 << 22


@dataclass(frozen=True)
class Task:
    name: str
    modulus: int  # k: the label is sum mod k; chance is 1/k
    shortcut: str  # "max" or "first"

    @property
    def n_classes(self) -> int:
        return self.modulus

    @property
    def chance(self) -> float:
        return 1.0 / self.modulus

    def label(self, x: np.ndarray) -> np.ndarray:
        return x.sum(axis=-1) % self.modulus

    def shortcut_feature(self, x: np.ndarray) -> np.ndarray:
        v = x.max(axis=-1) if self.shortcut == "max" else x[..., 0]
        return v % self.modulus


TASKS: dict[str, Task] = {
    "sum2-max": Task("sum2-max", 2, "max"),
    "sum2-first": Task("sum2-first", 2, "first"),
    "sum3-max": Task("sum3-max", 3, "max"),
    "sum3-first": Task("sum3-first", 3, "first"),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise SeedlabError(f"task: must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]


def n_consistent(ratio: float, n: int) -> int:
    """Exactly how many shortcut-consistent samples a split of ``n`` at ratio ``r`` holds."""
    # round half up on the decimal the user wrote (0.29 * 50 = 14.5 -> 15, not float's 14.4999...)
    return math.floor(Fraction(repr(float(ratio))) * n + Fraction(1, 2))


def count_sequences(task: Task, length: int, vocab: int) -> tuple[int, int]:
    """Exact numbers of (consistent, anti-shortcut) sequences in the whole space.

    Computed with residue convolutions, so it works for spaces far too big to enumerate.
    """
    k = task.modulus

    def residues(values: range) -> list[int]:
        dist = [0] * k
        for v in values:
            dist[v % k] += 1
        return dist

    def power(dist: list[int], n: int) -> list[int]:
        out = [1] + [0] * (k - 1)
        for _ in range(n):
            out = [sum(out[i] * dist[(j - i) % k] for i in range(k)) for j in range(k)]
        return out

    consistent = 0
    if task.shortcut == "first":
        # x0 % k == sum % k  <=>  sum(x[1:]) % k == 0, whatever x0 is
        consistent = vocab * power(residues(range(vocab)), length - 1)[0]
    else:
        # sequences whose max is exactly m = (all <= m) - (all <= m-1), split by sum residue
        for m in range(vocab):
            le = power(residues(range(m + 1)), length)
            lt = power(residues(range(m)), length) if m > 0 else [0] * k
            consistent += le[m % k] - lt[m % k]
    return consistent, vocab**length - consistent


def _decode(codes: np.ndarray, length: int, vocab: int) -> np.ndarray:
    """Integer codes in [0, vocab**length) -> sequences (first digit most significant)."""
    x = np.empty((codes.shape[0], length), dtype=np.int64)
    c = codes.copy()
    for i in range(length - 1, -1, -1):
        x[:, i] = c % vocab
        c //= vocab
    return x


def _draw_distinct(
    rng: np.random.Generator, task: Task, length: int, vocab: int, n_cons: int, n_anti: int
) -> tuple[np.ndarray, np.ndarray]:
    """Distinct sequences, uniform within each group: ``n_cons`` consistent, ``n_anti`` anti.

    Prefix-stable: asking for more samples returns the same first ones, so the val/adv
    splits (taken first) are the same whatever the ratio or size of the training split.
    """
    total = vocab**length
    if total <= _ENUMERATE_MAX:
        x = _decode(np.arange(total, dtype=np.int64), length, vocab)
        cons = task.label(x) == task.shortcut_feature(x)
        pick_c = rng.permutation(np.flatnonzero(cons))[:n_cons]
        pick_a = rng.permutation(np.flatnonzero(~cons))[:n_anti]
        return x[pick_c], x[pick_a]
    # rejection sampling on codes: a fixed stream of uniform draws; keep new ones of a needed group
    seen: set[int] = set()
    got: dict[bool, list[np.ndarray]] = {True: [], False: []}
    need = {True: n_cons, False: n_anti}
    while need[True] > 0 or need[False] > 0:
        codes = rng.integers(0, total, size=1 << 16, dtype=np.int64)
        fresh = np.array([c not in seen and not seen.add(c) for c in codes.tolist()])
        x = _decode(codes[fresh], length, vocab)
        cons = task.label(x) == task.shortcut_feature(x)
        for group in (True, False):
            take = x[cons == group][: need[group]]
            got[group].append(take)
            need[group] -= take.shape[0]
    return np.concatenate(got[True]), np.concatenate(got[False])


@dataclass
class Split:
    x: np.ndarray  # [n, length] int64
    y: np.ndarray  # [n] int64: the true label
    shortcut: np.ndarray  # [n] int64: the shortcut feature

    @property
    def consistent(self) -> np.ndarray:
        return self.y == self.shortcut

    def save(self, path: str | Path) -> None:
        from seedlab.store import atomic_write

        def write(p: Path) -> None:
            with open(p, "wb") as f:
                np.savez(f, x=self.x, y=self.y, shortcut=self.shortcut)

        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | Path) -> Split:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["x"], z["y"], z["shortcut"])


def _split(task: Task, x: np.ndarray) -> Split:
    return Split(x, task.label(x), task.shortcut_feature(x))


def check_feasible(task: Task, ratio: float, n_train: int, n_val: int, n_adv: int, length: int, vocab: int) -> None:
    """Raise a one-line error when the integer range cannot hold the requested distinct samples."""
    if not 0.0 <= ratio <= 1.0:
        raise SeedlabError(f"ratio: must be in [0, 1], got {ratio!r}")
    for name, n in (("n_train", n_train), ("n_val", n_val), ("n_adv", n_adv)):
        if n <= 0:
            raise SeedlabError(f"{name}: must be a positive integer, got {n!r}")
    c = n_consistent(ratio, n_train)
    avail_c, avail_a = count_sequences(task, length, vocab)
    need_c, need_a = c + n_val, (n_train - c) + n_adv
    if need_c > avail_c or need_a > avail_a:
        raise SeedlabError(
            f"vocab: integers 0..{vocab - 1} at length {length} give only {avail_c} consistent and"
            f" {avail_a} anti-shortcut distinct sequences for {task.name}; the splits need {need_c} and"
            f" {need_a} (raise vocab or length, or lower n_train/n_val/n_adv)"
        )


def make_splits(
    task: str | Task,
    ratio: float,
    n_train: int,
    *,
    n_val: int,
    n_adv: int,
    length: int,
    vocab: int,
    seed: int,
) -> dict[str, Split]:
    """The three fixed splits of one experiment, a pure function of its arguments."""
    task = get_task(task) if isinstance(task, str) else task
    check_feasible(task, ratio, n_train, n_val, n_adv, length, vocab)
    rng = np.random.default_rng([seed, length, vocab, task.modulus])
    c = n_consistent(ratio, n_train)
    xc, xa = _draw_distinct(rng, task, length, vocab, n_val + c, n_adv + n_train - c)
    # val/adv come first in each stream, so they do not depend on the ratio or n_train
    train = np.concatenate([xc[n_val:], xa[n_adv:]])
    train = train[rng.permutation(n_train)]
    return {"train": _split(task, train), "val": _split(task, xc[:n_val]), "adv": _split(task, xa[:n_adv])}

