"""``seedlab doctor``: what this machine offers the trainers, measured.

Cores and torch's threads, the CPU's model and the instruction sets torch can use for matrix
multiplies (AVX2, AVX-512, AVX-512 BF16, AMX), torch's own CPU kernel capability, every CUDA device,
and the matmul throughput measured here in fp32 and in bf16 (an n×n by n×n product, best of a few
repetitions after a warm-up). The precision to suggest follows from the measurement, not from the
flags: bf16 where its measured peak is at least twice fp32's (AMX CPUs, GPUs), else fp32 (bf16 on
a CPU without native support is emulated and slower). fp32 stays every preset's default either way.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import time
from pathlib import Path

import torch

from seedlab.errors import SeedlabError

#: /proc/cpuinfo flags that decide how fast a CPU multiplies (x86)
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu() -> dict:
    """The CPU's model and its matmul-relevant flags (Linux: /proc/cpuinfo; elsewhere: what platform says)."""
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


def examine(n: int = 2048, repeats: int = 5) -> dict:
    """Everything ``seedlab doctor`` prints: the CPU, the CUDA devices, and per device the fp32 and bf16
    matmul peaks measured here, with the precision they suggest."""
    devices = [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cpu": cpu(), "devices": []}
    for dev in devices:
        fp32, bf16 = (matmul_gflops(dt, dev, n, repeats) for dt in (torch.float32, torch.bfloat16))
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else out["cpu"]["model"]
        out["devices"].append({"device": str(dev), "name": name, "fp32_gflops": fp32, "bf16_gflops": bf16,
                               "suggest": "bf16" if bf16 >= 2 * fp32 else "fp32"})
    return out


def lines(report: dict) -> list[str]:
    """``examine``'s result as the lines the command prints."""
    c = report["cpu"]
    out = [f"torch {report['torch']} (CUDA {report['cuda'] or 'none'})",
           f"CPU: {c['model']}; {c['cores']} cores, torch uses {c['torch_threads']} threads; "
           f"flags: {', '.join(c['flags']) or 'none of ' + ', '.join(FLAGS)}; torch's CPU kernels: {c['capability']}"]
    for d in report["devices"]:
        ratio = d["bf16_gflops"] / d["fp32_gflops"]
        out.append(f"{d['device']} ({d['name']}): matmul fp32 {d['fp32_gflops']:.0f} GFLOP/s, bf16 {d['bf16_gflops']:.0f} "
                   f"GFLOP/s ({ratio:.2f}x): suggests precision {d['suggest']}"
                   + ("" if d["suggest"] == "fp32" else " for speed (shortcut: --set train.precision=bf16; twins/attribution: "
                                            "--set precision=bf16); presets stay fp32 and bf16 is not yet recommended "
                                            "for results: docs/results.md, \"Does precision change the science?\""))
    return out


#: bf16 measured this many times slower than fp32 (or worse): warn before a bf16 run
SLOW_BF16 = 1.0


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
