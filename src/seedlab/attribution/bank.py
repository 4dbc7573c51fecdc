"""The counterfactual bank: per seed, one shared prefix and a single-row fork for every candidate.

Per seed k (the batch of step t is a pure function of (k, t), lm/batches.py):

1. the **shared prefix** — updates 0 .. s-1 — is trained once and its complete state (weights
   and AdamW moments) kept in ``seed-<k>/prefix.safetensors``: every fork starts from it, and
   the estimators read θ_s and the optimizer's preconditioner from it;
2. the **twin** is forked from it and trained on the ordinary batches to the end; its weights are
   saved at s, at every horizon and at TracIn's cadence (``AttributionConfig.twin_steps``);
3. the **replica control** (seeds of ``replicas``; null: the first) trains the twin a second time
   from the prefix: its weights must hash the same at every saved step, or the bank stops with a
   one-line error — the evidence that training after s is deterministic, so every difference
   between a candidate's run and the twin is caused by the row;
4. every **candidate** is forked from the prefix; at step s its tokens replace row
   ``injection_row`` (lm/batches.py ``inject``: the passage, then padding the loss masks; the
   loss keeps the denominator N = B·T, so the batch differs from the twin's by the row alone).
   No weights are stored: the SHA-256 of every tensor at s and every horizon goes to its
   manifest, and the loss of its own text and of every query (:func:`seedlab.attribution.query_loss`)
   at every horizon to ``queries.parquet`` (attribution/measure.py turns those into Δ L_query);
5. the **own-row control** (``candidates.own_row``): a candidate equal to the replaced row must be
   bitwise the twin at every horizon (measured 0), or the bank stops.

The twin records every text's loss (all candidates' and the queries) at every horizon.
``integrity.json`` records what was shown. **Resume**: a finished run (its done marker) is skipped;
an unfinished one restarts from the kept prefix; the prefix itself is read back if it was saved.
Where each file lives: attribution/rundir.py. Single process, on ``device`` (no torchrun).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from seedlab.attribution.config import AttributionConfig
from seedlab.attribution.estimators import query_loss
from seedlab.attribution.measure import write_measured
from seedlab.attribution.rundir import BankDir, ForkFolder
from seedlab.attribution.texts import Inputs, load_inputs
from seedlab.errors import SeedlabError
from seedlab.lm.distributed import World
from seedlab.lm.forks import SharedPrefix, advance_to, first_difference, replica_control
from seedlab.lm.trainer import Trainer, make_deterministic, nondeterminism_is_an_error
from seedlab.progress import Bar
from seedlab.store import folder_lock, tensor_hashes, write_json, write_parquet, write_safetensors


def config_record(cfg: AttributionConfig) -> dict:
    """What config.json holds: the resolved config (what makes a folder hold the same design)."""
    return cfg.model_dump(mode="json")


def run_bank(cfg: AttributionConfig, out: str | Path, *, base: Path = Path("."), force: bool = False,
             progress: bool = True) -> pd.DataFrame:
    """Train (or finish) the bank in ``out`` and write its measured effects; returns measured.parquet's frame.

    Every input is checked before the folder is touched (corpus hashes, every text's length, the
    folder's design): bad input writes nothing. ``base``: the config file's folder."""
    inputs = load_inputs(cfg, base)
    rd = BankDir(Path(out))
    record = config_record(cfg)
    rd.claim(record, force=force)  # another design refused (one line); the same one resumes
    rd.check_inputs(inputs.record())
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    make_deterministic(World().device(cfg.device))
    rd.start(record, inputs.record())
    s, end = cfg.injection_step, cfg.end
    runs = [1 + len(inputs.candidates_of(k)) + (k in cfg.replica_seeds) for k in cfg.seeds]
    total = sum(s + n * (end - s) for n in runs)
    integrity: dict = {"seeds": {}}
    with folder_lock(rd.root, "{folder} is in use by another bank (pid {pid})"), \
            Bar("bank", total, "steps", enabled=progress) as bar, nondeterminism_is_an_error():
        for seed in cfg.seeds:
            integrity["seeds"][str(seed)] = bank_seed(rd, inputs, seed, bar)
        write_json(rd.integrity, integrity)
    return write_measured(rd.root)


def bank_seed(rd: BankDir, inputs: Inputs, seed: int, bar: Bar) -> dict:
    """One seed: prefix, twin, replica control, every candidate (resuming what is finished).
    Returns the seed's integrity record."""
    cfg = inputs.cfg
    s, end = cfg.injection_step, cfg.end
    new_trainer = partial(Trainer, cfg, inputs.gcfg, seed, inputs.corpus.train)
    prefix = SharedPrefix(rd.prefix(seed), new_trainer, s, on_step=bar.advance)
    if prefix.saved:
        bar.advance(s)  # trained before an interruption
    else:
        bar.start_sub(f"seed {seed}: shared prefix", s)
    horizons = list(cfg.horizon_steps())
    candidates = inputs.candidates_of(seed)
    texts = {n: t.tokens for n, t in candidates.items()} | {n: t.tokens for n, t in inputs.queries.items()}
    fork = partial(run_fork, cfg=cfg, prefix=prefix, horizons=horizons, pad_id=inputs.pad_id, bar=bar)
    twin = fork(rd.twin(seed), None, texts, label=f"seed {seed} twin", keep=cfg.twin_steps())
    record: dict = {"identical_at_injection": "by construction: every run forked from one copy of the prefix"}
    if seed in cfg.replica_seeds:
        record["replica"] = replica(rd.replica(seed), prefix, twin, end, seed, bar)
    queries = {n: t.tokens for n, t in inputs.queries.items()}
    for name, t in candidates.items():
        manifest = fork(rd.candidate(seed, name), t.tokens, {name: t.tokens} | queries, label=f"seed {seed} {name}")
        if t.kind == "control":
            record["own_row"] = own_row_control(manifest, twin, seed)
    return record


def run_fork(where: ForkFolder, passage: Sequence[int] | None, texts: Mapping[str, Sequence[int]], *,
             cfg: AttributionConfig, prefix: SharedPrefix, horizons: list[int], pad_id: int, bar: Bar, label: str,
             keep: Sequence[int] = ()) -> dict[str, dict[str, str]]:
    """One run forked from the prefix at s, with ``passage`` in the injected row (None: the twin),
    to the end. At s and every horizon: the weights' hashes; at every horizon: every text's
    L_query; at the steps of ``keep``: the weights themselves. A finished run is read back; an
    unfinished one starts over from the prefix. Returns its manifest ``{step: hashes}``."""
    s, end = cfg.injection_step, cfg.end
    if where.finished:
        bar.advance(end - s)
        return where.read_manifest()
    where.clear()  # what an interruption left
    trainer, _ = prefix.fork()
    bar.start_sub(label, end - s)
    manifest: dict[str, dict[str, str]] = {}
    rows: list[dict] = []
    want = set(horizons)

    def visit(tr: Trainer) -> None:
        t, weights = tr.step, tr.weights()
        manifest[str(t)] = tensor_hashes(weights)
        if t in keep:
            write_safetensors(where.checkpoint(t), weights, {"step": str(t), "seed": str(tr.seed), "run": label})
        if t in want:
            rows.extend({"step": t, "text": n, "loss": query_loss(tr.model, ids)} for n, ids in texts.items())

    losses = advance_to(trainer, end, passage=passage, at=s, row=cfg.injection_row, pad_id=pad_id,
                        stops={s, *want, *keep}, visit=visit, on_step=partial(bar.step, label))
    write_parquet(where.queries, pd.DataFrame(rows, columns=["step", "text", "loss"]))
    write_parquet(where.losses, pd.DataFrame({"step": range(s, end), "loss": losses}))
    write_json(where.manifest, manifest)
    where.mark_finished(end)
    return manifest


def replica(where: ForkFolder, prefix: SharedPrefix, twin: dict[str, dict[str, str]], end: int, seed: int, bar: Bar) -> dict:
    """The twin trained a second time from the prefix; bitwise equal at every saved step, or a
    one-line error. Writes only its record (``replica/manifest.json``) and done marker."""
    s = prefix.step
    if where.finished:
        bar.advance(end - s)
        return where.read_manifest()["record"]
    trainer, _ = prefix.fork()
    bar.start_sub(f"seed {seed} replica control", end - s)
    compared = replica_control(trainer, twin, end, what=f"seed {seed}: the replica control",
                               on_step=partial(bar.step, f"seed {seed}: replica control"))
    record = {"bitwise_equal_to_twin": True, "steps_compared": compared}
    write_json(where.manifest, {"record": record})
    where.mark_finished(end)
    return record


def own_row_control(manifest: dict[str, dict[str, str]], twin: dict[str, dict[str, str]], seed: int) -> dict:
    """The candidate equal to the replaced row must be the twin, bit for bit, at every step it hashed."""
    for t, hashes in manifest.items():
        bad = first_difference(twin[t], hashes)
        if bad is not None:
            raise SeedlabError(f"seed {seed}: the own-row control differs from the twin at step {t} in tensor {bad!r} "
                               "(replacing a row by itself changed the run: the injection is not exact)")
    return {"bitwise_equal_to_twin": True, "steps_compared": sorted(int(t) for t in manifest)}
