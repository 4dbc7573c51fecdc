"""Where independent jobs run: here, one after another (``local``), or on a Ray cluster (``ray``).

An executor maps ``fn`` over job specs and calls ``on_done(spec)`` as each finishes, so the
caller can record progress. Jobs must be independent and write their own results.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from seedlab.errors import SeedlabError

Job = Callable[[Any], Any]


def run_local(fn: Job, specs: Sequence[Any], on_done: Callable[[Any], None]) -> None:
    for spec in specs:
        fn(spec)
        on_done(spec)


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
) -> None:
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
    try:
        remote = ray.remote(num_cpus=cpus_per_job, num_gpus=gpus_per_job)(fn)
        pending = {remote.remote(spec): spec for spec in specs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                ray.get(ref)  # re-raises a job's failure here
                on_done(pending.pop(ref))
    finally:
        if started_here:
            ray.shutdown()
