"""The machine a command runs on, as every study records it: the CPU (its model and the flags
that decide how fast it multiplies), torch and CUDA, the device, precision, CPU threads and the
determinism settings as they stand.

- :func:`cpu` — the CPU's model, its matmul-relevant flags, cores, torch's threads and kernel capability.
- :func:`environment` — what the bits of a run depend on besides its config: a fork design's
  ``environment.json`` (checked when it resumes) and a shortcut job's ``meta.json`` record it.
- :func:`tune_allocator` — glibc's allocator told to keep freed memory (set once at start-up by the CLI).
- :func:`compare` — two such records: which key differs, and which only one of them holds (a
  record written by an older seedlab lacks the keys added since).

torch is imported where it is asked, so reading a record (``compare``) loads none.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: /proc/cpuinfo flags that decide how fast a CPU multiplies (x86)
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu() -> dict:
    """The CPU's model and its matmul-relevant flags (Linux: /proc/cpuinfo; elsewhere: what platform says)."""
    import torch

    info = Path("/proc/cpuinfo")
    model, flags = platform.processor() or platform.machine(), set()
    if info.is_file():
        for line in info.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    return {"model": model, "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "capability": torch.backends.cpu.get_cpu_capability()}


#: glibc ``mallopt`` parameters set at start-up: blocks up to 32 MiB (glibc's largest mmap threshold on 64 bits)
#: come from the heap, and the heap is not trimmed below 2 GiB of free memory. A step's multi-MB activations
#: are then reused instead of returned to the OS and faulted in again (the bank: ~9 M page faults without).
#: Only where memory comes from changes, never a value (tests/shortcut/test_bits.py checks the bits both ways).
MALLOPT = {"M_MMAP_THRESHOLD": (-3, 32 * 2 ** 20), "M_TRIM_THRESHOLD": (-1, 2 ** 31 - 1)}
#: ``SEEDLAB_MALLOC=0`` leaves the allocator as glibc sets it
MALLOC_ENV = "SEEDLAB_MALLOC"
_allocator: dict | None = None


def tune_allocator() -> dict:
    """Set :data:`MALLOPT` once per process (glibc only); returns what was set (the environment record's
    ``allocator``): ``{name: value}`` of each parameter glibc accepted, or ``{}`` (not glibc, or
    ``SEEDLAB_MALLOC=0``)."""
    global _allocator
    if _allocator is None:
        _allocator = {}
        if os.environ.get(MALLOC_ENV, "1") != "0" and platform.system() == "Linux":
            try:
                mallopt = ctypes.CDLL("libc.so.6").mallopt
            except (OSError, AttributeError):  # not glibc (musl has no mallopt)
                return _allocator
            _allocator = {name: value for name, (param, value) in MALLOPT.items() if mallopt(param, value) == 1}
    return _allocator


def determinism() -> dict:
    """The process's determinism settings as they stand (lm/determinism.py ``settle`` sets them)."""
    import torch

    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def environment(device: torch.device, precision: str) -> dict[str, Any]:
    """What the bits of a run on ``device`` depend on besides its config: torch and CUDA versions,
    the device type (and, on CUDA, the GPU's name), the CPU's model, flags and torch's kernel
    capability for it, ``precision``, torch's CPU threads and the determinism settings. A fork
    command records it after :func:`seedlab.lm.determinism.settle`."""
    import torch

    c = cpu()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device.type,
        **({"device_name": torch.cuda.get_device_name(device)} if device.type == "cuda" else {}),
        "cpu": c["model"],
        "cpu_flags": c["flags"],
        "cpu_capability": c["capability"],
        "precision": precision,
        "threads": torch.get_num_threads(),
        "allocator": dict(_allocator or {}),  # what tune_allocator set in this process (never a value's bits)
        **determinism(),
    }


#: keys of the environment record kept for the reader but never compared: they change no bit of a run
#: (where memory comes from: tests/shortcut/test_bits.py), so a resume under another setting is the same run
RECORDED_ONLY = frozenset({"allocator"})


def compare(first: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """Two environment records: the first key (sorted) that both hold with different values (None:
    none; :data:`RECORDED_ONLY` keys are not compared), and the keys only one of them holds (recorded by
    another seedlab: nothing to compare)."""
    both = sorted((set(first) & set(now)) - RECORDED_ONLY)
    return next((k for k in both if first[k] != now[k]), None), sorted(set(first) ^ set(now))
