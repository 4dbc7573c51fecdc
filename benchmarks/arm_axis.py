"""The arm axis (forks/stacked.py, lm/stack.py) against the serial loop, in one run, on this machine.

How it times (benchmarks/timing.py; docs/benchmarks.md, "How to measure"): every comparison is interleaved
(A, B, A, B, ...), the best of each, both sides at one thread count set explicitly, the load average read
before and after and printed beside the result. Never a ratio across thread counts.

1. **one update, by stack size**: a stack of A runs of the mini bank's GPT (preset attribution/mini: 2 layers,
   d 64, 64-token rows, 8 rows, the corpus's 2,048-token vocabulary) against the solo ``Trainer``, at each
   ``--threads`` count, A in --sizes; the solo trainer and every stack take turns (4 solo updates, 2 stack
   updates a turn) for --reps rounds after one untimed round; ms per run-update, useful GFLOP/s (the solo
   step's FLOPs, torch.utils.flop_counter) and % of the matmul peak measured at that thread count (best of 10
   products). Plotted (--plot).
2. **whole designs, serial against stacked** (--designs): ``seedlab attribution bank mini`` (--bank-seeds seeds,
   --heldout held-out candidates, replicates on) and ``seedlab twins run mini`` (--twins-seeds seeds), each
   shortened to --*-injection updates of prefix and --*-steps in all, in subprocesses: serial (``arm_batch=1``)
   against stacked (``arm_batch`` null) at each ``--threads`` count (``--set threads=N`` and
   ``OMP_NUM_THREADS=N`` for both), taking turns for --design-reps rounds; with ``--jobs N`` also serial
   against stacked with N processes of one thread each. Per pair: the best wall time of each (the process's
   start-up included, the same on both sides), stacked's speed over serial's, round by round, the run-updates
   per second, and whether every run of the pair gave bitwise the same results (one SHA-256 over every
   parquet's rows and every manifest: timing.py ``results_digest``).

Usage (part 1 with the default sizes ~1 minute a thread count; part 2 with the defaults ~8 minutes on 2 cores):

    python benchmarks/arm_axis.py [--corpus runs/corpus-embedded-bpe] [--threads 1,2] [--designs bank,twins]
                                  [--design-reps 2] [--jobs 2] [--sizes 1,8,64 | --sizes ""] [--plot docs/arm_axis.png]
"""

from __future__ import annotations

import argparse
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
from timing import interleaved, matmul_rate, results_digest, run_command

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


def by_stack_size(sizes: list[int], reps: int, vocab: int, thread_counts: list[int]) -> list[dict]:
    gcfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=vocab)
    tokens = np.random.default_rng(0).integers(0, vocab, 500_000).astype(np.int64)
    base = Trainer(Mini(), gcfg, 0, tokens)
    for _ in range(3):
        base.advance()
    flops = step_flops(base)
    rows = []
    for threads in thread_counts:
        torch.set_num_threads(threads)
        peak = matmul_rate(torch.device("cpu"))
        solo = base.fork()
        stacks = {a: Stack([base.fork() for _ in range(a)]) for a in sizes}
        per = {"solo": 4, **{a: 2 * a for a in sizes}}  # run-updates a turn

        def solo_turn(tr: Trainer):
            return lambda: [tr.advance() for _ in range(4)]

        def stack_turn(st: Stack, a: int):
            return lambda: [st.advance([None] * a) for _ in range(2)]

        t = interleaved({"solo": solo_turn(solo), **{a: stack_turn(st, a) for a, st in stacks.items()}}, reps,
                        threads=threads, warmup=1)
        for a in ["solo", *sizes]:
            sec = t.best[a] / per[a]
            rows.append({"threads": threads, "runs": a, "ms_per_run_update": 1e3 * sec, "gflops": flops / sec / 1e9,
                         "pct_peak": 100 * flops / sec / 1e9 / peak, "peak_gflops": peak, "conditions": t.conditions()})
        print(f"threads {threads}: matmul peak {peak:.0f} GFLOP/s, one update {flops / 1e9:.2f} GFLOP; {t.conditions()}",
              flush=True)
        for r in rows[-len(sizes) - 1:]:
            print(f"  {str(r['runs']):>5}  {r['ms_per_run_update']:6.1f} ms/run-update  {r['gflops']:5.1f} GFLOP/s "
                  f"({r['pct_peak']:.0f}% of peak)", flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, threads in enumerate(dict.fromkeys(r["threads"] for r in rows)):
        colour = colours[i % len(colours)]
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


def pair(name: str, argv: list[str], updates: int, threads: int, reps: int, tmp: Path, jobs: int = 1) -> dict:
    """Serial (``arm_batch=1``) against stacked (``arm_batch`` null), taking turns, both at ``threads`` threads
    a process (and ``--jobs jobs``); their best wall times and whether every run gave the same results."""
    env = {"PYTHONHASHSEED": "0"}
    digests: list[str] = []
    serial = iter(range(10**6))
    extra = ["--set", f"threads={threads}", *(["--jobs", str(jobs)] if jobs > 1 else [])]

    def run(batch: str):
        def fn() -> dict:
            out = tmp / f"{name}-t{threads}-j{jobs}-{batch}-{next(serial)}".replace(" ", "_")  # one folder a run
            stats = run_command([sys.executable, "-m", "seedlab", *argv, *extra, "--set", f"arm_batch={batch}",
                                 "--out", str(out), "--no-progress"], threads=threads, env=env)
            digests.append(results_digest(out))
            return stats

        return fn

    t = interleaved({"serial": run("1"), "stacked": run("null")}, reps, threads=threads)
    row = {"design": name, "threads": threads, "jobs": jobs, "updates": updates, "serial_s": t.best["serial"],
           "stacked_s": t.best["stacked"], "stacked_speedup": t.ratio("serial", "stacked"),
           "rounds": t.round_ratios("serial", "stacked"), "same_results": len(set(digests)) == 1,
           "digest": digests[0] if len(set(digests)) == 1 else ", ".join(digests), "conditions": t.conditions()}
    print(f"| {name} | {threads}{f' x {jobs} jobs' if jobs > 1 else ''} | {row['serial_s']:.1f} | {row['stacked_s']:.1f} | "
          f"**{row['stacked_speedup']:.2f}x** ({', '.join(f'{r:.2f}' for r in row['rounds'])}) | "
          f"{updates / row['serial_s']:.1f} / {updates / row['stacked_s']:.1f} | "
          f"{'same: `' + row['digest'] + '`' if row['same_results'] else 'DIFFER: ' + row['digest']} | {row['conditions']} |",
          flush=True)
    return row


def horizons(after: int) -> str:
    """The bank's horizons that fit ``after`` updates past s (the preset's 1, 10, 50 where they fit, and end)."""
    return "[" + ", ".join([str(h) for h in (1, 10, 50) if h < after] + ["end"]) + "]"


def designs(which: list[str], args, thread_counts: list[int]) -> list[dict]:
    corpus = str(Path(args.corpus).resolve())
    rows = []
    print("| design | threads a process | serial s (best) | stacked s (best) | stacked / serial speed (round by round) "
          "| run-updates/s serial / stacked | results | conditions |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        if "bank" in which:
            seeds, s, end = list(range(args.bank_seeds)), args.bank_injection, args.bank_steps
            runs = 1 + 2 * (6 + args.heldout + 1)  # twin, candidates (6 passages, held-out rows, own row) and replicates
            updates = len(seeds) * s + (len(seeds) * runs + 1) * (end - s)  # and one replica control
            argv = ["attribution", "bank", "mini", "--set", f"corpus={corpus}", "--set", f"seeds={seeds}",
                    "--set", f"candidates.heldout={args.heldout}", "--set", f"injection_step={s}", "--set", f"steps={end}",
                    "--set", f"horizons={horizons(end - s)}"]
            label = f"bank, {len(seeds)} seed(s) x {runs} runs + a replica, {updates:,} run-updates"
            for threads in thread_counts:
                rows.append(pair(label, argv, updates, threads, args.design_reps, Path(tmp)))
            if args.jobs > 1:
                rows.append(pair(label, argv, updates, 1, args.design_reps, Path(tmp), jobs=args.jobs))
        if "twins" in which:
            from seedlab.config import load_config
            from seedlab.twins.config import TwinsConfig

            seeds, s, end = list(range(args.twins_seeds)), args.twins_injection, args.twins_steps
            over = [f"corpus={corpus}", f"seeds={seeds}", f"injection_step={s}", f"steps={end}"]
            arms = len(load_config(TwinsConfig, "twins", "mini", over)[0].arm_names)
            updates = len(seeds) * s + (len(seeds) * arms + 1) * (end - s)
            argv = ["twins", "run", "mini", *[a for o in over for a in ("--set", o)]]
            label = f"twins, {len(seeds)} seed(s) x {arms} runs + a replica, {updates:,} run-updates"
            for threads in thread_counts:
                rows.append(pair(label, argv, updates, threads, args.design_reps, Path(tmp)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="runs/corpus-embedded-bpe", help="the prepared corpus (BPE 2048)")
    ap.add_argument("--threads", default="1,2", help="thread counts; every comparison runs both sides at one of them")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64", help="stack sizes of part 1 ('' leaves part 1 out)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds of part 1 (best kept)")
    ap.add_argument("--designs", default="bank,twins", help="part 2: bank, twins, both, or none")
    ap.add_argument("--design-reps", type=int, default=2, help="interleaved rounds of part 2 (serial, stacked; best kept)")
    ap.add_argument("--jobs", type=int, default=1, help="part 2's bank also as --jobs N (one thread a process), serial against stacked")
    ap.add_argument("--bank-seeds", type=int, default=1)
    ap.add_argument("--heldout", type=int, default=9, help="held-out candidates of the bank (+ 6 passages + own row)")
    ap.add_argument("--bank-injection", type=int, default=20, help="the bank's injection step (the preset's: 100)")
    ap.add_argument("--bank-steps", type=int, default=50, help="the bank's steps in all (the preset's: 200)")
    ap.add_argument("--twins-seeds", type=int, default=1)
    ap.add_argument("--twins-injection", type=int, default=20, help="the twins' injection step (the preset's: 100)")
    ap.add_argument("--twins-steps", type=int, default=50, help="the twins' steps in all (the preset's: 300)")
    ap.add_argument("--plot", default=None, help="write part 1's plot here (PNG)")
    ap.add_argument("--json", default=None, help="write every row here")
    args = ap.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    if not thread_counts or min(thread_counts) < 1 or min(args.reps, args.design_reps, args.jobs) < 1:
        ap.error("--threads: one or more counts, each at least 1; --reps, --design-reps, --jobs: at least 1")
    if not Path(args.corpus, "meta.json").is_file():
        subprocess.run([sys.executable, "-m", "seedlab", "corpus", "prepare", "embedded", "--out", args.corpus,
                        "--tokenizer", "bpe", "--vocab-size", "2048"], check=True)
    from seedlab.corpus import load

    vocab = load(args.corpus).vocab_size
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}", flush=True)
    sizes = [int(a) for a in args.sizes.split(",") if a.strip()]
    steps = by_stack_size(sizes, args.reps, vocab, thread_counts) if sizes else []
    if args.plot and steps:
        plot(steps, Path(args.plot))
    which = [] if args.designs == "none" else args.designs.split(",")
    whole_rows = designs(which, args, thread_counts) if which else []
    if args.json:
        Path(args.json).write_text(json.dumps({"by_stack_size": steps, "designs": whole_rows}, indent=1))


if __name__ == "__main__":
    main()
