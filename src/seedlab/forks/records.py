"""What a run of a fork design writes at a saved step, and adds to its seed's record when it is done: one
definition for the serial loop (forks/loop.py) and the stacks (forks/stacked.py), so both write the same bytes."""

from __future__ import annotations

import json

from seedlab.forks.arms import Arm
from seedlab.forks.folders import RunFolder
from seedlab.lm.trainer import Trainer
from seedlab.store import write_json, write_safetensors

Manifest = dict[str, dict[str, str]]  # {str(step): {tensor: SHA-256}}


def extra(d, seed: int, arm: Arm, where: RunFolder, manifest: Manifest) -> dict | None:
    """What a finished run adds to its seed's integrity record: the observer's (``d``: a forks/loop.py
    ``Design``), and what its perturbation did."""
    added = d.observer.finished(seed, arm, where, manifest) or {}
    if arm.perturbation is not None and where.perturbation.is_file():
        added["perturbations"] = {arm.name: json.loads(where.perturbation.read_text())}
    return added or None


def save(d, where: RunFolder, tr: Trainer, losses: list[float], manifest: Manifest) -> None:
    """The weights after ``tr.step`` updates, the manifest so far, then (a resumable design) the
    complete state: last, the resume point. Rank 0 alone writes."""
    if not d.world.main:
        return
    write_safetensors(where.checkpoint(tr.step), tr.weights(), {"step": str(tr.step), "seed": str(tr.seed),
                                                                 "run": where.path.name})
    if d.recording.resume:
        write_json(where.manifest, manifest)
        tr.save_state(where.state, losses)
