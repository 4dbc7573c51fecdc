"""Twins: seed-matched pre-training runs that differ in one row of one batch.

Per seed: the shared prefix (steps 0 .. s-1) is trained once, its complete state (model,
optimizer, step) kept, and every condition forked from it at the injection step s. At
step s the injected conditions replace one row of the batch with their passage; the twin
trains on the ordinary batch. The batch of (seed, step) is a pure function of the two, so
forks need no replay. ``independent=True`` (the audit) trains each condition's prefix from
scratch instead and checks that every weight tensor's SHA-256 agrees at step s.

Layout (DESIGN contract)::

    DIR/config.json               the resolved config (+ independent, world_size, injection_rank)
    DIR/preregistration.json      outcomes and measurement settings, hashed, before any training
    DIR/inputs.json               the corpus (absolute path, hashes) and every passage's text and token ids
    DIR/seed-<k>/prefix.safetensors               the shared prefix's complete state at step s
    DIR/seed-<k>/<condition>/step-<t>.safetensors  weights after t updates (state_dict keys)
    DIR/seed-<k>/<condition>/manifest.json        {t: {tensor: SHA-256}} for every saved t
    DIR/seed-<k>/<condition>/losses.parquet       (step, loss): the training loss of every update
    DIR/seed-<k>/<condition>/state.safetensors    the complete state at the last checkpoint (resume)

Under torchrun every rank runs this same code on its slice of each batch
(lm/distributed.py); rank 0 writes the files.
"""

from __future__ import annotations

import json
import os
import random
import string
import sys
from pathlib import Path

import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import check_passage
from seedlab.lm.distributed import World, check_divisible
from seedlab.lm.model import PRESETS, GPTConfig
from seedlab.lm.trainer import Trainer
from seedlab.progress import Bar
from seedlab.store import tensor_hashes, write_json, write_parquet, write_safetensors
from seedlab.twins.config import CONDITIONS, TwinsConfig  # noqa: F401  (re-exported)


def model_config(cfg: TwinsConfig, vocab_size: int) -> GPTConfig:
    return PRESETS[cfg.model].model_copy(update={"vocab_size": vocab_size, **({"block_size": cfg.block_size} if cfg.block_size else {})})


def load_passages(cfg: TwinsConfig, base: Path, corpus) -> dict[str, list[int]]:
    """Token ids of each injected condition's passage; random-chars is random keyboard text
    of ``random_chars_tokens`` tokens (default: as long as the fabricated passage)."""
    out: dict[str, list[int]] = {}
    for cond in ("fluent-fabricated", "fluent-attested"):
        if cond in cfg.conditions:
            if cond not in cfg.passages:
                raise SeedlabError(f"passages.{cond}: name a text file for this condition")
            path = base / cfg.passages[cond]
            if not path.is_file():
                raise SeedlabError(f"passages.{cond}: no such file {str(path)!r}")
            out[cond] = corpus.encode(path.read_text().strip())
    if "random-chars" in cfg.conditions:
        fluent = out.get("fluent-fabricated") or out.get("fluent-attested")
        n = cfg.random_chars_tokens or (len(fluent) if fluent else None)
        if n is None:
            raise SeedlabError("random_chars_tokens: set the passage length when the design has no fluent passage")
        rng = random.Random(cfg.random_chars_seed)
        keys = string.ascii_letters + string.digits + string.punctuation + " "
        ids: list[int] = []
        text = ""
        while len(ids) < n:  # grow random keyboard text until it has the same token length
            text += rng.choice(keys)
            ids = corpus.encode(text)
        out["random-chars"] = ids[:n]
    return out


def prepare(cfg: TwinsConfig, base: Path, world: World):
    """Everything checked before a run folder is touched: corpus (hashes), passages, attestation, ranks."""
    from seedlab.corpus import load

    corpus_dir = Path(cfg.corpus)  # like --out: relative to the current folder
    corpus = load(corpus_dir, verify=True)
    gcfg = model_config(cfg, corpus.vocab_size)
    check_attestation(cfg, corpus, warn=world.main)
    passages = load_passages(cfg, base, corpus)
    for cond, ids in passages.items():  # inject() checks the same, too late to write nothing
        check_passage(len(ids), gcfg.block_size, f"passages.{cond}")
    check_divisible(cfg.batch_size, cfg.micro_batch, world)
    return corpus, gcfg, passages


def run_twins(
    cfg: TwinsConfig,
    out: str | Path,
    *,
    base: Path = Path("."),
    independent: bool = False,
    progress: bool = True,
    record: dict | None = None,
    world: World | None = None,
) -> pd.DataFrame:
    """Train every seed x condition (resuming what an interrupted run left); returns all per-step losses.

    ``record`` (the resolved config) is written to ``out/config.json`` once every input is
    validated, before any training: a folder is only created for a run that can start.
    """
    world = world or World()
    corpus, gcfg, passages = prepare(cfg, base, world)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if world.device(cfg.device).type == "cuda":  # bitwise-reproducible kernels (cuBLAS needs the workspace setting)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    out = Path(out)
    if record is None:
        record = cfg.model_dump(mode="json") | {"independent": independent, "world_size": world.size}
    record = record | {"injection_rank": world.rank_of_row(cfg.injection_row, cfg.batch_size)}
    if world.main:
        _write_if_changed(out / "config.json", record)  # a resumed run leaves it untouched
        if not (out / "preregistration.json").is_file():  # written once, before the first step
            write_json(out / "preregistration.json", cfg.preregistration())
        inputs = {  # what later tools (measure, gradmatch) need without the config's folder
            "corpus": str(corpus.path.resolve()),
            "corpus_sha256": {k: v["sha256"] for k, v in corpus.meta["splits"].items()},
            "eot_id": corpus.eot_id,
            "passages": {c: {"text": corpus.decode(ids), "tokens": ids} for c, ids in passages.items()},
        }
        _write_if_changed(out / "inputs.json", inputs)
    world.barrier()
    s, ckpts = cfg.injection_step, cfg.checkpoint_steps()
    frames = []
    total = len(cfg.seeds) * ((1 if not independent else len(cfg.conditions)) * s + len(cfg.conditions) * (cfg.steps - s))
    with Bar("twins", total, "steps", enabled=progress and world.main) as bar:
        for seed in cfg.seeds:
            prefix_path = out / f"seed-{seed}" / "prefix.safetensors"
            prefix: tuple[Trainer, list[float]] | None = None
            if not independent and prefix_path.is_file():
                bar.advance(s)  # trained before an interruption
            at_injection: dict[str, dict[str, str]] = {}
            for cond in cfg.conditions:
                folder = out / f"seed-{seed}" / cond
                done, resume = (folder / "done.json").is_file(), (folder / "state.safetensors").is_file()
                manifest = json.loads((folder / "manifest.json").read_text()) if (done or resume) else {}
                world.barrier()  # every rank has looked at the folder before rank 0 writes to it
                first = 0 if independent else s  # where this condition's own steps start
                if done:  # finished before an interruption
                    at_injection[cond] = manifest[str(s)]
                    frames.append(pd.read_parquet(folder / "losses.parquet").assign(seed=seed, condition=cond))
                    bar.advance(cfg.steps - first)
                    continue
                if resume:  # from the last checkpoint
                    run = Trainer(cfg, gcfg, seed, corpus.train, world)
                    losses = run.load_state(folder / "state.safetensors", manifest)
                    bar.start_sub(f"seed {seed} {cond}", cfg.steps - first)
                    bar.advance(run.step - first)
                elif independent:  # the audit: this condition trains its own prefix
                    bar.start_sub(f"seed {seed} {cond}", cfg.steps)
                    run, losses = Trainer(cfg, gcfg, seed, corpus.train, world), []
                    while run.step < s:
                        losses.append(run.advance())
                        bar.advance()
                else:
                    prefix = prefix or shared_prefix(cfg, gcfg, seed, corpus.train, prefix_path, bar, world)
                    bar.start_sub(f"seed {seed} {cond}", cfg.steps - s)
                    run, losses = prefix[0].fork(), list(prefix[1])
                while True:
                    if run.step in ckpts and str(run.step) not in manifest:
                        state = run.model.state_dict()
                        manifest[str(run.step)] = tensor_hashes(state)
                        world.check_same(manifest[str(run.step)], f"seed {seed}, {cond}, step {run.step}")
                        if world.main:
                            meta = {"step": str(run.step), "seed": str(seed), "condition": cond}
                            write_safetensors(folder / f"step-{run.step}.safetensors", state, meta)
                            write_json(folder / "manifest.json", manifest)
                            run.save_state(folder / "state.safetensors", losses)  # last: the resume point
                    if run.step == cfg.steps:
                        break
                    inj = passages.get(cond) if run.step == s else None
                    losses.append(run.advance(inj, row=cfg.injection_row, pad_id=corpus.eot_id))
                    bar.update(note=f"seed {seed}: {cond}")
                    bar.advance()
                at_injection[cond] = manifest[str(s)]
                df = pd.DataFrame({"step": range(len(losses)), "loss": losses})
                if world.main:
                    write_parquet(folder / "losses.parquet", df)
                    write_json(folder / "done.json", {"steps": cfg.steps})
                    (folder / "state.safetensors").unlink(missing_ok=True)
                frames.append(df.assign(seed=seed, condition=cond))
            verify_identical(at_injection, seed, s)
    world.barrier()
    return pd.concat(frames, ignore_index=True)


def _write_if_changed(path: Path, obj: dict) -> None:
    if not path.is_file() or json.loads(path.read_text()) != obj:
        write_json(path, obj)


def shared_prefix(cfg: TwinsConfig, gcfg: GPTConfig, seed: int, tokens, path: Path, bar: Bar, world: World) -> tuple[Trainer, list[float]]:
    """Steps 0 .. s-1 of a seed, trained once and kept (complete state) for every fork."""
    run = Trainer(cfg, gcfg, seed, tokens, world)
    if path.is_file():
        return run, run.load_state(path)
    losses = []
    bar.start_sub(f"seed {seed} shared prefix", cfg.injection_step)
    while run.step < cfg.injection_step:
        losses.append(run.advance())
        bar.update(note=f"seed {seed}: shared prefix")
        bar.advance()
    if world.main:
        run.save_state(path, losses)
    return run, losses


def check_attestation(cfg: TwinsConfig, corpus, warn: bool = True) -> None:
    """A fabricated subject must not occur in the training split; an attested one should."""
    from seedlab.corpus import count

    for cond, subject in cfg.subjects.items():
        n = count(corpus, subject)["text"]
        if cond == "fluent-fabricated" and n > 0:
            raise SeedlabError(f"subjects.fluent-fabricated: {subject!r} occurs {n} times in the training split (not fabricated)")
        if cond == "fluent-attested" and n == 0 and warn:
            print(f"warning: subjects.fluent-attested: {subject!r} does not occur in the training split", file=sys.stderr)


def verify_identical(hashes: dict[str, dict[str, str]], seed: int, step: int) -> None:
    """Every condition's weights at the injection step are bitwise the same; else name the first difference."""
    conds = list(hashes)
    for c in conds[1:]:
        for name, h in hashes[conds[0]].items():
            if hashes[c].get(name) != h:
                raise SeedlabError(f"seed {seed}: {c} differs from {conds[0]} at step {step} in tensor {name!r} (twins are not identical)")
