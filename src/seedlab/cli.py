"""seedlab's command line: one Typer app; each study's commands live in the study's own ``cli`` module.

:data:`STUDIES` is the registry: a study is one line there. Its module is imported only when one of its
commands runs (some studies import torch), so ``seedlab --help`` stays fast.

A study outside seedlab (a package of its own, e.g. examples/repeats) registers through the entry-point
group :data:`ENTRY_POINTS` of its pyproject, ``NAME = "package.module"``, the module defining ``app`` and
``HELP`` as a registry line's does: once installed, ``seedlab --help`` lists it and ``seedlab NAME ...``
runs it. Such modules are imported at start-up (for their ``HELP``; keep them light: import in the commands).
One that does not load is named in one line on stderr and the other commands work; ``seedlab NAME ...``
is that line and exit code 2.

A command that takes a CONFIG and ``--set`` is declared with :func:`config_command`: its ``--help`` lists
the config's fields, and ``seedlab presets show`` knows which configs a study's presets are.

Bad input anywhere is a :class:`SeedlabError`: one line on stderr, exit code 2.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer
from typer.core import HAS_RICH, TyperCommand, TyperGroup, TyperOption
from typer.main import get_group

from seedlab.errors import SeedlabError

if TYPE_CHECKING:
    from pydantic import BaseModel


def _flags_take_no_value() -> None:
    """A flag (``--force``, ``--help``) takes no value, so its help shows no type: typer's rich help gives
    every option one (``--help <bool>``), click's plain help leaves a flag's out; seedlab's help is click's
    here, for every command of every study (all go through this module)."""
    shown = getattr(TyperOption, "display_type_rich", None)  # an older typer has no type column
    if shown is None or getattr(shown, "flags_untyped", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_untyped = True
    TyperOption.display_type_rich = display_type_rich


_flags_take_no_value()


class Study(NamedTuple):
    module: str  # defines `app`, a typer.Typer with the study's commands, and PRESETS (its presets folder) if it has presets
    help: str  # the study's line in `seedlab --help`


#: `seedlab NAME ...` runs the commands of STUDIES[NAME].module (corpus: the corpora the studies share;
#: claims: the findings ledger across them)
STUDIES: dict[str, Study] = {
    "shortcut": Study("seedlab.shortcut.cli", "The shortcut-saturation study (MPSP tasks, spurious ratio r)."),
    "corpus": Study("seedlab.corpus.cli", "Token corpora for the twins study (local files, OpenWebText, or the embedded default)."),
    "twins": Study("seedlab.twins.cli", "The single-example counterfactual: seed-matched twins that differ in one row."),
    "attribution": Study("seedlab.attribution.cli", "Influence estimators against measured single-row counterfactuals (a bank of forks)."),
    "claims": Study("seedlab.claims.cli", "The findings ledger (docs/claims/): render README's findings and the results pages from it, check its rules."),
}


#: the entry-point group of the studies outside seedlab: ``NAME = "package.module"`` (a module with ``app`` and ``HELP``)
ENTRY_POINTS = "seedlab.studies"


class Installed(NamedTuple):
    """The studies installed from outside seedlab (:data:`ENTRY_POINTS`)."""

    found: dict[str, Study]  # those that load
    broken: dict[str, str]  # name -> the one line that says why it does not load
    taken: list[str]  # one line for each entry point whose name seedlab or an earlier one holds (left out)


def installed_studies(reserved: frozenset[str] = frozenset()) -> Installed:
    """The studies installed from outside seedlab, each module imported. ``reserved``: names seedlab's own
    commands hold besides :data:`STUDIES` (an entry point may not take one)."""
    out = Installed({}, {}, [])
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an installed package"
        where = f"study {ep.name} (entry point {ep.value!r} of {dist})"
        if ep.name in STUDIES or ep.name in reserved or ep.name in out.found or ep.name in out.broken:
            out.taken.append(f"{where}: the name is taken (by seedlab or another package); left out")
            continue
        help_, why = _study_help(ep)
        if why is None:
            out.found[ep.name] = Study(ep.module, help_)
        else:
            out.broken[ep.name] = f"{where} does not load: {why}"
    return out


def _study_help(ep: importlib.metadata.EntryPoint) -> tuple[str, str | None]:
    """The help line of the study module ``ep`` names (imported here), or why it is not one."""
    if ep.attr:
        return "", f"it must name a module (package.module), not {ep.value!r}"
    try:
        module = importlib.import_module(ep.module)
    except Exception as err:  # someone else's module: whatever it raises is reported, not raised
        text = str(err).strip().splitlines()
        return "", f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
    if not isinstance(getattr(module, "app", None), typer.Typer):
        return "", f"{ep.module} defines no app (a typer.Typer with the study's commands)"
    if not isinstance(getattr(module, "HELP", None), str):
        return "", f"{ep.module} defines no HELP (its line in seedlab --help)"
    return " ".join(module.HELP.split()), None


def study_commands(name: str) -> TyperGroup:
    """The study ``name``'s commands (its module is imported here): a registered study's, or an
    installed one's (:func:`installed_studies`; one that does not load is a one-line SeedlabError)."""
    study = STUDIES.get(name)
    if study is None:
        installed = installed_studies()
        if name in installed.broken:
            raise SeedlabError(installed.broken[name])
        study = installed.found[name]
    group = get_group(importlib.import_module(study.module).app)
    group.help = study.help
    return group


def fields_help(model: type[BaseModel], under: str = "") -> str:
    """The config's fields for a command's ``--help``, one line each: ``name (default): help``, nested
    ones dotted and indented under their section; only those under ``under`` (e.g. "attribute") if given."""
    from seedlab.config import config_fields, yaml_value

    rows = [f for f in config_fields(model) if not under or f.name == under or f.name.startswith(f"{under}.")]
    lines = ["Config fields (--set NAME=VALUE; a preset's values: seedlab presets show NAME):"]
    for f in rows:
        default = yaml_value(f.default)
        what = "" if f.section else " (required)" if f.required else f" ({default if len(default) <= 40 else default[:39] + '…'})"
        lines.append(f"{'  ' * f.name.count('.')}{f.name}{what}: {f.help}")
    return "\n".join(lines)


def config_command(target: str, under: str = "") -> type[TyperCommand]:
    """The Typer command class of a command that takes a CONFIG and ``--set``: its ``--help`` ends with
    :func:`fields_help` of the config ``target`` (``"package.module:Class"``, imported only when the
    help is shown, so a study's CLI loads fast). ``seedlab presets show`` finds a study's configs here
    (:func:`study_configs`). Use: ``@app.command("run", cls=config_command("seedlab.twins.config:TwinsConfig"))``."""

    class ConfigCommand(TyperCommand):
        config = target

        @property
        def epilog(self) -> str:
            from seedlab.config import resolve

            text = fields_help(resolve(target), under)
            if HAS_RICH and self.rich_markup_mode == "rich":
                from rich.markup import escape

                text = escape(text)
            else:
                text = "\b\n" + text  # click: keep the lines as they are
            return "\n\n".join(t for t in (self._epilog, text) if t)

        @epilog.setter
        def epilog(self, text: str | None) -> None:
            self._epilog = text

    return ConfigCommand


class _Root(TyperGroup):
    """``seedlab``: the studies are listed from the registry and the installed ones (for ``--help`` and
    typo suggestions); a registered study's own commands are loaded only when it is the command that runs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.installed = installed_studies(frozenset(self.commands))
        studies = {**STUDIES, **self.installed.found}
        self.commands = {**{name: TyperGroup(name=name, help=s.help) for name, s in studies.items()}, **self.commands}

    def parse_args(self, ctx, args):
        # one line each on stderr; `seedlab NAME ...` of a study that does not load is that line as its error
        broken = [line for name, line in self.installed.broken.items() if args[:1] != [name]]
        for line in (*broken, *self.installed.taken):
            typer.echo(f"warning: {line}", err=True)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        if args[:1] and args[0] in self.installed.broken:
            raise SeedlabError(self.installed.broken[args[0]])
        name, cmd, rest = super().resolve_command(ctx, args)
        return name, study_commands(name) if name in STUDIES or name in self.installed.found else cmd, rest


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
    """List the presets of every study, each with what it is (the first sentence of its comment, wrapped)."""
    if ctx.invoked_subcommand is not None:
        return
    import shutil
    import textwrap

    from seedlab import presets

    width = max(shutil.get_terminal_size().columns, 60) - 1
    for study in (s for s in STUDIES if s in presets.STUDIES):
        typer.echo(f"{study}:")
        for name in presets.names(study):
            typer.echo(textwrap.fill(presets.describe(study, name), width, initial_indent=f"  {name:<16} ",
                                     subsequent_indent=" " * 19, break_on_hyphens=False, break_long_words=False))


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


@presets_app.command("show")
def presets_show(
    name: Annotated[str, typer.Argument(help="a preset: NAME, or STUDY/NAME where two studies have one (twins/mini); or a YAML file")],
) -> None:
    """Every field of a preset, dotted as --set names it, with its value there, its default and its help."""
    from seedlab import presets
    from seedlab.config import config_fields, load_yaml, parse, resolve, yaml_value

    study, path = presets.lookup(name)
    targets = [t for s in ([study] if study else STUDIES) for t in study_configs(s)]
    data, errors = load_yaml(path), []
    for target in targets:  # the first config of the study's commands that it is (shortcut: an ensemble or a sweep)
        try:
            cfg = parse(resolve(target), data)
            break
        except SeedlabError as err:
            errors.append(f"{target.rpartition(':')[2]}: {err}")
    else:
        raise SeedlabError(f"config: {path} is none of the configs a command reads ({'; '.join(errors)})")
    title = f"{study}/{path.stem}: {presets.describe(study, path.stem)}" if study else str(path)
    typer.echo(f"{title}\n{target.replace(':', '.')} (--set NAME=VALUE overrides a field)\n")
    rows = config_fields(type(cfg), cfg)
    cells = [("field", "value", "default", "help")] + [
        (f.name, "", "", f.help) if f.section else
        (f.name, yaml_value(f.value), "(required)" if f.required else yaml_value(f.default), f.help) for f in rows]
    widths = [max(len(c[0]) for c in cells)] + [min(max(len(c[i]) for c in cells), 28) for i in (1, 2)]
    for c in cells:
        typer.echo("  ".join(x.ljust(w) for x, w in zip(c, widths)) + "  " + c[3])


def study_configs(name: str) -> list[str]:
    """The configs the study's commands read (``"package.module:Class"``, in command order): those of
    its commands declared with :func:`config_command`."""
    found = (getattr(c, "config", None) for c in study_commands(name).commands.values())
    return list(dict.fromkeys(t for t in found if t))


@app.command("doctor")
def doctor(
    size: Annotated[int, typer.Option(help="n of the n x n matmul timed in each precision")] = 2048,
) -> None:
    """What this machine offers: cores, threads, CPU flags, CUDA devices, and the precision to use.

    The CPU flags that matter for matmuls (AVX-512, AMX), and the fp32 and bf16 matmul throughput measured
    here: fp32 for results; bf16 for fast exploration where it is at least twice as fast."""
    from seedlab.doctor import examine, lines

    if size < 16:
        raise SeedlabError(f"--size: at least 16, got {size}")
    for line in lines(examine(n=size)):
        typer.echo(line)


def main() -> None:
    from seedlab.machine import tune_allocator

    tune_allocator()  # freed activations kept for the next step (machine.MALLOPT): fewer page faults, the same bits
    # click handles usage errors itself (exit 2); our own bad-input errors are caught here
    try:
        app()
    except SeedlabError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
