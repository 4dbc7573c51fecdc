"""Bitwise-reproducible kernels and CPU threads: set in this one place for every command.

- :func:`settle` — at the start of a command that trains or differentiates a GPT (twins run,
  gradmatch, the attribution bank and its estimators): CPU threads, and on CUDA the fixed cuBLAS
  workspace (``CUBLAS_WORKSPACE_CONFIG``, which must be set before the first matrix multiply),
  cuDNN's autotuner off, and deterministic algorithms *required* (an operation without a
  deterministic implementation raises; :func:`nondeterminism_is_an_error` makes that one line).
- :func:`deterministic` — a block run with deterministic algorithms (required, or only preferred:
  ``strict=False`` warns where torch has none, for a library's kernels such as kronfluence's),
  the process's setting restored afterwards.

What was set is read back into a run's environment record by seedlab/machine.py ``determinism``.

On CPU the kernels are deterministic already; only the threads are set. NCCL's reduction order
is pinned where the process group starts (lm/distributed.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from seedlab.errors import SeedlabError
from seedlab.precision import warn_precision

#: the fixed cuBLAS workspace deterministic cuBLAS needs (set before the first matmul)
CUBLAS_WORKSPACE = ":4096:8"


def settle(device: torch.device, threads: int | None = None, precision: str = "fp32") -> None:
    """The process-wide settings of a bitwise-reproducible command on ``device`` (see the module docstring);
    a bf16 ``precision`` is refused where the device cannot run it and warned about where it is emulated
    (seedlab/precision.py, the precision policy)."""
    warn_precision(precision, str(device))
    if threads:
        torch.set_num_threads(threads)
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=False)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def deterministic(device: torch.device, *, strict: bool = True) -> Iterator[None]:
    """Deterministic algorithms on CUDA for the block (``strict=False``: preferred, a warning where
    torch has none), the process's setting restored afterwards. Nothing changes on CPU."""
    if device.type != "cuda":
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


@contextlib.contextmanager
def nondeterminism_is_an_error() -> Iterator[None]:
    """A PyTorch error about a missing deterministic implementation becomes a one-line SeedlabError
    that names the operation (PyTorch's first line does)."""
    try:
        yield
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "deterministic" not in str(err):
            raise
        raise SeedlabError(f"non-deterministic operation: {first}") from None

