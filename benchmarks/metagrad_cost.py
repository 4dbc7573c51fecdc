"""metagrad's cost like for like (docs/benchmarks.md, "metagrad against one training run"): one query, one horizon,
the whole run, timed beside one training run of the same design in the same process.

- **train**: one training run of the design from the seed's initialisation to the horizon (the bank's ``Trainer``,
  the ordinary (seed, t) batches, nothing evaluated or written);
- **metagrad**: attribution/estimators/metagrad.py ``adjoints`` for one query at that horizon over every row of
  the run (``first=0``): the replay from step 0 and the backward pass down to step 0, with its defaults (every
  complete state kept when they fit in 1 GiB, else the smallest checkpoint spacing that fits) unless ``--every``
  says otherwise. No bank is read: the replay is not hash-checked against a twin (the check reads a few manifest
  steps; ``seedlab attribution metagrad`` does it). Its own clock splits its best round into the replay (a
  training run that keeps the states) and the backward pass: MAGIC's 2-3x is quoted for the whole of its method
  (arXiv 2504.16430's abstract), whose forward pass is the training run that keeps its checkpoints, so the replay
  is part of the like-for-like number here, and the split says what the backward pass alone costs.

How it times (benchmarks/timing.py; docs/benchmarks.md, "How to measure"): the two take turns (train, metagrad,
train, metagrad, ...) for ``--repeats`` rounds after one untimed round of each, the best (minimum) of each kept, both
at one thread count (``--threads``, else the design's) set before every call; the load average is printed before
and after, with every round's ratio. ``--out FILE`` also writes it all as JSON. glibc's allocator is tuned as the
CLI tunes it at start-up (seedlab/machine.py ``tune_allocator``: freed activations kept rather than returned to the
OS; without it the VJP's multi-MB buffers cost page faults, ~25 % of metagrad's time on mini), for both sides.

    python benchmarks/metagrad_cost.py                                   # a tiny design built here (seconds)
    python benchmarks/metagrad_cost.py --design mini --repeats 3         # the mini bank's design (~2 x 30 s a round)

``--design``: a bank config (a preset name of ``seedlab attribution bank`` or a YAML file; its corpus must be
prepared, e.g. runs/corpus-embedded-bpe for mini); ``--horizon``: updates completed (default: the design's end);
``--query``: one of the design's queries (default: its first). The tiny default (GPT mini on 32-byte rows, 4 rows a
batch, 14 updates, the embedded corpus as bytes, prepared in a temporary folder) is what
tests/common/test_bench_metagrad.py runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved, load

#: the tiny default design (tests/attribution/conftest.py's TINY_BANK, one seed, one held-out query)
TINY = {"model": "mini", "block_size": 32, "batch_size": 4, "steps": 14, "injection_step": 4, "seeds": [0],
        "horizons": ["end"], "peak_lr": 1e-2, "threads": 1, "candidates": {"heldout": 1, "own_row": False},
        "queries": {"own": False, "heldout": 1}}


def tiny_design(folder: Path) -> Path:
    """The tiny design's config in ``folder`` (its corpus prepared there: the embedded text as bytes, 200 kB)."""
    import yaml

    from seedlab.corpus import prepare

    prepare("embedded", folder / "corpus", tokenizer="bytes", max_bytes=200_000)
    path = folder / "design.yaml"
    path.write_text(yaml.safe_dump({**TINY, "corpus": str(folder / "corpus")}))
    return path


def measure(design: str | Path, *, seed: int | None = None, query: str | None = None, horizon: int | None = None,
            repeats: int = 3, threads: int | None = None, every: int | None = None, device: str = "cpu") -> dict:
    """The two timed side by side (module doc): a dict of the design, the settings, every round's seconds, the
    best of each, their ratio and metagrad's counts."""
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.attribution.bank.texts import load_inputs
    from seedlab.attribution.estimators.metagrad import adjoints
    from seedlab.config import load_config
    from seedlab.lm.determinism import settle
    from seedlab.lm.distributed import World
    from seedlab.lm.trainer import Trainer

    cfg, base = load_config(AttributionConfig, "attribution", str(design))
    inputs = load_inputs(cfg, base)
    seed = cfg.seeds[0] if seed is None else seed
    H = cfg.end if horizon is None else horizon
    if not 0 < H <= cfg.steps:
        raise SystemExit(f"--horizon: must be in 1 .. {cfg.steps}, got {H}")
    names = list(inputs.queries)
    name = query or names[0]
    if name not in inputs.queries:
        raise SystemExit(f"--query: one of {', '.join(names)}, got {name!r}")
    q = {name: inputs.queries[name].tokens}
    dev = World().device(device)
    threads = threads or cfg.threads or torch.get_num_threads()
    settle(dev, threads)
    run_cfg = cfg.model_copy(update={"device": str(dev)})

    def fresh() -> Trainer:
        return Trainer(run_cfg, inputs.gcfg, seed, inputs.corpus.train)

    def train() -> None:
        tr = fresh()
        while tr.step < H:
            tr.advance()

    def metagrad() -> dict:
        adj = adjoints(fresh(), q, [H], first=0, every=every)
        return {"every": adj.every, "updates_replayed": adj.replayed, "vjps": adj.vjps, "states_held": adj.held,
                "replay_s": adj.seconds["replay"], "backward_s": adj.seconds["backward"]}

    t = interleaved({"train": train, "metagrad": metagrad}, repeats, threads=threads, dev=dev, warmup=1)
    P = sum(p.numel() for p in fresh().params)
    return {"design": str(design), "model": inputs.gcfg.model_dump(), "parameters": P, "batch_size": cfg.batch_size,
            "seed": seed, "query": name, "horizon": H, "device": str(dev), "threads": t.threads,
            "torch": torch.__version__, "machine": platform.node(), "load_before": t.load_before,
            "load_after": t.load_after, "times": t.times, "best": t.best, "ratio": t.ratio("metagrad", "train"),
            "round_ratios": t.round_ratios("metagrad", "train"), "metagrad": t.best_stats("metagrad"),
            "conditions": t.conditions()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--design", help="a bank config: preset name (e.g. mini) or YAML file; default: the tiny design")
    ap.add_argument("--seed", type=int, help="the training seed (default: the design's first)")
    ap.add_argument("--query", help="the query (default: the design's first)")
    ap.add_argument("--horizon", type=int, help="updates completed (default: the design's end)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds of each, after one untimed round")
    ap.add_argument("--threads", type=int, help="one thread count for both (default: the design's)")
    ap.add_argument("--every", type=int, help="metagrad's checkpoint spacing (default: its memory budget's)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    ap.add_argument("--out", type=Path, help="also write the result as JSON")
    a = ap.parse_args(argv)
    from seedlab.machine import tune_allocator

    allocator = tune_allocator()  # as the CLI does at start-up: freed activations kept, fewer page faults, same bits
    print(f"# load average {load():.2f} at the start; torch {torch.__version__}, {platform.node()}; allocator "
          f"{allocator or 'as glibc set it'}")
    with tempfile.TemporaryDirectory() as tmp:
        design = a.design or tiny_design(Path(tmp))
        r = measure(design, seed=a.seed, query=a.query, horizon=a.horizon, repeats=a.repeats, threads=a.threads,
                    every=a.every, device=a.device)
    r["design"] = a.design or "tiny (benchmarks/metagrad_cost.py TINY)"
    m = r["metagrad"]
    print(f"design {r['design']}: {r['parameters']:,} parameters, B {r['batch_size']}, seed {r['seed']}, query "
          f"{r['query']}, horizon {r['horizon']} (the whole run from step 0), {r['device']}")
    print(f"one training run: {r['best']['train']:.3f} s; metagrad, one query, one horizon: "
          f"{r['best']['metagrad']:.3f} s ({m['updates_replayed']} updates replayed, {m['vjps']} VJPs, "
          f"every {m['every']}, {m['states_held']} complete states held)")
    print(f"ratio {r['ratio']:.2f}x (rounds: {', '.join(f'{v:.2f}' for v in r['round_ratios'])}); {r['conditions']}")
    print(f"of metagrad's best round: the replay {m['replay_s']:.3f} s ({m['replay_s'] / r['best']['train']:.2f}x the "
          f"training run), the backward pass {m['backward_s']:.3f} s ({m['backward_s'] / r['best']['train']:.2f}x)")
    if a.out:
        a.out.write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
