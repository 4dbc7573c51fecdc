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
(twins/distributed.py); rank 0 writes the files.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import random
import string
import sys
from pathlib import Path

import pandas as pd
import torch

from seedlab.errors import SeedlabError
from seedlab.progress import Bar
from seedlab.store import write_json, write_parquet, write_safetensors
from seedlab.twins.batches import check_passage, get_batch, inject
from seedlab.twins.config import CONDITIONS, TwinsConfig  # noqa: F401  (re-exported)
from seedlab.twins.distributed import World, check_divisible
from seedlab.twins.model import GPT, PRESETS, GPTConfig, masked_ce_sum
from seedlab.twins.schedule import lr_at


def tensor_hashes(state: dict[str, torch.Tensor]) -> dict[str, str]:
    return {k: hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest() for k, v in state.items()}


def read_verified(path: Path, expected: dict[str, str] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors file, each tensor's SHA-256 checked against
    ``expected`` (a manifest entry) or, for state files, the hashes stored in its own metadata."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise SeedlabError(f"{path}: not a readable checkpoint ({str(e).splitlines()[0]})") from None
    if expected is None:
        if "sha256" not in meta:
            raise SeedlabError(f"{path}: no recorded hashes to check it against")
        expected = json.loads(meta["sha256"])
    got = tensor_hashes(tensors)
    for name, h in expected.items():
        if got.get(name) != h:
            why = "is missing" if name not in got else "does not match its recorded SHA-256"
            raise SeedlabError(f"{path}: tensor {name!r} {why} (corrupted checkpoint)")
    return tensors, meta


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


class _Run:
    """One model + optimizer, advanced step by step on the (seed, step) batches."""

    def __init__(self, cfg: TwinsConfig, gcfg: GPTConfig, seed: int, tokens, world: World = World()):
        self.cfg, self.seed, self.tokens, self.world, self.step = cfg, seed, tokens, world, 0
        self.device = world.device(cfg.device)
        self.model = GPT(gcfg).to(self.device).init_from_seed(seed)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        rest = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2),
            fused=True,  # one kernel per step on CPU and GPU (nanoGPT's GPU choice); deterministic
        )
        self.warmup = cfg.warmup or cfg.injection_step
        self.params = list(self.model.parameters())

    def advance(self, passage: list[int] | None = None, pad_id: int = 0) -> float:
        """One update on batch (seed, step) — with ``passage`` in row ``injection_row`` — and its mean loss.

        The loss is the masked CE *sum* over this rank's rows divided by the target tokens
        of the whole batch; with gradients summed over ranks and micro-batches, the update
        is that of the whole batch's mean loss however the rows are split."""
        cfg, block = self.cfg, self.model.config.block_size
        x, y = get_batch(self.tokens, self.seed, self.step, cfg.batch_size, block)
        mask = torch.ones_like(x, dtype=torch.bool)
        if passage is not None:
            x, y, mask = inject(x, y, cfg.injection_row, passage, pad_id)
        n_targets = int(mask.sum())
        mine = self.world.rows(cfg.batch_size)
        micro = cfg.micro_batch or (mine.stop - mine.start)
        lr = lr_at(self.step, peak_lr=cfg.peak_lr, warmup=self.warmup, total=cfg.steps, min_lr=cfg.min_lr)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for i in range(mine.start, mine.stop, micro):
            xs, ys, ms = (t[i : i + micro].to(self.device) for t in (x, y, mask))
            with self._autocast():
                logits, _ = self.model(xs)
            part = masked_ce_sum(logits, ys, ms) / n_targets
            part.backward()
            total += part.detach()
        self.world.all_reduce_grads(self.params)
        torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        self.opt.step()
        self.step += 1
        return self.world.sum(total)

    def _autocast(self):
        if self.cfg.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def save_state(self, path: Path, losses: list[float]) -> None:
        """The complete training state (weights, AdamW moments and step counts, losses so far),
        with every tensor's SHA-256 in the file's metadata."""
        t = {f"model.{k}": v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        for i, st in self.opt.state_dict()["state"].items():
            for k, v in st.items():
                t[f"opt.{i}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
        t["losses"] = torch.tensor(losses, dtype=torch.float64)
        write_safetensors(path, t, {"step": str(self.step), "sha256": json.dumps(tensor_hashes(t))})

    def load_state(self, path: Path, manifest: dict[str, dict[str, str]] | None = None) -> list[float]:
        """Restore a state file (its hashes checked; its weights also against ``manifest``)."""
        t, meta = read_verified(path)
        self.step = int(meta["step"])
        weights = {k[6:]: v for k, v in t.items() if k.startswith("model.")}
        if manifest is not None and str(self.step) in manifest and tensor_hashes(weights) != manifest[str(self.step)]:
            raise SeedlabError(f"{path}: its weights at step {self.step} do not match manifest.json (corrupted checkpoint)")
        self.model.load_state_dict(weights)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in t.items():
            if k.startswith("opt."):
                _, i, name = k.split(".", 2)
                state.setdefault(int(i), {})[name] = v
        self.opt.load_state_dict({"state": state, "param_groups": self.opt.state_dict()["param_groups"]})
        return t["losses"].tolist()

    def fork(self) -> _Run:
        """A copy with its own model and optimizer state (deep-copied together, so the
        optimizer's references point at the copy's parameters)."""
        twin = copy.copy(self)
        twin.model, twin.opt = copy.deepcopy((self.model, self.opt))
        twin.params = list(twin.model.parameters())
        return twin


def prepare(cfg: TwinsConfig, base: Path, world: World):
    """Everything checked before a run folder is touched: corpus (hashes), passages, attestation, ranks."""
    from seedlab.twins.corpus import load

    corpus_dir = (base / cfg.corpus) if not Path(cfg.corpus).is_absolute() else Path(cfg.corpus)
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
            prefix: tuple[_Run, list[float]] | None = None
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
                    run = _Run(cfg, gcfg, seed, corpus.train, world)
                    losses = run.load_state(folder / "state.safetensors", manifest)
                    bar.start_sub(f"seed {seed} {cond}", cfg.steps - first)
                    bar.advance(run.step - first)
                elif independent:  # the audit: this condition trains its own prefix
                    bar.start_sub(f"seed {seed} {cond}", cfg.steps)
                    run, losses = _Run(cfg, gcfg, seed, corpus.train, world), []
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
                    losses.append(run.advance(inj, pad_id=corpus.eot_id))
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


def shared_prefix(cfg: TwinsConfig, gcfg: GPTConfig, seed: int, tokens, path: Path, bar: Bar, world: World) -> tuple[_Run, list[float]]:
    """Steps 0 .. s-1 of a seed, trained once and kept (complete state) for every fork."""
    run = _Run(cfg, gcfg, seed, tokens, world)
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
    from seedlab.twins.corpus import count

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
