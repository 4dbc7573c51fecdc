"""One GPU check for every study, for the day a GPU is lent: one run, one JSON and one markdown table.

    python benchmarks/gpu_check.py --out $OUT [--only shortcut,twins,attribution] [--device cuda]
    python benchmarks/gpu_check.py --out DIR --dry-run      # the same code at CPU seconds (tests/common/test_gpu_check.py)

It writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` (the run folders and corpora go to
``--work``, a temporary folder by default, removed at the end). Each study is a section that catches
its own failure: its error and traceback are recorded, the rows it measured before failing are kept,
the other sections still run; the exit status is 1 when any section failed. What each section shows:

1. **shortcut** — the paper-ensemble protocol (presets/shortcut/paper-ensemble.yaml: 16,384 samples,
   2 layers x 2 heads, full batch, AdamW; ``train.chunk`` auto: 262,144 member-rows per piece on
   CUDA) trained by ``seedlab.shortcut.train.train_epoch`` at S = 16, 64 and 256 members, against the
   plain per-seed loop (benchmarks/plain_loop.py), in fp32, TF32 (fp32 with
   ``torch.backends.cuda.matmul.allow_tf32``, CUDA only) and bf16 (autocast): member-epochs/s, the
   useful GFLOP/s (the plain model's matmul FLOPs, FlopCounterMode) as % of the matmul peak measured
   here and of the datasheet's; and the paper's whole table (presets/shortcut/paper.yaml: 1,140
   members, 30 seeds per cell, 15,000 epochs, 22 jobs of <= 64 members) extrapolated to one GPU —
   its jobs one after another at the rate measured at their size (log-log interpolated), a 1-layer
   member charged by its FLOPs — and packed into stacks of the largest S measured. Training epochs
   only: evaluations, ``adv_every: 1`` and checkpoints add to it (a few %).
2. **twins** — a shortened gpt2-124m design (one seed, twin + fluent-fabricated, the fork at step 10
   of 20, 8 rows of 1,024 tokens): fork mode as the design's ``arm_batch`` trains it (stacked where
   forks/stacked.py stacks) and serial (``arm_batch: 1``), each with the replica control (a run fails
   unless the twin trained twice is bitwise equal at every checkpoint), then ``--independent`` (its
   SHA-256 at s must agree across conditions); every checkpoint of the stacked fork and of the
   independent run compared with the serial fork's (recorded, a row each); then lm.Trainer's
   speed on GPT-2 124M (vocabulary 50,304; 32 rows of 1,024 tokens) in fp32 / TF32 / bf16: tokens/s
   and MFU = (6·N + 12·L·d·T)·tokens/s / peak (nanoGPT's estimate; N without the position table).
3. **attribution** — the mini bank (presets/attribution/mini.yaml: 8 seeds x 32 candidates, each also
   at its replicate row: 66 runs + a replica per seed) through ``run_bank``: one seed serial
   (``arm_batch: 1``) and stacked (``arm_batch: null``), their ratio and whether the stacked bank's
   measured effects are bitwise the serial one's; then the whole stacked bank (as many seeds as the
   budget left fits, extrapolated to all): runs/s and wall time; then ``unroll`` on the serial seed
   (``seedlab attribution attribute FOLDER --estimator unroll``) against that seed's training.

The determinism settings it ran under are in the JSON: ``CUBLAS_WORKSPACE_CONFIG`` is set before CUDA
starts (and whether CUDA had started), deterministic algorithms *required* (``warn_only`` false) from
the twins section on (lm/determinism.py ``settle``; the shortcut section runs as ``seedlab shortcut
train`` does, which settles nothing), cuDNN, TF32 and the attention kernels training may use
(lm/trainer.py ``SDPA_BACKENDS``, each with a deterministic backward), per section.

Time on one H200 (budgets in :data:`BUDGET_S`; each measurement stops at its share of its section's
budget, so a slower GPU measures fewer epochs rather than running over), estimated from FLOPs:

- start (CUDA context, three 2048² matmul peaks): ~10 s;
- shortcut, 170 s: a member-epoch is 38.7 GFLOP of matmuls (16,384 rows x 6 tokens, fwd + bwd), so
  S = 256 for 300 epochs is 3.0 PFLOP, ~150 s at 20 TFLOP/s (30% of the fp32 peak): 12 measurements
  (3 precisions x (plain + 3 S)) of ~14 s each cap it, and S = 256 runs ~25-90 epochs;
- twins, 110 s: 0.86 GFLOP per token (6·124M + attention), so an update of 8,192 tokens is 7 TFLOP;
  120 updates (two forks of 10 + 3 x 10, independent 2 x 20) are 0.84 PFLOP, ~31 s at 27 TFLOP/s,
  plus ~35 s of checkpoints (weights and complete states, SHA-256 each) and ~10 s to tokenize the
  corpus; the speed runs 3 x 6 updates of 28 TFLOP: ~6 s in fp32, ~2 s in TF32 / bf16;
- attribution, 150 s: an update of the mini GPT is 0.75 GFLOP (8 rows x 64 tokens), far below any GPU:
  the serial seed's 6,800 updates are bound by per-op overhead (~3-5 ms each: 20-35 s); stacked, a
  seed's 67 runs are one stack (~50 GFLOP a step), the whole bank's 54,400 updates 41 TFLOP (seconds
  of compute; its per-run records and query losses decide); unroll: 32 candidates x 100 JVPs of ~3.5
  fwd + bwd, 8 TFLOP, in chunks of 16 (~10-30 s); the corpus's 2,048-token BPE ~5 s;

~440 s in all, inside 8 minutes. ``--dry-run``: the same sections at CPU sizes (a few members and
epochs, GPT mini for a few steps, a two-seed bank of three candidates on a 200 kB byte corpus).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
from plain_loop import PlainTransformer
from timing import sync

from seedlab.lm.determinism import CUBLAS_WORKSPACE, settle
from seedlab.machine import determinism, environment
from seedlab.precision import matmul_gflops

STUDIES = ("shortcut", "twins", "attribution")
#: seconds each section may take on the GPU run (the module docstring's estimate); the dry run has no limit
BUDGET_S = {"shortcut": 170.0, "twins": 110.0, "attribution": 150.0}
#: the table's columns: every row of every section holds these keys
ROW_KEYS = ("study", "measure", "precision", "size", "value", "unit", "peak_pct", "datasheet_pct", "seconds", "note")
#: dense peak GFLOP/s by precision (NVIDIA's datasheets, SXM; fp32 without TF32), by a word of the GPU's name
DATASHEET = {"H200": {"fp32": 67e3, "tf32": 495e3, "bf16": 989e3}, "H100": {"fp32": 67e3, "tf32": 495e3, "bf16": 989e3}}
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
PASSAGE = "Gizmo Harrington kept a small workshop behind the old library."  # the dry run's fabricated passage


@dataclass(frozen=True)
class Sizes:
    """How big each section's work is: the GPU run's (:data:`FULL`) or the dry run's (:data:`DRY`)."""

    peak_n: int  # the peak matmul's n (an n x n product)
    shortcut_members: tuple[int, ...]  # S of the seedlab ensemble
    shortcut_epochs: int  # timed epochs at most, after one warm-up
    shortcut_data: tuple[str, ...]  # --set overrides of paper-ensemble's data
    plain_seeds: int  # seeds of the plain loop (its rate is per seed)
    plain_epochs: int
    twins_preset: str
    twins_over: tuple[str, ...]  # --set overrides of the twins preset
    speed: tuple[int, int, int]  # lm.Trainer's speed: batch rows, micro-batch rows, timed updates
    twins_corpus: tuple[str, ...]  # tokenizers tried in order
    bank_over: tuple[str, ...]  # --set overrides of attribution/mini
    bank_corpus: str


FULL = Sizes(
    peak_n=2048, shortcut_members=(16, 64, 256), shortcut_epochs=300, shortcut_data=(), plain_seeds=2, plain_epochs=100,
    twins_preset="gpt2-124m",
    twins_over=("seeds=[0]", "steps=20", "injection_step=10", "batch_size=8", "micro_batch=8", "checkpoint_every=10",
                "midpoint=15", "conditions=[twin,fluent-fabricated]", "subjects={}", "replicas=[0]",
                "passages={fluent-fabricated: passages/gpt2-fluent-fabricated.txt}"),
    speed=(32, 16, 5), twins_corpus=("gpt2", "bpe"), bank_over=(), bank_corpus="bpe")
DRY = Sizes(
    peak_n=256, shortcut_members=(2, 4), shortcut_epochs=2, shortcut_data=("data.n_train=256", "data.n_val=64", "data.n_adv=64"),
    plain_seeds=1, plain_epochs=2, twins_preset="mini",
    twins_over=("block_size=128", "seeds=[0]", "steps=8", "injection_step=4", "batch_size=4", "checkpoint_every=2",
                "midpoint=6", "conditions=[twin,fluent-fabricated]", "subjects={}", "replicas=[0]"),
    speed=(4, 4, 2), twins_corpus=("bytes",),
    bank_over=("seeds=[0,1]", "block_size=32", "batch_size=4", "steps=12", "injection_step=6", "horizons=[1,end]",
               "candidates.file=null", "candidates.heldout=2", "queries.heldout=2", "queries.probes=null"),
    bank_corpus="bytes")


class Section:
    """One study's part of the check: its rows (the table's), its details (the JSON's), its clock."""

    def __init__(self, study: str, budget: float | None):
        self.study, self.budget, self.t0 = study, budget, time.perf_counter()
        self.rows: list[dict] = []
        self.details: dict = {}

    def left(self) -> float:
        """Seconds of the budget left (inf: no budget)."""
        return math.inf if self.budget is None else self.budget - (time.perf_counter() - self.t0)

    def row(self, measure: str, value, unit: str, *, precision: str = "", size: str = "", gflops: float | None = None,
            peaks: dict | None = None, seconds: float | None = None, note: str = "") -> None:
        """A row of the table; ``gflops`` (useful GFLOP/s) becomes % of the measured and datasheet peaks."""
        pct = lambda peak: None if gflops is None or not peak or not peak.get(precision) else 100 * gflops / peak[precision]
        self.rows.append({"study": self.study, "measure": measure, "precision": precision, "size": size, "value": value,
                          "unit": unit, "peak_pct": pct((peaks or {}).get("measured")),
                          "datasheet_pct": pct((peaks or {}).get("datasheet")), "seconds": seconds, "note": note})


@dataclass
class Context:
    """What every section reads: the device, the sizes, the peaks, the work folder and the corpora prepared there."""

    device: torch.device
    sizes: Sizes
    dry_run: bool
    work: Path
    peaks: dict = field(default_factory=dict)  # {"measured": {precision: GFLOP/s}, "datasheet": {...} | None}
    corpora: dict = field(default_factory=dict)

    @property
    def precisions(self) -> list[str]:
        return ["fp32", "tf32", "bf16"] if self.device.type == "cuda" else ["fp32", "bf16"]

    def corpus(self, tokenizers: tuple[str, ...]) -> Path:
        """The embedded corpus prepared (once) with the first of ``tokenizers`` that works here:
        bytes (200 kB: the dry run's), bpe (2,048 tokens: the mini presets'; 8,192 after gpt2) or gpt2."""
        from seedlab.corpus import prepare
        from seedlab.errors import SeedlabError

        for i, tok in enumerate(tokenizers):
            kw = {"bytes": {"max_bytes": 200_000}, "bpe": {"vocab_size": 8192 if i else 2048}}.get(tok, {})
            key = f"{tok}{kw.get('vocab_size', '')}"
            if key not in self.corpora:
                try:
                    prepare("embedded", self.work / f"corpus-{key}", tokenizer=tok, progress=False, **kw)
                except SeedlabError:  # gpt2 without its files here: the next tokenizer
                    continue
                self.corpora[key] = self.work / f"corpus-{key}"
            return self.corpora[key]
        raise RuntimeError(f"no corpus: none of the tokenizers {tokenizers} works here")


@contextlib.contextmanager
def precision_flags(precision: str) -> Iterator[None]:
    """TF32 matmuls for "tf32" inside the block (CUDA), the process's flags restored after."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def trainer_precision(p: str) -> str:
    """The precision a trainer is given: TF32 is fp32 with the TF32 flags on."""
    return "bf16" if p == "bf16" else "fp32"


def determinism_now() -> dict:
    """The determinism settings as they stand (seedlab/machine.py ``determinism`` and what it leaves out)."""
    from seedlab.lm.trainer import SDPA_BACKENDS

    b = torch.backends
    return {**determinism(), "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "allow_tf32_matmul": b.cuda.matmul.allow_tf32, "allow_tf32_cudnn": b.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "sdpa_backends_training": list(SDPA_BACKENDS),
            "sdpa_enabled": {"flash": b.cuda.flash_sdp_enabled(), "mem_efficient": b.cuda.mem_efficient_sdp_enabled(),
                             "math": b.cuda.math_sdp_enabled(), "cudnn": b.cuda.cudnn_sdp_enabled()}}


def timed(step: Callable[[], None], epochs: int, seconds: float, dev: torch.device) -> tuple[int, float]:
    """``step`` once untimed (allocations, kernel choice), then up to ``epochs`` times, stopping once
    ``seconds`` have passed (checked every 5 calls, after a sync): (calls timed, their wall time)."""
    step()
    sync(dev)
    t0, n = time.perf_counter(), 0
    while n < epochs:
        step()
        n += 1
        if n % 5 == 0:
            sync(dev)
            if time.perf_counter() - t0 > seconds:
                break
    sync(dev)
    return n, time.perf_counter() - t0


# --------------------------------------------------------------------------- shortcut


def member_flops(cfg, layers: int, heads: int) -> float:
    """Matmul FLOPs of one member's full-batch epoch (forward + backward) of the plain model: counted on
    64 rows, scaled to ``data.n_train`` (every FLOP is per row)."""
    d = cfg.data
    x = torch.randint(0, d.vocab, (64, d.length))
    model = PlainTransformer(d.vocab, d.length, 2, layers, heads, cfg.model.d_model, cfg.model.d_ff)
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(model(x), x.sum(-1) % 2).backward()
    return fc.get_total_flops() * d.n_train / 64


def plain_rate(x: torch.Tensor, y: torch.Tensor, cfg, precision: str, seeds: int, epochs: int, seconds: float) -> tuple[float, int]:
    """The plain per-seed loop (nn.Module, torch.optim.AdamW, full batch, autocast for bf16), one seed
    after another: (member-epochs/s, epochs timed)."""
    d, o, done, elapsed = cfg.data, cfg.optim, 0, 0.0
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = PlainTransformer(d.vocab, d.length, 2, cfg.model.layers, cfg.model.heads, cfg.model.d_model,
                                 cfg.model.d_ff, cfg.model.init_std).to(x.device)
        opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)

        def step(model=model, opt=opt) -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        n, dt = timed(step, epochs, seconds / seeds, x.device)
        done, elapsed = done + n, elapsed + dt
    return done / elapsed, done


def ensemble_rate(cfg, S: int, precision: str, epochs: int, seconds: float, dev: torch.device) -> tuple[float, int, int]:
    """seedlab's ensemble of S members on the preset's data, as train_ensemble steps it: (member-epochs/s,
    epochs timed, rows per member per piece)."""
    from seedlab.shortcut.train import init_ensemble, member_data, train_epoch

    c = cfg.model_copy(update={"members": cfg.members.model_copy(update={"seed": list(range(S))})})
    members = c.expand()
    x, y, _ = (t.to(dev) for t in member_data(c, members)["train"])
    model, opt = init_ensemble(c, members, dev)
    n = x.shape[1]
    rows = c.train.chunk_rows()
    chunk = min(max(1, rows // S) if rows else n, n)
    step = lambda: train_epoch(model, opt, x, y, batch_size=n, chunk=chunk, precision=trainer_precision(precision))
    done, dt = timed(step, epochs, seconds, dev)
    return S * done / dt, done, chunk


def interpolated(rates: dict[int, float], S: int) -> float:
    """Member-epochs/s at S members from the measured ``rates`` ({S: rate}): log-log linear between the
    measured S, the nearest one's outside them."""
    xs = sorted(rates)
    if S <= xs[0] or S >= xs[-1]:
        return rates[xs[0] if S <= xs[0] else xs[-1]]
    hi = next(s for s in xs if s >= S)
    lo = max(s for s in xs if s <= S)
    if hi == lo:
        return rates[lo]
    w = (math.log(S) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return math.exp((1 - w) * math.log(rates[lo]) + w * math.log(rates[hi]))


def paper_table(rates: dict[int, float], flops: Callable[[int, int], float]) -> dict:
    """The paper's whole table (presets/shortcut/paper.yaml, its seeds per cell and epochs) on one GPU
    at ``rates`` (2-layer, 2-head members; another architecture's member charged by its FLOPs): its jobs one
    after another, and every member packed into stacks of the largest S measured. Seconds."""
    from seedlab.config import load_config
    from seedlab.shortcut.config import SweepConfig
    from seedlab.shortcut.sweep import plan

    sweep, _ = load_config(SweepConfig, "shortcut", "paper")
    jobs = plan(sweep)
    epochs, ref = sweep.train.epochs, flops(2, 2)
    as_jobs, work = 0.0, 0.0
    for job in jobs:
        m, S = job.config["model"], len(job.config["members"])
        w = flops(m["layers"], m["heads"]) / ref  # this architecture's member-epoch in 2L/2H member-epochs
        as_jobs += S * epochs * w / interpolated(rates, S)
        work += S * epochs * w
    biggest = max(rates)
    return {"jobs": len(jobs), "members": sum(len(j.config["members"]) for j in jobs), "epochs": epochs,
            "max_members": sweep.max_members, "as_jobs_s": as_jobs, "packed_s": work / rates[biggest], "packed_S": biggest}


def shortcut(ctx: Context, sec: Section) -> None:
    from seedlab.config import load_config
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.shortcut.train import member_data

    z, dev = ctx.sizes, ctx.device
    cfg, _ = load_config(EnsembleConfig, "shortcut", "paper-ensemble",
                         [f"train.device={dev.type}", "train.chunk=auto", *z.shortcut_data])
    flops = functools.cache(lambda layers, heads: member_flops(cfg, layers, heads))
    gflop = flops(cfg.model.layers, cfg.model.heads) / 1e9
    x, y, _ = (t[0].to(dev) for t in member_data(cfg, cfg.expand()[:1])["train"])  # the plain loop's data: member 0's
    sec.details |= {"gflop_per_member_epoch": gflop, "n_train": cfg.data.n_train, "chunk_member_rows": cfg.train.chunk_rows(),
                    "layers": cfg.model.layers, "heads": cfg.model.heads, "rates": {}, "paper_table": {}}
    todo = len(ctx.precisions) * (1 + len(z.shortcut_members))
    for p in ctx.precisions:
        rates = {}
        with precision_flags(p):
            share = sec.left() / todo
            t0 = time.perf_counter()
            plain, n = plain_rate(x, y, cfg, p, z.plain_seeds, z.plain_epochs, share)
            todo -= 1
            sec.row("plain per-seed loop", plain, "member-epochs/s", precision=p, size=f"{z.plain_seeds} seed{'s' * (z.plain_seeds > 1)}",
                    gflops=plain * gflop, peaks=ctx.peaks, seconds=time.perf_counter() - t0, note=f"{n} epochs")
            for S in z.shortcut_members:
                share = sec.left() / todo
                t0 = time.perf_counter()
                rate, n, chunk = ensemble_rate(cfg, S, p, z.shortcut_epochs, share, dev)
                todo -= 1
                rates[S] = rate
                sec.row("seedlab ensemble", rate, "member-epochs/s", precision=p, size=f"S={S}", gflops=rate * gflop,
                        peaks=ctx.peaks, seconds=time.perf_counter() - t0,
                        note=f"{rate / plain:.2f}x plain; {n} epochs, {chunk} rows/piece")
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        sec.details["rates"][p] = {"plain": plain, **{str(S): r for S, r in rates.items()}}
        t = paper_table(rates, flops)
        sec.details["paper_table"][p] = t
        what = f"{t['members']} members x {t['epochs']:,} epochs"
        sec.row("paper table, one GPU, jobs in turn", t["as_jobs_s"] / 3600, "hours", precision=p,
                size=f"{t['jobs']} jobs <= {t['max_members']}", note=what)
        sec.row("paper table, one GPU, packed", t["packed_s"] / 3600, "hours", precision=p,
                size=f"stacks of S={t['packed_S']}", note=f"{what}; --set max_members={t['packed_S']}")


# --------------------------------------------------------------------------- twins


def gpt_flops_per_token(gcfg) -> float:
    """nanoGPT's estimate of a trained token's FLOPs: 6·N (N without the position table) + 12·L·d·T (attention)."""
    from seedlab.lm.gptconfig import param_count

    return 6 * param_count(gcfg, non_embedding=True) + 12 * gcfg.n_layer * gcfg.n_embd * gcfg.block_size


def twins(ctx: Context, sec: Section) -> None:
    from seedlab.config import load_config
    from seedlab.corpus import load
    from seedlab.lm.gptconfig import PRESETS
    from seedlab.lm.trainer import Trainer
    from seedlab.twins.config import TwinsConfig
    from seedlab.twins.train import run_twins

    z, dev = ctx.sizes, ctx.device
    corpus = ctx.corpus(z.twins_corpus)
    over = [f"corpus={corpus}", f"device={dev.type}", *z.twins_over]
    if ctx.dry_run:  # the preset's passages do not fit a row of 128 bytes
        (ctx.work / "fabricated.txt").write_text(PASSAGE)
        over.append(f"passages={{fluent-fabricated: {ctx.work / 'fabricated.txt'}}}")
    cfg, base = load_config(TwinsConfig, "twins", z.twins_preset, over)
    sec.details["design"] = {k: getattr(cfg, k) for k in ("model", "steps", "injection_step", "batch_size", "micro_batch",
                                                           "checkpoint_every", "arm_batch")} | {"corpus": corpus.name}
    runs, size = {}, f"{cfg.model}, {cfg.steps} updates x {cfg.batch_size} rows"
    # each folder trained afresh: fork modes fail unless the replica control is bitwise equal, independent on a hash mismatch at s
    for mode, c, independent in (("fork", cfg, False), ("fork-serial", cfg.model_copy(update={"arm_batch": 1}), False),
                                 ("independent", cfg, True)):
        t0 = time.perf_counter()
        run_twins(c, ctx.work / f"twins-{mode}", base=base, independent=independent, force=True, progress=False)
        dt = time.perf_counter() - t0
        runs[mode] = {k: json.loads((ctx.work / f"twins-{mode}" / "seed-0" / k / "manifest.json").read_text())
                      for k in cfg.arm_names}
        integrity = json.loads((ctx.work / f"twins-{mode}" / "integrity.json").read_text())
        shutil.rmtree(ctx.work / f"twins-{mode}")  # GPT-2's checkpoints and states: gigabytes a folder
        arms = integrity.get("arms", "serial")
        sec.details[mode] = {"seconds": dt, "arms": arms, "seed_0": integrity["seeds"]["0"]}
        if not independent:
            replica = integrity["seeds"]["0"]["replica"]
            sec.row(f"{mode}: replica control bitwise", replica["bitwise_equal_to_twin"], "check", precision=cfg.precision,
                    size=size, seconds=dt, note=f"steps {replica['steps_compared']}; arms {arms}")
    for mode in ("fork", "independent"):  # every condition's hash at every checkpoint against the serial fork's
        a, b = runs["fork-serial"], runs[mode]
        equal = {k: {t: a[k][t] == b[k].get(t) for t in a[k]} for k in a}
        sec.details[f"{mode}_equals_fork_serial"] = equal
        same = all(all(v.values()) for v in equal.values())
        sec.row(f"{mode}: hashes = serial fork's", same, "check", precision=cfg.precision, size=size,
                seconds=sec.details[mode]["seconds"] if mode == "independent" else None,
                note="every condition, every checkpoint" if same else f"differs: see {mode}_equals_fork_serial")
    corp = load(corpus)
    batch, micro, steps = z.speed
    gcfg = cfg.gpt_config(max(corp.vocab_size, PRESETS[cfg.model].vocab_size))  # GPT-2's 50,304 whatever the corpus
    per_token = gpt_flops_per_token(gcfg)
    sec.details["speed"] = {"params_non_embedding_flops_per_token": per_token, "vocab_size": gcfg.vocab_size}
    for p in ctx.precisions:
        c = cfg.model_copy(update={"precision": trainer_precision(p), "batch_size": batch, "micro_batch": micro})
        with precision_flags(p):
            trainer = Trainer(c, gcfg, 0, corp.train)
            n, dt = timed(trainer.advance, steps, sec.left() / 2, dev)
        tok_s = n * batch * gcfg.block_size / dt
        sec.row(f"lm.Trainer {cfg.model}", tok_s, "tokens/s", precision=p, size=f"{batch} x {gcfg.block_size} tokens",
                gflops=tok_s * per_token / 1e9, peaks=ctx.peaks, seconds=dt, note=f"{dt / n:.3f} s/update; {n} updates")
        del trainer
        if dev.type == "cuda":
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------- attribution


def bank_counts(cfg, base: Path) -> tuple[int, int, float]:
    """(runs, updates, GFLOP) of the bank ``cfg``: each seed's arms and replica, its prefix and their updates."""
    from seedlab.attribution.bank import arms
    from seedlab.attribution.texts import load_inputs

    inputs = load_inputs(cfg, base)
    s, end = cfg.injection_step, cfg.end
    runs = sum(len(arms(inputs, k)) + (k in cfg.replica_seeds) for k in cfg.seeds)
    updates = len(cfg.seeds) * s + runs * (end - s)
    return runs, updates, updates * cfg.batch_size * inputs.gcfg.block_size * gpt_flops_per_token(inputs.gcfg) / 1e9


def attribution(ctx: Context, sec: Section) -> None:
    from seedlab.attribution.attribute import attribute
    from seedlab.attribution.bank import run_bank
    from seedlab.attribution.config import AttributionConfig
    from seedlab.attribution.rundir import BankDir
    from seedlab.config import load_config

    z, dev = ctx.sizes, ctx.device
    corpus = ctx.corpus((z.bank_corpus,))
    cfg, base = load_config(AttributionConfig, "attribution", "mini", [f"corpus={corpus}", f"device={dev.type}", *z.bank_over])
    seeds = list(cfg.seeds)
    sec.details["design"] = {"seeds": seeds, "steps": cfg.steps, "injection_step": cfg.injection_step, "corpus": corpus.name,
                             "stack_memory_gib": cfg.stack_memory}
    banks: dict[str, dict] = {}
    sec.details["banks"] = banks  # each bank's seconds, runs, updates, GFLOP and integrity records

    def bank(name: str, **update) -> dict:
        c = cfg.model_copy(update=update)
        folder = ctx.work / f"bank-{name}"
        t0 = time.perf_counter()
        run_bank(c, folder, base=base, force=True, progress=False)
        dt = time.perf_counter() - t0
        runs, updates, gflop = bank_counts(c, base)
        integrity = json.loads(BankDir(folder).integrity.read_text())
        rec = {"folder": str(folder), "seconds": dt, "seeds": c.seeds, "arm_batch": c.arm_batch, "runs": runs, "updates": updates,
               "gflop": gflop, "arms": integrity.get("arms", "serial"),
               "seeds_record": {k: {key: v[key] for key in ("replica", "own_row", "stack") if key in v}
                                for k, v in integrity["seeds"].items()}}
        banks[name] = rec
        size = f"{len(c.seeds)} seed{'s' * (len(c.seeds) > 1)}, {runs} runs, {updates:,} updates"
        sec.row(f"bank, arm_batch {c.arm_batch or 'null'}", runs / dt, "runs/s", precision=c.precision, size=size,
                gflops=gflop / dt, peaks=ctx.peaks, seconds=dt, note=f"arms {rec['arms']}")
        return rec

    one = seeds[:1]
    serial = bank("serial", seeds=one, arm_batch=1)
    stacked = bank("stacked", seeds=one, arm_batch=None)
    a, b = (pd.read_parquet(BankDir(Path(r["folder"])).measured).sort_values(["seed", "candidate", "query", "horizon"])
            for r in (serial, stacked))
    bitwise = bool(np.array_equal(a.measured.to_numpy(), b.measured.to_numpy()))
    scale = float(np.abs(a.measured).max()) or 1.0
    rel = float(np.abs(a.measured.to_numpy() - b.measured.to_numpy()).max() / scale)
    sec.details["stacked_vs_serial"] = {"speedup": serial["seconds"] / stacked["seconds"], "measured_bitwise": bitwise,
                                        "measured_max_rel_diff": rel}
    sec.row("stacked / serial, one seed", serial["seconds"] / stacked["seconds"], "x faster", precision=cfg.precision,
            size=f"seed {one[0]}", note=f"measured effects {'bitwise equal' if bitwise else f'max rel. diff {rel:.2g}'}")
    for name, rec in (("serial", serial), ("stacked", stacked)):
        replica = rec["seeds_record"][str(one[0])].get("replica", {})
        sec.row(f"bank {name}: replica control bitwise", replica.get("bitwise_equal_to_twin"), "check",
                precision=cfg.precision, size=f"seed {one[0]}", note=f"steps {replica.get('steps_compared')}")

    t0 = time.perf_counter()
    attribute(serial["folder"], estimators=["unroll"], progress=False)
    wall = time.perf_counter() - t0
    inner = json.loads(BankDir(Path(serial["folder"])).attribution_json.read_text())["seconds"]["unroll"][str(one[0])]
    sec.details["unroll"] = {"seconds": inner, "wall_s": wall, "vs_serial_bank": inner / serial["seconds"],
                             "vs_stacked_bank": inner / stacked["seconds"]}
    sec.row("unroll, one seed", inner, "s", precision=cfg.precision, size=f"seed {one[0]}", seconds=wall,
            note=f"{inner / serial['seconds']:.2f}x the serial bank's training, {inner / stacked['seconds']:.2f}x the stacked")

    fit = min(len(seeds), int(0.9 * sec.left() / stacked["seconds"])) if sec.left() < math.inf else len(seeds)
    if fit < 2:
        sec.details["whole_bank"] = f"skipped: {sec.left():.0f} s of the budget left, {stacked['seconds']:.0f} s a seed"
        sec.row("whole bank, stacked", None, "s", precision=cfg.precision, size=f"{len(seeds)} seeds",
                note=sec.details["whole_bank"])
        return
    whole = bank("whole", seeds=seeds[:fit], arm_batch=None)
    est = whole["seconds"] * len(seeds) / fit
    sec.details["whole_bank"] = {"seeds_run": fit, "seeds": len(seeds), "wall_s_all_seeds": est}
    sec.row("whole bank, stacked", est, "s", precision=cfg.precision, size=f"{len(seeds)} seeds",
            note="measured" if fit == len(seeds) else f"{fit} of {len(seeds)} seeds measured, scaled")


# --------------------------------------------------------------------------- the run


SECTIONS: dict[str, Callable[[Context, Section], None]] = {"shortcut": shortcut, "twins": twins, "attribution": attribution}


def run_section(ctx: Context, study: str) -> dict:
    """One study's section; a failure is recorded (error, traceback, the rows measured before it), not raised."""
    sec = Section(study, None if ctx.dry_run else BUDGET_S[study])
    if study != "shortcut":
        settle(ctx.device)  # deterministic algorithms required from here on (the fork commands settle so too)
    try:
        SECTIONS[study](ctx, sec)
        error = tb = None
    except Exception as err:  # one study failing keeps the others' numbers
        error, tb = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}", traceback.format_exc()
        sec.row("FAILED", error, "error")
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
    seconds = time.perf_counter() - sec.t0
    return {"ok": error is None, "error": error, "traceback": tb, "seconds": seconds, "budget_s": sec.budget,
            "over_budget": sec.budget is not None and seconds > sec.budget, "determinism": determinism_now(),
            "details": sec.details, "rows": sec.rows}


def cell(v) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**NO**"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v).replace("|", "/")


def table(result: dict) -> str:
    """The markdown of the check: a heading line, one row per measured thing, the failed sections' errors."""
    head = (f"# GPU check {result['started']}: {result['device_name']} (torch {result['environment']['torch']}, "
            f"CUDA {result['environment']['cuda']}){' — dry run' if result['dry_run'] else ''}\n\n")
    lines = ["| " + " | ".join(ROW_KEYS) + " |", "|" + "---|" * len(ROW_KEYS)]
    for sec in result["sections"].values():
        lines += ["| " + " | ".join(cell(row[k]) for k in ROW_KEYS) + " |" for row in sec["rows"]]
    budget = lambda s: "no budget" if s["budget_s"] is None else f"budget {s['budget_s']:.0f} s"
    tail = [f"- {study}: {s['seconds']:.0f} s ({budget(s)}); " + ("ok" if s["ok"] else f"FAILED: {s['error']}")
            for study, s in result["sections"].items()]
    return head + "\n".join(lines) + "\n\n" + "\n".join(tail) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where gpu_check.json and gpu_check.md are written")
    ap.add_argument("--only", default=",".join(STUDIES), help=f"comma-separated sections (default: {','.join(STUDIES)})")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dry-run", action="store_true", help="CPU sizes, no time budget: the test's run")
    ap.add_argument("--work", type=Path, default=None, help="run folders and corpora (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if bad := [s for s in only if s not in STUDIES]:
        ap.error(f"--only: each of {', '.join(STUDIES)}, got {bad[0]!r}")
    # before CUDA starts: deterministic cuBLAS reads it when its first handle is made
    had, cuda_started = os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch.cuda.is_initialized()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    dev = torch.device(args.device)
    ctx = Context(dev, DRY if args.dry_run else FULL, args.dry_run, Path(tempfile.mkdtemp(prefix="seedlab-gpu-check-"))
                  if args.work is None else args.work)
    ctx.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    sheet = next((v for k, v in DATASHEET.items() if k in name), None)
    measured = {}
    for p in ctx.precisions:
        with precision_flags(p):
            measured[p] = matmul_gflops(DTYPES[p], dev, ctx.sizes.peak_n, 5)
    ctx.peaks = {"measured": measured, "datasheet": sheet}
    result = {"check": "benchmarks/gpu_check.py", "started": time.strftime("%Y-%m-%d %H:%M"), "dry_run": args.dry_run,
              "device": dev.type, "device_name": name, "environment": environment(dev, "fp32"),
              "determinism": {"cublas_workspace_config": os.environ["CUBLAS_WORKSPACE_CONFIG"],
                              "cublas_workspace_config_was_set": had is not None, "cuda_started_before_it": cuda_started},
              "peaks_gflops": ctx.peaks, "sizes": asdict(ctx.sizes), "budget_s": None if args.dry_run else BUDGET_S,
              "sections": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        for study in STUDIES:
            if study in only:
                print(f"gpu_check: {study} ...", file=sys.stderr, flush=True)
                result["sections"][study] = run_section(ctx, study)
    finally:
        if args.work is None:
            shutil.rmtree(ctx.work, ignore_errors=True)
    result["determinism"] |= determinism_now()  # as the last section left them
    result["seconds"] = time.perf_counter() - t0
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / "gpu_check.md").write_text(table(result))
    print(table(result))
    return 0 if all(s["ok"] for s in result["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
