"""Reports only render (DESIGN.md): every study's report modules load no torch and import no scipy or statsmodels.

A study is a package under src/seedlab that has a ``report.py`` or a ``report/`` room (found, not listed). Its
*report modules* are ``report.py``, ``figures.py`` and any ``*_report.py`` or ``report_*.py`` beside them, or every
module of its ``report/`` room (a study in rooms: attribution/).
Each of them, imported in a fresh interpreter (all of them in one, one after another), leaves ``torch`` out of ``sys.modules`` (not
even through the modules it imports: reading a run's tables and drawing them needs no torch), and
its own source imports neither scipy nor statsmodels (the statistics live in a module that only
computes, which the report imports).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import seedlab

SRC = Path(seedlab.__file__).resolve().parent  # src/seedlab
#: what a report module's own source may not import (top-level names)
COMPUTING = {"scipy", "statsmodels"}


def report_modules() -> list[Path]:
    """Every report module of every study (a package with a report.py), sorted."""
    found = []
    for report in sorted(SRC.glob("*/report.py")):
        study = report.parent
        found += [p for p in sorted(study.glob("*.py"))
                  if p.stem in ("report", "figures") or p.stem.endswith("_report") or p.stem.startswith("report_")]
    for room in sorted(SRC.glob("*/report/")):
        found += [p for p in sorted(room.glob("*.py")) if p.stem != "__init__"]
    return found


def module_name(path: Path) -> str:
    return ".".join(("seedlab", *path.relative_to(SRC).with_suffix("").parts))


MODULES = report_modules()


def study_of(path: Path) -> str:
    return path.relative_to(SRC).parts[0]


def test_the_studies_are_found():
    studies = {study_of(p) for p in MODULES}
    assert {"shortcut", "twins", "attribution"} <= studies
    assert all((SRC / s / "report.py") in MODULES or (SRC / s / "report" / "bank.py") in MODULES for s in studies)


#: run in one fresh interpreter: import the modules one after another and print, as JSON, for each the
#: chain of seedlab imports that first asked for torch while it was imported ("" when none did). Once one
#: has loaded torch the later ones cannot be judged: they get None. (One interpreter, not one per module:
#: each start costs ~3 s, and while none loads torch every later import is as fresh as the first.)
PROBE = """
import importlib, json, sys, traceback
chain, out = [], {}
class Finder:
    def find_spec(self, name, path, target=None):
        if name == "torch" and not chain:
            chain.extend(f.filename.split("src/seedlab/")[-1] + f":{f.lineno}" for f in traceback.extract_stack()
                         if "src/seedlab/" in f.filename)
        return None
sys.meta_path.insert(0, Finder())
for name in sys.argv[1:]:
    if "torch" in sys.modules:
        out[name] = None
        continue
    importlib.import_module(name)
    out[name] = " <- ".join(reversed(chain)) if "torch" in sys.modules else ""
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def torch_chains() -> dict[str, str | None]:
    r = subprocess.run([sys.executable, "-c", PROBE, *map(module_name, MODULES)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_report_module_loads_no_torch(path, torch_chains):
    chain = torch_chains[module_name(path)]
    assert chain is not None, f"not judged: a report module imported before {module_name(path)} loaded torch (see its failure)"
    assert not chain, f"importing {module_name(path)} loads torch: {chain}"


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_report_module_imports_no_scipy_or_statsmodels_itself(path):
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        bad += [f"{path.relative_to(SRC)}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] in COMPUTING]
    assert not bad, "\n".join(bad)
