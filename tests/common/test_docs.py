"""The docs cannot drift from the code: README.md and docs/ checked against the tree and the command line.

- docs/architecture.md names every module file under src/seedlab, and every module it names exists
  (a module row is a table row whose first cell is a backticked path ending in ``.py``).
- Every ``seedlab ...`` command in the docs (```bash blocks, with ``\\`` continuations joined, and inline
  code spans) names an existing command, and every ``--option`` it passes is one of that command's
  declared options (what its ``--help`` lists); it passes no more arguments than the command takes.
  The *short* commands also run as written, in a fresh folder, and must exit 0 (see :data:`SHORT`).
- Every ``make TARGET`` the README names is a Makefile target.
- Every ``from seedlab... import`` in a ```python block of the docs imports.
- Every relative link resolves to a file inside the repository (and a ``#heading`` to a heading there).

docs/preregistration/ is left out of the command checks: those texts are frozen before their runs (the runs
keep their SHA-256), so they record the commands of their day.
"""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import textwrap
from pathlib import Path

import pytest
from typer.main import get_command, get_group
from typer.testing import CliRunner

import seedlab
from example_study import EXAMPLES, installed, project
from seedlab import presets
from seedlab.cli import ENTRY_POINTS, STUDIES, app, study_commands

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(seedlab.__file__).resolve().parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND_DOCS = [p for p in DOCS if "preregistration" not in p.relative_to(ROOT).parts]

#: How "short" is chosen: a command runs here when it trains nothing, reads no folder that another command
#: must have made first, and takes about a second on a 2-core CPU (doctor: a few seconds of matmuls). These
#: are the command paths (after ``seedlab``) that qualify; ``--help`` of any command qualifies too. Every
#: other command (trainings, measures, reports of run folders) is only parsed.
SHORT = {(), ("presets",), ("presets", "show"), ("presets", "copy"), ("shortcut", "data"), ("doctor",)}


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


# --------------------------------------------------------------------------- architecture.md


def _named_modules() -> list[str]:
    rows = re.findall(r"^\|\s*`([\w/]+\.py)`\s*\|", (ROOT / "docs" / "architecture.md").read_text(), re.M)
    return rows


def test_architecture_names_every_module_and_only_modules_that_exist():
    files = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if "__pycache__" not in p.parts}
    named = _named_modules()
    assert len(named) == len(set(named)), f"named twice: {sorted({m for m in named if named.count(m) > 1})}"
    assert not files - set(named), f"docs/architecture.md does not name: {sorted(files - set(named))}"
    assert not set(named) - files, f"docs/architecture.md names modules that do not exist: {sorted(set(named) - files)}"


# --------------------------------------------------------------------------- commands


def _fences(text: str, lang: str) -> list[str]:
    """The fenced blocks of one language, dedented (a fence may be indented inside a list item)."""
    return [textwrap.dedent(b) for b in re.findall(rf"^[ \t]*```{lang}\n(.*?)^[ \t]*```", text, re.S | re.M)]


def _prose(text: str) -> str:
    """The text without its fenced blocks."""
    return re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.S | re.M)


def _shell_lines(block: str) -> list[str]:
    """A bash block's command lines: ``\\`` continuations joined, comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _words(line: str) -> list[str]:
    """The words of one shell line, a trailing ``# comment`` left out (shlex, as the shell splits them)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars="&;|")
    lex.whitespace_split, lex.commenters = True, "#"
    return list(lex)


def _seedlab_calls(line: str) -> list[list[str]]:
    """The argument lists of every seedlab call in a shell line: ``seedlab``, ``.venv/bin/seedlab``,
    ``ENV=1 seedlab``, ``python -m seedlab``, ``torchrun ... -m seedlab``, each ended by ``&&``, ``;`` or ``|``."""
    calls: list[list[str]] = []
    current = None
    for word in _words(line):
        if set(word) <= set("&;|"):
            current = None
        elif current is not None:
            current.append(word)
        elif word == "seedlab" or word.endswith("bin/seedlab"):
            current = []
            calls.append(current)
    return calls


def _doc_commands() -> list[tuple[str, list[str]]]:
    """(where, args after ``seedlab``) of every seedlab call in the docs."""
    found = []
    for path in COMMAND_DOCS:
        text = path.read_text()
        for block in _fences(text, "bash"):
            for line in _shell_lines(block):
                found += [(f"{_rel(path)}: {line.strip()}", args) for args in _seedlab_calls(line)]
        for span in re.findall(r"`([^`]+)`", _prose(text)):
            span = " ".join(span.split())
            if re.match(r"(\S*/)?seedlab |\S*python -m seedlab |torchrun ", span):
                found += [(f"{_rel(path)}: `{span}`", args) for args in _seedlab_calls(span)]
    return found


COMMANDS = _doc_commands()
ROOT_COMMAND = get_command(app)
#: the studies the docs install from examples/ (pip install -e examples/repeats): name -> the module its entry point names
EXAMPLE_STUDIES = project()["entry-points"][ENTRY_POINTS]


def _example_commands(name: str):
    """An example study's commands, as seedlab has them once it is installed (examples/ importable)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(EXAMPLES))
        return get_group(importlib.import_module(EXAMPLE_STUDIES[name]).app)


def _resolve(args: list[str]):
    """(command path, the (Typer's) click command, the arguments left for it) of ``seedlab ARGS``."""
    cmd, path, i = ROOT_COMMAND, [], 0
    while hasattr(cmd, "commands") and i < len(args) and not args[i].startswith("-"):
        name = args[i]
        sub = (study_commands(name) if cmd is ROOT_COMMAND and name in STUDIES else
               _example_commands(name) if cmd is ROOT_COMMAND and name in EXAMPLE_STUDIES else cmd.commands.get(name))
        assert sub is not None, f"no command {' '.join(['seedlab', *path, name])!r}"
        cmd, path, i = sub, [*path, name], i + 1
    return tuple(path), cmd, args[i:]


def _check_arguments(cmd, args: list[str]) -> str | None:
    """What is wrong with ``args`` for ``cmd`` (an unknown option, too many arguments), or None."""
    options = {o: p for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
    positional = [p for p in cmd.params if p.param_type_name == "argument"]
    takes = None if any(p.nargs < 0 for p in positional) else sum(p.nargs for p in positional)
    given, i = 0, 0
    while i < len(args):
        word = args[i]
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if name == "--help":
                return None
            if name not in options:
                return f"{name} is not an option of this command (it has {', '.join(sorted(options))})"
            opt = options[name]
            i += 1 if opt.is_flag or opt.count or "=" in word or name in opt.secondary_opts else 1 + opt.nargs
            continue
        if "..." not in word:  # ``A...``, ``...``: the docs' ellipses, not arguments
            given += 1
        i += 1
    if takes is not None and given > takes:
        return f"{given} arguments given, the command takes {takes}"
    return None


def test_the_docs_name_commands():
    """The extraction finds the commands (a guard against a regex that silently finds none)."""
    paths = {_resolve(args)[0] for _, args in COMMANDS}
    assert {("shortcut", "sweep"), ("twins", "run"), ("attribution", "bank"), ("shortcut", "data")} <= paths


@pytest.mark.parametrize(("where", "args"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_in_the_docs_exists_with_its_options(where, args):
    path, cmd, rest = _resolve(args)
    problem = _check_arguments(cmd, rest)
    assert problem is None, f"{where}: {problem}"
    takes_config = [p.name for p in cmd.params if p.param_type_name == "argument"][:1] == ["config"]
    if takes_config and rest and re.fullmatch(r"[a-z0-9][a-z0-9-]*", rest[0]):  # a preset's name (not a file, not CONFIG)
        assert rest[0] in presets.names(path[0]), f"{where}: {rest[0]} is not a {path[0]} preset"


def _short() -> list[tuple[str, list[str]]]:
    """The short commands, each distinct one once (where it first appears)."""
    out: dict[tuple[str, ...], str] = {}
    for where, args in COMMANDS:
        if "--help" in args or _resolve(args)[0] in SHORT:
            out.setdefault(tuple(args), where)
    return [(where, list(args)) for args, where in out.items()]


SHORT_COMMANDS = _short()


@pytest.mark.parametrize(("where", "args"), SHORT_COMMANDS, ids=[w for w, _ in SHORT_COMMANDS])
def test_the_short_commands_run_as_written(where, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever they write lands here
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"{where}: exit {result.exit_code}\n{result.output}{result.exception!r}"


def test_every_command_a_doc_names_has_a_help(tmp_path):
    with installed(tmp_path):  # the example studies, as pip install -e leaves them
        for path in sorted({_resolve(args)[0] for _, args in COMMANDS}):
            result = CliRunner().invoke(app, [*path, "--help"])
            assert result.exit_code == 0, f"seedlab {' '.join(path)} --help: {result.output}"


def test_the_readme_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"\bmake ([\w-]+)", (ROOT / "README.md").read_text()))
    assert {"demo", "test"} <= named and named <= targets, f"not Makefile targets: {sorted(named - targets)}"


# --------------------------------------------------------------------------- python blocks and links


@pytest.mark.parametrize("path", [p for p in DOCS if "```python" in p.read_text()], ids=_rel)
def test_the_python_examples_import(path):
    for block in _fences(path.read_text(), "python"):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seedlab"):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"{_rel(path)}: {node.module} has no {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_every_relative_link_resolves_inside_the_repository(path):
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        assert where.is_relative_to(ROOT), f"{_rel(path)}: {target} points outside the repository"
        assert where.exists(), f"{_rel(path)}: {target} does not exist"
        if anchor and where.is_file():
            headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", where.read_text(), re.M)}
            assert anchor in headings, f"{_rel(path)}: {target}: no such heading"
