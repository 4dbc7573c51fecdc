"""Twins: seed-matched pre-training runs that differ in one row of one batch.

Per seed: the shared prefix (steps 0 .. s-1) is trained once, its complete state (model,
optimizer, step) kept, and every condition forked from it at the injection step s. At
step s the injected conditions replace one row of the batch with their passage; the twin
trains on the ordinary batch. The batch of (seed, step) is a pure function of the two, so
forks need no replay. ``independent=True`` (the audit) trains each condition's prefix from
scratch instead and checks that every weight tensor's SHA-256 agrees at step s.

Layout (DESIGN contract): DIR/seed-<k>/<condition>/step-<t>.safetensors (t = updates
completed), losses.parquet (step, loss), manifest.json (SHA-256 of every tensor per step).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import string
from pathlib import Path
from typing import Annotated

import pandas as pd
import torch
from pydantic import Field, model_validator

from seedlab.config import Strict
from seedlab.errors import SeedlabError
from seedlab.progress import Bar
from seedlab.store import write_json, write_parquet, write_safetensors
from seedlab.twins.batches import check_passage, get_batch, inject
from seedlab.twins.model import GPT, PRESETS, GPTConfig
from seedlab.twins.schedule import lr_at

CONDITIONS = ("twin", "fluent-fabricated", "fluent-attested", "random-chars")
Pos = Annotated[int, Field(gt=0)]


class TwinsConfig(Strict):
    corpus: str  # a prepared corpus folder (seedlab corpus prepare), relative to the config file
    model: str = "mini"  # a preset of twins.model.PRESETS
    block_size: Pos | None = None  # tokens per row; null: the preset's
    seeds: list[int] = [0, 1]
    steps: Pos = 300  # optimizer updates per run (paper: 9,536)
    batch_size: Pos = 16  # rows per batch (paper: 256)
    injection_step: int = 100  # updates completed before the injected batch (paper: 200)
    injection_row: int = 0  # which row of that batch is replaced
    peak_lr: float = 6e-4  # (paper: 6e-4)
    min_lr: float = 6e-5  # end of the cosine decay (not stated)
    warmup: Pos | None = None  # null: ends at the injection step, so it happens at peak LR
    weight_decay: float = 0.1  # (not stated; nanoGPT)
    beta1: float = 0.9
    beta2: float = 0.95  # (not stated; nanoGPT)
    grad_clip: float = 1.0  # (not stated; nanoGPT)
    conditions: list[str] = list(CONDITIONS)
    passages: dict[str, str] = {}  # condition -> text file (relative to the config file)
    subjects: dict[str, str] = {}  # condition -> the passage's subject, checked against the corpus
    checkpoint_every: Pos | None = None  # plus injection, injection + 50, mid-point and final
    threads: Pos | None = None

    @model_validator(mode="after")
    def _check(self) -> TwinsConfig:
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad:
            raise ValueError(f"conditions: must be among {', '.join(CONDITIONS)}, got {bad[0]!r}")
        if self.model not in PRESETS:
            raise ValueError(f"model: must be one of {', '.join(PRESETS)}, got {self.model!r}")
        if not 0 < self.injection_step < self.steps:
            raise ValueError(f"injection_step: must be inside the run (1 .. {self.steps - 1}), got {self.injection_step}")
        if not 0 <= self.injection_row < self.batch_size:
            raise ValueError(f"injection_row: must be in 0 .. {self.batch_size - 1}, got {self.injection_row}")
        return self

    def checkpoint_steps(self) -> list[int]:
        s = self.injection_step
        steps = {s, min(s + 50, self.steps), self.steps // 2 + 1, self.steps}
        if self.checkpoint_every:
            steps |= set(range(self.checkpoint_every, self.steps + 1, self.checkpoint_every))
        return sorted(steps)


def tensor_hashes(state: dict[str, torch.Tensor]) -> dict[str, str]:
    return {k: hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest() for k, v in state.items()}


def load_passages(cfg: TwinsConfig, base: Path, corpus) -> dict[str, list[int]]:
    """Token ids of each injected condition's passage; random-chars matches the fabricated length."""
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
        n = len(out.get("fluent-fabricated") or out.get("fluent-attested") or [0] * 64)
        rng = random.Random(0)
        keys = string.ascii_letters + string.digits + string.punctuation + " "
        ids: list[int] = []
        text = ""
        while len(ids) < n:  # grow random keyboard text until it has the same token length
            text += rng.choice(keys)
            ids = corpus.encode(text)
        out["random-chars"] = ids[:n]
    return out


class _Run:
    """One model + optimizer, advanced step by step on the (seed, step) batches."""

    def __init__(self, cfg: TwinsConfig, gcfg: GPTConfig, seed: int, tokens):
        self.cfg, self.seed, self.tokens, self.step = cfg, seed, tokens, 0
        self.model = GPT(gcfg).init_from_seed(seed)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2), foreach=False,
        )
        self.warmup = cfg.warmup or cfg.injection_step

    def advance(self, passage: list[int] | None = None, pad_id: int = 0) -> float:
        cfg = self.cfg
        x, y = get_batch(self.tokens, self.seed, self.step, cfg.batch_size, self.model.config.block_size)
        mask = None
        if passage is not None:
            x, y, mask = inject(x, y, cfg.injection_row, passage, pad_id)
        lr = lr_at(self.step, peak_lr=cfg.peak_lr, warmup=self.warmup, total=cfg.steps, min_lr=cfg.min_lr)
        for g in self.opt.param_groups:
            g["lr"] = lr
        _, loss = self.model(x, y, loss_mask=mask)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.step += 1
        return float(loss.detach())

    def save_state(self, path: Path, losses: list[float]) -> None:
        """The complete training state (weights, AdamW moments and step counts, losses so far)."""
        t = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        for i, st in self.opt.state_dict()["state"].items():
            for k, v in st.items():
                t[f"opt.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
        t["losses"] = torch.tensor(losses, dtype=torch.float64)
        write_safetensors(path, t, {"step": str(self.step)})

    def load_state(self, path: Path) -> list[float]:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            t = {k: f.get_tensor(k) for k in f.keys()}
            self.step = int(f.metadata()["step"])
        self.model.load_state_dict({k[6:]: v for k, v in t.items() if k.startswith("model.")})
        sd = self.opt.state_dict()
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in t.items():
            if k.startswith("opt."):
                _, i, name = k.split(".", 2)
                state.setdefault(int(i), {})[name] = v
        self.opt.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
        return t["losses"].tolist()

    def fork(self) -> _Run:
        """A copy with its own model and optimizer state (deep-copied together, so the
        optimizer's references point at the copy's parameters)."""
        twin = copy.copy(self)
        twin.model, twin.opt = copy.deepcopy((self.model, self.opt))
        return twin


def run_twins(
    cfg: TwinsConfig, out: str | Path, *, base: Path = Path("."), independent: bool = False, progress: bool = True, record: dict | None = None
) -> pd.DataFrame:
    """Train every seed x condition (resuming what an interrupted run left); returns all per-step losses.

    ``record`` (the resolved config) is written to ``out/config.json`` once every input is
    validated, before any training: a folder is only created for a run that can start.
    """
    from seedlab.twins.corpus import load

    corpus_dir = (base / cfg.corpus) if not Path(cfg.corpus).is_absolute() else Path(cfg.corpus)
    corpus = load(corpus_dir, verify=True)
    gcfg = PRESETS[cfg.model].model_copy(update={"vocab_size": corpus.vocab_size, **({"block_size": cfg.block_size} if cfg.block_size else {})})
    check_attestation(cfg, corpus)
    passages = load_passages(cfg, base, corpus)
    for cond, ids in passages.items():  # before anything is written; inject() checks the same
        check_passage(len(ids), gcfg.block_size, f"passages.{cond}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(out)
    write_json(out / "config.json", record if record is not None else cfg.model_dump(mode="json") | {"independent": independent})
    s, ckpts = cfg.injection_step, cfg.checkpoint_steps()
    frames = []
    total = len(cfg.seeds) * ((1 if not independent else len(cfg.conditions)) * s + len(cfg.conditions) * (cfg.steps - s))
    with Bar("twins", total, "steps", enabled=progress) as bar:
        for seed in cfg.seeds:
            prefix: tuple[_Run, list[float]] | None = None
            at_injection: dict[str, dict[str, str]] = {}
            for cond in cfg.conditions:
                folder = out / f"seed-{seed}" / cond
                if (folder / "done.json").is_file():  # finished before an interruption
                    at_injection[cond] = json.loads((folder / "manifest.json").read_text())[str(s)]
                    frames.append(pd.read_parquet(folder / "losses.parquet").assign(seed=seed, condition=cond))
                    bar.advance(cfg.steps - s + (s if independent else 0))
                    continue
                if (folder / "state.safetensors").is_file():  # resume from the last checkpoint
                    run = _Run(cfg, gcfg, seed, corpus.train)
                    losses = run.load_state(folder / "state.safetensors")
                    manifest = json.loads((folder / "manifest.json").read_text())
                elif independent:  # the audit: this condition trains its own prefix
                    run, losses, manifest = _Run(cfg, gcfg, seed, corpus.train), [], {}
                    while run.step < s:
                        losses.append(run.advance())
                        bar.advance()
                else:
                    prefix = prefix or shared_prefix(cfg, gcfg, seed, corpus.train, out / f"seed-{seed}" / "prefix.safetensors", bar)
                    run, losses, manifest = prefix[0].fork(), list(prefix[1]), {}
                bar.advance(run.step - s if run.step > s else 0)
                while True:
                    if run.step in ckpts and str(run.step) not in manifest:
                        state = run.model.state_dict()
                        write_safetensors(folder / f"step-{run.step}.safetensors", state, {"step": str(run.step), "seed": str(seed), "condition": cond})
                        manifest[str(run.step)] = tensor_hashes(state)
                        write_json(folder / "manifest.json", manifest)
                        run.save_state(folder / "state.safetensors", losses)  # last: the resume point
                    if run.step == cfg.steps:
                        break
                    inj = passages.get(cond) if run.step == s else None
                    losses.append(run.advance(inj, pad_id=corpus.eot_id))
                    bar.update(note=f"seed {seed}: {cond}")
                    bar.advance()
                at_injection[cond] = manifest[str(s)]
                df = pd.DataFrame({"step": range(len(losses)), "loss": losses})
                write_parquet(folder / "losses.parquet", df)
                write_json(folder / "done.json", {"steps": cfg.steps})
                (folder / "state.safetensors").unlink(missing_ok=True)
                frames.append(df.assign(seed=seed, condition=cond))
            verify_identical(at_injection, seed, s)
    return pd.concat(frames, ignore_index=True)


def shared_prefix(cfg: TwinsConfig, gcfg: GPTConfig, seed: int, tokens, path: Path, bar: Bar) -> tuple[_Run, list[float]]:
    """Steps 0 .. s-1 of a seed, trained once and kept (complete state) for every fork."""
    run = _Run(cfg, gcfg, seed, tokens)
    if path.is_file():
        return run, run.load_state(path)
    losses = []
    while run.step < cfg.injection_step:
        losses.append(run.advance())
        bar.update(note=f"seed {seed}: shared prefix")
        bar.advance()
    run.save_state(path, losses)
    return run, losses


def check_attestation(cfg: TwinsConfig, corpus) -> None:
    """A fabricated subject must not occur in the training split; an attested one should."""
    import sys

    from seedlab.twins.corpus import count

    for cond, subject in cfg.subjects.items():
        n = count(corpus, subject)["text"]
        if cond == "fluent-fabricated" and n > 0:
            raise SeedlabError(f"subjects.fluent-fabricated: {subject!r} occurs {n} times in the training split (not fabricated)")
        if cond == "fluent-attested" and n == 0:
            print(f"warning: subjects.fluent-attested: {subject!r} does not occur in the training split", file=sys.stderr)


def verify_identical(hashes: dict[str, dict[str, str]], seed: int, step: int) -> None:
    """Every condition's weights at the injection step are bitwise the same; else name the first difference."""
    conds = list(hashes)
    for c in conds[1:]:
        for name, h in hashes[conds[0]].items():
            if hashes[c].get(name) != h:
                raise SeedlabError(f"seed {seed}: {c} differs from {conds[0]} at step {step} in tensor {name!r} (twins are not identical)")
