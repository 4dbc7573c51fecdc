"""Twins: seed-matched pre-training runs that differ in one row of one batch.

Per seed: the shared prefix (steps 0 .. s-1) is trained once, its complete state (model,
optimizer, step) kept, and every condition forked from it at the injection step s. At
step s the injected conditions replace one row of the batch with their passage; the twin
trains on the ordinary batch. The batch of (seed, step) is a pure function of the two, so
forks need no replay. Forked conditions are identical at step s *by construction* (copies of
one state); ``independent=True`` (the audit) trains each condition's prefix from scratch
instead, and compares every weight tensor's SHA-256 as soon as each condition reaches step s
(a mismatch stops the run at once).

The evidence that training *after* s is deterministic is the **replica control**: for the
seeds of ``cfg.replica_seeds`` the twin is trained a second time from the same start, and its
weights must be bitwise equal to the twin's at every checkpoint, or the run fails.
``integrity.json`` records what was shown.

A killed run resumes: a finished condition (``done.json``) is read back, an unfinished one
restarts from its last checkpoint's complete state, a missing one forks the kept prefix.
Where each file lives: twins/rundir.py. Under torchrun every rank runs this same code on
its slice of each batch (lm/distributed.py); rank 0 writes the files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pandas as pd
import torch

from seedlab.lm import forks
from seedlab.lm.batches import check_passage
from seedlab.lm.distributed import World, check_divisible
from seedlab.lm.forks import SharedPrefix, advance_to, check_identical
from seedlab.lm.trainer import Trainer, make_deterministic, nondeterminism_is_an_error
from seedlab.progress import Bar
from seedlab.store import tensor_hashes, write_json, write_parquet, write_safetensors
from seedlab.twins.config import TwinsConfig
from seedlab.twins.passages import attestation, load_passages
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
    """Train every seed x condition and the replica controls (resuming what an interrupted run
    left); returns all per-step losses.

    ``config.json`` (the resolved config) is written once every input is validated, before
    any training: a folder is only created for a run that can start. ``base``: the config's
    folder (passage files are relative to it)."""
    world = world or World()
    corpus, gcfg, passages, attested = load_inputs(cfg, base, world)  # everything checked before the folder is touched
    _torch_settings(cfg, world)
    rd = RunDir(Path(out))
    inputs = inputs_record(corpus, passages, attested)
    rd.check_inputs(inputs)  # a resumed run: the same passages and corpus
    disk = rd.check_disk(rd.disk_plan(cfg, gcfg, independent=independent))  # refused when it cannot fit
    if world.main and progress:
        print(disk, file=sys.stderr)
    if world.main:
        rd.start(config_record(cfg, independent=independent, world=world), cfg.preregistration(), inputs)
    world.barrier()
    s = cfg.injection_step
    first = 0 if independent else s  # where a condition's own steps start (its progress line)
    runs = len(cfg.conditions) + len(cfg.replica_seeds) / len(cfg.seeds)
    total = int(len(cfg.seeds) * (0 if independent else s) + len(cfg.seeds) * runs * (cfg.steps - first))
    frames, integrity = [], {"mode": "independent" if independent else "fork", "seeds": {}}
    with Bar("twins", total, "steps", enabled=progress and world.main) as bar, nondeterminism_is_an_error():
        for seed in cfg.seeds:
            new_trainer = partial(Trainer, cfg, gcfg, seed, corpus.train, world)  # at the seed's init, step 0
            if independent:
                at_injection = reach_injection(rd, new_trainer, cfg, seed, world, bar)
                start = partial(own_prefix, new_trainer, s, bar)
            else:
                prefix = SharedPrefix(rd.prefix(seed), new_trainer, s, world=world,
                                      on_step=partial(bar.step, f"seed {seed}: shared prefix"))
                if prefix.saved:
                    bar.advance(s)  # trained before an interruption
                else:
                    bar.start_sub(f"seed {seed} shared prefix", s)  # trained when the first condition forks it
                start = partial(fork_prefix, prefix, bar)
                at_injection = {}
            for cond in cfg.conditions:
                where, label = rd.condition(seed, cond), f"seed {seed} {cond}"
                losses, manifest = train_condition(where, start, new_trainer, cfg, passages.get(cond), corpus.eot_id,
                                                   bar, label, world)
                frames.append(losses.assign(seed=seed, condition=cond))
                at_injection[cond] = manifest[str(s)]
            check_identical(at_injection, f"seed {seed}", s)
            record = {"identical_at_injection": "checked: every tensor's SHA-256 equal across conditions" if independent
                      else "by construction: every condition forked from one copy of the prefix"}
            if seed in cfg.replica_seeds:
                record["replica"] = replica_control(rd, seed, start, cfg, first, bar, world)
            integrity["seeds"][str(seed)] = record
            if not independent and "prefix" not in cfg.keep and world.main:
                rd.prefix(seed).unlink(missing_ok=True)  # every fork of it is done
    if world.main:
        write_json(rd.integrity, integrity)
    world.barrier()
    return pd.concat(frames, ignore_index=True)


def train_condition(where: ConditionDir, start, new_trainer, cfg: TwinsConfig, passage, pad_id: int,
                    bar: Bar, label: str, world: World) -> tuple[pd.DataFrame, dict]:
    """One seed x condition to the end (or read back when finished); returns its losses and manifest."""
    s, ckpts = cfg.injection_step, cfg.checkpoint_steps()  # the steps before s: counted by the prefix
    finished, resumable = where.finished, where.state.is_file()
    manifest = where.read_manifest() if (finished or resumable) else {}
    world.barrier()  # every rank has looked at the folder before rank 0 writes to it
    if finished:  # before an interruption
        bar.advance(cfg.steps - s)
        return pd.read_parquet(where.losses), manifest
    if resumable:  # from the last checkpoint
        trainer, losses = resume(new_trainer(), where, manifest, s, bar, label)
    else:
        trainer, losses = start(label)
    advance_to(trainer, cfg.steps, passage=passage, at=s, row=cfg.injection_row, pad_id=pad_id,
               stops={t for t in ckpts if str(t) not in manifest}, on_step=partial(bar.step, label), losses=losses,
               visit=lambda tr: save_checkpoint(tr, losses, where, manifest, world))
    return finish(where, losses, cfg, world), manifest


# --------------------------------------------------------------------------- before the first step


def load_inputs(cfg: TwinsConfig, base: Path, world: World):
    """Everything checked before a run folder is touched: corpus (hashes), passages, attestation, ranks.
    Returns (corpus, the GPT's config, {condition: passage token ids}, the attestation record)."""
    from seedlab.corpus import load

    corpus_dir = Path(cfg.corpus)  # like --out: relative to the current folder
    corpus = load(corpus_dir, verify=True)
    gcfg = cfg.gpt_config(corpus.vocab_size)
    passages = load_passages(cfg, base, corpus)
    attested = attestation(cfg, corpus, gcfg.block_size, warn=world.main)
    for cond, ids in passages.items():  # inject() checks the same, too late to write nothing
        check_passage(len(ids), gcfg.block_size, f"passages.{cond}")
    check_divisible(cfg.batch_size, cfg.micro_batch, world)
    return corpus, gcfg, passages, attested


def _torch_settings(cfg: TwinsConfig, world: World) -> None:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    make_deterministic(world.device(cfg.device))


# --------------------------------------------------------------------------- how a condition starts


def fork_prefix(prefix: SharedPrefix, bar: Bar, label: str) -> tuple[Trainer, list[float]]:
    """A copy of the seed's shared prefix at step s (trained, or read back, at the first fork), and its losses so far."""
    trainer, losses = prefix.fork()
    bar.start_sub(label, trainer.cfg.steps - prefix.step)
    return trainer, losses


def resume(trainer: Trainer, where: ConditionDir, manifest: dict, first: int, bar: Bar, label: str) -> tuple[Trainer, list[float]]:
    """A condition interrupted after a checkpoint: its complete state there (checked against the manifest)."""
    losses = trainer.load_state(where.state, manifest)
    bar.start_sub(label, trainer.cfg.steps - first)
    bar.advance(trainer.step - first)
    return trainer, losses


def own_prefix(new_trainer: Callable[[], Trainer], s: int, bar: Bar, label: str) -> tuple[Trainer, list[float]]:
    """The independent audit: a condition trains steps 0 .. s-1 itself, from the seed's init."""
    trainer = new_trainer()
    bar.start_sub(label, trainer.cfg.steps)
    return trainer, advance_to(trainer, s, on_step=bar.advance)


def reach_injection(rd: RunDir, new_trainer: Callable[[], Trainer], cfg: TwinsConfig, seed: int, world: World,
                    bar: Bar) -> dict[str, dict[str, str]]:
    """The independent audit, first half: every condition trains steps 0 .. s-1 from the seed's
    init and saves its checkpoint (and complete state) at s; its hashes are compared with the
    conditions before it as soon as it arrives, so a mismatch stops the run before any condition
    goes on. Returns {condition: hashes at s}; every condition then resumes from its state at s."""
    s, hashes = cfg.injection_step, {}
    for cond in cfg.conditions:
        where = rd.condition(seed, cond)
        manifest = where.read_manifest()
        world.barrier()
        if str(s) not in manifest:
            trainer, losses = own_prefix(new_trainer, s, bar, f"seed {seed} {cond}")
            save_checkpoint(trainer, losses, where, manifest, world)
        else:
            bar.advance(s)  # reached before an interruption
        hashes[cond] = manifest[str(s)]
        check_identical(hashes, f"seed {seed}", s)
    return hashes


def replica_control(rd: RunDir, seed: int, start, cfg: TwinsConfig, first: int, bar: Bar, world: World) -> dict:
    """The seed's twin trained a second time from the same start (the kept prefix, or its own
    prefix when independent); its weights must be bitwise the twin's at every checkpoint. Writes
    only hashes (``seed-<k>/replica/manifest.json``) and ``done.json``; returns the record."""
    where, twin = rd.replica(seed), rd.condition(seed, "twin").read_manifest()
    if where.finished:
        bar.advance(cfg.steps - first)
        return where.read_manifest()["record"]
    trainer, _ = start(f"seed {seed} replica control")
    compared = forks.replica_control(trainer, twin, cfg.steps, what=f"seed {seed}: the replica control", repeats="the twin",
                                     on_step=partial(bar.step, f"seed {seed}: replica control"), world=world)
    record = {"bitwise_equal_to_twin": True, "steps_compared": compared}
    if world.main:
        write_json(where.manifest, {"record": record})
        where.mark_finished(cfg.steps)
    return record


# --------------------------------------------------------------------------- files a condition writes


def save_checkpoint(trainer: Trainer, losses: list[float], where: ConditionDir, manifest: dict, world: World) -> None:
    """The weights after ``trainer.step`` updates, their hashes in the manifest, then the complete
    state (last: the resume point). Every rank checks it holds the same weights."""
    t, state, cond = trainer.step, trainer.weights(), where.path.name
    manifest[str(t)] = tensor_hashes(state)
    world.check_same(manifest[str(t)], f"seed {trainer.seed}, {cond}, step {t}")
    if world.main:
        write_safetensors(where.checkpoint(t), state, {"step": str(t), "seed": str(trainer.seed), "condition": cond})
        write_json(where.manifest, manifest)
        trainer.save_state(where.state, losses)


def finish(where: ConditionDir, losses: list[float], cfg: TwinsConfig, world: World) -> pd.DataFrame:
    """Every update's loss, the done marker; the resume state removed, or kept as the final state
    (``keep: [final]``: it was saved at the final checkpoint). Returns the losses."""
    df = pd.DataFrame({"step": range(len(losses)), "loss": losses})
    if world.main:
        write_parquet(where.losses, df)
        if "final" in cfg.keep:
            where.state.replace(where.final_state)
        where.mark_finished(cfg.steps)
        where.state.unlink(missing_ok=True)
    return df
