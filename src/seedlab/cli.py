"""seedlab's command line: one Typer app; each study's commands live in the study's own ``cli`` module.

:data:`STUDIES` is the registry: a study is one line there. Its module is imported only when one of its
commands runs (some studies import torch), so ``seedlab --help`` stays fast.

Bad input anywhere is a :class:`SeedlabError`: one line on stderr, exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer
from typer.core import TyperGroup
from typer.main import get_group

from seedlab.errors import SeedlabError


class Study(NamedTuple):
    module: str  # defines `app`, a typer.Typer with the study's commands, and PRESETS (its presets folder) if it has presets
    help: str  # the study's line in `seedlab --help`


#: `seedlab NAME ...` runs the commands of STUDIES[NAME].module (corpus: the corpora the studies share)
STUDIES: dict[str, Study] = {
    "shortcut": Study("seedlab.shortcut.cli", "The shortcut-saturation study (MPSP tasks, spurious ratio r)."),
    "corpus": Study("seedlab.corpus.cli", "Token corpora for the twins study (local files, OpenWebText, or the embedded default)."),
    "twins": Study("seedlab.twins.cli", "The single-example counterfactual: seed-matched twins that differ in one row."),
    "attribution": Study("seedlab.attribution.cli", "Influence estimators against measured single-row counterfactuals (a bank of forks)."),
}


def study_commands(name: str) -> TyperGroup:
    """The registered study ``name``'s commands (its module is imported here)."""
    group = get_group(importlib.import_module(STUDIES[name].module).app)
    group.help = STUDIES[name].help
    return group


class _Root(TyperGroup):
    """``seedlab``: the studies are listed from the registry (for ``--help`` and typo suggestions);
    a study's own commands are loaded only when it is the command that runs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = {**{name: TyperGroup(name=name, help=s.help) for name, s in STUDIES.items()}, **self.commands}

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        return name, study_commands(name) if name in STUDIES else cmd, rest


app = typer.Typer(
    cls=_Root,
    help="seedlab: measured training-dynamics experiments, many seeds at once.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
presets_app = typer.Typer(help="The configs seedlab ships: every CONFIG argument also takes a preset's name.",
                          invoke_without_command=True)
app.add_typer(presets_app, name="presets")


@presets_app.callback()
def presets_list(ctx: typer.Context) -> None:
    """List the presets of every study, with the first line of each (what it is)."""
    if ctx.invoked_subcommand is not None:
        return
    from seedlab import presets

    for study in (s for s in STUDIES if s in presets.STUDIES):
        typer.echo(f"{study}:")
        for name in presets.names(study):
            typer.echo(f"  {name:<16} {presets.describe(study, name)}")


@presets_app.command("copy")
def presets_copy(
    name: Annotated[str, typer.Argument(help="STUDY/NAME, e.g. twins/mini")],
    out: Annotated[Path, typer.Argument(help="folder to write NAME.yaml into (with the files it names, e.g. passages)")],
    force: Annotated[bool, typer.Option(help="overwrite existing files")] = False,
) -> None:
    """Write a preset out as a file to edit (and run: seedlab twins run OUT/NAME.yaml)."""
    from seedlab import presets

    written = presets.copy(name, out, force=force)
    typer.echo(f"{written[0]} ({len(written) - 1} more file(s) beside it)")


@app.command("doctor")
def doctor(
    size: Annotated[int, typer.Option(help="n of the n x n matmul timed in each precision")] = 2048,
) -> None:
    """What this machine offers: cores, threads, CPU flags (AVX-512, AMX), CUDA devices, and the fp32 and
    bf16 matmul throughput measured here, with the precision it suggests."""
    from seedlab.doctor import examine, lines

    if size < 16:
        raise SeedlabError(f"--size: at least 16, got {size}")
    for line in lines(examine(n=size)):
        typer.echo(line)


def main() -> None:
    # click handles usage errors itself (exit 2); our own bad-input errors are caught here
    try:
        app()
    except SeedlabError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
