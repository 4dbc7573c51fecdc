"""The package layout's import and path rules, checked statically (``ast``) over src/seedlab.

- A study (every subpackage of seedlab other than the shared ones: today ``shortcut`` and
  ``twins``) never imports another study.
- The shared code — ``seedlab.forks``, ``seedlab.measures``, ``seedlab.lm``, ``seedlab.corpus``,
  ``seedlab.presets``, ``seedlab.claims`` (the findings ledger: the core only) and the core (the top-level modules: config, store, stats, ...) — imports no study. ``cli.py`` is the
  one top-level module that may import everything (``__main__.py`` only calls it).
- Layers: ``seedlab.forks`` (the fork design) sits between the studies and ``lm`` + ``corpus``:
  ``lm``, ``corpus`` and the core never import it, and ``lm`` and ``corpus`` never import each other.
  ``seedlab.measures`` (what several studies measure) sits below the studies too: it may import ``lm``
  and the core, not ``forks`` or ``corpus``; ``lm``, ``corpus``, ``forks`` and the core never import it.
- Nothing in src imports ``benchmarks``.
- Only a study's ``rundir.py`` (and ``seedlab/store.py``) build paths inside a run folder:
  in the studies and in ``cli.py``, any ``X / "literal"``, ``X / f"..."`` or
  ``X.joinpath("literal")`` outside ``rundir.py`` is flagged; such code asks the study's
  rundir for the path instead (``rd.summary_path``, ``rd.figure("curves.png")``).
  Corpus folders and preset folders are not run folders, so ``seedlab/corpus`` and
  ``seedlab/presets`` are exempt from this rule; in ``seedlab/forks`` only ``folders.py`` (the
  fork design's folder) builds such paths.

Every failure lists each violation as ``path:line: what``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import seedlab

SRC = Path(seedlab.__file__).resolve().parent  # src/seedlab
SHARED_PACKAGES = {"forks", "measures", "lm", "corpus", "presets", "claims"}
#: package -> the shared packages it must not import (the layers below the studies)
LAYERS = {"lm": {"forks", "corpus", "measures"}, "corpus": {"forks", "lm", "measures"}, "core": {"forks", "measures"},
          "forks": {"measures"}, "measures": {"forks", "corpus"}, "claims": {"forks", "measures", "lm", "corpus"}}
#: top-level modules allowed to import any study
ENTRY_POINTS = {"cli.py", "__main__.py"}


def _studies() -> set[str]:
    return {p.name for p in SRC.iterdir() if p.is_dir() and p.name not in SHARED_PACKAGES and not p.name.startswith("_")}


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _where(path: Path, node: ast.AST) -> str:
    return f"src/seedlab/{path.relative_to(SRC).as_posix()}:{node.lineno}"


def _package_of(path: Path) -> list[str]:
    """The dotted package a module file belongs to, as parts: src/seedlab/twins/x.py -> [seedlab, twins]."""
    return ["seedlab", *path.relative_to(SRC).parent.parts]


def _imports(path: Path) -> Iterator[tuple[ast.AST, str]]:
    """(node, absolute module name) of every import in a file, nested ones included; for
    ``from a import b`` both ``a`` and ``a.b`` (b may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(path)[: len(_package_of(path)) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield node, module
            for alias in node.names:
                yield node, f"{module}.{alias.name}"


def _study_of(module: str, studies: set[str]) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "seedlab" and parts[1] in studies else None


def _owner(path: Path, studies: set[str]) -> str:
    """``study:<name>``, ``shared`` or ``entry`` for a module file."""
    rel = path.relative_to(SRC)
    if len(rel.parts) == 1:
        return "entry" if rel.name in ENTRY_POINTS else "shared"
    return f"study:{rel.parts[0]}" if rel.parts[0] in studies else "shared"


def import_violations() -> list[str]:
    studies, out = _studies(), []
    for path in _modules():
        owner = _owner(path, studies)
        seen = set()
        for node, module in _imports(path):
            if module == "benchmarks" or module.startswith("benchmarks."):
                out.append(f"{_where(path, node)}: imports {module} (src never imports benchmarks)")
                continue
            target = _study_of(module, studies)
            if target is None or owner == "entry" or (node.lineno, target) in seen:
                continue
            if owner == "shared":
                out.append(f"{_where(path, node)}: shared code imports the {target} study ({module})")
            elif owner != f"study:{target}":
                out.append(f"{_where(path, node)}: the {owner[6:]} study imports the {target} study ({module})")
            seen.add((node.lineno, target))
    return sorted(set(out), key=_by_place)


def layer_violations() -> list[str]:
    out = []
    for path in _modules():
        rel = path.relative_to(SRC)
        layer = "core" if len(rel.parts) == 1 and rel.name not in ENTRY_POINTS else rel.parts[0]
        banned = LAYERS.get(layer, set())
        for node, module in _imports(path):
            parts = module.split(".")
            if len(parts) > 1 and parts[0] == "seedlab" and parts[1] in banned:
                out.append(f"{_where(path, node)}: {layer} imports seedlab.{parts[1]} (a layer above or beside it)")
    return sorted(set(out), key=_by_place)


def _is_name_literal(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr)


def path_violations() -> list[str]:
    studies, out = _studies(), []
    for path in _modules():
        rel = path.relative_to(SRC)
        in_study = len(rel.parts) > 1 and rel.parts[0] in studies
        in_forks = rel.parts[0] == "forks" and rel.name != "folders.py"
        if not (in_study or in_forks or rel.as_posix() == "cli.py") or rel.name == "rundir.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_name_literal(node.right):
                out.append(f"{_where(path, node)}: builds a path: {ast.unparse(node)}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "joinpath"
                  and any(_is_name_literal(a) for a in node.args)):
                out.append(f"{_where(path, node)}: builds a path: {ast.unparse(node)}")
    return sorted(set(out), key=_by_place)


def _by_place(line: str) -> tuple[str, int, str]:
    file, number, rest = line.split(":", 2)
    return file, int(number), rest


def test_the_checks_see_the_studies_and_every_module():
    assert {"shortcut", "twins", "attribution"} <= _studies() and not {"forks", "lm", "measures", "claims"} & _studies()
    names = {p.relative_to(SRC).as_posix() for p in _modules()}
    assert {"cli.py", "store.py", "lm/model.py", "corpus/build.py", "twins/rundir.py", "forks/loop.py"} <= names


def test_studies_never_import_each_other_and_shared_code_imports_no_study():
    bad = import_violations()
    assert not bad, "import rules broken:\n" + "\n".join(bad)


def test_forks_sits_between_the_studies_and_lm_and_corpus():
    bad = layer_violations()
    assert not bad, "layers broken:\n" + "\n".join(bad)


def test_only_rundir_builds_run_folder_paths():
    bad = path_violations()
    assert not bad, (f"{len(bad)} path(s) built outside a study's rundir.py (ask the rundir for it):\n"
                     + "\n".join(bad))


# --------------------------------------------------------------------------- the checker itself


@pytest.fixture
def fake_src(tmp_path, monkeypatch):
    """A throwaway src/seedlab tree to run the checks on."""
    root = tmp_path / "seedlab"
    for rel, text in {
        "cli.py": "from seedlab.twins import train\nfrom seedlab.shortcut.sweep import run_sweep\n",
        "store.py": "def f(folder):\n    return folder / 'done.json'\n",
        "stats.py": "from seedlab.twins.stats import paired\n",
        "lm/trainer.py": "from seedlab import shortcut\nfrom seedlab.forks.loop import run_design\n",
        "forks/loop.py": "def f(d):\n    return d / 'seed-0'\n",
        "forks/folders.py": "def f(d):\n    return d / 'config.json'\n",
        "corpus/build.py": "def f(out):\n    return out / 'meta.json'\n",
        "shortcut/report.py": "from ..twins import report\nimport benchmarks.timing\n"
                              "def f(run, k):\n    return run / f'fig-{k}.png', run.joinpath('x')\n",
        "shortcut/rundir.py": "def f(run):\n    return run / 'summary.parquet'\n",
        "twins/measure.py": "from seedlab.twins.rundir import RunDir\nfrom .config import X\n"
                            "def f(a, b):\n    return a / b, 2 / 3\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setitem(globals(), "SRC", root)
    return root


def test_the_checker_finds_each_kind_of_violation(fake_src):
    assert import_violations() == [
        "src/seedlab/lm/trainer.py:1: shared code imports the shortcut study (seedlab.shortcut)",
        "src/seedlab/shortcut/report.py:1: the shortcut study imports the twins study (seedlab.twins)",
        "src/seedlab/shortcut/report.py:2: imports benchmarks.timing (src never imports benchmarks)",
        "src/seedlab/stats.py:1: shared code imports the twins study (seedlab.twins.stats)",
    ]
    assert layer_violations() == ["src/seedlab/lm/trainer.py:2: lm imports seedlab.forks (a layer above or beside it)"]
    assert path_violations() == [
        "src/seedlab/forks/loop.py:2: builds a path: d / 'seed-0'",
        "src/seedlab/shortcut/report.py:4: builds a path: run / f'fig-{k}.png'",
        "src/seedlab/shortcut/report.py:4: builds a path: run.joinpath('x')",
    ]


#: a study in rooms, its rooms from the ground up: a module may import its own room and the rooms below it
#: (the study's top-level modules — its commands, export and score — may import every room)
ROOMS = {"attribution": ["bank", "estimators", "analyses", "report"]}


def room_violations(src: Path = SRC) -> list[str]:
    out: dict[tuple[str, str], str] = {}
    for study, rooms in ROOMS.items():
        for path in sorted((src / study).rglob("*.py")):
            rel = path.relative_to(src / study).parts
            if len(rel) == 1:
                continue  # on top
            mine = rooms.index(rel[0])
            for node, module in _imports(path):
                parts = module.split(".")
                if parts[:2] == ["seedlab", study] and len(parts) > 2:
                    other = parts[2]
                    where = f"{study}/{'/'.join(rel)}:{node.lineno}"
                    if other not in rooms:
                        out.setdefault((where, other), f"{where}: imports {module} (the {study} top, above every room)")
                    elif rooms.index(other) > mine:
                        out.setdefault((where, other), f"{where}: imports {module} ({rel[0]}/ is below {other}/)")
    return [out[k] for k in sorted(out)]  # one line per import (``from a import b`` is seen as a and a.b)


def test_a_study_in_rooms_imports_only_its_own_room_and_those_below():
    assert (SRC / "attribution" / "bank").is_dir() and (SRC / "attribution" / "report").is_dir()
    bad = room_violations()
    assert not bad, "rooms broken:\n" + "\n".join(sorted(set(bad)))


def test_the_room_check_finds_an_import_that_runs_back_up(tmp_path):
    pkg = tmp_path / "attribution"
    for room in ROOMS["attribution"]:
        (pkg / room).mkdir(parents=True)
    (pkg / "bank" / "run.py").write_text("from seedlab.attribution.analyses import stats\n")
    (pkg / "report" / "bank.py").write_text("from seedlab.attribution.bank import run\nimport seedlab.attribution.cli\n")
    bad = room_violations(tmp_path)
    assert len(bad) == 2 and "bank/ is below analyses/" in bad[0] and "above every room" in bad[1]
