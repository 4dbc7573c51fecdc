"""Sweeps: a grid over tasks x ratios x layers x heads x weight decays x lrs x seeds.

The grid expands into members; members of one architecture (and one class count) are
grouped into ensembles of at most ``max_members``; each ensemble is a *job* whose folder
is the hash of its resolved config (``DIR/jobs/<hash>/``). Seeds are the outermost loop,
so the first jobs to finish already cover every cell.

Resumable: a job is finished when its ``done.json`` exists (written last, atomically);
a restarted sweep skips finished jobs and reruns unfinished ones from scratch. The
sweep's ``summary.parquet``/``curves.parquet`` are rebuilt from finished jobs after each
one, atomically, so they always hold exactly one row per finished member. A lock on
``DIR/.lock`` (released by the OS even on kill -9) keeps two sweeps out of one folder.
"""

from __future__ import annotations

import functools
import itertools
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pandas as pd
from pydantic import Discriminator, Field, Tag, field_validator

from seedlab.config import Strict, parse
from seedlab.errors import SeedlabError
from seedlab.progress import Bar
from seedlab.shortcut.config import (
    DataConfig,
    EnsembleConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
    _ratio,
    _task_name,
)
from seedlab.shortcut.tasks import TASKS
from seedlab.store import content_hash, folder_lock, write_json, write_parquet, write_yaml


class SweepGrid(Strict):
    task: list[str] = ["sum2-max"]
    ratio: list[float] = [0.5, 0.9]  # fractions of shortcut-consistent training samples
    layers: list[Annotated[int, Field(gt=0)]] = [1, 2]
    heads: list[Annotated[int, Field(gt=0)]] = [1]
    weight_decay: list[Annotated[float, Field(ge=0)]] | None = None  # null: optim.weight_decay
    lr: list[Annotated[float, Field(gt=0)]] | None = None  # null: optim.lr
    seed: list[int] | Annotated[int, Field(gt=0)] = 8  # a list, or a count n meaning 0..n-1

    @field_validator("task")
    @classmethod
    def _tasks(cls, v: list[str]) -> list[str]:
        return [_task_name(t) for t in v]

    @field_validator("ratio")
    @classmethod
    def _ratios(cls, v: list[float]) -> list[float]:
        return [_ratio(r) for r in v]

    @field_validator("task", "ratio", "layers", "heads", "weight_decay", "lr")
    @classmethod
    def _nonempty(cls, v: list | None) -> list | None:
        if v is not None and not v:
            raise ValueError("empty grid axis: list at least one value")
        return v

    @field_validator("seed")
    @classmethod
    def _seeds(cls, v: list[int] | int) -> list[int] | int:
        if isinstance(v, list) and not v:
            raise ValueError("empty grid axis: list at least one seed (or give a count)")
        return v

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed)) if isinstance(self.seed, int) else self.seed


Grids = Annotated[
    Annotated[SweepGrid, Tag("as-grid")] | Annotated[list[SweepGrid], Tag("as-list")],
    Discriminator(lambda v: "as-list" if isinstance(v, list) else "as-grid"),
]


class SweepConfig(Strict):
    """``seedlab shortcut sweep CONFIG``: shared hyperparameters plus the grid."""

    model: ModelConfig = ModelConfig()  # layers/heads here are overridden by the grid
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    grid: Grids = SweepGrid()  # one grid, or several (their union, duplicates dropped)
    max_members: Annotated[int, Field(gt=0)] = 64  # members per ensemble job (bounds memory)


@dataclass(frozen=True)
class Job:
    key: str  # hash of the resolved ensemble config: the job's folder name
    config: dict  # the resolved EnsembleConfig, as JSON-able data


def plan(cfg: SweepConfig) -> list[Job]:
    """Expand the grid(s) into ensemble jobs, in a stable order."""
    grids = cfg.grid if isinstance(cfg.grid, list) else [cfg.grid]
    seen: set[tuple] = set()
    jobs = []
    for g in grids:
        wds = g.weight_decay or [cfg.optim.weight_decay]
        lrs = g.lr or [cfg.optim.lr]
        for layers, heads in itertools.product(g.layers, g.heads):
            model = parse(ModelConfig, cfg.model.model_dump() | {"layers": layers, "heads": heads}, prefix="grid")
            for k in sorted({TASKS[t].n_classes for t in g.task}):
                tasks = [t for t in g.task if TASKS[t].n_classes == k]
                members = []
                for s, t, r, wd, lr in itertools.product(g.seeds, tasks, g.ratio, wds, lrs):
                    if (key := (layers, heads, t, r, s, wd, lr)) not in seen:  # grids may overlap
                        seen.add(key)
                        members.append({"task": t, "ratio": r, "seed": s, "weight_decay": wd, "lr": lr})
                jobs += _ensembles(cfg, model, members)
    return jobs


def _ensembles(cfg: SweepConfig, model: ModelConfig, members: list[dict]) -> list[Job]:
    """Cut one architecture's members into jobs of at most ``max_members``."""
    jobs = []
    for i in range(0, len(members), cfg.max_members):
        ens = EnsembleConfig.model_validate(
            {
                "model": model.model_dump(),
                "data": cfg.data.model_dump(),
                "optim": cfg.optim.model_dump(),
                "train": cfg.train.model_dump(),
                "members": members[i : i + cfg.max_members],
            }
        )
        data = ens.model_dump(mode="json")
        jobs.append(Job(content_hash(data), data))
    return jobs


#: per-job tables merged into the sweep folder (member ids made global)
TABLES = ("summary.parquet", "curves.parquet", "gradients.parquet")


def job_dir(out: Path, job: Job) -> Path:
    return out / "jobs" / job.key


def is_done(out: Path, job: Job) -> bool:
    return (job_dir(out, job) / "done.json").exists()


def run_job(spec: tuple[str, dict, int | None], on_eval: Callable[[int, dict], None] | None = None) -> str:
    """Train one job into its folder (module-level, so Ray can ship it to a worker)."""
    from seedlab.shortcut.train import train_ensemble

    folder, data, threads = spec
    import torch

    if threads:
        torch.set_num_threads(threads)
    folder_p = Path(folder)
    if folder_p.exists():  # leftovers of an interrupted attempt
        shutil.rmtree(folder_p)
    cfg = EnsembleConfig.model_validate(data)
    r = train_ensemble(cfg, folder_p, progress=False, on_eval=on_eval)
    write_json(folder_p / "done.json", {"members": len(r.members), "seconds": round(r.seconds, 3)})
    return folder


def sweep_lock(out: Path):
    """An exclusive lock on the sweep folder; a second sweep gets a clear one-line error."""
    return folder_lock(out, busy="--out: {folder} is in use by another sweep (pid {pid}); wait for it or stop it")


def aggregate(out: Path, jobs: list[Job]) -> pd.DataFrame:
    """Rebuild the sweep's tables from finished jobs: one row per member, global member ids."""
    tables: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}
    offset = 0
    for job in jobs:
        d = job_dir(out, job)
        if is_done(out, job):
            for name in TABLES:
                if (d / name).exists():  # gradients.parquet only when measured
                    t = pd.read_parquet(d / name)
                    t["member"] += offset
                    t.insert(0, "job", job.key)
                    tables[name].append(t)
        offset += len(job.config["members"])
    for name, parts in tables.items():
        if parts:
            write_parquet(out / name, pd.concat(parts, ignore_index=True))
    return pd.concat(tables["summary.parquet"], ignore_index=True) if tables["summary.parquet"] else pd.DataFrame()


def finished_jobs(out: Path) -> list[tuple[str, Path, int]]:
    """(job key, folder, first global member id) of each finished job of the sweep in ``out``."""
    from seedlab.config import load_yaml

    jobs, offset, found = plan(parse(SweepConfig, load_yaml(out / "sweep.yaml"))), 0, []
    for job in jobs:
        if is_done(out, job):
            found.append((job.key, job_dir(out, job), offset))
        offset += len(job.config["members"])
    return found


def run_sweep(
    cfg: SweepConfig,
    out: str | Path,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Run (or resume) every unfinished job of the sweep and aggregate the results."""
    from seedlab.executors import preflight_ray, run_local, run_ray
    from seedlab.shortcut.train import check_members

    if executor not in ("local", "ray"):
        raise SeedlabError(f"--executor: must be local or ray, got {executor!r}")
    if executor == "ray":
        preflight_ray(ray_address)
    jobs = plan(cfg)
    for job in jobs:  # every job's data can be built: fail before anything is written
        ens = EnsembleConfig.model_validate(job.config)
        check_members(ens, ens.expand())
    out = Path(out)
    with sweep_lock(out):
        write_yaml(out / "sweep.yaml", cfg.model_dump(mode="json"))
        todo = [j for j in jobs if not is_done(out, j)]
        n_members = sum(len(j.config["members"]) for j in jobs)
        bar = Bar("sweep", len(jobs), "jobs", note=f"({n_members} members)", done=len(jobs) - len(todo), enabled=progress)
        by_dir = {str(job_dir(out, j)): j for j in todo}

        def on_done(spec: tuple[str, dict, int | None]) -> None:
            aggregate(out, jobs)
            bar.advance()

        threads = 1 if executor == "ray" else cfg.train.threads
        specs = [(d, j.config, threads) for d, j in by_dir.items()]
        epochs = cfg.train.epochs
        note = lambda epoch, _: bar.update(note=f"({n_members} members; this job: epoch {epoch}/{epochs})")
        with bar:
            if executor == "local":  # one job at a time: show its epochs too
                run_local(functools.partial(run_job, on_eval=note), specs, on_done)
            else:
                run_ray(run_job, specs, on_done, address=ray_address)
        return aggregate(out, jobs)
