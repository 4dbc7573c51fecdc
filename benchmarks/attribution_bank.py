"""The attribution bank's cost, in one run, on the mini design (the preset attribution/mini, one seed):

1. **bank vs independent twins**: ``run_bank`` for one seed and K candidates (shared prefix trained
   once, twin, replica control, K forks) against training each candidate's run *from scratch*
   (steps 0 .. end with the candidate injected at s, the same query evaluations and hashes), timed
   for ``--scratch`` candidates and extrapolated to K; and the from-scratch runs' weights at every
   horizon compared with the bank's manifests (they must be bitwise equal);
2. **estimators vs one candidate run**: each estimator of ``seedlab attribution attribute`` on
   that bank (all K candidates and every query at once), timed alone, against the wall time of one
   candidate's fork (s .. end, query evaluations included) — per estimator call and per candidate —
   and against the bank's training of the same K candidates (``unroll``'s goal: at most 2x);
3. **damping sweep** (``--damping``, optional): EK-FAC at each λ (``attribute.damping``; "auto":
   kronfluence's heuristic), printing how the estimate's scale (median |estimate| / median
   |measured|) and its rank agreement with the measured effects (Spearman across candidates per
   query, mean over queries and seeds, per query kind at the first and last horizon) move with λ.

How it times (benchmarks/timing.py; docs/benchmarks.md, "How to measure"): part 1's bank and from-scratch
runs take turns (bank, scratch, bank, scratch, ...), part 2's fork and estimators too (fork, sgd, adam, ...),
each for ``--repeats`` rounds, the best of each kept (an estimator's time is its own clock in
attribution.json, without the parquet I/O); everything at one thread count (``--threads``, else the config's),
set before every call; the load average before and after is printed beside each part.

Usage (about 8 minutes on this 2-core machine with the defaults, two rounds of everything):

    python benchmarks/attribution_bank.py [--corpus runs/corpus-embedded-bpe] [--candidates 16] [--scratch 2]
                                          [--threads N] [--repeats 2] [--estimators sgd,adam,tracin,cosine,ekfac,unroll]
                                          [--damping auto,1e-4,1e-3,1e-2,1e-1] [--fit-rows 256]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from itertools import count
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved

from seedlab.attribution.estimators.attribute import attribute
from seedlab.attribution.bank.run import run_bank
from seedlab.attribution.bank.config import AttributionConfig

from seedlab.attribution.bank.rundir import BankDir
from seedlab.attribution.bank.texts import load_inputs
from seedlab.config import load_config
from seedlab.forks.arms import injection
from seedlab.forks.prefix import advance_to
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes
from seedlab.measures.text import text_ce


def candidate_run(inputs, seed: int, name: str, texts: dict, prefix: Path | None = None) -> tuple[float, dict]:
    """One candidate's run as the bank trains it (hashes at s and every horizon, the texts' losses at
    every horizon): from the saved ``prefix`` state (a fork), or from step 0 (None: no shared prefix).
    Returns (wall seconds, {step: hashes})."""
    cfg = inputs.cfg
    s, horizons = cfg.injection_step, set(cfg.horizon_steps())
    passage = inputs.candidates_of(seed)[name].tokens
    manifest: dict[str, dict[str, str]] = {}

    def visit(tr: Trainer) -> None:
        manifest[str(tr.step)] = tensor_hashes(tr.weights())
        if tr.step in horizons:
            for ids in texts.values():
                text_ce(tr.model, ids)

    t0 = time.perf_counter()
    trainer = Trainer(cfg, inputs.gcfg, seed, inputs.corpus.train)
    if prefix is not None:
        trainer.load_state(prefix)
    advance_to(trainer, cfg.end, arm=injection(name, passage, s, cfg.injection_row), pad_id=inputs.pad_id,
               stops={s, *horizons}, visit=visit)
    return time.perf_counter() - t0, manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="mini", help="attribution preset or YAML (default: mini)")
    ap.add_argument("--corpus", default=None, help="the prepared corpus (default: the config's)")
    ap.add_argument("--candidates", type=int, default=16, help="K held-out candidate rows (no passage file)")
    ap.add_argument("--scratch", type=int, default=2, help="candidates also trained from scratch (timed, compared)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads of every side (default: the config's)")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a field of the design (as the CLI's --set), e.g. injection_step=20")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds of parts 1 and 2, the best of each kept")
    ap.add_argument("--estimators", default="sgd,adam,tracin,cosine,ekfac,unroll")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--damping", default=None, help="EK-FAC damping sweep: comma-separated λ values, 'auto' = "
                    "kronfluence's heuristic (default: no sweep)")
    ap.add_argument("--fit-rows", type=int, default=None, help="attribute.fit_rows for the sweep (default: the config's)")
    args = ap.parse_args()
    over = [f"seeds=[{args.seed}]", f"candidates.heldout={args.candidates}", "candidates.file=null",
            *([f"corpus={args.corpus}"] if args.corpus else []), *([f"threads={args.threads}"] if args.threads else []),
            *args.settings]
    cfg, base = load_config(AttributionConfig, "attribution", args.config, over)
    threads = cfg.threads or torch.get_num_threads()  # every side of every ratio at this count
    if args.repeats < 1:
        ap.error(f"--repeats: at least 1, got {args.repeats}")
    torch.set_num_threads(threads)
    inputs = load_inputs(cfg, base)
    s, end, K = cfg.injection_step, cfg.end, args.candidates
    print(f"design: {cfg.model} block {inputs.gcfg.block_size}, batch {cfg.batch_size}, s = {s}, end = {end}, "
          f"K = {K} candidates, queries {len(inputs.queries)} + self; torch {torch.__version__}, "
          f"{threads} thread(s), {platform.processor() or platform.machine()}", flush=True)
    out: dict = {"K": K, "s": s, "end": end, "threads": threads}
    with tempfile.TemporaryDirectory(prefix="seedlab-bench-bank-") as tmp:
        banks = count()
        bank = Path(tmp) / "bank"

        def train_bank() -> None:
            nonlocal bank
            bank = Path(tmp) / f"bank-{next(banks)}"
            run_bank(cfg, bank, base=base, progress=False)

        queries = {n: t.tokens for n, t in inputs.queries.items()}
        names = list(inputs.candidates_of(args.seed))[: args.scratch]
        scratch: list[dict] = []

        def from_scratch() -> None:
            scratch.append({name: candidate_run(inputs, args.seed, name, {name: inputs.candidates[name].tokens} | queries)[1]
                            for name in names})

        t1 = interleaved({"bank": train_bank, "scratch": from_scratch}, args.repeats, threads=threads)
        rd = BankDir(bank)
        equal = all(m == rd.candidate(args.seed, name).read_manifest() for run in scratch for name, m in run.items())
        out["bank_s"] = t1.best["bank"]
        arms = 2 if cfg.candidates.replicate_row is not None else 1  # each candidate's fork (and its replicate)
        steps_bank = s + (arms * K + 2) * (end - s)  # prefix + twin + replica + the candidates' forks
        per = t1.best["scratch"] / len(names)
        out |= {"scratch_per_candidate_s": per, "scratch_equal_to_bank": equal, "independent_K_s": per * K,
                "bank_over_independent": out["bank_s"] / (per * K), "part1_conditions": t1.conditions()}
        print(f"1. ({t1.conditions()})\n   bank: {out['bank_s']:.1f} s for {steps_bank} updates ({out['bank_s'] / K:.2f} s "
              "per candidate, prefix, twin and replica included)", flush=True)
        print(f"   from scratch: {per:.2f} s per candidate ({end} updates) -> K runs {per * K:.1f} s; "
              f"bank / independent = {out['bank_s'] / (per * K):.2f}x (by update count "
              f"{steps_bank / (K * end):.2f}x); scratch runs bitwise equal to the bank's forks: {equal}", flush=True)
        first = names[0]
        texts = {first: inputs.candidates[first].tokens} | queries

        def fork() -> dict:
            sec, manifest = candidate_run(inputs, args.seed, first, texts, rd.prefix(args.seed))
            assert manifest == rd.candidate(args.seed, first).read_manifest()
            return {"seconds": sec}

        def estimator(est: str):
            def fn() -> dict:
                t0 = time.perf_counter()
                attribute(bank, estimators=[est], progress=False)
                wall = time.perf_counter() - t0
                inner = json.loads(rd.attribution_json.read_text())["seconds"][est][str(args.seed)]
                return {"seconds": inner, "wall_with_io_s": wall}

            return fn

        estimators = args.estimators.split(",")
        t2 = interleaved({"fork": fork, **{e: estimator(e) for e in estimators}}, args.repeats, threads=threads)
        fork_s = out["fork_s"] = t2.best["fork"]
        out["part2_conditions"] = t2.conditions()
        print(f"2. ({t2.conditions()})\n   one candidate fork ({end - s} updates + queries): {fork_s:.2f} s", flush=True)
        est = {}
        for name in estimators:
            inner = t2.best[name]
            est[name] = {"seconds": inner, "wall_with_io_s": t2.best_stats(name)["wall_with_io_s"],
                         "per_candidate_s": inner / K, "vs_one_fork": inner / fork_s,
                         "per_candidate_vs_one_fork": inner / K / fork_s, "vs_bank": inner / out["bank_s"]}
            print(f"   {name:<7} {inner:7.2f} s for {K} candidates x all queries x horizons "
                  f"({inner / fork_s:.2f} candidate runs; per candidate {inner / K / fork_s:.3f}; "
                  f"{inner / out['bank_s']:.2f}x the bank's training of the same candidates)", flush=True)
        out["estimators"] = est
        if args.damping:
            out["damping"] = damping_sweep(bank, args.damping.split(","), args.fit_rows)
    print(json.dumps(out, indent=1))


def _spearman(g: pd.DataFrame) -> float:
    if g.estimate.nunique() < 2 or g.measured.nunique() < 2:
        return float("nan")
    return float(g.estimate.rank().corr(g.measured.rank()))


def damping_sweep(bank: Path, values: list[str], fit_rows: int | None) -> dict:
    """EK-FAC at every λ of ``values`` on the bank: the estimate's scale and its rank agreement."""
    extra = [f"attribute.fit_rows={fit_rows}"] if fit_rows else []
    print("3. EK-FAC damping sweep: scale = median |estimate| / median |measured|; Spearman across candidates "
          "(mean over queries and seeds) per query kind at the first / last horizon", flush=True)
    out = {}
    for lam in values:
        lam = lam.strip()
        df = attribute(bank, estimators=["ekfac"], progress=False,
                       settings=[f"attribute.damping={'null' if lam == 'auto' else repr(float(lam))}", *extra])
        d = df[df.candidate_kind != "control"]
        scale = float(d.estimate.abs().median() / d.measured.abs().median())
        rho = pd.Series({k: _spearman(g) for k, g in d.groupby(["query_kind", "horizon", "seed", "query"])})
        rho = rho.groupby(level=[0, 1]).mean()
        first, last = min(d.horizon), max(d.horizon)
        per_kind = {k: (float(rho.get((k, first), np.nan)), float(rho.get((k, last), np.nan)))
                    for k in dict.fromkeys(d.query_kind)}
        out[lam] = {"median_abs_estimate": float(d.estimate.abs().median()), "scale": scale,
                    "spearman_first_last": per_kind}
        print(f"   λ = {lam:>6}: median |estimate| {out[lam]['median_abs_estimate']:.3g}, scale {scale:.3g}; "
              + ", ".join(f"{k} {a:+.2f} / {b:+.2f}" for k, (a, b) in per_kind.items()), flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
