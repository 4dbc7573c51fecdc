"""The machine a command runs on, as every study records it: the CPU (its model and the flags
that decide how fast it multiplies), torch and CUDA, the device, precision, CPU threads and the
determinism settings as they stand.

- :func:`cpu` — the CPU's model, its matmul-relevant flags, cores, torch's threads and kernel capability.
- :func:`environment` — what the bits of a run depend on besides its config: a fork design's
  ``environment.json`` (checked when it resumes) and a shortcut job's ``meta.json`` record it.
- :func:`compare` — two such records: which key differs, and which only one of them holds (a
  record written by an older seedlab lacks the keys added since).

torch is imported where it is asked, so reading a record (``compare``) loads none.
"""

from __future__ import annotations

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
        **determinism(),
    }


def compare(first: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[str | None, list[str]]:
    """Two environment records: the first key (sorted) that both hold with different values (None:
    none), and the keys only one of them holds (recorded by another seedlab: nothing to compare)."""
    both = sorted(set(first) & set(now))
    return next((k for k in both if first[k] != now[k]), None), sorted(set(first) ^ set(now))
