"""What a run of a fork design writes at a saved step and when it is done, and what it adds to its seed's
record: one definition for the serial loop (forks/loop.py) and the stacks (forks/stacked.py), so both write
the same bytes."""

from __future__ import annotations

import json

import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.forks.arms import Arm
from seedlab.forks.folders import RunFolder
from seedlab.lm.trainer import Trainer
from seedlab.store import write_json, write_parquet, write_safetensors

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


def merge(record: dict, added: dict | None) -> None:
    """A finished run's additions (:func:`extra`) into its seed's record; several arms' perturbations merge."""
    for key, value in (added or {}).items():
        record[key] = record.get(key, {}) | value if key == "perturbations" else value


def losses_frame(d, losses: list[float]) -> pd.DataFrame:
    """losses.parquet's frame: the losses of every update from ``recording.losses_from``."""
    start = d.recording.losses_from
    return pd.DataFrame({"step": range(start, len(losses)), "loss": losses[start:]})


def finish(d, where: RunFolder, frame: pd.DataFrame, manifest: Manifest) -> None:
    """A trained run's last files (rank 0): its losses and manifest, its complete final state where the
    design keeps it (saved at the final step, a saved step), the done marker, then its resume state removed."""
    if not d.world.main:
        return
    write_parquet(where.losses, frame)
    write_json(where.manifest, manifest)
    if d.recording.keep_final:
        where.state.replace(where.final_state)
    where.mark_finished(d.cfg.end)
    where.state.unlink(missing_ok=True)


def finish_replica(d, where: RunFolder, record: dict) -> None:
    """The replica control's files (rank 0): its record (``replica/manifest.json``) and done marker. A
    control that compared no step is a failed control, never "equal": a one-line error, nothing written."""
    if not record.get("steps_compared"):
        raise SeedlabError(f"{where.path}: the replica control compared no step with its twin (the twin recorded no "
                           "hashes it could read): a control that compares nothing has not passed")
    if d.world.main:
        write_json(where.manifest, {"record": record})
        where.mark_finished(d.cfg.end)


def early_starts(d, seed: int) -> dict[str, int]:
    """``{arm: t}`` of the seed's arms that leave the shared prefix before the fork step (forks/arms.py ``Arm.start``)."""
    s = d.cfg.injection_step
    return {a.name: a.leaves(s) for a in d.arms(seed) if a.leaves(s) < s}


def early_record(early: dict[str, int]) -> dict:
    """What the seed's integrity record says of its arms that left the prefix before s."""
    return {"identical_at_start": "by construction: forked from the shared prefix's own state at that step (the "
                                  "prefix is a pure function of the seed); not compared with the twin at s",
            "arms": dict(early)}


def earlier_states(d, seed: int) -> dict[int, object]:
    """``{t: path}`` of the prefix states the seed's early arms start from (forks/prefix.py ``SharedPrefix(earlier=)``)."""
    return {t: d.folder.prefix_at(seed, t) for t in sorted(set(early_starts(d, seed).values()))}


def remove_prefix(d, seed: int) -> None:
    """The seed's kept prefix (and its earlier states) removed: every fork of it is done."""
    d.folder.prefix(seed).unlink(missing_ok=True)
    for path in earlier_states(d, seed).values():
        path.unlink(missing_ok=True)

