"""``seedlab shortcut``: the shortcut study's commands. Each imports what it runs, so that
``seedlab --help`` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from seedlab.cli import config_command

#: the study's presets: ``seedlab presets`` lists them; every CONFIG argument takes one's name
PRESETS = "shortcut"

app = typer.Typer(no_args_is_help=True)  # its line in `seedlab --help` is its entry in seedlab.cli.STUDIES


@app.command("data")
def shortcut_data(
    task: Annotated[str, typer.Option(help="sum2-max | sum2-first | sum3-max | sum3-first")],
    ratio: Annotated[float, typer.Option(help="fraction of shortcut-consistent training samples, in [0, 1]")],
    n_train: Annotated[int, typer.Option(help="training samples")],
    seed: Annotated[int, typer.Option(help="data seed: fixes all three splits")],
    out: Annotated[Path, typer.Option(help="folder for train.npz, val.npz, adv.npz")],
    n_val: Annotated[int, typer.Option(help="validation samples (r = 1)")] = 2048,
    n_adv: Annotated[int, typer.Option(help="adversarial samples (r = 0)")] = 2048,
    length: Annotated[int, typer.Option(help="integers per sequence")] = 5,
    vocab: Annotated[int, typer.Option(help="integers are drawn from 0 .. vocab-1")] = 16,
    force: Annotated[bool, typer.Option(help="overwrite existing files")] = False,
) -> None:
    """Write the three fixed splits of one MPSP-family task."""
    from seedlab.shortcut.rundir import write_splits

    splits = write_splits(out, task, ratio, n_train, n_val=n_val, n_adv=n_adv, length=length, vocab=vocab, seed=seed, force=force)
    c = int(splits["train"].consistent.sum())
    typer.echo(f"wrote {out}/{{train,val,adv}}.npz: train {n_train} ({c} consistent), val {n_val}, adv {n_adv}")


@app.command("train", cls=config_command("seedlab.shortcut.config:EnsembleConfig"))
def shortcut_train(
    config: Annotated[str, typer.Argument(help="ensemble config: a YAML file or a preset name (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="run folder")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set train.epochs=100")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="overwrite an existing run")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Train one ensemble; write summary.parquet and curves.parquet into OUT."""
    from seedlab.config import load_config
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.shortcut.rundir import RunDir
    from seedlab.shortcut.train import check_members, train_ensemble

    cfg, _ = load_config(EnsembleConfig, PRESETS, config, set_)
    members = cfg.expand()
    check_members(cfg, members)  # everything is validated before anything is written
    run = RunDir(out)
    run.refuse_overwrite(force)
    result = train_ensemble(cfg, out, members=members, progress=progress)
    g = int(result.summary["generalized"].sum())
    typer.echo(f"{len(members)} members, {result.epochs_run} epochs in {result.seconds:.1f}s; {g} generalized -> {run.summary_path}")


@app.command("sweep", cls=config_command("seedlab.shortcut.config:SweepConfig"))
def shortcut_sweep(
    config: Annotated[str, typer.Argument(help="sweep config: a YAML file or a preset name, e.g. quick (seedlab presets)")],
    out: Annotated[Path, typer.Option(help="sweep folder (resumable: rerun to finish)")],
    executor: Annotated[str, typer.Option(help="local (no services) or ray")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="a running Ray cluster (HOST:PORT or auto); default: start a local one")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set grid.seed=4")] = [],  # noqa: B006
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    preregistration: Annotated[Path | None, typer.Option(help="a text file of hypotheses and decision rules, kept in OUT (with its SHA-256) before the first member is trained; the report quotes it")] = None,
) -> None:
    """Run (or resume) a sweep; write summary.parquet and curves.parquet into OUT."""
    from seedlab.config import load_config
    from seedlab.shortcut.config import SweepConfig
    from seedlab.shortcut.rundir import SweepDir
    from seedlab.shortcut.sweep import run_sweep

    cfg, _ = load_config(SweepConfig, PRESETS, config, set_)
    df = run_sweep(cfg, out, executor=executor, ray_address=ray_address, progress=progress, preregistration=preregistration)
    g = int(df["generalized"].sum()) if len(df) else 0
    typer.echo(f"{len(df)} members finished, {g} generalized -> {SweepDir(out).summary_path}")


@app.command("analyze")
def shortcut_analyze(
    run: Annotated[Path, typer.Argument(help="a run folder (shortcut train) or a sweep folder")],
    n: Annotated[int, typer.Option(help="validation/adversarial rows per member")] = 512,
) -> None:
    """Circuit analyses of every checkpoint -> circuits.parquet (fingerprints, ablations, probes) and
    patching.parquet (activation patching on matched counterfactual pairs)."""
    from seedlab.shortcut.analyze import write_analyses

    for name, path in write_analyses(run, n=n).items():
        typer.echo(f"{name}: {path}")


@app.command("report")
def shortcut_report(run: Annotated[Path, typer.Argument(help="a sweep folder")]) -> None:
    """Write report.md and PNG figures into a sweep folder."""
    from seedlab.shortcut.report import write_report

    path = write_report(run)
    typer.echo(f"report: {path}")
