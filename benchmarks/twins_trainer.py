"""The twins trainer vs a plain nanoGPT loop, side by side in one run, in fp32 and in bf16.

Model, block size, batch size, AdamW settings and lr schedule come from the twins config
(default: the preset mini, GPT "mini" at block 128, batch 16). ``--precision`` picks fp32, bf16
or both (the default); the config's ``precision`` is set to each in turn. bf16 is
``torch.autocast(device, dtype=torch.bfloat16)`` around the forward, weights, gradients and AdamW
kept in fp32 (the master weights): in the plain loop it is the one line a user adds to nanoGPT
around forward + loss, in seedlab's ``Trainer`` the config's ``precision: bf16``. The header gives
the machine (date, host, CPU model and its matmul flags, torch, threads, device) and the matmul
peak measured here in each precision (``seedlab.doctor.matmul_gflops``). Four parts:

1. throughput, in each precision: the plain nanoGPT loop (benchmarks/plain_gpt_loop.py), the same
   loop chunked (micro-batches of the config's ``micro_batch``, else of ``--micro`` rows, default a
   quarter of the batch, with gradient accumulation as nanoGPT's ``gradient_accumulation_steps``)
   and ``Trainer.advance``; ``--steps`` timed steps after ``--warmup``, all of them interleaved
   (A, B, C, ... A, B, C, ...), best of ``--repeats`` (benchmarks/timing.py); tokens/s, the ratio to the plain loop of the
   same precision (target >= 0.9x for the Trainer against the plain loop that splits the batch as it
   does), the ratio to seedlab's fp32 Trainer, and GFLOP/s (nanoGPT's 6N + 12·L·d·T per token) with
   their share of the matmul peak of the precision used;
2. determinism, in each precision: a fresh ``Trainer`` repeats the timed run's steps; every weight's
   SHA-256 must agree (bf16 autocast too: on one machine it is as reproducible as fp32);
3. the shared prefix: ``run_twins`` for one seed forked vs ``independent=True`` (wall time, interleaved,
   best of ``--fork-repeats``; steps trained s + C·(T - s) vs C·T), and the forked and independent final
   weights compared;
4. pieces: what ``advance`` does differently from the plain loop (batch, loss, AdamW, readout),
   each timed alone, interleaved, best of ``--repeats``.

Every part runs at ``--threads`` threads (default: torch's), set before every timed call and handed to the
config (``threads``), so all sides of every ratio run at the same count; each part prints its conditions (rounds,
threads, the load average before and after) beside its numbers (docs/benchmarks.md, "How to measure").

Parts 3 and 4 run in one precision only, the first of ``--precision`` (fp32 by default): part 3 is
the longest and what it measures (steps saved by the fork, forked == independent) does not depend
on the precision; pass ``--precision bf16`` to run them in bf16.

Why no ``torch.func`` (``vmap``) variant: vmap pays when one process trains many independent models
of one shape at once (stacked weights, ``functional_call``). A twins run trains one model at a
time: the C arms of a design are forks of one shared prefix, trained once up to the injection
step s, and from there differ in one row of one batch, so until the fork there is nothing to
batch. A possible future variant: vmap the C arms *after* the fork (stacked weights and AdamW
moments, their batches identical but for the injected row), the C·(T - s) steps becoming T - s
C-wide ones; it would have to stay bitwise equal to the arms trained one by one (part 3's check),
which batched kernels, reducing in another order, need not.

Usage (roughly 6 minutes with the defaults on this 2-core machine, part 3 being 4 of them; --fork-steps and
--fork-injection scale part 3 down; on a busy machine --threads 1 keeps the timings far steadier):

    python benchmarks/twins_trainer.py [--steps 60] [--repeats 3] [--precision fp32 bf16] [--micro 4]
                                       [--fork-steps 300 --fork-injection 100 --fork-repeats 2] [--skip-fork]
                                       [--corpus runs/corpus-embedded-bpe] [--threads 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from plain_gpt_loop import PlainGPTLoop
from plain_gpt_loop import get_batch as plain_batch
from timing import Timings, interleaved, set_threads
from timing import load as load_average

import seedlab.config
from seedlab import doctor
from seedlab.config import load_yaml, parse
from seedlab.corpus import load, prepare
from seedlab.lm.batches import get_batch
from seedlab.lm.distributed import World
from seedlab.lm.model import GPT, masked_ce_sum
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes
from seedlab.twins.config import TwinsConfig
from seedlab.twins.train import run_twins

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: part 1's loops in each precision, in the order they take turns and are printed
LOOPS = ("plain", "chunked", "twins")


def flops_per_token(gcfg) -> tuple[float, float]:
    """(nanoGPT's estimate 6N + 12·L·d·T with N the non-embedding params, FlopCounterMode's
    matmul count of one forward+backward per token; the CPU attention kernel is not counted)."""
    m = GPT(gcfg, seed=0)
    L, d, T = gcfg.n_layer, gcfg.n_embd, gcfg.block_size
    x = torch.randint(0, gcfg.vocab_size, (2, T))
    with FlopCounterMode(display=False) as fc:
        m(x, x)[1].backward()
    return 6 * m.num_params(non_embedding=True) + 12 * L * d * T, fc.get_total_flops() / x.numel()


def throughput(cfgs: dict[str, TwinsConfig], gcfg, tokens: np.ndarray, micro: int, dev: torch.device, args):
    """Part 1: every loop of ``LOOPS`` in every precision of ``cfgs``, all taking turns at ``args.threads``.

    Returns (the Timings of ``args.steps`` steps keyed by (precision, loop); each precision's Trainer; the steps
    each Trainer has taken)."""
    steps: dict[tuple[str, str], Callable[[], object]] = {}
    runs: dict[str, Trainer] = {}
    for p, cfg in cfgs.items():
        runs[p] = Trainer(cfg, gcfg, args.seed, tokens)
        steps[p, "plain"] = PlainGPTLoop(cfg, gcfg, args.seed, tokens, dev).step
        steps[p, "chunked"] = PlainGPTLoop(cfg, gcfg, args.seed, tokens, dev, micro=micro).step
        steps[p, "twins"] = runs[p].advance
    set_threads(args.threads)
    for _ in range(args.warmup):
        for step in steps.values():
            step()

    def timed(step: Callable[[], object]) -> Callable[[], None]:
        def fn() -> None:
            for _ in range(args.steps):
                step()

        return fn

    t = interleaved({k: timed(step) for k, step in steps.items()}, args.repeats, threads=args.threads, dev=dev)
    return t, runs, args.warmup + args.repeats * args.steps


def determinism(cfg, gcfg, tokens, first: Trainer, steps: int, seed: int) -> tuple[bool, int]:
    again = Trainer(cfg, gcfg, seed, tokens)
    for _ in range(steps):
        again.advance()
    a, b = tensor_hashes(first.model.state_dict()), tensor_hashes(again.model.state_dict())
    return a == b, len(a)


def fork_vs_independent(cfg: TwinsConfig, base: Path, repeats: int, dev: torch.device) -> tuple[Timings, bool]:
    """run_twins forked vs independent (fresh folders each time), interleaved at the config's threads; and
    whether every condition's final weights agree bitwise between the two."""
    manifests: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="twins-bench-") as tmp:

        def go(independent: bool) -> Callable[[], None]:
            def fn() -> None:
                out = Path(tempfile.mkdtemp(dir=tmp))
                run_twins(cfg, out, base=base, independent=independent, progress=False)
                key = "independent" if independent else "forked"
                manifests[key] = {
                    c: json.loads((out / f"seed-{cfg.seeds[0]}" / c / "manifest.json").read_text())[str(cfg.steps)]
                    for c in cfg.arm_names
                }

            return fn

        t = interleaved({"forked": go(False), "independent": go(True)}, repeats, threads=cfg.threads, dev=dev)
    return t, manifests["forked"] == manifests["independent"]


def pieces(cfg: TwinsConfig, gcfg, tokens: np.ndarray, dev: torch.device, repeats: int, calls: int) -> tuple[list[tuple], list[str]]:
    """(piece, twins way, plain way, twins µs/step, plain µs/step) per piece, each piece's two ways interleaved
    at the config's threads (the loss on logits of ``cfg.precision``'s dtype, as autocast leaves them); and each
    piece's conditions line."""
    B, T, V = cfg.batch_size, gcfg.block_size, gcfg.vocab_size
    rows: list[tuple] = []
    conditions: list[str] = []

    def per_call(fns: dict[str, Callable[[], None]]) -> list[float]:
        def many(f):
            return lambda: [f() for _ in range(calls)]

        t = interleaved({k: many(f) for k, f in fns.items()}, repeats, threads=cfg.threads, dev=dev)
        conditions.append(t.conditions())
        return [1e6 * t.best[k] / calls for k in fns]

    # the batch: numpy default_rng([seed, step]) + stack + mask + count, vs torch.randint offsets
    gen, step = torch.Generator().manual_seed(0), iter(range(10**9))

    def twins_batch():
        x, y = get_batch(tokens, 0, next(step), B, T)
        mask = torch.ones_like(x, dtype=torch.bool)
        int(mask.sum())
        x.to(dev), y.to(dev), mask.to(dev)

    times = per_call({"t": twins_batch, "p": lambda: plain_batch(tokens, B, T, dev, gen)})
    rows.append(("batch", "get_batch(seed, step) + mask + .to", "randint get_batch", *times))

    # the loss: masked CE sum / n_targets (reduction="none", where, sum) vs F.cross_entropy mean, fwd + bwd
    logits = torch.randn(B, T, V, device=dev, dtype=DTYPES[cfg.precision], requires_grad=True)
    y = torch.randint(0, V, (B, T), device=dev)
    m = torch.ones(B, T, dtype=torch.bool, device=dev)

    def twins_loss():
        total = torch.zeros((), device=dev)
        part = masked_ce_sum(logits, y, m) / (B * T)
        part.backward()
        total += part.detach()
        logits.grad = None

    def plain_loss():
        F.cross_entropy(logits.view(-1, V).float(), y.view(-1)).backward()
        logits.grad = None

    times = per_call({"t": twins_loss, "p": plain_loss})
    rows.append(("loss fwd+bwd", "CE none + where + sum/n", "F.cross_entropy mean", *times))

    # AdamW: fused (twins) vs torch's default (plain on CPU; fused on CUDA, as nanoGPT)
    def opt_step(**kw) -> Callable[[], None]:
        model = GPT(gcfg, seed=0).to(dev)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=1e-4, **kw)
        return opt.step

    plain_kw = {"fused": True} if dev.type == "cuda" else {}
    times = per_call({"t": opt_step(fused=True), "p": opt_step(**plain_kw)})
    rows.append(("AdamW step", "fused=True", "fused" if plain_kw else "default", *times))

    # the per-step loss readout: float() of the accumulated loss (a host sync on CUDA) vs none
    v = torch.ones((), device=dev)
    times = per_call({"t": lambda: float(v * 1), "p": lambda: v * 1})
    rows.append(("loss readout", "float(total) every step", "none", *times))
    return rows, conditions


def machine(dev: torch.device, precisions: list[str], n: int) -> dict[str, float]:
    """Print the machine's header lines; return the matmul peak (GFLOP/s) in each precision."""
    c = doctor.cpu()
    flags = ", ".join(c["flags"]) or "none of " + ", ".join(doctor.FLAGS)
    gpu = f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()}: {c['model']}, {c['cores']} cores, flags {flags}, "
          f"torch's CPU kernels {c['capability']}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"device {dev}{gpu}")
    peak = {p: doctor.matmul_gflops(DTYPES[p], dev, n, repeats=3) for p in precisions}
    print(f"matmul peak ({n}x{n} @ {n}x{n}, best of 3): "
          + ", ".join(f"{p} {g:,.1f} GFLOP/s" for p, g in peak.items())
          + (f" (bf16/fp32 {peak['bf16'] / peak['fp32']:.2f}x)" if len(peak) == 2 else ""))
    return peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="mini", help="a twins config file or preset name")
    ap.add_argument("--corpus", type=Path, help="a prepared corpus; default: 'embedded' with mini.yaml's 2,048-token BPE, prepared in a temp dir")
    ap.add_argument("--precision", nargs="+", choices=list(DTYPES), default=list(DTYPES),
                    help="the precisions of parts 1 and 2 (default: both); parts 3 and 4 run in the first")
    ap.add_argument("--micro", type=int, help="rows per micro-batch of the chunked plain loop when the config "
                    "sets no micro_batch; default: a quarter of the batch")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per repeat (throughput)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (throughput)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds, best taken")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peak-size", type=int, default=2048, help="n of the n x n matmul timed for the peak")
    ap.add_argument("--fork-steps", type=int, help="T for part 3; default: the config's steps")
    ap.add_argument("--fork-injection", type=int, help="s for part 3; default: the config's injection_step, scaled with T")
    ap.add_argument("--fork-repeats", type=int, default=2, help="interleaved rounds of part 3, best taken")
    ap.add_argument("--skip-fork", action="store_true", help="leave out part 3 (the longest)")
    ap.add_argument("--piece-calls", type=int, default=20, help="calls per round for each piece (part 4)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch CPU threads of every loop, set before each timed call (default: torch's, %(default)s here)")
    ap.add_argument("--device", help="override the config's device (auto|cpu|cuda)")
    args = ap.parse_args()
    precisions = list(dict.fromkeys(args.precision))  # as given, once each
    if min(args.threads, args.repeats, args.fork_repeats, args.steps) < 1:
        ap.error("--threads, --repeats, --fork-repeats and --steps: at least 1")
    set_threads(args.threads)
    t_start = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="twins-corpus-") as tmp:
        corpus_dir = args.corpus or Path(tmp) / "corpus"
        if args.corpus is None:
            prepare("embedded", corpus_dir, tokenizer="bpe", vocab_size=2048)
        corpus = load(corpus_dir)
        config_file = seedlab.config.config_file("twins", args.config)
        raw = load_yaml(config_file) | {"corpus": str(Path(corpus_dir).resolve()), "seeds": [args.seed]}
        if args.device:
            raw["device"] = args.device
        raw["threads"] = args.threads  # the Trainer and run_twins settle the same count as the plain loops
        base = parse(TwinsConfig, raw)
        cfgs = {p: base.model_copy(update={"precision": p}) for p in precisions}
        cfg = cfgs[precisions[0]]  # parts 3 and 4
        gcfg = base.gpt_config(corpus.vocab_size)
        tokens = corpus.train
        B, T = base.batch_size, gcfg.block_size
        micro = base.micro_batch or args.micro or max(1, B // 4)
        if B % micro:
            ap.error(f"--micro: must divide the batch of {B} rows, got {micro}")
        est, counted = flops_per_token(gcfg)
        dev = World().device(base.device)

        peak = machine(dev, precisions, args.peak_size)
        name = args.config
        split = f"micro-batches of {base.micro_batch}" if base.micro_batch else "the whole batch at once"
        print(f"config {name}: model {base.model} (L={gcfg.n_layer}, d={gcfg.n_embd}, V={gcfg.vocab_size}), block {T}, "
              f"batch {B} = {B * T} tokens/step ({split}); precisions {', '.join(precisions)}; "
              f"corpus {len(tokens):,} train tokens")
        load1, cores = load_average(), os.cpu_count() or 1
        if load1 > cores - 0.5:
            hint = " (try --threads 1)" if args.threads > 1 else ""
            print(f"warning: load average {load1:.1f} on {cores} cores at the start: timings are contended{hint}")
        n_params = GPT(gcfg).num_params(non_embedding=True)
        print(f"FLOPs/token (fwd+bwd): {est / 1e6:.3f} M (6N + 12·L·d·T, N = {n_params:,} non-embedding); "
              f"FlopCounterMode matmuls {counted / 1e6:.3f} M")

        # 1. throughput
        t1, runs, done = throughput(cfgs, gcfg, tokens, micro, dev, args)
        best = t1.best
        n_tok = args.steps * B * T
        ref = "chunked" if base.micro_batch else "plain"  # the plain loop that splits the batch as the Trainer does
        labels = {"plain": "plain nanoGPT loop", "chunked": f"plain loop, {B // micro} micro-batches of {micro}",
                  "twins": "seedlab `Trainer.advance`" + (f", micro-batches of {base.micro_batch}" if base.micro_batch else "")}
        print(f"\n## 1. throughput: {args.steps} steps a round, all {len(best)} loops taking turns, after "
              f"{args.warmup} warm-up steps; {t1.conditions()}")
        print("| precision | trainer | ms/step | tokens/s | vs plain, same precision | vs seedlab fp32 | GFLOP/s "
              "| % of the precision's matmul peak |")
        print("|---|---|---|---|---|---|---|---|")
        for p in precisions:
            for loop in LOOPS:
                t, rate = best[p, loop], n_tok / best[p, loop]
                vs_fp32 = f"{best['fp32', 'twins'] / t:.2f}x" if "fp32" in precisions else "-"
                print(f"| {p} | {labels[loop]} | {1e3 * t / args.steps:.1f} | {rate:,.0f} | {best[p, 'plain'] / t:.2f}x | "
                      f"{vs_fp32} | {rate * est / 1e9:.2f} | {100 * rate * est / 1e9 / peak[p]:.0f}% |")
        for p in precisions:
            per_round = t1.round_ratios((p, ref), (p, "twins"))  # plain time / twins time
            ratio, med = best[p, ref] / best[p, "twins"], float(np.median(per_round))
            print(f"{p}: twins / {'plain' if ref == 'plain' else 'chunked plain'} {ratio:.2f}x best of each, {med:.2f}x median of the rounds (target >= 0.9x: "
                  f"{'met' if min(ratio, med) >= 0.9 else 'NOT met'}); round by round: "
                  f"{', '.join(f'{r:.2f}x' for r in per_round)}")

        # 2. determinism
        print(f"\n## 2. determinism: each precision's timed twins run ({done} steps) repeated by a fresh Trainer")
        for p in precisions:
            same, n = determinism(cfgs[p], gcfg, tokens, runs[p], done, args.seed)
            print(f"{p}: deterministic: {'yes' if same else 'NO'} ({n} tensors, SHA-256 of each)")

        # 3. the shared prefix
        if not args.skip_fork:
            Tf = args.fork_steps or cfg.steps
            s = args.fork_injection or max(1, Tf * cfg.injection_step // cfg.steps)  # the config's share
            fcfg = cfg.model_copy(update={"steps": Tf, "injection_step": s})
            fcfg = parse(TwinsConfig, fcfg.model_dump(mode="json"))  # re-validated
            C = len(fcfg.arm_names)
            forked, indep = s + C * (Tf - s), C * Tf
            real = (Tf, s) == (cfg.steps, cfg.injection_step)
            scaled = "" if real else f" (scaled down from the config's T={cfg.steps}, s={cfg.injection_step})"
            print(f"\n## 3. shared prefix: run_twins, one seed, T={Tf}, s={s}, C={C} conditions{scaled}, {cfg.precision}")
            print(f"steps trained per seed: forked s + C·(T - s) = {s} + {C}·{Tf - s} = {forked:,}; "
                  f"independent C·T = {C}·{Tf} = {indep:,}; the fork saves (C - 1)·s = {indep - forked:,} "
                  f"({100 * (indep - forked) / indep:.0f}%)")
            t3, agree = fork_vs_independent(fcfg, config_file.parent, args.fork_repeats, dev)
            walls = t3.best
            print(t3.conditions())
            print("| mode | steps | wall s | ms/step |")
            print("|---|---|---|---|")
            for mode, n in (("forked", forked), ("independent", indep)):
                print(f"| {mode} | {n:,} | {walls[mode]:.1f} | {1e3 * walls[mode] / n:.1f} |")
            print(f"forked/independent wall time: {walls['forked'] / walls['independent']:.2f} "
                  f"(steps alone: {forked / indep:.2f}); "
                  f"final weights forked == independent, every condition: {'yes' if agree else 'no'}")
            step_ms = 1e3 * best[cfg.precision, "twins"] / args.steps
            slow = [k for k, n in (("forked", forked), ("independent", indep)) if 1e3 * walls[k] / n > 1.25 * step_ms]
            if slow:
                print(f"note: {' and '.join(slow)} ran > 1.25x part 1's {step_ms:.1f} ms/step: contended? "
                      "rerun with --fork-repeats 2 (or --threads 1 on a busy machine)")

        # 4. pieces
        rows, piece_conditions = pieces(cfg, gcfg, tokens, dev, args.repeats, args.piece_calls)
        step_us = 1e6 * best[cfg.precision, "twins"] / args.steps
        print(f"\n## 4. what advance() does differently, each piece alone: "
              f"{args.piece_calls} calls x best of {args.repeats}, {cfg.precision}")
        print("| piece | twins way | plain way | twins µs | plain µs | difference, % of a twins step | conditions |")
        print("|---|---|---|---|---|---|---|")
        for (piece, tw, pw, t_us, p_us), how in zip(rows, piece_conditions):
            print(f"| {piece} | {tw} | {pw} | {t_us:,.0f} | {p_us:,.0f} | {100 * (t_us - p_us) / step_us:+.1f}% | {how} |")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
