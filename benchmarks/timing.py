"""How every benchmark here times (docs/benchmarks.md, "How to measure").

- One measurement is the **best (minimum)** of repeated runs, never their mean: noise on a shared machine only
  ever adds time, so the minimum is the estimate least moved by it.
- Two or more ways of doing the same work are timed **interleaved** (A, B, A, B, ...), the best of each, so a
  slow spell of the machine falls on both rather than on one (:func:`interleaved`).
- Every side runs at **one thread count, set explicitly** before each of its runs (:func:`set_threads`; a
  subprocess gets it through ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` and its own command line).
- The machine's **load average is read before and after** and reported beside the result
  (:meth:`Timings.conditions`).

:func:`run_command` times a subprocess with its resource use (``resource.getrusage`` of the child: user and
system CPU seconds, minor and major page faults); :func:`results_digest` is one SHA-256 over a run folder's
results, to say whether two ways of running gave the same bits. Also here: a device sync and the machine's
matmul ceiling (:func:`matmul_rate`).
"""

from __future__ import annotations

import hashlib
import math
import os
import resource
import subprocess
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

K = TypeVar("K", bound=Hashable)


def sync(dev: torch.device | None) -> None:
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize()


def load() -> float:
    """The machine's 1-minute load average (NaN where the OS keeps none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


def set_threads(threads: int) -> int:
    """``torch.set_num_threads(threads)``, checked; returns the count now in force."""
    if threads < 1:
        raise ValueError(f"threads: at least 1, got {threads}")
    torch.set_num_threads(threads)
    if torch.get_num_threads() != threads:
        raise RuntimeError(f"torch runs {torch.get_num_threads()} threads after set_num_threads({threads})")
    return threads


@dataclass
class Timings(Generic[K]):
    """What :func:`interleaved` measured: every round's seconds of each entry (in the order timed), the one
    thread count all of them ran at, the load average before the first timed round and after the last, and
    per entry per round whatever dict its function returned (``stats``: e.g. a subprocess's page faults)."""

    times: dict[K, list[float]]
    threads: int
    load_before: float
    load_after: float
    stats: dict[K, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def best(self) -> dict[K, float]:
        """The best (minimum) seconds of each entry."""
        return {k: min(ts) for k, ts in self.times.items()}

    @property
    def rounds(self) -> int:
        return min(len(ts) for ts in self.times.values())

    def ratio(self, slow: K, fast: K) -> float:
        """best[slow] / best[fast]: how many times faster ``fast`` is (above 1: faster)."""
        return self.best[slow] / self.best[fast]

    def round_ratios(self, slow: K, fast: K) -> list[float]:
        """The same ratio round by round (the spread says how far the best-of ratio can be trusted)."""
        return [s / f for s, f in zip(self.times[slow], self.times[fast])]

    def best_stats(self, key: K) -> dict[str, Any]:
        """The stats of ``key``'s best round ({} when its function returned none)."""
        ts, st = self.times[key], self.stats.get(key, [])
        return st[ts.index(min(ts))] if st else {}

    def conditions(self) -> str:
        """The line that goes beside every ratio taken from these timings."""
        return (f"interleaved, best of {self.rounds} each, {self.threads} thread{'s' * (self.threads != 1)} each, "
                f"load average {self.load_before:.2f} before, {self.load_after:.2f} after")


def interleaved(fns: Mapping[K, Callable[[], object]], repeats: int, *, threads: int,
                dev: torch.device | None = None, warmup: int = 0) -> Timings[K]:
    """Each function of ``fns`` run ``repeats`` times, taking turns (A, B, A, B, ...), after ``warmup`` untimed
    rounds; the thread count set to ``threads`` before every call (a function that changes it for itself, as a
    trainer settling its config's threads, must be handed the same count).

    A function's time is the wall time around it, device-synced; a function that returns a dict with
    ``"seconds"`` (it timed its own work: a subprocess, an estimator's inner clock) is taken at its word. Every
    dict returned is kept in ``Timings.stats``."""
    if repeats < 1:
        raise ValueError(f"repeats: at least 1, got {repeats}")
    if not fns:
        raise ValueError("nothing to time")
    set_threads(threads)
    for _ in range(warmup):
        for fn in fns.values():
            set_threads(threads)
            fn()
    sync(dev)
    before = load()
    times: dict[K, list[float]] = {k: [] for k in fns}
    stats: dict[K, list[dict[str, Any]]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            set_threads(threads)
            sync(dev)
            t = time.perf_counter()
            out = fn()
            sync(dev)
            wall = time.perf_counter() - t
            if isinstance(out, dict):
                stats[k].append(out)
                wall = float(out.get("seconds", wall))
            times[k].append(wall)
    return Timings(times, threads, before, load(), {k: v for k, v in stats.items() if v})


def best_of(fn: Callable[[], object], repeats: int, *, threads: int, dev: torch.device | None = None,
            warmup: int = 1) -> Timings[str]:
    """One function alone: the best of ``repeats`` runs after ``warmup`` (``.best["run"]``)."""
    return interleaved({"run": fn}, repeats, threads=threads, dev=dev, warmup=warmup)


def matmul_rate(dev: torch.device, n: int = 2048, reps: int = 10) -> float:
    """The machine's fp32 matmul GFLOP/s at the current thread count (an n x n ``a @ b``, the best of ``reps``
    products each timed alone, after one untimed): the ceiling for any trainer."""
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    a @ b
    best = math.inf
    for _ in range(reps):
        sync(dev)
        t = time.perf_counter()
        a @ b
        sync(dev)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def thread_env(threads: int) -> dict[str, str]:
    """The environment that holds a child process's OpenMP and MKL pools at ``threads``."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def run_command(argv: Sequence[str], *, threads: int, env: Mapping[str, str] | None = None,
                cwd: str | Path | None = None) -> dict[str, Any]:
    """Run ``argv`` to the end (stdout and stderr captured; a failure raises with their tail) under
    ``thread_env(threads)`` and ``env``; returns its wall ``seconds`` and, from ``getrusage(RUSAGE_CHILDREN)``
    before and after (the child and every descendant it waited for), ``user_s``, ``sys_s``, ``minflt`` (minor
    page faults) and ``majflt``. Run commands one at a time: the counters are the process's children's."""
    full = os.environ | thread_env(threads) | dict(env or {})
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(list(argv), env=full, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        tail = (done.stdout[-2000:] + done.stderr[-4000:]).strip()
        raise RuntimeError(f"exit {done.returncode}: {' '.join(argv)}\n{tail}")
    return {"seconds": wall, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
            "minflt": r1.ru_minflt - r0.ru_minflt, "majflt": r1.ru_majflt - r0.ru_majflt}


def results_digest(folder: Path) -> str:
    """One SHA-256 (16 hex digits) over a run folder's results: every parquet's rows and every manifest.json
    (the replica's left out: its record names its place in a stack). Equal digests: bitwise the same results."""
    import pandas as pd

    folder = Path(folder)
    h = hashlib.sha256()
    for t in sorted(folder.rglob("*.parquet")):
        h.update(t.relative_to(folder).as_posix().encode() + pd.read_parquet(t).to_csv(index=False).encode())
    for m in sorted(folder.rglob("manifest.json")):
        if m.parent.name != "replica":
            h.update(m.relative_to(folder).as_posix().encode() + m.read_bytes())
    return h.hexdigest()[:16]
