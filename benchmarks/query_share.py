"""How much of a bank fork's time its query losses take: the lever of batching them through the stack, measured.

A fork of the attribution bank trains ``end - s`` updates and, at each of its horizons, evaluates the loss of its own
text and of every query (``seedlab.measures.text.text_ce``: one forward of one row per text). Batching those
forwards through the stack could at most remove their time, so their share of a fork bounds the gain. Timed here,
interleaved (benchmarks/timing.py: A, B, A, B, best of each, one thread count set before every call, the load
average before and after):

- **update**: one ``Trainer.advance`` of the design (its batch, forward, backward, clip, AdamW);
- **texts**: one horizon's evaluations of a fork (its own text and every query) — and of the twin (every candidate
  and every query).

The shares follow: a fork ``H * texts / ((end - s) * update + H * texts)`` with ``H`` horizons; the twin's the same
over ``end`` updates. Usage (about a minute):

    python benchmarks/query_share.py [--config mini] [--corpus runs/corpus-embedded-bpe] [--threads 1] [--repeats 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved

from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.texts import load_inputs
from seedlab.config import load_config
from seedlab.lm.trainer import Trainer
from seedlab.measures.text import text_ce


def shares(update: float, fork_texts: float, twin_texts: float, *, horizons: int, after: int, end: int) -> dict:
    """The query losses' share of a fork's and of the twin's time, from one update's and one horizon's seconds."""
    fork = horizons * fork_texts / (after * update + horizons * fork_texts)
    twin = horizons * twin_texts / (end * update + horizons * twin_texts)
    return {"fork": fork, "twin": twin}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="mini", help="attribution preset or YAML (default: mini)")
    ap.add_argument("--corpus", default=None, help="the prepared corpus (default: the config's)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads of both sides (default 1, the preset's)")
    ap.add_argument("--repeats", type=int, default=30, help="interleaved rounds, the best of each kept")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE")
    args = ap.parse_args(argv)
    over = ["seeds=[0]", *([f"corpus={args.corpus}"] if args.corpus else []), *args.settings]
    cfg, base = load_config(AttributionConfig, "attribution", args.config, over)
    inputs = load_inputs(cfg, base)
    trainer = Trainer(cfg, inputs.gcfg, 0, inputs.corpus.train)
    queries = [t.tokens for t in inputs.queries.values()]
    candidates = [t.tokens for t in inputs.candidates_of(0).values()]
    fork_texts = [candidates[0], *queries]  # a fork: its own text and every query
    twin_texts = [*candidates, *queries]

    def update() -> None:
        trainer.advance(None, pad_id=inputs.pad_id)

    def texts(which):
        def go() -> None:
            for ids in which:
                text_ce(trainer.model, ids)
        return go

    timed = interleaved({"update": update, "fork texts": texts(fork_texts), "twin texts": texts(twin_texts)},
                        repeats=args.repeats, threads=args.threads, warmup=2)
    best = timed.best
    H, s, end = len(cfg.horizon_steps()), cfg.injection_step, cfg.end
    out = shares(best["update"], best["fork texts"], best["twin texts"], horizons=H, after=end - s, end=end)
    print(f"design: {cfg.model}, block {inputs.gcfg.block_size}, batch {cfg.batch_size}, s = {s}, end = {end}, {H} horizons; "
          f"{len(fork_texts)} texts a fork, {len(twin_texts)} the twin; {timed.conditions()}")
    print(f"one update {best['update'] * 1e3:.2f} ms; one horizon's texts: a fork {best['fork texts'] * 1e3:.2f} ms, "
          f"the twin {best['twin texts'] * 1e3:.2f} ms")
    print(f"query losses' share: a fork {out['fork']:.1%}, the twin {out['twin']:.1%} (the most batching them could save)")
    return {**best, **out}


if __name__ == "__main__":
    main()
