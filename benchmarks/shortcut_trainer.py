"""seedlab's ensemble trainer vs a plain per-seed PyTorch loop, side by side in one run.

The paper model (2 layers, 2 heads, d_model 64, d_ff 128, sequence length 5),
16,384 training samples, full batch, AdamW. Reports member-epochs per second for
both, their ratio, and achieved GFLOP/s against this machine's measured fp32
matmul rate. Usage:

    python benchmarks/shortcut_trainer.py [--members 8 16] [--epochs 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from plain_loop import PlainTransformer
from timing import matmul_rate, sync

from seedlab.shortcut.config import ModelConfig
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.optim import EnsembleAdamW
from seedlab.shortcut.train import train_epoch

N, LENGTH, VOCAB = 16384, 5, 16


def plain_flops(x, y) -> int:
    """Matmul FLOPs of one full-batch forward+backward of one member (the useful work)."""
    m = PlainTransformer(VOCAB, LENGTH, 2)
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(m(x), y).backward()
    return fc.get_total_flops()


def bench_plain(members: int, epochs: int, x, y, dev, chunk: int | None = None) -> float:
    """One nn.Module per seed, torch.optim.AdamW, full batch: member-epochs per second.

    ``chunk`` (rows) accumulates the full-batch gradient in pieces, as seedlab does: it
    separates what cache-sized pieces buy from what the member axis buys.
    """
    done, elapsed = 0, 0.0
    for seed in range(members):
        torch.manual_seed(seed)
        model = PlainTransformer(VOCAB, LENGTH, 2).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

        def step(model=model, opt=opt) -> None:  # bound now: timed within this iteration
            opt.zero_grad(set_to_none=True)
            c = chunk or N
            for i in range(0, N, c):
                (F.cross_entropy(model(x[i : i + c]), y[i : i + c], reduction="sum") / N).backward()
            opt.step()

        step()  # warm-up, not timed
        sync(dev)
        t = time.perf_counter()
        for _ in range(epochs):
            step()
        sync(dev)
        elapsed += time.perf_counter() - t
        done += epochs
    return done / elapsed


def bench_seedlab(members: int, epochs: int, x, y, dev, chunk: int | None) -> float:
    S = members
    model = EnsembleTransformer(ModelConfig(), S, VOCAB, LENGTH, 2)
    model.init_members(list(range(S)))
    model.to(dev)
    opt = EnsembleAdamW(model.parameters(), lr=[1e-3] * S, weight_decay=[0.1] * S, beta1=[0.9] * S, beta2=[0.999] * S, eps=[1e-8] * S)
    xs, ys = x.expand(S, -1, -1).contiguous(), y.expand(S, -1).contiguous()
    run = lambda: train_epoch(model, opt, xs, ys, batch_size=N, chunk=max(1, chunk // S) if chunk else N)
    run()  # warm-up
    sync(dev)
    t = time.perf_counter()
    for _ in range(epochs):
        run()
    sync(dev)
    return S * epochs / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--plain-members", type=int, default=4, help="seeds timed for the plain loop (its rate is per seed)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=8192, help="member-rows per piece (rows per member = chunk // S)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (N, LENGTH), generator=g).to(dev)
    y = (x.sum(-1) % 2).to(dev)

    peak = matmul_rate(dev)
    flops = plain_flops(x.cpu(), y.cpu())
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {platform.processor() or platform.machine()} torch {torch.__version__} "
          f"threads {torch.get_num_threads()} device {dev}")
    print(f"fp32 matmul: {peak:.1f} GFLOP/s; plain model: {flops / 1e9:.2f} GFLOP per member-epoch (matmuls, fwd+bwd)")
    plain = bench_plain(args.plain_members, args.epochs, x, y, dev)
    print("| trainer | S | member-epochs/s | vs plain | GFLOP/s (useful) | % of matmul peak |")
    print("|---|---|---|---|---|---|")
    row = lambda name, S, r: print(f"| {name} | {S} | {r:.2f} | {r / plain:.2f}x | {r * flops / 1e9:.1f} | {100 * r * flops / 1e9 / peak:.0f}% |")
    row("plain per-seed loop", 1, plain)
    for S in args.members:
        row(f"seedlab ensemble (chunk {args.chunk})", S, bench_seedlab(S, args.epochs, x, y, dev, args.chunk))
    row("seedlab ensemble (no chunking)", args.members[0], bench_seedlab(args.members[0], args.epochs, x, y, dev, None))
    row("plain loop, chunked like seedlab (1024 rows)", 1, bench_plain(args.plain_members, args.epochs, x, y, dev, chunk=1024))


if __name__ == "__main__":
    main()
