"""The precision policy of every trainer: where bf16 cannot run it is refused, where it runs
slower than fp32 (a CPU without native bf16 emulates it) a one-line warning says so, with the
slowdown measured here. fp32 is every preset's default; ``seedlab doctor`` reports the peaks.

- :func:`matmul_gflops` — the throughput of an n×n by n×n product in one dtype on one device.
- :func:`check_precision` — the refusal, or the warning's line (None: nothing to say).
- :func:`warn_precision` — the same, the warning printed once per process (lm/determinism.py
  ``settle`` and the shortcut's trainer call it before their first step).
"""

from __future__ import annotations

import functools
import sys
import time

import torch

from seedlab.errors import SeedlabError
from seedlab.machine import cpu

#: bf16 measured this many times slower than fp32 (or worse): warn before a bf16 run
SLOW_BF16 = 1.0


def matmul_gflops(dtype: torch.dtype, device: torch.device, n: int = 2048, repeats: int = 5) -> float:
    """Best-of-``repeats`` throughput of an n×n @ n×n product in ``dtype`` on ``device`` (GFLOP/s, 2n³ per product)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(device, dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up: kernel choice, allocations
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def check_precision(precision: str, device: str) -> str | None:
    """Refuse bf16 where it cannot run (a CUDA device without bf16), and return a one-line warning
    where it runs slower than fp32 (a CPU without native bf16 emulates it), naming the hardware and the
    slowdown measured here (a 1024² matmul in each precision, about a second); None when fine."""
    if precision != "bf16":
        return None
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return None  # the run fails on the device itself, with torch's own message
        if not torch.cuda.is_bf16_supported():
            raise SeedlabError(f"precision bf16: {torch.cuda.get_device_name(dev)} has no bfloat16 support; use fp32")
        return None
    fp32, bf16 = (matmul_gflops(dt, dev, 1024, 3) for dt in (torch.float32, torch.bfloat16))
    if bf16 * SLOW_BF16 >= fp32:
        return None
    c = cpu()
    native = [f for f in ("avx512_bf16", "amx_bf16") if f in c["flags"]]
    return (f"warning: precision bf16 on this CPU ({c['model']}; {'has ' + ', '.join(native) if native else 'no AVX-512 BF16 or AMX'}) "
            f"multiplies {fp32 / bf16:.1f}x slower than fp32 (measured {bf16:.0f} vs {fp32:.0f} GFLOP/s): "
            "bf16 is emulated here; precision fp32 is faster")


@functools.cache
def warn_precision(precision: str, device: str) -> None:
    """:func:`check_precision`, its warning printed to stderr (once per process)."""
    if (msg := check_precision(precision, device)) is not None:
        print(msg, file=sys.stderr)
