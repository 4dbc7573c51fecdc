"""``seedlab doctor``: what this machine offers the trainers, measured.

Cores and torch's threads, the CPU's model and the instruction sets torch can use for matrix
multiplies (AVX2, AVX-512, AVX-512 BF16, AMX), torch's own CPU kernel capability, every CUDA device,
and the matmul throughput measured here in fp32 and in bf16 (an n×n by n×n product, best of a few
repetitions after a warm-up). What it says of precision is one thing: fp32 for results (every preset's
precision; bf16 is not recommended for them, docs/results/precision.md), and, where bf16's measured
peak is at least twice fp32's (AMX CPUs, GPUs: ``fast_bf16``), bf16 for fast exploration. That
follows from the measurement, not from the flags (bf16 on a CPU without native support is emulated
and slower).

It only reports: the CPU comes from seedlab/machine.py, the measurement and the policy a bf16 run
is held to (refused where it cannot run, warned about where emulated) from seedlab/precision.py.
"""

from __future__ import annotations

import torch

from seedlab.machine import FLAGS, cpu
from seedlab.precision import matmul_gflops

def examine(n: int = 2048, repeats: int = 5) -> dict:
    """Everything ``seedlab doctor`` prints: the CPU, the CUDA devices, and per device the fp32 and bf16
    matmul peaks measured here, and whether bf16's is at least twice fp32's (``fast_bf16``)."""
    devices = [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cpu": cpu(), "devices": []}
    for dev in devices:
        fp32, bf16 = (matmul_gflops(dt, dev, n, repeats) for dt in (torch.float32, torch.bfloat16))
        name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else out["cpu"]["model"]
        out["devices"].append({"device": str(dev), "name": name, "fp32_gflops": fp32, "bf16_gflops": bf16,
                               "fast_bf16": bf16 >= 2 * fp32})
    return out


def lines(report: dict) -> list[str]:
    """``examine``'s result as the lines the command prints."""
    c = report["cpu"]
    out = [f"torch {report['torch']} (CUDA {report['cuda'] or 'none'})",
           f"CPU: {c['model']}; {c['cores']} cores, torch uses {c['torch_threads']} threads; "
           f"flags: {', '.join(c['flags']) or 'none of ' + ', '.join(FLAGS)}; torch's CPU kernels: {c['capability']}"]
    for d in report["devices"]:
        ratio = d["bf16_gflops"] / d["fp32_gflops"]
        use = ("precision fp32 for results (every preset's: bf16 is not recommended for them, docs/results/precision.md), "
               "bf16 for fast exploration (--set precision=bf16; shortcut: --set train.precision=bf16)" if d["fast_bf16"]
               else "precision fp32 (every preset's; bf16 is not markedly faster here)")
        out.append(f"{d['device']} ({d['name']}): matmul fp32 {d['fp32_gflops']:.0f} GFLOP/s, bf16 {d['bf16_gflops']:.0f} "
                   f"GFLOP/s ({ratio:.2f}x): {use}")
    return out
