"""The repeats study's commands: ``run``, ``measure``, ``report``. Each imports what it runs.

seedlab finds the study through the entry point its pyproject declares (group ``seedlab.studies``:
``repeats = "repeats.cli"``, this module, with ``app`` and ``HELP``): after ``pip install -e examples/repeats``
``seedlab --help`` lists it and ``seedlab repeats run ...`` runs these commands as any study's (bad input:
one line on stderr, exit 2). Nothing in seedlab names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from seedlab.cli import config_command

#: the study's line in `seedlab --help`
HELP = "An example fork study: does a passage seen three times differ from one seen once?"

app = typer.Typer(no_args_is_help=True)


@app.command("run", cls=config_command("repeats.config:RepeatsConfig"))
def repeats_run(
    config: Annotated[Path, typer.Argument(help="a repeats config: a YAML file (repeats/config.py RepeatsConfig)")],
    out: Annotated[Path, typer.Option(help="the design's folder: seed-<k>/<arm>/, integrity.json")],
    set_: Annotated[list[str], typer.Option("--set", help="override a field, e.g. --set gap=5")] = [],  # noqa: B006
    force: Annotated[bool, typer.Option(help="overwrite another design's folder")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    allow_env_change: Annotated[bool, typer.Option(help="resume under another environment than the design started in")] = False,
) -> None:
    """Train the design: per seed a shared prefix, then the twin, once, thrice and ordinary forked at the injection step."""
    from seedlab.config import apply_overrides, load_yaml, parse

    from repeats.config import ARMS, RepeatsConfig
    from repeats.train import run

    cfg = parse(RepeatsConfig, apply_overrides(load_yaml(config), set_, RepeatsConfig))
    integrity = run(cfg, out, force=force, progress=progress, allow_env_change=allow_env_change)
    reps = [k for k, v in integrity["seeds"].items() if "replica" in v]
    typer.echo(f"{len(cfg.seeds)} seeds x {len(ARMS)} arms -> {out}\n"
               f"identical at step {cfg.injection_step}: by construction (forked from one copy of each seed's prefix); "
               f"the replica control (seed {', '.join(reps)}) is bitwise equal to the twin at every hashed step")


@app.command("measure")
def repeats_measure(
    run: Annotated[Path, typer.Argument(help="a finished repeats design folder (repeats run --out)")],
    device: Annotated[str, typer.Option(help="cpu | cuda | cuda:N")] = "cpu",
) -> None:
    """Per seed x arm the passage's CE against the twin's and the weight distance to it; paired over seeds."""
    from repeats.config import RepeatsFolder
    from repeats.measure import measure

    measures, paired = measure(run, device=device)
    folder = RepeatsFolder(run)
    typer.echo(f"{len(measures)} seed x arm rows -> {folder.measures}; {len(paired)} paired comparisons -> {folder.paired}")


@app.command("report")
def repeats_report(run: Annotated[Path, typer.Argument(help="a measured repeats design folder")]) -> None:
    """Write report.md: the answer first, then the paired comparisons."""
    from repeats.report import write_report

    typer.echo(f"report: {write_report(run)}")

