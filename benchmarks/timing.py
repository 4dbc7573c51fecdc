"""What every benchmark here needs: a device sync and the machine's matmul ceiling."""

from __future__ import annotations

import time

import torch


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def matmul_rate(dev: torch.device, n: int = 2048, reps: int = 10) -> float:
    """The machine's fp32 matmul GFLOP/s (an n x n ``a @ b``): the ceiling for any trainer."""
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    a @ b
    sync(dev)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(dev)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9
