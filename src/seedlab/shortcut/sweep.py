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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from seedlab.config import load_yaml, parse
from seedlab.errors import SeedlabError
from seedlab.progress import Bar
from seedlab.shortcut.config import LATER_FIELDS, REPORT_ONLY, EnsembleConfig, ModelConfig, SweepConfig
from seedlab.shortcut.rundir import MERGED, RunDir, SweepDir
from seedlab.shortcut.tasks import TASKS
from seedlab.store import content_hash, write_parquet, write_yaml


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
        for layers, heads in itertools.product(g.layers, g.heads):
            model = parse(ModelConfig, cfg.model.model_dump() | {"layers": layers, "heads": heads}, prefix="grid")
            for k in sorted({TASKS[t].n_classes for t in g.task}):
                tasks = [t for t in g.task if TASKS[t].n_classes == k]
                members = []
                # an axis left null is one value left null: the optimizer's
                for s, t, r, wd, lr in itertools.product(g.seeds, tasks, g.ratio, g.weight_decay or [None], g.lr or [None]):
                    wd, lr = cfg.optim.for_member(wd, lr)
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
        jobs.append(Job(job_key(data), data))
    return jobs


def job_key(data: dict) -> str:
    """A job's folder name: the hash of its resolved config, leaving out the
    :data:`~seedlab.shortcut.config.REPORT_ONLY` fields and each of the
    :data:`~seedlab.shortcut.config.LATER_FIELDS` that holds the value older configs meant, so a
    sweep started before a field existed resumes into the same folders."""
    dropped = set(REPORT_ONLY) | {path for path, old in LATER_FIELDS.items() if _at(data, path) == old}
    return content_hash(_without(data, dropped))


def _at(data: dict, path: tuple[str, ...]) -> object:
    for key in path:
        data = data.get(key, {}) if isinstance(data, dict) else {}
    return data


def _without(data: dict, paths: set[tuple[str, ...]], prefix: tuple[str, ...] = ()) -> dict:
    """A copy of nested ``data`` without the fields at ``paths``."""
    return {k: _without(v, paths, (*prefix, k)) if isinstance(v, dict) else v
            for k, v in data.items() if (*prefix, k) not in paths}


def run_job(spec: tuple[str, dict, int | None], on_eval: Callable[[int, dict], None] | None = None) -> str:
    """Train one job into its folder (module-level, so Ray can ship it to a worker)."""
    import torch

    from seedlab.shortcut.train import train_ensemble

    folder, data, threads = spec
    if threads:
        torch.set_num_threads(threads)
    run = RunDir(folder).clear()  # an interrupted attempt starts again from an empty folder
    result = train_ensemble(EnsembleConfig.model_validate(data), run.root, progress=False, on_eval=on_eval)
    run.mark_done({"members": len(result.members), "seconds": round(result.seconds, 3)})
    return folder


def aggregate(sweep: SweepDir, jobs: list[Job]) -> pd.DataFrame:
    """Rebuild the sweep's tables from finished jobs: one row per member, global member ids."""
    tables: dict[str, list[pd.DataFrame]] = {name: [] for name in MERGED}
    offset = 0
    for job in jobs:
        run = sweep.job(job.key)
        if run.is_done():
            for name in MERGED:
                if run.table(name).exists():  # gradients only when measured
                    t = pd.read_parquet(run.table(name))
                    t["member"] += offset
                    t.insert(0, "job", job.key)
                    tables[name].append(t)
        offset += len(job.config["members"])
    for name, parts in tables.items():
        if parts:
            write_parquet(sweep.table(name), pd.concat(parts, ignore_index=True))
    return pd.concat(tables["summary"], ignore_index=True) if tables["summary"] else pd.DataFrame()


def finished_jobs(sweep: SweepDir) -> list[tuple[str, RunDir, int]]:
    """(job key, run folder, first global member id) of each finished job of a sweep."""
    jobs, offset, found = plan(parse(SweepConfig, load_yaml(sweep.config_path))), 0, []
    for job in jobs:
        if sweep.job(job.key).is_done():
            found.append((job.key, sweep.job(job.key), offset))
        offset += len(job.config["members"])
    return found


def run_sweep(
    cfg: SweepConfig,
    out: str | Path,
    *,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool = True,
    preregistration: str | Path | None = None,
) -> pd.DataFrame:
    """Run (or resume) every unfinished job of the sweep and aggregate the results; ``preregistration``:
    a text file of hypotheses and decision rules, kept in the folder before any member is trained."""
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
    sweep = SweepDir(out)
    started = lambda: any(sweep.job(j.key).is_done() for j in jobs) or sweep.summary_path.is_file()
    if preregistration is not None:  # a bad pre-registration writes nothing, not even the lock
        sweep.preregister(Path(preregistration), started(), write=False)
    with sweep.lock():
        todo = [j for j in jobs if not sweep.job(j.key).is_done()]
        if preregistration is not None:
            sweep.preregister(Path(preregistration), started())
        write_yaml(sweep.config_path, cfg.model_dump(mode="json"))
        n_members = sum(len(j.config["members"]) for j in jobs)
        bar = Bar("sweep", len(jobs), "jobs", note=f"({n_members} members)", done=len(jobs) - len(todo), enabled=progress)

        def on_done(spec: tuple[str, dict, int | None]) -> None:
            aggregate(sweep, jobs)
            bar.advance()

        threads = 1 if executor == "ray" else cfg.train.threads
        specs = [(str(sweep.job(j.key).root), j.config, threads) for j in todo]
        epochs = cfg.train.epochs
        note = lambda epoch, _: bar.update(note=f"({n_members} members; this job: epoch {epoch}/{epochs})")
        with bar:
            if executor == "local":  # one job at a time: show its epochs too
                run_local(functools.partial(run_job, on_eval=note), specs, on_done)
            else:
                gpus = cfg.gpus_per_job if cfg.train.device.startswith("cuda") else 0.0
                run_ray(run_job, specs, on_done, address=ray_address, gpus_per_job=gpus)
        return aggregate(sweep, jobs)
