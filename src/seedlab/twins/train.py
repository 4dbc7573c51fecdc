"""Twins: seed-matched pre-training runs that differ in one row of one batch.

Per seed: the shared prefix (steps 0 .. s-1) is trained once, its complete state (model,
optimizer, step) kept, and every condition forked from it at the injection step s. At
step s the injected conditions replace one row of the batch with their passage; the twin
trains on the ordinary batch. The batch of (seed, step) is a pure function of the two, so
forks need no replay. ``independent=True`` (the audit) trains each condition's prefix from
scratch instead and checks that every weight tensor's SHA-256 agrees at step s.

A killed run resumes: a finished condition (``done.json``) is read back, an unfinished one
restarts from its last checkpoint's complete state, a missing one forks the kept prefix.
Where each file lives: twins/rundir.py. Under torchrun every rank runs this same code on
its slice of each batch (lm/distributed.py); rank 0 writes the files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import check_passage
from seedlab.lm.distributed import World, check_divisible
from seedlab.lm.trainer import Trainer
from seedlab.progress import Bar
from seedlab.store import tensor_hashes, write_json, write_parquet, write_safetensors
from seedlab.twins.config import TwinsConfig
from seedlab.twins.passages import check_attestation, load_passages
from seedlab.twins.rundir import ConditionDir, RunDir, config_record, inputs_record


def run_twins(
    cfg: TwinsConfig,
    out: str | Path,
    *,
    base: Path = Path("."),
    independent: bool = False,
    progress: bool = True,
    world: World | None = None,
) -> pd.DataFrame:
    """Train every seed x condition (resuming what an interrupted run left); returns all per-step losses.

    ``config.json`` (the resolved config) is written once every input is validated, before
    any training: a folder is only created for a run that can start. ``base``: the config's
    folder (passage files are relative to it)."""
    world = world or World()
    corpus, gcfg, passages = load_inputs(cfg, base, world)  # everything checked before the folder is touched
    _torch_settings(cfg, world)
    rd = RunDir(Path(out))
    if world.main:
        rd.start(config_record(cfg, independent=independent, world=world), cfg.preregistration(), inputs_record(corpus, passages))
    world.barrier()
    s, ckpts = cfg.injection_step, cfg.checkpoint_steps()
    first = 0 if independent else s  # where a condition's own steps start (its progress line)
    total = len(cfg.seeds) * ((len(cfg.conditions) if independent else 1) * s + len(cfg.conditions) * (cfg.steps - s))
    frames = []
    with Bar("twins", total, "steps", enabled=progress and world.main) as bar:
        for seed in cfg.seeds:
            new_trainer = partial(Trainer, cfg, gcfg, seed, corpus.train, world)  # at the seed's init, step 0
            prefix = None if independent else SharedPrefix(rd.prefix(seed), new_trainer, cfg, world)
            if prefix and prefix.saved:
                bar.advance(s)  # trained before an interruption
            at_injection: dict[str, dict[str, str]] = {}  # condition -> every weight's SHA-256 at step s
            for cond in cfg.conditions:
                where, label = rd.condition(seed, cond), f"seed {seed} {cond}"
                finished, resumable = where.finished, where.state.is_file()
                manifest = where.read_manifest() if (finished or resumable) else {}
                world.barrier()  # every rank has looked at the folder before rank 0 writes to it
                if finished:  # before an interruption
                    at_injection[cond] = manifest[str(s)]
                    frames.append(pd.read_parquet(where.losses).assign(seed=seed, condition=cond))
                    bar.advance(cfg.steps - first)
                    continue
                if resumable:  # from the last checkpoint
                    trainer, losses = resume(new_trainer(), where, manifest, first, bar, label)
                elif independent:  # the audit: this condition trains its own prefix
                    trainer, losses = own_prefix(new_trainer(), s, bar, label)
                else:
                    trainer, losses = prefix.fork(bar, label)
                while True:
                    if trainer.step in ckpts and str(trainer.step) not in manifest:
                        save_checkpoint(trainer, losses, where, manifest, seed, cond, world)
                    if trainer.step == cfg.steps:
                        break
                    passage = passages.get(cond) if trainer.step == s else None  # the injected row
                    losses.append(trainer.advance(passage, row=cfg.injection_row, pad_id=corpus.eot_id))
                    bar.update(note=f"seed {seed}: {cond}")
                    bar.advance()
                at_injection[cond] = manifest[str(s)]
                frames.append(finish(where, losses, cfg.steps, world).assign(seed=seed, condition=cond))
            verify_identical(at_injection, seed, s)
    world.barrier()
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------- before the first step


def load_inputs(cfg: TwinsConfig, base: Path, world: World):
    """Everything checked before a run folder is touched: corpus (hashes), passages, attestation, ranks.
    Returns (corpus, the GPT's config, {condition: passage token ids})."""
    from seedlab.corpus import load

    corpus_dir = Path(cfg.corpus)  # like --out: relative to the current folder
    corpus = load(corpus_dir, verify=True)
    gcfg = cfg.gpt_config(corpus.vocab_size)
    check_attestation(cfg, corpus, warn=world.main)
    passages = load_passages(cfg, base, corpus)
    for cond, ids in passages.items():  # inject() checks the same, too late to write nothing
        check_passage(len(ids), gcfg.block_size, f"passages.{cond}")
    check_divisible(cfg.batch_size, cfg.micro_batch, world)
    return corpus, gcfg, passages


def _torch_settings(cfg: TwinsConfig, world: World) -> None:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if world.device(cfg.device).type == "cuda":  # bitwise-reproducible kernels (cuBLAS needs the workspace setting)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


# --------------------------------------------------------------------------- how a condition starts


class SharedPrefix:
    """Steps 0 .. s-1 of a seed, trained once (or read back from ``path``) when the first
    condition forks it, and kept (complete state) for every later fork."""

    def __init__(self, path: Path, new_trainer: Callable[[], Trainer], cfg: TwinsConfig, world: World):
        self.path, self.new_trainer, self.world = path, new_trainer, world
        self.s, self.steps = cfg.injection_step, cfg.steps
        self.saved = path.is_file()  # trained before an interruption
        self.kept: tuple[Trainer, list[float]] | None = None

    def fork(self, bar: Bar, label: str) -> tuple[Trainer, list[float]]:
        """A copy of the prefix's trainer at step s, and its losses so far."""
        if self.kept is None:
            self.kept = self._train_or_read(bar)
        bar.start_sub(label, self.steps - self.s)
        trainer, losses = self.kept
        return trainer.fork(), list(losses)

    def _train_or_read(self, bar: Bar) -> tuple[Trainer, list[float]]:
        trainer = self.new_trainer()
        if self.path.is_file():
            return trainer, trainer.load_state(self.path)
        seed, losses = trainer.seed, []
        bar.start_sub(f"seed {seed} shared prefix", self.s)
        while trainer.step < self.s:
            losses.append(trainer.advance())
            bar.update(note=f"seed {seed}: shared prefix")
            bar.advance()
        if self.world.main:
            trainer.save_state(self.path, losses)
        return trainer, losses


def resume(trainer: Trainer, where: ConditionDir, manifest: dict, first: int, bar: Bar, label: str) -> tuple[Trainer, list[float]]:
    """A condition interrupted after a checkpoint: its complete state there (checked against the manifest)."""
    losses = trainer.load_state(where.state, manifest)
    bar.start_sub(label, trainer.cfg.steps - first)
    bar.advance(trainer.step - first)
    return trainer, losses


def own_prefix(trainer: Trainer, s: int, bar: Bar, label: str) -> tuple[Trainer, list[float]]:
    """The independent audit: a condition trains steps 0 .. s-1 itself, from the seed's init."""
    bar.start_sub(label, trainer.cfg.steps)
    losses = []
    while trainer.step < s:
        losses.append(trainer.advance())
        bar.advance()
    return trainer, losses


# --------------------------------------------------------------------------- files a condition writes


def save_checkpoint(trainer: Trainer, losses: list[float], where: ConditionDir, manifest: dict,
                    seed: int, cond: str, world: World) -> None:
    """The weights after ``trainer.step`` updates, their hashes in the manifest, then the complete
    state (last: the resume point). Every rank checks it holds the same weights."""
    t, state = trainer.step, trainer.weights()
    manifest[str(t)] = tensor_hashes(state)
    world.check_same(manifest[str(t)], f"seed {seed}, {cond}, step {t}")
    if world.main:
        write_safetensors(where.checkpoint(t), state, {"step": str(t), "seed": str(seed), "condition": cond})
        write_json(where.manifest, manifest)
        trainer.save_state(where.state, losses)


def finish(where: ConditionDir, losses: list[float], steps: int, world: World) -> pd.DataFrame:
    """Every update's loss, the done marker, and the resume state removed; returns the losses."""
    df = pd.DataFrame({"step": range(len(losses)), "loss": losses})
    if world.main:
        write_parquet(where.losses, df)
        where.mark_finished(steps)
        where.state.unlink(missing_ok=True)
    return df


def verify_identical(hashes: dict[str, dict[str, str]], seed: int, step: int) -> None:
    """Every condition's weights at the injection step are bitwise the same; else name the first difference."""
    conds = list(hashes)
    for c in conds[1:]:
        for name, h in hashes[conds[0]].items():
            if hashes[c].get(name) != h:
                raise SeedlabError(f"seed {seed}: {c} differs from {conds[0]} at step {step} in tensor {name!r} (twins are not identical)")
