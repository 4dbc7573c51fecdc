"""Where independent jobs run: here, one after another or in ``jobs`` processes (``local``), or
on a Ray cluster (``ray``).

An executor maps ``fn`` over job specs, calls ``on_done(spec)`` as each finishes, so the caller
can record progress, and returns what ``fn`` returned, in the order of the specs. Jobs must be
independent. In other processes (``jobs`` > 1, Ray) ``fn`` and the specs must pickle, and a
job's :class:`SeedlabError` reaches the caller as itself (one line); the first failure stops the rest.

Progress inside a job: ``run_local(..., on_progress=f)`` lets a job call :func:`report` (``key``, units done), and
``f(key, n)`` is called in the caller's process as the units arrive (at most every :data:`POLL` seconds), so a bar
moves while a job of many minutes runs rather than only when it ends. Reports are a view, not a count the caller may
rely on: a job's last ones can arrive after its ``on_done`` (the caller settles its total there). Elsewhere (Ray, or
no ``on_progress``) :func:`report` does nothing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from seedlab.errors import SeedlabError

Job = Callable[[Any], Any]
Progress = Callable[[Any, int], None]
POLL = 0.5  # seconds between the caller's reads of the jobs' progress reports

_reports: Any = None  # in a job of run_local with on_progress: where report() puts (key, n)


class _Direct:
    """The reports' sink for jobs run in the caller's own process: straight to ``on_progress``."""

    def __init__(self, on_progress: Progress):
        self.put = lambda item: on_progress(*item)


def report(key: Any, n: int) -> None:
    """In a job of :func:`run_local` given ``on_progress``: ``n`` more units of ``key`` done (module doc); a no-op
    anywhere else."""
    if _reports is not None:
        _reports.put((key, n))


class Reporter:
    """In a job: ``reporter(n)`` adds ``n`` units of ``key``, sent on (:func:`report`) at most every ``every`` seconds,
    so a job of many small steps puts one item on the queue per gathering rather than one per step."""

    def __init__(self, key: Any, every: float = POLL):
        import time

        self.key, self.every, self.n, self.clock = key, every, 0, time.monotonic
        self.last = self.clock()

    def __call__(self, n: int = 1) -> None:
        self.n += n
        if self.clock() - self.last >= self.every:
            report(self.key, self.n)
            self.n, self.last = 0, self.clock()

    # a job's stand-in for the caller's progress.Bar, where its loop advances and notes one
    advance = __call__

    def update(self, note: str = "") -> None:
        pass


class Tally:
    """The caller's side of a bar fed by its jobs' reports: :meth:`progress` is ``run_local``'s ``on_progress``,
    :meth:`done` settles a job's ``total(key)`` units when it ends (its unsent or late reports: a late one is
    dropped), so the bar ends at its total whatever arrived."""

    def __init__(self, advance: Callable[[int], None], total: Callable[[Any], int]):
        self.advance, self.total = advance, total
        self.seen: dict[Any, int] = {}
        self.settled: set[Any] = set()

    def progress(self, key: Any, n: int) -> None:
        if key not in self.settled:
            self.seen[key] = self.seen.get(key, 0) + n
            self.advance(n)

    def done(self, key: Any) -> None:
        self.settled.add(key)
        rest = self.total(key) - self.seen.get(key, 0)
        if rest > 0:
            self.advance(rest)


def run_tallied(fn: Job, specs: Sequence[Any], advance: Callable[[int], None], total: Callable[[Any], int],
                jobs: int, key: Callable[[Any], Any] = lambda spec: spec[1]) -> list[Any]:
    """:func:`run_local` feeding a bar: the jobs' reports ``advance`` it, and each job's ``total(key(spec))`` units
    are settled when it ends (:class:`Tally`). ``key``: a job's report key, by default its spec's second item (the
    seed, in the specs of bank, attribute, metagrad and rowscores)."""
    tally = Tally(advance, total)
    return run_local(fn, specs, lambda spec: tally.done(key(spec)), jobs=jobs, on_progress=tally.progress)


def _listen(queue) -> None:
    """A worker's initializer: its reports go to ``queue``."""
    global _reports
    _reports = queue


def _drain(queue, on_progress: Progress) -> None:
    import queue as q

    while True:
        try:
            key, n = queue.get_nowait()
        except q.Empty:
            return
        on_progress(key, n)


def run_local(fn: Job, specs: Sequence[Any], on_done: Callable[[Any], None], jobs: int = 1,
              on_progress: Progress | None = None) -> list[Any]:
    """Here, one after another; ``jobs`` > 1: in that many fresh (spawned) processes at once. ``on_progress``: where
    the jobs' :func:`report` calls go (module doc)."""
    global _reports
    if jobs <= 1:
        out, before = [], _reports
        _reports = _Direct(on_progress) if on_progress is not None else None
        try:
            for spec in specs:
                out.append(fn(spec))
                on_done(spec)
        finally:
            _reports = before
        return out
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    out = [None] * len(specs)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue() if on_progress is not None else None
    pool = ProcessPoolExecutor(max(1, min(jobs, len(specs))), mp_context=ctx,
                               initializer=_listen if queue is not None else None,
                               initargs=(queue,) if queue is not None else ())
    workers = pool._processes  # to stop the running jobs when one fails (Python < 3.14 has no terminate_workers)
    try:
        futures = {pool.submit(fn, spec): i for i, spec in enumerate(specs)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=POLL if queue is not None else None, return_when=FIRST_COMPLETED)
            if queue is not None:
                _drain(queue, on_progress)
            for future in finished:
                out[futures[future]] = future.result()
                on_done(specs[futures[future]])
    except BaseException as err:  # a job failed (or Ctrl-C): stop the others now
        running = list(workers.values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in running:
            p.terminate()
        if isinstance(err, BrokenProcessPool):
            raise SeedlabError("--jobs: a worker process died (killed, or out of memory?)") from None
        raise
    pool.shutdown()
    if queue is not None:
        _drain(queue, on_progress)
        queue.close()
    return out


def _check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail fast (instead of Ray's long retry loop) when a cluster address does not answer."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise SeedlabError(f"--ray-address: expected HOST:PORT, 'ray://HOST:PORT' or 'auto', got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError):
        raise SeedlabError(f"--ray-address: no Ray cluster answers at {address!r}") from None


def preflight_ray(address: str | None) -> None:
    """Ray is importable and the cluster (if one is named) answers; else a one-line error."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SeedlabError("--executor ray: Ray is not installed (pip install 'seedlab[ray]')") from None
    if address:
        _check_reachable(address)


def run_ray(
    fn: Job, specs: Sequence[Any], on_done: Callable[[Any], None], *, address: str | None, cpus_per_job: float = 1.0,
    gpus_per_job: float = 0.0,
) -> list[Any]:
    """Run each spec as a Ray task: on the cluster at ``address``, or on a new local cluster.
    ``gpus_per_job``: the GPUs each task asks Ray for (a fraction lets several share one GPU)."""
    preflight_ray(address)
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # keep Ray's C++ retry warnings off stderr
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError) as err:
            hint = "" if os.environ.get("RAY_AUTH_MODE") else " (a token-authenticated cluster also needs RAY_AUTH_MODE=token, or use --ray-address auto on its head node)"
            raise SeedlabError(f"--ray-address: could not connect to Ray at {address!r}: {str(err).splitlines()[0]}{hint}") from None
    out = [None] * len(specs)
    try:
        remote = ray.remote(num_cpus=cpus_per_job, num_gpus=gpus_per_job)(fn)
        pending = {remote.remote(spec): i for i, spec in enumerate(specs)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                try:
                    out[pending[ref]] = ray.get(ref)  # re-raises a job's failure here
                except ray.exceptions.RayTaskError as err:
                    if isinstance(err.cause, SeedlabError):
                        raise err.cause from None  # its one line, not the remote traceback
                    raise
                on_done(specs[pending.pop(ref)])
    finally:
        if started_here:
            ray.shutdown()
    return out
