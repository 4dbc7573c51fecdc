"""seedlab's ensemble trainer vs what a user would write, in fp32 and bf16, side by side in one run.

The paper model (2 layers, 2 heads, d_model 64, d_ff 128, sequence length 5, vocab 16),
16,384 training rows (``--rows``), full batch, AdamW (lr 1e-3, weight decay 0.1). Trainers, each timed in
every ``--precision`` asked for (bf16, for trainers 1-3: ``torch.autocast(device.type,
dtype=torch.bfloat16)`` around the forward and the loss, the one line a user adds; for seedlab:
``precision="bf16"``, its weights folded and cast once per step, ``train.Bf16Step``; weights and
AdamW stay fp32 in all):

1. plain per-seed loop: benchmarks/plain_loop.py's ``PlainTransformer`` + ``torch.optim.AdamW``,
   one seed after another (``--plain-members`` seeds, one epoch of each per round; its rate is per seed);
2. the same loop chunked: the full-batch gradient accumulated over 1,024-row pieces;
3. vmap ensemble of S members, the variant a user would pick: ``torch.func.stack_module_state``
   over S ``PlainTransformer`` copies, ``functional_call`` vmapped over the member axis, the
   members' losses summed, ``.backward()`` on the stacked (leaf) params, one ``torch.optim.AdamW``
   over them (elementwise, so per-member AdamW); unchunked (it holds every member's full-batch
   activations: ~0.7 GB per member on CPU) and chunked (``--chunk // S`` rows per piece);
4. seedlab's ensemble: ``seedlab.shortcut.train.train_epoch(..., precision=...)``, ``--chunk // S``
   rows per member per piece;
5. (bf16 only) seedlab's ensemble under ``torch.autocast``, its bf16 path before issue 30: the fp32
   ``train_epoch`` step with every piece's forward and loss under autocast (``--skip-autocast`` leaves it out).

``--skip-vmap`` leaves trainer 3 out (its unchunked variant is the slowest row by far).

How it times (benchmarks/timing.py, docs/benchmarks.md "How to measure"): every trainer of every precision
takes turns, one epoch each per round (A, B, C, ..., A, B, C, ...), after ``--warmup`` untimed rounds, for
``--epochs`` rounds; each trainer's rate is its **best** round's; all of them at ``--threads`` threads, set
before every epoch; the load average read before the first timed round and after the last and printed beside
the table. Columns: member-epochs/s, the ratio to the plain loop of the same precision and to seedlab fp32
(same S; the first ``--members`` S for S = 1 rows), useful GFLOP/s (the plain model's matmul FLOPs per
member-epoch, FlopCounterMode, so every trainer is scored on the same work) and its share of this machine's
matmul peak in the precision used (``seedlab.doctor.matmul_gflops``, best of five 2048² products, measured in
the same run). Then the side-by-side ratios that docs/benchmarks.md quotes, each with its round-by-round
spread. The goals after them are measured facts, not assertions. ``--profile`` adds a torch.profiler table of
seedlab's S = 8 trainer (top 15 ops by self CPU time) per precision. Usage:

    python benchmarks/shortcut_trainer.py [--precision fp32 bf16] [--members 8 16] [--plain-members 1]
        [--epochs 4] [--warmup 1] [--chunk 8192] [--threads 2] [--rows 16384] [--device cpu]
        [--skip-vmap] [--skip-autocast] [--profile]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from plain_loop import PlainTransformer
from timing import interleaved, set_threads, sync

from seedlab.doctor import cpu, matmul_gflops
from seedlab.shortcut.config import ModelConfig
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.optim import EnsembleAdamW
from seedlab.shortcut.train import train_epoch

LENGTH, VOCAB, CLASSES = 5, 16, 2
LR, WD = 1e-3, 0.1
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PLAIN_CHUNK = 1024  # rows per piece of the chunked plain loop


def autocast(dev: torch.device, precision: str):
    """The one line a user adds for bf16 (a no-op in fp32)."""
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def plain_model(seed: int, dev: torch.device) -> PlainTransformer:
    torch.manual_seed(seed)
    return PlainTransformer(VOCAB, LENGTH, CLASSES).to(dev)


def plain_flops(x, y) -> int:
    """Matmul FLOPs of one full-batch forward+backward of one member (the useful work)."""
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(plain_model(0, x.device)(x), y).backward()
    return fc.get_total_flops()


def full_batch_step(loss_fn, opt, x, y, rows: int, precision: str) -> Callable[[], None]:
    """An optimizer step closure: the full-batch gradient of ``loss_fn(x, y)`` (a sum over rows)
    accumulated over ``rows``-row pieces, the forward and loss under autocast."""
    n = x.shape[0]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for i in range(0, n, rows):
            with autocast(x.device, precision):
                loss = loss_fn(x[i : i + rows], y[i : i + rows])
            (loss / n).backward()
        opt.step()
    return step


def plain_epochs(members: int, x, y, precision: str, chunk: int | None = None) -> Callable[[], None]:
    """One nn.Module per seed, torch.optim.AdamW: one epoch of each of ``members`` seeds, one after another."""
    steps = []
    for seed in range(members):
        model = plain_model(seed, x.device)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
        loss = lambda xb, yb, model=model: F.cross_entropy(model(xb), yb, reduction="sum")
        steps.append(full_batch_step(loss, opt, x, y, chunk or x.shape[0], precision))
    return lambda: [step() for step in steps]


def vmap_epoch(S: int, x, y, precision: str, chunk: int | None) -> Callable[[], None]:
    """S PlainTransformers stacked with torch.func, vmapped over the member axis, one AdamW."""
    params, buffers = stack_module_state([plain_model(seed, x.device) for seed in range(S)])
    params = {k: v.detach().requires_grad_() for k, v in params.items()}  # leaves that AdamW steps
    base = plain_model(0, x.device).to("meta")
    member = lambda p, b, xb, yb: F.cross_entropy(functional_call(base, (p, b), (xb,)), yb, reduction="sum")
    losses = vmap(member, in_dims=(0, 0, None, None))  # every member sees the same rows
    opt = torch.optim.AdamW(params.values(), lr=LR, weight_decay=WD)
    loss = lambda xb, yb: losses(params, buffers, xb, yb).sum()
    rows = max(1, chunk // S) if chunk else x.shape[0]
    return full_batch_step(loss, opt, x, y, rows, precision)


def seedlab_parts(S: int, x, y):
    model = EnsembleTransformer(ModelConfig(), S, VOCAB, LENGTH, CLASSES)
    model.init_members(list(range(S)))
    model.to(x.device)
    opt = EnsembleAdamW(model.parameters(), lr=[LR] * S, weight_decay=[WD] * S, beta1=[0.9] * S, beta2=[0.999] * S, eps=[1e-8] * S)
    return model, opt, x.expand(S, -1, -1).contiguous(), y.expand(S, -1).contiguous()


def seedlab_epoch(S: int, x, y, precision: str, chunk: int | None) -> Callable[[], None]:
    model, opt, xs, ys = seedlab_parts(S, x, y)
    n = x.shape[0]
    return lambda: train_epoch(model, opt, xs, ys, batch_size=n, chunk=max(1, chunk // S) if chunk else n, precision=precision)


def seedlab_autocast_epoch(S: int, x, y, chunk: int | None) -> Callable[[], None]:
    """seedlab's ensemble under ``torch.autocast``: ``train_epoch``'s fp32 step (full batch) with every
    piece's forward and loss under autocast, as ``precision: bf16`` trained before issue 30."""
    model, opt, xs, ys = seedlab_parts(S, x, y)
    n = x.shape[0]
    rows = max(1, chunk // S) if chunk else n

    def step() -> None:
        opt.zero_grad()
        for c0 in range(0, n, rows):
            with autocast(x.device, "bf16"):
                loss, _ = model.losses(xs[:, c0 : c0 + rows], ys[:, c0 : c0 + rows])
            (loss.sum() / n).backward()
        opt.step()
    return step


def profile(S: int, x, y, precision: str, chunk: int, epochs: int = 2) -> None:
    step = seedlab_epoch(S, x, y, precision, chunk)
    step()  # warm-up, outside the profile
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if x.device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(epochs):
            step()
        sync(x.device)
    print(f"\n## profile: seedlab {precision}, S = {S}, {epochs} epochs (chunk {chunk})")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    ap.add_argument("--members", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--plain-members", type=int, default=1, help="seeds of the plain loops, one epoch of each per round (their rate is per seed)")
    ap.add_argument("--epochs", type=int, default=4, help="timed rounds (one epoch of every trainer each), the best of each kept")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--chunk", type=int, default=8192, help="member-rows per piece (rows per member = chunk // S)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch threads of every trainer, set before each epoch (default: torch's, %(default)s here)")
    ap.add_argument("--rows", type=int, default=16384, help="training rows (the paper's 16,384; fewer only to check the script runs)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-vmap", action="store_true", help="leave the vmap ensembles out")
    ap.add_argument("--skip-autocast", action="store_true", help="leave seedlab under autocast (bf16's old path) out")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of seedlab at S = 8, per precision")
    args = ap.parse_args()
    if min(args.epochs, args.threads, args.rows, args.plain_members, *args.members) < 1 or args.warmup < 0:
        ap.error("--epochs, --threads, --rows, --plain-members and --members: at least 1; --warmup: at least 0")
    set_threads(args.threads)
    dev = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (args.rows, LENGTH), generator=g).to(dev)
    y = (x.sum(-1) % 2).to(dev)
    precisions = [p for p in DTYPES if p in args.precision]
    S8 = 8 if 8 in args.members else args.members[0]  # the goals' S

    c = cpu()
    peak = {p: matmul_gflops(DTYPES[p], dev, 2048, 5) for p in precisions}
    flops = plain_flops(x.cpu(), y.cpu()) / 1e9
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} {c['model']} (flags: {', '.join(c['flags']) or 'none'}; "
          f"kernels {c['capability']}) torch {torch.__version__} threads {torch.get_num_threads()} of {c['cores']} cores "
          f"device {dev}; {args.rows:,} rows")
    print(f"matmul peak (2048², best of 5): {', '.join(f'{p} {peak[p]:.1f} GFLOP/s' for p in precisions)}; "
          f"plain model: {flops:.2f} GFLOP per member-epoch (matmuls, fwd+bwd)")

    names = {"plain": "plain per-seed loop", "plain-chunked": f"plain loop, chunked ({PLAIN_CHUNK} rows)",
             "vmap": "vmap ensemble", "vmap-chunked": f"vmap ensemble, chunked ({args.chunk} member-rows)",
             "seedlab": f"seedlab ensemble (chunk {args.chunk} member-rows)",
             "seedlab-autocast": f"seedlab ensemble under torch.autocast (chunk {args.chunk} member-rows)"}
    epochs: dict[tuple[str, str, int], Callable[[], object]] = {}  # (trainer, precision, S) -> one round's work
    work: dict[tuple[str, str, int], int] = {}  # member-epochs per round
    for p in precisions:
        epochs[("plain", p, 1)] = plain_epochs(args.plain_members, x, y, p)
        epochs[("plain-chunked", p, 1)] = plain_epochs(args.plain_members, x, y, p, PLAIN_CHUNK)
        work[("plain", p, 1)] = work[("plain-chunked", p, 1)] = args.plain_members
        for S in args.members:
            if not args.skip_vmap:
                epochs[("vmap", p, S)] = vmap_epoch(S, x, y, p, None)
                epochs[("vmap-chunked", p, S)] = vmap_epoch(S, x, y, p, args.chunk)
            epochs[("seedlab", p, S)] = seedlab_epoch(S, x, y, p, args.chunk)
            if p == "bf16" and not args.skip_autocast:
                epochs[("seedlab-autocast", p, S)] = seedlab_autocast_epoch(S, x, y, args.chunk)
            work.update({k: S for k in epochs if k[2] == S and not k[0].startswith("plain")})
    print(f"  timing {len(epochs)} trainers, taking turns: {args.warmup} untimed round(s), then {args.epochs} ...",
          file=sys.stderr, flush=True)
    t = interleaved(epochs, args.epochs, threads=args.threads, dev=dev, warmup=args.warmup)
    rate = {k: work[k] / best for k, best in t.best.items()}  # member-epochs/s, best round

    fmt = lambda v: f"{v:.2f}x" if v else "–"
    print(f"\n{t.conditions()}")
    print("| trainer | precision | S | member-epochs/s | vs plain (same precision) | vs seedlab fp32 | GFLOP/s (useful) | % of matmul peak |")
    print("|---|---|---|---|---|---|---|---|")
    for (key, p, S), r in rate.items():
        ref = rate.get(("seedlab", "fp32", S if S > 1 else args.members[0]))
        print(f"| {names[key]} | {p} | {S} | {r:.2f} | {fmt(r / rate[('plain', p, 1)])} | {fmt(ref and r / ref)} | "
              f"{r * flops:.1f} | {100 * r * flops / peak[p]:.0f}% |")

    def pair(fast: tuple, slow: tuple, what: str) -> float | None:
        """fast's rate / slow's, best of each, and round by round (member-epochs per round differ: scaled)."""
        if fast not in rate or slow not in rate:
            return None
        scale = work[fast] / work[slow]
        rounds = ", ".join(f"{scale * r:.2f}" for r in t.round_ratios(slow, fast))
        ratio = rate[fast] / rate[slow]
        print(f"- {what}: {ratio:.2f}x (best of each; round by round {rounds})")
        return ratio

    print(f"\nSide by side ({t.conditions()}):")
    for S in args.members:
        for p in precisions:
            pair(("seedlab", p, S), ("plain", p, 1), f"seedlab {p} S = {S} / plain {p} loop")
            pair(("seedlab", p, S), ("plain-chunked", p, 1), f"seedlab {p} S = {S} / plain {p} loop chunked")
        pair(("seedlab", "bf16", S), ("seedlab-autocast", "bf16", S), f"seedlab bf16 S = {S} / seedlab under autocast")
        pair(("seedlab", "bf16", S), ("seedlab", "fp32", S), f"seedlab bf16 S = {S} / seedlab fp32")

    print(f"\nGoals (measured here, S = {S8}):")
    verdict = lambda ok: "met" if ok else "missed"
    sl = rate.get(("seedlab", "bf16", S8))
    vm = max(((r, f"{names[k]}, {p}") for (k, p, S), r in rate.items() if k.startswith("vmap") and S == S8), default=None)
    if sl is None:
        print("- seedlab bf16 >= 2x the plain bf16 loop and >= 2x the best vmap variant: not measured (bf16 not asked for)")
    else:
        pl = rate[("plain", "bf16", 1)]
        print(f"- seedlab bf16 >= 2x the plain bf16 loop: {verdict(sl >= 2 * pl)} ({sl:.2f} vs {pl:.2f} member-epochs/s, {sl / pl:.2f}x)")
        if vm is not None:
            print(f"- seedlab bf16 >= 2x the best vmap variant: {verdict(sl >= 2 * vm[0])} ({sl:.2f} vs {vm[0]:.2f} of {vm[1]}, {sl / vm[0]:.2f}x)")
    s32 = rate.get(("seedlab", "fp32", S8))
    if s32 is None:
        print("- seedlab fp32 >= 65% of the fp32 matmul peak: not measured (fp32 not asked for)")
    else:
        share = 100 * s32 * flops / peak["fp32"]
        print(f"- seedlab fp32 >= 65% of the fp32 matmul peak: {verdict(share >= 65)} "
              f"({s32 * flops:.1f} of {peak['fp32']:.1f} GFLOP/s useful, {share:.0f}%)")

    if args.profile:
        for p in precisions:
            profile(S8, x, y, p, args.chunk)


if __name__ == "__main__":
    main()
