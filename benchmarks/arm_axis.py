"""The arm axis (forks/stacked.py, lm/stack.py) against the serial loop, in one run, on this machine:

1. **one update, by stack size**: a stack of A runs of the mini bank's GPT (preset attribution/mini: 2 layers,
   d 64, 64-token rows, 8 rows, the corpus's 2,048-token vocabulary) against the solo ``Trainer``, at 1 and 2
   threads, A in --sizes; ms per run-update, useful GFLOP/s (the solo step's FLOPs, torch.utils.flop_counter)
   and % of the matmul peak measured at that thread count. Interleaved, best of --reps. Plotted (--plot).
2. **whole designs** (--designs): ``seedlab attribution bank mini`` (--bank-seeds seeds, --heldout held-out
   candidates, replicates on) and ``seedlab twins run mini`` (--twins-seeds seeds, --twins-steps) in
   subprocesses, serial (``arm_batch=1``) and stacked (``arm_batch`` null), at 1 and 2 threads, and the bank
   also as ``--jobs 2`` (a seed per process, one thread each); wall seconds, run-updates per second, the ratio
   to today's default (serial, one thread, one job), and which folders hold bitwise the same results
   (measured.parquet / measures.parquet and every manifest).

Usage (~25 minutes with the defaults on this 2-core machine; part 1 alone, --designs none: ~2 minutes):

    python benchmarks/arm_axis.py [--corpus runs/corpus-embedded-bpe] [--designs bank,twins] [--plot docs/arm_axis.png]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from timing import matmul_rate

from seedlab.lm.model import GPTConfig
from seedlab.lm.stack import Stack
from seedlab.lm.trainer import Trainer


class Mini:
    """The mini bank's training settings (presets/attribution/mini.yaml)."""

    steps, batch_size, micro_batch, peak_lr, min_lr, weight_decay = 200, 8, None, 1e-2, 1e-3, 0.1
    beta1, beta2, grad_clip, device, precision, warmup_steps = 0.9, 0.95, 1.0, "cpu", "fp32", 100


def step_flops(trainer: Trainer) -> float:
    """FLOPs of one solo update's forward and backward (matmuls and attention: flop_counter's count)."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = trainer.fork()
    with FlopCounterMode(display=False) as fc:
        probe.backward()
    return float(fc.get_total_flops())


def by_stack_size(sizes: list[int], reps: int, vocab: int) -> list[dict]:
    gcfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=vocab)
    tokens = np.random.default_rng(0).integers(0, vocab, 500_000).astype(np.int64)
    base = Trainer(Mini(), gcfg, 0, tokens)
    for _ in range(3):
        base.advance()
    flops = step_flops(base)
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        peak = matmul_rate(torch.device("cpu"))
        solo = base.fork()
        stacks = {a: Stack([base.fork() for _ in range(a)]) for a in sizes}
        best = {"solo": float("inf"), **{a: float("inf") for a in sizes}}
        for _ in range(reps):
            solo.advance()
            t0 = time.perf_counter()
            for _ in range(4):
                solo.advance()
            best["solo"] = min(best["solo"], (time.perf_counter() - t0) / 4)
            for a, st in stacks.items():
                st.advance([None] * a)
                t0 = time.perf_counter()
                st.advance([None] * a)
                st.advance([None] * a)
                best[a] = min(best[a], (time.perf_counter() - t0) / 2 / a)
        for a in ["solo", *sizes]:
            sec = best[a]
            rows.append({"threads": threads, "runs": a, "ms_per_run_update": 1e3 * sec, "gflops": flops / sec / 1e9,
                         "pct_peak": 100 * flops / sec / 1e9 / peak, "peak_gflops": peak})
        print(f"threads {threads}: matmul peak {peak:.0f} GFLOP/s, one update {flops / 1e9:.2f} GFLOP", flush=True)
        for r in rows[-len(sizes) - 1:]:
            print(f"  {str(r['runs']):>5}  {r['ms_per_run_update']:6.1f} ms/run-update  {r['gflops']:5.1f} GFLOP/s "
                  f"({r['pct_peak']:.0f}% of peak)", flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for threads, colour in ((1, "tab:blue"), (2, "tab:orange")):
        mine = [r for r in rows if r["threads"] == threads]
        stacked = [r for r in mine if r["runs"] != "solo"]
        ax.plot([r["runs"] for r in stacked], [r["ms_per_run_update"] for r in stacked], "o-", color=colour,
                label=f"stack, {threads} thread{'s' * (threads > 1)}")
        solo = next(r for r in mine if r["runs"] == "solo")["ms_per_run_update"]
        ax.axhline(solo, color=colour, ls="--", lw=1, label=f"solo Trainer, {threads} thread{'s' * (threads > 1)}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("runs in the stack (A)")
    ax.set_ylabel("ms per run-update")
    ax.set_ylim(bottom=0)
    ax.set_title("the mini bank's GPT: cost per run against stack size", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}", flush=True)


def digest(folder: Path) -> str:
    """One SHA-256 over a design folder's tables (every parquet's rows) and every manifest.json: what
    'the same results' means here."""
    import pandas as pd

    h = hashlib.sha256()
    for t in sorted(folder.rglob("*.parquet")):
        h.update(t.relative_to(folder).as_posix().encode() + pd.read_parquet(t).to_csv(index=False).encode())
    for m in sorted(folder.rglob("manifest.json")):
        if m.parent.name != "replica":  # the replica's record names its place in a stack
            h.update(m.relative_to(folder).as_posix().encode() + m.read_bytes())
    return h.hexdigest()[:16]


ONLY = ""  # --only


def whole(name: str, argv: list[str], out: Path, updates: int) -> dict | None:
    if ONLY not in name:
        return None
    env = os.environ | {"PYTHONHASHSEED": "0"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "seedlab", *argv, "--out", str(out), "--no-progress"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    row = {"design": name, "wall_s": wall, "updates": updates, "updates_per_s": updates / wall, "digest": digest(out)}
    print(f"  {name:<34} {wall:7.1f} s  {updates / wall:6.1f} run-updates/s  results {row['digest']}", flush=True)
    return row


def designs(which: list[str], args) -> list[dict]:
    corpus = str(Path(args.corpus).resolve())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if "bank" in which:
            seeds = list(range(args.bank_seeds))
            runs = 1 + 2 * (6 + args.heldout + 1) + 1  # twin, candidates and replicates, the replica control
            updates = len(seeds) * 100 + len(seeds) * runs * 100 - 100 * (len(seeds) - 1)  # one replica seed
            base = ["attribution", "bank", "mini", "--set", f"corpus={corpus}", "--set", f"seeds={seeds}",
                    "--set", f"candidates.heldout={args.heldout}"]
            print(f"bank: {len(seeds)} seeds x {runs - 1} runs + a replica, {updates} run-updates", flush=True)
            for label, extra in (("bank serial, 1 thread (today)", ["--set", "arm_batch=1"]),
                                 ("bank stacked, 1 thread", []),
                                 ("bank serial, 2 threads", ["--set", "arm_batch=1", "--set", "threads=2"]),
                                 ("bank stacked, 2 threads", ["--set", "threads=2"]),
                                 ("bank serial, --jobs 2", ["--set", "arm_batch=1", "--jobs", "2"]),
                                 ("bank stacked, --jobs 2", ["--jobs", "2"])):
                rows.append(whole(label, base + extra, Path(tmp) / label.replace(" ", "_").replace(",", ""), updates))
        if "twins" in which:
            seeds, steps = list(range(args.twins_seeds)), args.twins_steps
            conds = 7 + 1  # the preset's 7 conditions and the replica control
            updates = len(seeds) * 100 + (len(seeds) * 7 + 1) * (steps - 100)
            base = ["twins", "run", "mini", "--set", f"corpus={corpus}", "--set", f"seeds={seeds}", "--set", f"steps={steps}"]
            print(f"twins: {len(seeds)} seeds x {conds - 1} conditions + a replica, {updates} run-updates", flush=True)
            for label, extra in (("twins serial, 1 thread (today)", ["--set", "arm_batch=1", "--set", "threads=1"]),
                                 ("twins stacked, 1 thread", ["--set", "threads=1"]),
                                 ("twins serial, 2 threads", ["--set", "arm_batch=1", "--set", "threads=2"]),
                                 ("twins stacked, 2 threads", ["--set", "threads=2"])):
                out = Path(tmp) / label.replace(" ", "_").replace(",", "")
                rows.append(whole(label, base + extra, out, updates))
    rows = [r for r in rows if r is not None]
    for r in rows:
        first = next((x for x in rows if x["design"].split()[0] == r["design"].split()[0] and "today" in x["design"]), r)
        r["vs_today"] = first["wall_s"] / r["wall_s"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="runs/corpus-embedded-bpe", help="the prepared corpus (BPE 2048)")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64", help="stack sizes of part 1")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of part 1 (best kept)")
    ap.add_argument("--designs", default="bank,twins", help="part 2: bank, twins, both, or none")
    ap.add_argument("--bank-seeds", type=int, default=2)
    ap.add_argument("--heldout", type=int, default=9, help="held-out candidates of the bank (+ 6 passages + own row)")
    ap.add_argument("--twins-seeds", type=int, default=2)
    ap.add_argument("--twins-steps", type=int, default=200)
    ap.add_argument("--plot", default=None, help="write part 1's plot here (PNG)")
    ap.add_argument("--only", default="", help="part 2: only the configurations whose label contains this (e.g. stacked)")
    ap.add_argument("--json", default=None, help="write every row here")
    args = ap.parse_args()
    if not Path(args.corpus, "meta.json").is_file():
        subprocess.run([sys.executable, "-m", "seedlab", "corpus", "prepare", "embedded", "--out", args.corpus,
                        "--tokenizer", "bpe", "--vocab-size", "2048"], check=True)
    from seedlab.corpus import load

    vocab = load(args.corpus).vocab_size
    print(f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}", flush=True)
    global ONLY
    ONLY = args.only
    steps = by_stack_size([int(a) for a in args.sizes.split(",")], args.reps, vocab) if args.sizes else []
    if args.plot and steps:
        plot(steps, Path(args.plot))
    which = [] if args.designs == "none" else args.designs.split(",")
    whole_rows = designs(which, args) if which else []
    for r in whole_rows:
        print(f"| {r['design']} | {r['wall_s']:.0f} | {r['updates_per_s']:.1f} | {r['vs_today']:.2f}x | `{r['digest']}` |")
    if args.json:
        Path(args.json).write_text(json.dumps({"by_stack_size": steps, "designs": whole_rows}, indent=1))


if __name__ == "__main__":
    main()
