"""Reports only render (DESIGN.md): every study's report modules load no torch and import no scipy or statsmodels.

A study is a package under src/seedlab that has a ``report.py`` (found, not listed). Its *report
modules* are ``report.py``, ``figures.py`` and any ``*_report.py`` or ``report_*.py`` beside them.
Each of them, imported alone in a fresh interpreter, leaves ``torch`` out of ``sys.modules`` (not
even through the modules it imports: reading a run's tables and drawing them needs no torch), and
its own source imports neither scipy nor statsmodels (the statistics live in a module that only
computes, which the report imports).
"""

from __future__ import annotations

import ast
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
    return found


def module_name(path: Path) -> str:
    return ".".join(("seedlab", *path.relative_to(SRC).with_suffix("").parts))


MODULES = report_modules()


def test_the_studies_are_found():
    studies = {p.parent.name for p in MODULES}
    assert {"shortcut", "twins", "attribution"} <= studies
    assert all((SRC / s / "report.py") in MODULES for s in studies)


#: run in a fresh interpreter: import the module, print the chain of seedlab imports that first asked for torch
#: (empty when none did)
PROBE = """
import importlib, sys, traceback
chain = []
class Finder:
    def find_spec(self, name, path, target=None):
        if name == "torch" and not chain:
            chain.extend(f.filename.split("src/seedlab/")[-1] + f":{f.lineno}" for f in traceback.extract_stack()
                         if "src/seedlab/" in f.filename)
        return None
sys.meta_path.insert(0, Finder())
importlib.import_module(sys.argv[1])
print(" <- ".join(reversed(chain)) if "torch" in sys.modules else "")
"""


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_report_module_loads_no_torch(path):
    r = subprocess.run([sys.executable, "-c", PROBE, module_name(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not r.stdout.strip(), f"importing {module_name(path)} loads torch: {r.stdout.strip()}"


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_report_module_imports_no_scipy_or_statsmodels_itself(path):
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        bad += [f"{path.relative_to(SRC)}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] in COMPUTING]
    assert not bad, "\n".join(bad)
