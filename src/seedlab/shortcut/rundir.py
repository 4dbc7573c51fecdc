"""Where every file of the shortcut study lives, and the policies of its folders.

Three folders, the file contract other tools read:

- a **data folder** (``seedlab shortcut data --out``): ``train.npz``, ``val.npz``, ``adv.npz``;
- an **ensemble run folder** (``seedlab shortcut train --out``, and each job of a sweep):
  ``config.yaml`` (the resolved EnsembleConfig), ``summary.parquet`` (one row per member),
  ``curves.parquet``, ``gradients.parquet`` and ``gradients_heads.parquet`` (when measured), ``meta.json``,
  ``checkpoints/epoch-<6 digits>.safetensors`` with ``checkpoints/manifest.json``
  (``{epoch: {tensor: SHA-256}}``), then ``circuits.parquet``, ``patching.parquet``, ``report.md`` and its PNGs;
- a **sweep folder** (``seedlab shortcut sweep --out``): ``sweep.yaml``, ``jobs/<hash>/`` (an
  ensemble run folder each, finished when its ``done.json`` exists), the merged
  ``summary/curves/gradients/gradients_heads.parquet`` (member ids made global), ``.lock``, and the same
  ``circuits.parquet``, ``patching.parquet``, ``report.md`` and PNGs as a run folder; with
  ``--preregistration FILE``, ``preregistration.md`` (the file's text) and ``preregistration.json``
  (its SHA-256, where it came from, when), written before the first member is trained.

Readers (the report's, at the end): the summary, any other table, the config's settings the report names, what
each job counted as generalized, the pre-registration.

Policies: ``shortcut train`` and ``shortcut data`` refuse to overwrite results without
``--force``; a sweep resumes (finished jobs are kept, an unfinished job restarts from an
empty folder) and holds the folder's lock while it runs. How files are written and checked
(atomically, hashed) is :mod:`seedlab.store`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from seedlab.config import load_yaml, parse
from seedlab.errors import SeedlabError
from seedlab.shortcut.config import DataConfig, GradientsConfig, TrainConfig
from seedlab.shortcut.tasks import SPLITS, Split, make_splits
from seedlab.store import (
    file_sha256,
    folder_lock,
    is_done,
    mark_done,
    read_manifest,
    read_verified,
    refuse_overwrite,
    tensor_hashes,
    write_json,
    write_safetensors,
    write_text,
)

#: tables a sweep merges from its jobs (member ids made global)
MERGED = ("summary", "curves", "gradients", "gradients_heads")


def data_files(folder: Path) -> dict[str, Path]:
    """split -> its ``.npz`` file in a data folder."""
    return {s: Path(folder) / f"{s}.npz" for s in SPLITS}


class _Results:
    """The files a run folder and a sweep folder share: tables, circuits, the report and its figures."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def table(self, name: str) -> Path:
        """``summary``, ``curves``, ``gradients``, ``gradients_heads``, ``circuits`` or ``patching`` -> its parquet file."""
        return self.root / f"{name}.parquet"

    @property
    def summary_path(self) -> Path:
        return self.table("summary")

    @property
    def curves_path(self) -> Path:
        return self.table("curves")

    @property
    def gradients_path(self) -> Path:
        return self.table("gradients")

    @property
    def gradients_heads_path(self) -> Path:
        """The gradient conflict restricted to each attention head's parameters (shortcut/gradients.py)."""
        return self.table("gradients_heads")

    @property
    def circuits_path(self) -> Path:
        return self.table("circuits")

    @property
    def patching_path(self) -> Path:
        """Matched-pair activation patching, per-pair quantiles (``seedlab shortcut analyze``)."""
        return self.table("patching")

    @property
    def report_path(self) -> Path:
        return self.root / "report.md"

    def figure(self, name: str) -> Path:
        """A PNG beside the report, e.g. ``figure("curves.png")``."""
        return self.root / name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"


class RunDir(_Results):
    """An ensemble run folder: one trained ensemble and everything measured on it."""

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def meta_path(self) -> Path:
        return self.root / "meta.json"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def manifest_path(self) -> Path:
        return self.checkpoints_dir / "manifest.json"

    def checkpoint(self, epoch: int) -> Path:
        return self.checkpoints_dir / f"epoch-{epoch:06d}.safetensors"

    def refuse_overwrite(self, force: bool) -> None:
        """``shortcut train --out``: a folder holding a finished run needs ``--force``."""
        refuse_overwrite([self.summary_path], force)

    def start(self) -> RunDir:
        """Before training into the folder: it exists, and no manifest of an earlier run lists its checkpoints."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifest_path.unlink(missing_ok=True)
        return self

    def clear(self) -> RunDir:
        """An empty folder: what an interrupted attempt left is removed."""
        if self.root.exists():
            shutil.rmtree(self.root)
        return self

    def mark_done(self, info: Mapping[str, Any]) -> Path:
        """The folder's ``done.json``, written last: a sweep job is finished."""
        return mark_done(self.root, info)

    def is_done(self) -> bool:
        return is_done(self.root)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, epoch: int, state: Mapping[str, Any], metadata: dict[str, str]) -> Path:
        """Write the weights at ``epoch`` and record every tensor's SHA-256 in the manifest."""
        path = write_safetensors(self.checkpoint(epoch), state, metadata)
        manifest = read_manifest(self.manifest_path)
        manifest[str(epoch)] = tensor_hashes(state)
        write_json(self.manifest_path, manifest)
        return path

    def checkpoint_epochs(self) -> list[int]:
        """Epochs with a checkpoint listed in the manifest, ascending."""
        epochs = sorted(int(e) for e in read_manifest(self.manifest_path))
        if not epochs and any(self.checkpoints_dir.glob("epoch-*.safetensors")):
            raise SeedlabError(
                f"{self.checkpoints_dir}: checkpoints without a manifest.json to check them against"
                " (a run from an older seedlab: train it again)"
            )
        return epochs

    def load_checkpoint(self, epoch: int) -> tuple[dict[str, Any], dict[str, str]]:
        """The tensors and metadata of the checkpoint at ``epoch``, every tensor checked against the manifest."""
        expected = read_manifest(self.manifest_path).get(str(epoch))
        if expected is None:
            raise SeedlabError(f"{self.manifest_path}: no checkpoint at epoch {epoch}")
        return read_verified(self.checkpoint(epoch), expected)


class SweepDir(_Results):
    """A sweep folder: its config, one ensemble run folder per job, the merged tables."""

    @property
    def config_path(self) -> Path:
        return self.root / "sweep.yaml"

    def job(self, key: str) -> RunDir:
        return RunDir(self.root / "jobs" / key)

    @property
    def preregistration_path(self) -> Path:
        return self.root / "preregistration.md"

    @property
    def preregistration_record(self) -> Path:
        return self.root / "preregistration.json"

    def preregister(self, source: Path, started: bool, *, write: bool = True) -> None:
        """Keep ``source`` (hypotheses and decision rules fixed before looking) in the folder, with its
        SHA-256 and the time: only before the first member is trained (``started``: a job has finished),
        and a resumed sweep must name the same text. Checks first, then writes (``write=False``: checks only)."""
        if not source.is_file():
            raise SeedlabError(f"--preregistration: no such file {str(source)!r}")
        sha = file_sha256(source)
        if self.preregistration_record.is_file():
            before = json.loads(self.preregistration_record.read_text())["sha256"]
            if before != sha:
                raise SeedlabError(f"--preregistration: {self.root} was pre-registered with another text "
                                   f"(SHA-256 {before[:12]}, {source} has {sha[:12]}); a pre-registration cannot change")
            return
        if started:
            raise SeedlabError(f"--preregistration: {self.root} already holds finished members; a pre-registration "
                               "must come before the first one (use a new --out)")
        if not write:
            return
        write_text(self.preregistration_path, source.read_text())
        write_json(self.preregistration_record, {
            "sha256": sha, "source": str(source), "written_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })


    def lock(self):
        """An exclusive lock on the folder while a sweep runs; a second sweep gets a one-line error."""
        busy = "--out: {folder} is in use by another sweep (pid {pid}); wait for it or stop it"
        return folder_lock(self.root, busy=busy)


def is_sweep(folder: str | Path) -> bool:
    return SweepDir(folder).config_path.is_file()


def open_folder(folder: str | Path) -> RunDir | SweepDir:
    """A sweep folder when it holds ``sweep.yaml``, else an ensemble run folder."""
    return SweepDir(folder) if is_sweep(folder) else RunDir(folder)


def write_splits(
    out: str | Path,
    task: str,
    ratio: float,
    n_train: int,
    *,
    n_val: int,
    n_adv: int,
    length: int,
    vocab: int,
    seed: int,
    force: bool = False,
) -> dict[str, Split]:
    """``seedlab shortcut data``: validate the settings, make the three splits and write them to the
    data folder ``out`` (``train.npz``, ``val.npz``, ``adv.npz``; existing files are refused unless
    ``force``). Returns the splits written."""
    d = parse(DataConfig, {"length": length, "vocab": vocab, "n_train": n_train, "n_val": n_val, "n_adv": n_adv, "data_seed": seed})
    splits = make_splits(task, ratio, d.n_train, n_val=d.n_val, n_adv=d.n_adv, length=d.length, vocab=d.vocab, seed=d.data_seed)
    files = data_files(out)
    refuse_overwrite(list(files.values()), force)
    for name, split in splits.items():
        split.save(files[name])
    return splits


# ---------------------------------------------------------------- readers (the report's)


def read_summary(folder: RunDir | SweepDir) -> pd.DataFrame:
    """The folder's per-member summary (a run folder's or a sweep's merged one), ``generalized`` as bool."""
    path = folder.summary_path
    if not path.is_file():
        raise SeedlabError(f"{folder.root}: no summary.parquet (run `seedlab shortcut sweep` first)")
    df = pd.read_parquet(path)
    if df.empty:
        raise SeedlabError(f"{path}: no members (the sweep wrote an empty summary)")
    df["generalized"] = df["generalized"].astype(bool)
    return df


def read_table(folder: RunDir | SweepDir, name: str, **read: Any) -> pd.DataFrame | None:
    """One of the folder's tables (:meth:`_Results.table`), None where the folder lacks it; ``read``: passed to
    :func:`pandas.read_parquet` (``columns``, ``filters``). A patching table from before the pair kinds and paths
    holds same-label pairs patched whole, so it reads as ``pairs = same_label``, ``path = total``."""
    path = folder.table(name)
    if not path.is_file():
        return None
    df = pd.read_parquet(path, **read)
    if name == "patching":
        df = df.assign(**{c: v for c, v in (("pairs", "same_label"), ("path", "total")) if c not in df})
    return df


def table_columns(folder: RunDir | SweepDir, name: str) -> list[str]:
    """The column names of one of the folder's tables (its schema alone; the table must exist)."""
    import pyarrow.parquet as pq

    return pq.read_schema(folder.table(name)).names


def _config(folder: RunDir | SweepDir) -> dict | None:
    """The folder's config as written (a run's config.yaml, a sweep's sweep.yaml); None without one."""
    return load_yaml(folder.config_path) if folder.config_path.is_file() else None


def adv_split_size(folder: RunDir | SweepDir) -> int | None:
    """``data.n_adv`` of the folder's config; None without a config."""
    record = _config(folder)
    return None if record is None else DataConfig.model_validate(record.get("data", {})).n_adv


def train_cadence(folder: RunDir | SweepDir) -> dict | None:
    """How often the run or sweep looked at its members, from the folder's config: ``eval_every`` (epochs between
    evaluations), ``adv_every`` (epochs between checks of the adversarial split alone; None: only at the evaluations)
    and ``precision`` ("fp32", the value of a config from before the field existed, or "bf16"); None without a
    config."""
    record = _config(folder)
    if record is None:
        return None
    train = record.get("train") or {}
    return {"eval_every": train.get("eval_every", TrainConfig.model_fields["eval_every"].default),
            "adv_every": train.get("adv_every"), "precision": train.get("precision", "fp32")}


def saturated_loss(folder: RunDir | SweepDir) -> float:
    """``train.gradients.saturated_loss`` of the folder's config (its default without a config or the field)."""
    record = _config(folder) or {}
    return GradientsConfig.model_validate((record.get("train") or {}).get("gradients") or {}).saturated_loss


#: what jobs trained before meta.json recorded the definition (2026-12-01) counted
OLD_DEFINITION = "adversarial accuracy exactly 100% at one evaluation or adv_every check, validation not checked"


def generalized_definitions(folder: RunDir | SweepDir, jobs: list[str]) -> list[str]:
    """What ``generalized`` meant when each job (a sweep's ``jobs`` keys, in order; a run folder is its own job) was
    trained, from its meta.json (train.GENERALIZED; :data:`OLD_DEFINITION` where meta.json predates the record);
    the jobs without a meta.json are left out, and with none at all the folder reads as :data:`OLD_DEFINITION`."""
    runs = [folder.job(k) for k in jobs] if isinstance(folder, SweepDir) else [folder]
    metas = [json.loads(r.meta_path.read_text()) for r in runs if r.meta_path.is_file()]
    return [m.get("generalized", OLD_DEFINITION) for m in metas] or [OLD_DEFINITION]


@dataclass(frozen=True)
class Preregistration:
    """A sweep's kept pre-registration: its text, where and when it was copied from, its recorded SHA-256, and
    whether the text still has that hash."""

    text: str
    source: str
    written_utc: str
    sha256: str
    intact: bool


def read_preregistration(folder: SweepDir) -> Preregistration | None:
    """The pre-registration kept in the sweep folder (``--preregistration``); None without one."""
    if not folder.preregistration_record.is_file():
        return None
    rec = json.loads(folder.preregistration_record.read_text())
    return Preregistration(folder.preregistration_path.read_text(), rec["source"], rec["written_utc"], rec["sha256"],
                           file_sha256(folder.preregistration_path) == rec["sha256"])
