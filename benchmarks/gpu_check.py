"""One GPU check for every study, for the day a GPU is lent: one run, one JSON and one markdown table.

    make gpu-wheels                                            # here: the wheels the lent image lacks, into .whl/
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \\
      PYTHONPATH=/tmp/site python3 benchmarks/gpu_check.py --out $OUT --wheels .whl      # there (docs/benchmarks.md)
    python benchmarks/gpu_check.py --out DIR --dry-run          # the same code at CPU seconds
    python benchmarks/gpu_check.py --out DIR [--only twins,mfu] [--budget twins=90] [--device cuda] [--work DIR]

It writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out`` after every section, so a run killed from
outside keeps what finished (``finished`` false until the end); run folders and corpora go to ``--work``, a
temporary folder by default, removed at the end. Each section runs in its own process under a hard time limit
enforced by this one (its budget: terminated, then killed 1 s later): a section that hangs, crashes or leaves
CUDA in a sticky error ends alone, is recorded as timed out or failed with the rows it wrote before (a section
writes its record after every row), and the next section starts in a fresh process. Exit status: 0 when every
section passed, 1 when one failed, 2 on bad input — an unknown section, a budget below a section's minimum or
over the 8 minutes, a wheel folder that lacks a package the image needs, a package seedlab needs missing here —
each one line, before any section starts.

0. **peaks** (always first) — the device (name, memory) and its datasheet's dense peaks (:func:`datasheet`: H100
   SXM, H100 PCIe or H200 told apart by name and memory; none for another device), then the matmul peak
   measured per precision (fp32, TF32 on CUDA, bf16): 8192³ products on random data, after 3 warm-up products,
   the best of 5 rounds of 5 products (a round timed between two syncs). Every later section's "% of peak"
   divides by these.
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
   of 20, 8 rows of 1,024 tokens, checkpoints at 10 and 20 only, no complete state kept: what the replica
   control compares): fork mode as the design's ``arm_batch`` trains it (stacked where forks/stacked.py stacks)
   and serial (``arm_batch: 1``), each with the replica control (a run fails unless the twin trained twice is
   bitwise equal at every checkpoint; a control that compared no step reads NO and fails the section), then
   ``--independent`` (its SHA-256 at s must agree across conditions); every checkpoint of the stacked fork and of
   the independent run compared with the serial fork's (a row each). Disk: the design's checkpoints and resume
   states are estimated first (:func:`twins_disk_bytes`, ~9 GB for GPT-2 124M) and refused over the budget
   (``Sizes.twins_disk_gb``) or the free space; while it trains, :class:`DiskGuard` stops it once its folder
   outgrows the budget; each mode's folder is removed before the next.
3. **mfu** — lm.Trainer's speed on GPT-2 124M (vocabulary 50,304; 32 rows of 1,024 tokens) in fp32 / TF32 /
   bf16, each twice: under the determinism settings the trainer runs with (lm/determinism.py ``settle``:
   deterministic algorithms required, cuDNN deterministic) and with deterministic algorithms off (the fixed
   cuBLAS workspace stays: it is set before CUDA starts), each row labelled: tokens/s and MFU =
   (6·N + 12·L·d·T)·tokens/s / peak (nanoGPT's estimate; N without the position table), against the
   measured peak (``peak_pct``) and the datasheet's (``datasheet_pct``).
4. **attribution** — the mini bank (presets/attribution/mini.yaml: 8 seeds x 32 candidates, each also
   at its replicate row: 66 runs + a replica per seed) through ``run_bank``: one seed serial
   (``arm_batch: 1``) and stacked (``arm_batch: null``), their ratio and whether the stacked bank's
   measured effects are bitwise the serial one's; then the whole stacked bank (as many seeds as the
   budget left fits, extrapolated to all): runs/s and wall time; then ``unroll`` on the serial seed
   (``seedlab attribution attribute FOLDER --estimator unroll``) against that seed's training.

The determinism settings each section ran under are in its record and the JSON's ``determinism``:
``CUBLAS_WORKSPACE_CONFIG`` is set in every section's process before CUDA starts, deterministic algorithms are
*required* (``warn_only`` false) in twins, mfu (its labelled half) and attribution (lm/determinism.py ``settle``;
peaks and shortcut run as ``seedlab shortcut train`` does, which settles nothing), cuDNN, TF32 and the attention
kernels training may use (lm/trainer.py ``SDPA_BACKENDS``, each with a deterministic backward).

Time on one H100 or H200, by construction at most 8 minutes (:data:`LIMIT_S`): the budgets in
:data:`BUDGET_S` plus a 3 s kill grace per section plus :data:`STARTUP_S` (Python, torch's import, the
pre-flight checks, the files) sum to <= 480 s, and each section's limit is also cut to what is left of that.
A section's process measures against its deadline (each measurement stops at its share of what is left), so a
slower GPU measures fewer epochs rather than running over. Estimated from FLOPs, each section's start (Python,
torch, the CUDA context: ~5-10 s) included:

- peaks, 25 s: 3 precisions x 28 products of 1.1 TFLOP (8192³), ~1 s of fp32 at ~50 TFLOP/s, less in TF32 / bf16;
- shortcut, 140 s: a member-epoch is 38.7 GFLOP of matmuls (16,384 rows x 6 tokens, fwd + bwd), so
  S = 256 for 300 epochs is 3.0 PFLOP, ~150 s at 20 TFLOP/s (30% of the fp32 peak): 12 measurements
  (3 precisions x (plain + 3 S)) of ~10 s each cap it, and S = 256 runs ~20-70 epochs;
- twins, 110 s: 0.86 GFLOP per token (6·124M + attention), so an update of 8,192 tokens is 7 TFLOP;
  120 updates (two forks of 10 + 3 x 10, independent 2 x 20) are 0.84 PFLOP, ~31 s at 27 TFLOP/s,
  plus the checkpoints (per mode ~9 GB written, SHA-256 of each weights file) and ~5 s to tokenize the corpus;
- mfu, 45 s: 3 x 2 x 6 updates of 28 TFLOP: ~6 s each in fp32, ~2 s in TF32 / bf16;
- attribution, 120 s: an update of the mini GPT is 0.75 GFLOP (8 rows x 64 tokens), far below any GPU:
  the serial seed's 6,800 updates are bound by per-op overhead (~3-5 ms each: 20-35 s); stacked, a
  seed's 67 runs are one stack (~50 GFLOP a step), the whole bank's 54,400 updates 41 TFLOP (seconds
  of compute; its per-run records and query losses decide); unroll: 32 candidates x 100 JVPs of ~3.5
  fwd + bwd, 8 TFLOP, in chunks of 16 (~10-30 s); the corpus's 2,048-token BPE ~5 s.

``--dry-run``: the same sections at CPU sizes (a 256³ peak, a few members and epochs, GPT mini for a few steps,
a two-seed bank of three candidates on a 200 kB byte corpus), each section's process under a 300 s limit.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
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
import gpu_wheels
from plain_loop import PlainTransformer
from timing import sync

STUDIES = ("shortcut", "twins", "mfu", "attribution")
#: every section in the order they run: the peaks first, always (every "% of peak" needs them)
ORDER = ("peaks", *STUDIES)
#: seconds each section's process may take on the GPU run, its start included (the docstring's estimate)
BUDGET_S = {"peaks": 25.0, "shortcut": 140.0, "twins": 110.0, "mfu": 45.0, "attribution": 120.0}
#: the least budget a section can do its work in (a smaller --budget is refused before anything starts)
MIN_BUDGET_S = {"peaks": 10.0, "shortcut": 30.0, "twins": 60.0, "mfu": 20.0, "attribution": 45.0}
LIMIT_S = 480.0  # the whole check, by construction
STARTUP_S = 15.0  # the parent's own time: Python and torch's import, the pre-flight checks, writing the files
KILL_GRACE_S = 3.0  # after a section's limit: terminated, killed 1 s later, waited for 2 s more at most
MARGIN_S = 3.0  # a section stops measuring this long before its deadline (its last record, its exit)
#: lm/determinism.py's CUBLAS_WORKSPACE, named here: the parent imports no seedlab module before its checks
CUBLAS_WORKSPACE = ":4096:8"
DRY_LIMIT_S = 300.0  # a dry-run section's hard limit (CPU sizes run to the end: no budget inside)
assert sum(BUDGET_S.values()) + len(BUDGET_S) * KILL_GRACE_S + STARTUP_S <= LIMIT_S  # by construction
#: the modules the sections import: a pre-flight import of each turns a missing package into one line
SECTION_MODULES = ("seedlab.lm.trainer", "seedlab.shortcut.train", "seedlab.twins.train", "seedlab.attribution.bank.run",
                   "seedlab.attribution.estimators.attribute")
#: the table's columns: every row of every section holds these keys
ROW_KEYS = ("study", "measure", "precision", "size", "value", "unit", "peak_pct", "datasheet_pct", "seconds", "note")
#: dense peak GFLOP/s by precision (NVIDIA's datasheets, their sparsity figures halved; fp32 without TF32)
DATASHEETS = {"H100 SXM": {"fp32": 67e3, "tf32": 495e3, "bf16": 989e3},
              "H100 PCIe": {"fp32": 51e3, "tf32": 378e3, "bf16": 756e3},
              "H200 SXM": {"fp32": 67e3, "tf32": 495e3, "bf16": 989e3}}
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
PASSAGE = "Gizmo Harrington kept a small workshop behind the old library."  # the dry run's fabricated passage


class BadInput(Exception):
    """Bad input to the check: one line, exit 2, before any section starts."""


@dataclass(frozen=True)
class Sizes:
    """How big each section's work is: the GPU run's (:data:`FULL`) or the dry run's (:data:`DRY`)."""

    peak_n: int  # the peak matmul's n (an n x n by n x n product)
    peak_warmup: int  # products before the timed rounds
    peak_rounds: tuple[int, int]  # (rounds, products per round): the best round's rate is the peak
    shortcut_members: tuple[int, ...]  # S of the seedlab ensemble
    shortcut_epochs: int  # timed epochs at most, after one warm-up
    shortcut_data: tuple[str, ...]  # --set overrides of paper-ensemble's data
    plain_seeds: int  # seeds of the plain loop (its rate is per seed)
    plain_epochs: int
    twins_preset: str
    twins_over: tuple[str, ...]  # --set overrides of the twins preset
    twins_disk_gb: float  # the twins section's disk budget for one mode's folder (checkpoints, resume states)
    disk_reserve_gb: float  # free space left on the disk under the work folder, at the least
    speed: tuple[int, int, int]  # lm.Trainer's speed: batch rows, micro-batch rows, timed updates
    twins_corpus: tuple[str, ...]  # tokenizers tried in order
    bank_over: tuple[str, ...]  # --set overrides of attribution/mini
    bank_corpus: str


FULL = Sizes(
    peak_n=8192, peak_warmup=3, peak_rounds=(5, 5),
    shortcut_members=(16, 64, 256), shortcut_epochs=300, shortcut_data=(), plain_seeds=2, plain_epochs=100,
    twins_preset="gpt2-124m",
    twins_over=("seeds=[0]", "steps=20", "injection_step=10", "batch_size=8", "micro_batch=8", "midpoint=15", "keep=[]",
                "conditions=[twin,fluent-fabricated]", "subjects={}", "replicas=[0]",
                "passages={fluent-fabricated: passages/gpt2-fluent-fabricated.txt}"),
    twins_disk_gb=16.0, disk_reserve_gb=2.0,
    speed=(32, 16, 5), twins_corpus=("gpt2", "bpe"), bank_over=(), bank_corpus="bpe")
DRY = Sizes(
    peak_n=256, peak_warmup=2, peak_rounds=(5, 3),
    shortcut_members=(2, 4), shortcut_epochs=2, shortcut_data=("data.n_train=256", "data.n_val=64", "data.n_adv=64"),
    plain_seeds=1, plain_epochs=2, twins_preset="mini",
    twins_over=("block_size=128", "seeds=[0]", "steps=8", "injection_step=4", "batch_size=4", "checkpoint_every=2",
                "midpoint=6", "keep=[]", "conditions=[twin,fluent-fabricated]", "subjects={}", "replicas=[0]"),
    twins_disk_gb=1.0, disk_reserve_gb=0.1,
    speed=(4, 4, 2), twins_corpus=("bytes",),
    bank_over=("seeds=[0,1]", "block_size=32", "batch_size=4", "steps=12", "injection_step=6", "horizons=[1,end]",
               "candidates.file=null", "candidates.heldout=2", "queries.heldout=2", "queries.probes=null"),
    bank_corpus="bytes")


def write_json(path: Path, obj) -> None:
    """``obj`` as JSON at ``path``, whole or not at all (written beside it, then renamed)."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


class Section:
    """One section's part of the check: its rows (the table's), its details (the JSON's), its deadline. Its
    record is written to ``record`` after every row, so a section killed at its limit keeps what it measured."""

    def __init__(self, study: str, deadline: float | None = None, record: Path | None = None):
        self.study, self.deadline, self.record, self.t0 = study, deadline, record, time.perf_counter()
        self.rows: list[dict] = []
        self.details: dict = {}

    def left(self) -> float:
        """Seconds left to measure in (inf: no deadline, the dry run)."""
        return math.inf if self.deadline is None else self.deadline - MARGIN_S - time.time()

    def save(self, **final) -> None:
        if self.record is not None:
            write_json(self.record, {"complete": False, "details": self.details, "rows": self.rows} | final)

    def row(self, measure: str, value, unit: str, *, precision: str = "", size: str = "", gflops: float | None = None,
            peaks: dict | None = None, seconds: float | None = None, note: str = "") -> None:
        """A row of the table; ``gflops`` (useful GFLOP/s) becomes % of the measured and datasheet peaks."""
        pct = lambda peak: None if gflops is None or not peak or not peak.get(precision) else 100 * gflops / peak[precision]
        self.rows.append({"study": self.study, "measure": measure, "precision": precision, "size": size, "value": value,
                          "unit": unit, "peak_pct": pct((peaks or {}).get("measured")),
                          "datasheet_pct": pct((peaks or {}).get("datasheet")), "seconds": seconds, "note": note})
        self.save()


@dataclass
class Context:
    """What every section reads: the device, the sizes, the peaks, the work folder and the corpora prepared there."""

    device: torch.device
    sizes: Sizes
    dry_run: bool
    work: Path
    peaks: dict = field(default_factory=dict)  # {"measured": {precision: GFLOP/s}, "datasheet": {...} | None}

    @property
    def precisions(self) -> list[str]:
        return ["fp32", "tf32", "bf16"] if self.device.type == "cuda" else ["fp32", "bf16"]

    def corpus(self, tokenizers: tuple[str, ...]) -> Path:
        """The embedded corpus prepared in the work folder (once for all sections: a later section's process
        finds it there) with the first of ``tokenizers`` that works here: bytes (200 kB: the dry run's), bpe
        (2,048 tokens: the mini presets'; 8,192 after gpt2) or gpt2."""
        from seedlab.corpus import prepare
        from seedlab.errors import SeedlabError

        for i, tok in enumerate(tokenizers):
            kw = {"bytes": {"max_bytes": 200_000}, "bpe": {"vocab_size": 8192 if i else 2048}}.get(tok, {})
            folder = self.work / f"corpus-{tok}{kw.get('vocab_size', '')}"
            if (folder / "meta.json").is_file():
                return folder
            shutil.rmtree(folder, ignore_errors=True)  # a section killed while preparing it
            try:
                prepare("embedded", folder, tokenizer=tok, progress=False, **kw)
            except SeedlabError:  # gpt2 without its files here: the next tokenizer
                continue
            return folder
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


@contextlib.contextmanager
def free_kernels() -> Iterator[None]:
    """Deterministic algorithms off and cuDNN free to pick any algorithm inside the block (what ``settle``
    set, undone), the process's settings restored after. ``CUBLAS_WORKSPACE_CONFIG`` stays: it is read once,
    when CUDA starts."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic = before[2]


def trainer_precision(p: str) -> str:
    """The precision a trainer is given: TF32 is fp32 with the TF32 flags on."""
    return "bf16" if p == "bf16" else "fp32"


def determinism_now() -> dict:
    """The determinism settings as they stand (seedlab/machine.py ``determinism`` and what it leaves out)."""
    from seedlab.lm.trainer import SDPA_BACKENDS
    from seedlab.machine import determinism

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


# --------------------------------------------------------------------------- peaks


def datasheet(name: str, memory_gib: float) -> tuple[str | None, str]:
    """Which datasheet a device's dense peaks come from, told apart by its name and memory (KINDS.md: the
    SXM H100 reports "NVIDIA H100 80GB HBM3" with 81,559 MiB, the H200 "NVIDIA H200" with 143,771 MiB; the
    PCIe H100 says PCIe, 80 GB): (a key of :data:`DATASHEETS` or None, why)."""
    n = name.upper()
    if "H100" in n and "NVL" not in n and 70 <= memory_gib <= 82:
        if "PCIE" in n:
            return "H100 PCIe", f"{name!r}, {memory_gib:.1f} GiB: PCIe in the name, 80 GB"
        if "HBM3" in n or "SXM" in n:
            return "H100 SXM", f"{name!r}, {memory_gib:.1f} GiB: HBM3 / SXM in the name, 80 GB"
    if "H200" in n and "NVL" not in n and 130 <= memory_gib <= 145:
        return "H200 SXM", f"{name!r}, {memory_gib:.1f} GiB: H200 in the name, 141 GB"
    return None, f"{name!r} with {memory_gib:.1f} GiB is none of {', '.join(DATASHEETS)}: no datasheet, its column stays empty"


def peak_gflops(dtype: torch.dtype, dev: torch.device, n: int, warmup: int, rounds: int, per_round: int) -> tuple[float, list[float]]:
    """The best rate of an n x n by n x n product in ``dtype`` on random data (GFLOP/s, 2n³ a product):
    ``warmup`` products untimed, then ``rounds`` rounds of ``per_round`` products each timed between two syncs.
    (best, every round's rate)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dev, dtype) for _ in range(2))
    out = torch.empty(n, n, device=dev, dtype=dtype)
    for _ in range(warmup):
        torch.matmul(a, b, out=out)
    sync(dev)
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(per_round):
            torch.matmul(a, b, out=out)
        sync(dev)
        rates.append(2 * n**3 * per_round / (time.perf_counter() - t0) / 1e9)
    return max(rates), rates


def peaks(ctx: Context, sec: Section) -> None:
    from seedlab.machine import environment

    z, dev = ctx.sizes, ctx.device
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name, memory = props.name, props.total_memory / 2**30
    else:
        name, memory = f"CPU ({platform.processor() or platform.machine()})", float("nan")
    sheet, why = datasheet(name, memory) if dev.type == "cuda" else (None, "a CPU: no datasheet")
    sec.details |= {"device_name": name, "memory_gib": memory, "datasheet_model": sheet, "datasheet_why": why,
                    "environment": environment(dev, "fp32")}
    figures = DATASHEETS.get(sheet) if sheet else None
    measured, rounds = {}, {}
    sec.details |= {"measured": measured, "datasheet": figures, "rounds_gflops": rounds}
    n, (r, k) = z.peak_n, z.peak_rounds
    for p in ctx.precisions:
        t0 = time.perf_counter()
        with precision_flags(p):
            measured[p], rounds[p] = peak_gflops(DTYPES[p], dev, n, z.peak_warmup, r, k)
        write_json(ctx.work / "peaks.json", {"measured": measured, "datasheet": figures})
        sec.row("matmul peak", measured[p], "GFLOP/s", precision=p, size=f"{n}³", gflops=measured[p],
                peaks={"datasheet": figures}, seconds=time.perf_counter() - t0,
                note=f"best of {r} rounds of {k} after {z.peak_warmup} warm-up; datasheet: {sheet or 'none'}")


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


def replica_check(replica: dict) -> tuple[bool, str]:
    """A replica control's row: (passed, note). One that compared no step has not passed, whatever it says."""
    steps = replica.get("steps_compared") or []
    if not steps:
        return False, "compared no step: a control that compares nothing has not passed"
    return bool(replica.get("bitwise_equal_to_twin")), f"steps {steps}"


def twins_disk_bytes(cfg, gcfg) -> int:
    """What one mode of the twins design writes at most (bytes): every run (each arm and the replica) keeps
    its fp32 weights at each hashed checkpoint and a resume state (weights + AdamW's two moments) while it
    trains, and the shared prefix's complete state lives until its seed is done."""
    from seedlab.lm.gptconfig import param_count

    w = 4 * param_count(gcfg)
    hashed = [t for t in cfg.checkpoint_steps() if t >= cfg.injection_step]
    runs = len(cfg.seeds) * len(cfg.arm_names) + len(cfg.replica_seeds)
    return runs * (len(hashed) + 3) * w + len(cfg.seeds) * 3 * w


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_size
    return total


class DiskGuard:
    """The block stops once ``folder`` holds more than ``budget`` bytes or the disk under it has less than
    ``reserve`` bytes free (looked at every ``interval`` s from a thread, which interrupts the main thread with
    SIGINT: a section's process keeps Python's handler, KeyboardInterrupt):
    a RuntimeError naming what was exceeded. ``peak``: the largest size seen."""

    def __init__(self, folder: Path, budget: float, reserve: float, interval: float = 0.5):
        self.folder, self.budget, self.reserve, self.interval = Path(folder), budget, reserve, interval
        self.peak, self.exceeded = 0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            size = folder_bytes(self.folder)
            self.peak = max(self.peak, size)
            free = shutil.disk_usage(self.folder if self.folder.exists() else self.folder.parent).free
            if size > self.budget:
                self.exceeded = f"{self.folder.name} holds {size / 1e9:.2f} GB, over the disk budget of {self.budget / 1e9:.2f} GB"
            elif free < self.reserve:
                self.exceeded = f"{free / 1e9:.2f} GB left free on the disk under {self.folder.name} (reserve {self.reserve / 1e9:.2f} GB)"
            if self.exceeded:  # a real SIGINT to the main thread: it also cuts a blocking call short
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                return

    def __enter__(self) -> DiskGuard:
        # the guard relies on Python's own SIGINT handler (KeyboardInterrupt); whatever ran before in this process
        # (a library, a test) may have replaced it, so it is set for the block and put back after
        self._handler = signal.signal(signal.SIGINT, signal.default_int_handler)
        self._thread.start()
        return self

    def __exit__(self, kind, err, tb) -> None:
        self._stop.set()
        self._thread.join()
        signal.signal(signal.SIGINT, self._handler)
        if self.exceeded and (kind is None or issubclass(kind, KeyboardInterrupt)):
            raise RuntimeError(f"stopped: {self.exceeded}") from None


def twins_config(ctx: Context):
    """The section's shortened twins design (:data:`Sizes.twins_over`) on the work folder's corpus: (config, base)."""
    from seedlab.config import load_config
    from seedlab.twins.config import TwinsConfig

    z = ctx.sizes
    corpus = ctx.corpus(z.twins_corpus)
    over = [f"corpus={corpus}", f"device={ctx.device.type}", *z.twins_over]
    if ctx.dry_run:  # the preset's passages do not fit a row of 128 bytes
        (ctx.work / "fabricated.txt").write_text(PASSAGE)
        over.append(f"passages={{fluent-fabricated: {ctx.work / 'fabricated.txt'}}}")
    return load_config(TwinsConfig, "twins", z.twins_preset, over)


def gpt_config(cfg):
    """The design's GPT at GPT-2's vocabulary (50,304) whatever the corpus's."""
    from seedlab.corpus import load
    from seedlab.lm.gptconfig import PRESETS

    corp = load(cfg.corpus)
    return corp, cfg.gpt_config(max(corp.vocab_size, PRESETS[cfg.model].vocab_size))


def twins(ctx: Context, sec: Section) -> None:
    from seedlab.twins.train import run_twins

    z = ctx.sizes
    cfg, base = twins_config(ctx)
    _, gcfg = gpt_config(cfg)
    need, budget, reserve = twins_disk_bytes(cfg, gcfg), z.twins_disk_gb * 1e9, z.disk_reserve_gb * 1e9
    sec.details["design"] = {k: getattr(cfg, k) for k in ("model", "steps", "injection_step", "batch_size", "micro_batch",
                                                           "checkpoint_every", "arm_batch", "keep")} | {
        "corpus": Path(cfg.corpus).name, "checkpoints": cfg.checkpoint_steps(), "disk_estimate_gb": need / 1e9,
        "disk_budget_gb": z.twins_disk_gb}
    if need > budget:
        raise RuntimeError(f"the design writes ~{need / 1e9:.1f} GB a mode, over the section's disk budget of {z.twins_disk_gb} GB")
    runs, size, empty = {}, f"{cfg.model}, {cfg.steps} updates x {cfg.batch_size} rows", []
    # each folder trained afresh: fork modes fail unless the replica control is bitwise equal, independent on a hash mismatch at s
    for mode, c, independent in (("fork", cfg, False), ("fork-serial", cfg.model_copy(update={"arm_batch": 1}), False),
                                 ("independent", cfg, True)):
        folder = ctx.work / f"twins-{mode}"
        free = shutil.disk_usage(ctx.work).free
        if free < need + reserve:
            raise RuntimeError(f"{free / 1e9:.1f} GB free under {ctx.work}: the {mode} run needs ~{need / 1e9:.1f} GB "
                               f"and {z.disk_reserve_gb} GB stays free")
        t0 = time.perf_counter()
        with DiskGuard(folder, budget, reserve) as guard:
            run_twins(c, folder, base=base, independent=independent, force=True, progress=False)
        dt = time.perf_counter() - t0
        runs[mode] = {k: json.loads((folder / "seed-0" / k / "manifest.json").read_text()) for k in cfg.arm_names}
        integrity = json.loads((folder / "integrity.json").read_text())
        left = folder_bytes(folder)
        shutil.rmtree(folder)  # GPT-2's checkpoints: gigabytes a folder
        arms = integrity.get("arms", "serial")
        sec.details[mode] = {"seconds": dt, "arms": arms, "seed_0": integrity["seeds"]["0"],
                             "disk_peak_seen_gb": max(guard.peak, left) / 1e9, "disk_at_end_gb": left / 1e9}
        if not independent:
            passed, note = replica_check(integrity["seeds"]["0"]["replica"])
            if "compared no step" in note:
                empty.append(mode)
            sec.row(f"{mode}: replica control bitwise", passed, "check", precision=cfg.precision, size=size, seconds=dt,
                    note=f"{note}; arms {arms}")
    for mode in ("fork", "independent"):  # every condition's hash at every checkpoint against the serial fork's
        a, b = runs["fork-serial"], runs[mode]
        equal = {k: {t: a[k][t] == b[k].get(t) for t in a[k]} for k in a}
        sec.details[f"{mode}_equals_fork_serial"] = equal
        same = all(all(v.values()) for v in equal.values())
        sec.row(f"{mode}: hashes = serial fork's", same, "check", precision=cfg.precision, size=size,
                seconds=sec.details[mode]["seconds"] if mode == "independent" else None,
                note="every condition, every checkpoint" if same else f"differs: see {mode}_equals_fork_serial")
    if empty:
        raise RuntimeError(f"the replica control compared no step in {', '.join(empty)}: it has not passed")


# --------------------------------------------------------------------------- mfu


def mfu(ctx: Context, sec: Section) -> None:
    from seedlab.lm.trainer import Trainer

    dev = ctx.device
    batch, micro, steps = ctx.sizes.speed
    cfg, _ = twins_config(ctx)
    corp, gcfg = gpt_config(cfg)
    per_token = gpt_flops_per_token(gcfg)
    sec.details |= {"params_non_embedding_flops_per_token": per_token, "vocab_size": gcfg.vocab_size, "settings": {}}
    modes = (("deterministic", "as the trainer runs: lm/determinism.py settle", contextlib.nullcontext),
             ("not deterministic", "deterministic algorithms off, cuDNN free; the cuBLAS workspace stays", free_kernels))
    todo = len(ctx.precisions) * len(modes)
    for p in ctx.precisions:
        for label, what, settings in modes:
            c = cfg.model_copy(update={"precision": trainer_precision(p), "batch_size": batch, "micro_batch": micro})
            share = sec.left() / todo
            with settings(), precision_flags(p):
                sec.details["settings"][f"{label}, {p}"] = determinism_now()
                trainer = Trainer(c, gcfg, 0, corp.train)
                n, dt = timed(trainer.advance, steps, share / 2, dev)
            todo -= 1
            tok_s = n * batch * gcfg.block_size / dt
            sec.row(f"lm.Trainer {cfg.model}, {label}", tok_s, "tokens/s", precision=p,
                    size=f"{batch} x {gcfg.block_size} tokens", gflops=tok_s * per_token / 1e9, peaks=ctx.peaks,
                    seconds=dt, note=f"{what}; MFU = the % columns; {dt / n:.3f} s/update; {n} updates")
            del trainer
            if dev.type == "cuda":
                torch.cuda.empty_cache()


# --------------------------------------------------------------------------- attribution


def bank_counts(cfg, base: Path) -> tuple[int, int, float]:
    """(runs, updates, GFLOP) of the bank ``cfg``: each seed's arms and replica, its prefix and their updates."""
    from seedlab.attribution.bank.arms import arms
    from seedlab.attribution.bank.texts import load_inputs

    inputs = load_inputs(cfg, base)
    s, end = cfg.injection_step, cfg.end
    runs = sum(len(arms(inputs, k)) + (k in cfg.replica_seeds) for k in cfg.seeds)
    updates = len(cfg.seeds) * s + runs * (end - s)
    return runs, updates, updates * cfg.batch_size * inputs.gcfg.block_size * gpt_flops_per_token(inputs.gcfg) / 1e9


def attribution(ctx: Context, sec: Section) -> None:
    from seedlab.attribution.estimators.attribute import attribute
    from seedlab.attribution.bank.run import run_bank
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.attribution.bank.rundir import BankDir
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
    empty = []
    for name, rec in (("serial", serial), ("stacked", stacked)):
        passed, note = replica_check(rec["seeds_record"][str(one[0])].get("replica", {}))
        if "compared no step" in note:
            empty.append(name)
        sec.row(f"bank {name}: replica control bitwise", passed, "check", precision=cfg.precision, size=f"seed {one[0]}",
                note=note)
    # a control that compared nothing fails the section at its end (what follows needs no replica)

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
    else:
        whole = bank("whole", seeds=seeds[:fit], arm_batch=None)
        est = whole["seconds"] * len(seeds) / fit
        sec.details["whole_bank"] = {"seeds_run": fit, "seeds": len(seeds), "wall_s_all_seeds": est}
        sec.row("whole bank, stacked", est, "s", precision=cfg.precision, size=f"{len(seeds)} seeds",
                note="measured" if fit == len(seeds) else f"{fit} of {len(seeds)} seeds measured, scaled")
    if empty:
        raise RuntimeError(f"the replica control compared no step in the {' and the '.join(empty)} bank: it has not passed")


# --------------------------------------------------------------------------- a section's process


SECTIONS: dict[str, Callable[[Context, Section], None]] = {"peaks": peaks, "shortcut": shortcut, "twins": twins,
                                                           "mfu": mfu, "attribution": attribution}


def run_section(ctx: Context, study: str, deadline: float | None = None, record: Path | None = None) -> dict:
    """One section; a failure is recorded (error, traceback, the rows measured before it), not raised."""
    from seedlab.lm.determinism import settle

    sec = Section(study, deadline, record)
    if study not in ("peaks", "shortcut"):
        settle(ctx.device)  # deterministic algorithms required from here on (the fork commands settle so too)
    try:
        SECTIONS[study](ctx, sec)
        error = tb = None
    except Exception as err:  # the record says what failed; the parent goes on with the next section
        error, tb = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}", traceback.format_exc()
        sec.row("FAILED", error, "error")
    rec = {"complete": True, "ok": error is None, "error": error, "traceback": tb, "process_seconds": time.perf_counter() - sec.t0,
           "determinism": determinism_now(), "details": sec.details, "rows": sec.rows}
    if record is not None:
        write_json(record, rec)
    return rec


def orphan_watch(parent: int) -> None:
    """Exit at once when the parent is gone (killed from outside): no section outlives the check."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def child(args) -> int:
    """A section's process: ``--child STUDY --record FILE``, its record written there after every row."""
    cuda_started = torch.cuda.is_initialized()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # the parent sets it too; before CUDA starts
    orphan_watch(os.getppid())
    dev = torch.device(args.device)
    peaks_file = args.work / "peaks.json"
    ctx = Context(dev, DRY if args.dry_run else FULL, args.dry_run, args.work,
                  json.loads(peaks_file.read_text()) if peaks_file.is_file() else {})
    rec = run_section(ctx, args.child, args.deadline, args.record)
    rec["cuda_started_before_it"] = cuda_started
    write_json(args.record, rec)
    return 0 if rec["ok"] else 1


# --------------------------------------------------------------------------- the parent


def child_argv(study: str, record: Path, work: Path, args, deadline: float | None) -> list[str]:
    """The command of ``study``'s process (this script, ``--child``)."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", study, "--record", str(record), "--work", str(work),
            "--device", args.device, "--out", str(args.out)]
    return argv + (["--dry-run"] if args.dry_run else []) + ([] if deadline is None else ["--deadline", repr(deadline)])


def tail(path: Path, chars: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-chars:]
    return ""


def run_child(argv: list[str], limit: float, record: Path, log: Path, env: dict) -> dict:
    """Run one section's process for at most ``limit`` s (then terminated, killed 1 s later): its record,
    or what it wrote before it was stopped or died, with how it ended."""
    record.unlink(missing_ok=True)
    t0 = time.perf_counter()
    timed_out, rc = False, None
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if rc is None:  # timed out, or the parent itself was interrupted
                proc.terminate()
                try:
                    rc = proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        rc = proc.wait(timeout=2.0)
    seconds = time.perf_counter() - t0
    rec = None
    with contextlib.suppress(OSError, ValueError):
        rec = json.loads(record.read_text())
    if rec is None:
        rec = {"complete": False, "ok": False, "error": None, "traceback": None, "determinism": None, "details": {}, "rows": []}
    if timed_out:
        rec |= {"ok": False, "error": f"timed out: stopped at its limit of {limit:.0f} s"
                + ("" if rec["complete"] else f" ({len(rec['rows'])} rows kept)")}
    elif not rec["complete"]:
        rec |= {"ok": False, "error": f"its process ended (exit code {rc}) before its record was complete"}
    elif rc != 0 and rec["ok"]:
        rec |= {"ok": False, "error": f"its process ended with exit code {rc} after a complete record"}
    if not rec["ok"] and not rec.get("traceback"):
        rec["traceback"] = tail(log)
    return rec | {"seconds": seconds, "limit_s": limit, "timed_out": timed_out, "exit_code": rc}


def parse_budgets(text: str | None, order: list[str]) -> dict[str, float]:
    """``--budget NAME=SECONDS,...`` over :data:`BUDGET_S`, each at least its section's minimum, the sections
    run plus their kill grace and the start inside the 8 minutes (BadInput otherwise)."""
    budgets = dict(BUDGET_S)
    for part in [p.strip() for p in (text or "").split(",") if p.strip()]:
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in BUDGET_S:
            raise BadInput(f"--budget: no section {name!r} (sections: {', '.join(ORDER)})")
        try:
            seconds = float(value)
        except ValueError:
            raise BadInput(f"--budget {part!r}: NAME=SECONDS, e.g. twins=90") from None
        if not seconds >= MIN_BUDGET_S[name]:
            raise BadInput(f"--budget {name}={value.strip()}: below the section's minimum of {MIN_BUDGET_S[name]:.0f} s")
        budgets[name] = seconds
    total = sum(budgets[s] for s in order) + len(order) * KILL_GRACE_S + STARTUP_S
    if total > LIMIT_S:
        raise BadInput(f"--budget: the sections' budgets, {len(order)} x {KILL_GRACE_S:.0f} s of kill grace and "
                       f"{STARTUP_S:.0f} s of start come to {total:.0f} s, over the check's {LIMIT_S:.0f} s")
    return budgets


def parse_only(text: str) -> list[str]:
    """The sections to run, in :data:`ORDER`, the peaks always among them (BadInput on an unknown name)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if bad := [s for s in names if s not in ORDER]:
        raise BadInput(f"--only: no section {bad[0]!r} (sections: {', '.join(ORDER)})")
    return [s for s in ORDER if s == "peaks" or s in names]


def preflight(args) -> str | None:
    """What must hold before any section starts (BadInput, one line, otherwise): the wheel folder (``--wheels``)
    holds every package the image needs, every package seedlab needs is installed here at a version it accepts,
    the sections' modules import. Returns a warning, or None: a seedlab wheel built from other code than this
    checkout's src/ (the check runs the wheel's)."""
    if args.wheels is not None:
        if not args.wheels.is_dir():
            raise BadInput(f"--wheels: no folder {str(args.wheels)!r}")
        if bad := gpu_wheels.problems(args.wheels):
            raise BadInput(f"--wheels: {bad[0]}")
    if bad := gpu_wheels.installed_problems():
        raise BadInput(bad[0])
    for module in SECTION_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise BadInput(f"{module} does not import here: {err} (install the carried wheels first: docs/benchmarks.md)") from None
    return None if args.wheels is None else gpu_wheels.stale(args.wheels)


def cell(v) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "**NO**"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v).replace("|", "/")


def table(result: dict) -> str:
    """The markdown of the check: a heading line, one row per measured thing, a line per section."""
    env = result["environment"]
    head = (f"# GPU check {result['started']}: {result['device_name']} (torch {env['torch']}, CUDA {env['cuda']})"
            f"{' — dry run' if result['dry_run'] else ''}{'' if result['finished'] else ' — unfinished'}\n\n"
            + (f"**Warning**: {result['warning']}\n\n" if result.get("warning") else ""))
    lines = ["| " + " | ".join(ROW_KEYS) + " |", "|" + "---|" * len(ROW_KEYS)]
    for sec in result["sections"].values():
        lines += ["| " + " | ".join(cell(row[k]) for k in ROW_KEYS) + " |" for row in sec["rows"]]
    tail_lines = [f"- {study}: {s['seconds']:.0f} s (limit {s['limit_s']:.0f} s); " + ("ok" if s["ok"] else f"FAILED: {s['error']}")
                  for study, s in result["sections"].items()]
    return head + "\n".join(lines) + "\n\n" + "\n".join(tail_lines) + "\n"


def save(result: dict, out: Path) -> None:
    write_json(out / "gpu_check.json", result)
    (out / "gpu_check.md").write_text(table(result))


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise BadInput(message)


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where gpu_check.json and gpu_check.md are written")
    ap.add_argument("--only", default=",".join(STUDIES), help=f"comma-separated sections (default: {','.join(STUDIES)}; "
                                                              "the peaks always run)")
    ap.add_argument("--budget", default=None, help="NAME=SECONDS,... over the default budgets "
                                                   f"({', '.join(f'{k} {v:.0f}' for k, v in BUDGET_S.items())})")
    ap.add_argument("--wheels", type=Path, default=None, help="the carried wheel folder (.whl): checked before anything runs")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dry-run", action="store_true", help="CPU sizes, no time budget inside a section: the test's run")
    ap.add_argument("--work", type=Path, default=None, help="run folders and corpora (default: a temporary folder, removed)")
    ap.add_argument("--child", choices=ORDER, help=argparse.SUPPRESS)
    ap.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    t0 = time.time()
    try:
        args = parser().parse_args(argv)
        if args.child:
            return child(args)
        order = parse_only(args.only)
        budgets = parse_budgets(args.budget, order)
        if torch.device(args.device).type != "cuda" and not args.dry_run:
            raise BadInput(f"--device {args.device}: the GPU's sizes on a CPU would only run out their budgets; add --dry-run")
        warning = preflight(args)
    except BadInput as err:
        print(f"gpu_check: {err}", file=sys.stderr)
        return 2
    if warning:
        print(f"gpu_check: warning: {warning}", file=sys.stderr)
    had = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": had or CUBLAS_WORKSPACE, "PYTHONUNBUFFERED": "1"}
    work = Path(tempfile.mkdtemp(prefix="seedlab-gpu-check-")) if args.work is None else args.work
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    end = t0 + LIMIT_S - STARTUP_S  # the sections' time ends here whatever the start took
    result = {"check": "benchmarks/gpu_check.py", "started": time.strftime("%Y-%m-%d %H:%M"), "finished": False,
              "dry_run": args.dry_run, "device": torch.device(args.device).type, "device_name": "unknown: no peaks section yet",
              "environment": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
              "determinism": {"cublas_workspace_config": env["CUBLAS_WORKSPACE_CONFIG"],
                              "cublas_workspace_config_was_set": had is not None, "cuda_started_before_it": False},
              "peaks_gflops": {}, "sizes": asdict(DRY if args.dry_run else FULL),
              "budget_s": None if args.dry_run else {s: budgets[s] for s in order}, "limit_s": None if args.dry_run else LIMIT_S,
              "wheels": None if args.wheels is None else str(args.wheels), "warning": warning, "sections": {}}
    save(result, args.out)
    main_thread = threading.current_thread() is threading.main_thread()
    stop = signal.getsignal(signal.SIGTERM)
    if main_thread:  # killed from outside: SystemExit, and run_child's finally ends the section's process too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for study in order:
            if args.dry_run:
                limit, deadline = DRY_LIMIT_S, None
            else:
                limit = min(budgets[study], end - time.time() - KILL_GRACE_S)
                deadline = time.time() + limit
            print(f"gpu_check: {study} ...", file=sys.stderr, flush=True)
            if not args.dry_run and limit < MIN_BUDGET_S[study]:
                rec = {"complete": False, "ok": False, "error": f"not run: {max(limit, 0):.0f} s left of the "
                       f"{LIMIT_S:.0f} s, under its minimum of {MIN_BUDGET_S[study]:.0f} s", "traceback": None,
                       "determinism": None, "details": {}, "rows": [], "seconds": 0.0, "limit_s": max(limit, 0.0),
                       "timed_out": False, "exit_code": None}
            else:
                record = work / f"section-{study}.json"
                rec = run_child(child_argv(study, record, work, args, deadline), limit, record, work / f"section-{study}.log", env)
            rec |= {"budget_s": None if args.dry_run else budgets[study], "over_budget": rec["timed_out"]}
            result["sections"][study] = rec
            if study == "peaks" and rec["details"].get("device_name"):
                d = rec["details"]
                result |= {"device_name": d["device_name"], "environment": result["environment"] | d.get("environment", {}),
                           "peaks_gflops": {"measured": d.get("measured"), "datasheet": d.get("datasheet"),
                                            "datasheet_model": d.get("datasheet_model"), "datasheet_why": d.get("datasheet_why")}}
            if rec.get("cuda_started_before_it"):
                result["determinism"]["cuda_started_before_it"] = True
            if rec.get("determinism"):
                result["determinism"] |= rec["determinism"]  # as the last section left them
            result["seconds"] = time.time() - t0
            save(result, args.out)
            print(f"gpu_check: {study} {'ok' if rec['ok'] else 'FAILED: ' + str(rec['error'])} "
                  f"({rec['seconds']:.0f} s of {rec['limit_s']:.0f})", file=sys.stderr, flush=True)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, stop)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result |= {"finished": True, "seconds": time.time() - t0}
    save(result, args.out)
    print(table(result))
    return 0 if all(s["ok"] for s in result["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
