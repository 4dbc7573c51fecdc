"""A twins run folder on disk, as later tools read it (measure, gradmatch, report).

``open_run`` reads ``config.json`` (the resolved TwinsConfig) and ``inputs.json`` (the corpus's
path and hashes, each passage's token ids), loads the corpus and lists which seed x condition
runs finished; ``RunDir.weights`` returns a checkpoint with every tensor's SHA-256 checked
against the run's ``manifest.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from seedlab.config import parse
from seedlab.errors import SeedlabError
from seedlab.lm.model import GPTConfig
from seedlab.store import read_verified
from seedlab.twins.config import TwinsConfig
from seedlab.twins.train import model_config


@dataclass
class RunDir:
    """A finished (or partly finished) twins design on disk."""

    root: Path
    cfg: TwinsConfig
    gcfg: GPTConfig
    corpus: object
    passages: dict[str, list[int]]
    done: dict[tuple[int, str], Path] = field(default_factory=dict)  # (seed, condition) -> folder
    missing: list[str] = field(default_factory=list)

    def folder(self, seed: int, cond: str) -> Path:
        return self.root / f"seed-{seed}" / cond

    def weights(self, seed: int, cond: str, step: int) -> dict[str, torch.Tensor]:
        """Weights after ``step`` updates, every tensor's SHA-256 checked against manifest.json
        (the run need not have finished: an interrupted one has its checkpoints so far)."""
        folder = self.folder(seed, cond)
        try:
            expected = json.loads((folder / "manifest.json").read_text()).get(str(step))
        except (OSError, json.JSONDecodeError):
            expected = None
        if expected is None:
            raise SeedlabError(f"{folder}: no checkpoint at step {step} in manifest.json (seed {seed} {cond} has not reached it)")
        state, _ = read_verified(folder / f"step-{step}.safetensors", expected)
        return state


def open_run(root: str | Path, corpus: str | Path | None = None) -> RunDir:
    """Read a run folder's config and inputs; list which seed x condition runs finished."""
    from seedlab.corpus import load

    root = Path(root)
    if not (root / "config.json").is_file():
        raise SeedlabError(f"{root}: not a twins run folder (no config.json)")
    record = json.loads((root / "config.json").read_text())
    cfg = parse(TwinsConfig, {k: v for k, v in record.items() if k in TwinsConfig.model_fields})
    if not (root / "inputs.json").is_file():
        raise SeedlabError(f"{root}: no inputs.json (a run from an older seedlab: train it again)")
    inputs = json.loads((root / "inputs.json").read_text())
    path = Path(corpus or inputs["corpus"])
    if not (path / "meta.json").is_file():
        how = "pass --corpus" if corpus else "the corpus has moved since the run: pass --corpus"
        raise SeedlabError(f"corpus: no prepared corpus at {str(path)!r} ({how})")
    c = load(path, verify=False)
    want = inputs.get("corpus_sha256")
    if want and {k: v["sha256"] for k, v in c.meta["splits"].items()} != want:
        raise SeedlabError(f"corpus: {path} is not the corpus this run was trained on (hashes differ)")
    passages = {k: v["tokens"] for k, v in inputs["passages"].items()}
    run = RunDir(root, cfg, model_config(cfg, c.vocab_size), c, passages)
    for seed in cfg.seeds:
        for cond in cfg.conditions:
            if (run.folder(seed, cond) / "done.json").is_file():
                run.done[seed, cond] = run.folder(seed, cond)
            else:
                run.missing.append(f"seed {seed} {cond}")
    return run
