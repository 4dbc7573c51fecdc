"""A fork design of one's own grown to a small study (examples/repeats): at most five files, no study
imported, one line in the registry (seedlab.cli.STUDIES) — then seedlab runs, measures and reports it
as any study, through the one start (forks.start.begin) and the one loop (forks.loop.run_design)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from seedlab.cli import STUDIES, Study, app

pytestmark = pytest.mark.usefixtures("one_thread")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PACKAGE = EXAMPLES / "repeats"
STUDY_PACKAGES = ("seedlab.twins", "seedlab.attribution", "seedlab.shortcut")
S, GAP, END, SEEDS = 4, 3, 14, [0, 1]
PASSAGE = "Gizmo Harrington mends clocks."


def test_the_study_is_at_most_five_files_and_imports_no_study():
    files = sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert 1 <= len(files) <= 5, [p.name for p in files]
    imported = set()
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
    studies = sorted(m for m in imported if any(m == s or m.startswith(f"{s}.") for s in STUDY_PACKAGES))
    assert not studies, studies
    assert {"seedlab.forks.start", "seedlab.forks.loop"} <= imported  # the one start, the one loop


@pytest.fixture(scope="module")
def registered():
    """examples/ on the path and the study's one registry line."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(EXAMPLES))
        mp.setitem(STUDIES, "repeats", Study("repeats.cli", "An example fork study."))
        yield


@pytest.fixture(scope="module")
def design(registered, twins_inputs, tmp_path_factory):
    """A tiny design trained, measured and reported through `seedlab repeats ...`: its folder and the outputs."""
    base = tmp_path_factory.mktemp("repeats")
    cfg = {"corpus": str(twins_inputs[0]), "passage": PASSAGE, "model": "mini", "block_size": 32, "batch_size": 4,
           "steps": END, "injection_step": S, "gap": GAP, "seeds": SEEDS, "peak_lr": 1e-2, "threads": 1}
    (base / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    out, said = base / "d", {}
    for args in (["run", str(base / "cfg.yaml"), "--out", str(out), "--no-progress"], ["measure", str(out)],
                 ["report", str(out)]):
        result = CliRunner().invoke(app, ["repeats", *args])
        assert result.exit_code == 0, f"{args[0]}: {result.output}{result.exception!r}"
        said[args[0]] = result.output
    return out, said


def test_run_measure_report(design):
    out, said = design
    integrity = json.loads((out / "integrity.json").read_text())
    replica = integrity["seeds"]["0"]["replica"]
    assert replica["bitwise_equal_to_twin"] and replica["steps_compared"] == list(range(S, END + 1))
    assert "replica" not in integrity["seeds"]["1"]  # the first seed's twin is trained twice
    assert "bitwise equal" in said["run"]
    m = pd.read_parquet(out / "measures.parquet")
    assert sorted(zip(m.seed, m.arm)) == sorted((k, a) for k in SEEDS for a in ("once", "thrice", "ordinary"))
    assert (m.step == END).all() and (m.distance > 0).all()
    assert (m.groupby("seed").twin_passage_ce.nunique() == 1).all()  # one twin per seed
    p = pd.read_parquet(out / "paired.parquet")
    assert sorted(zip(p.comparison, p.measure)) == sorted((c, x) for c in ("thrice − once", "once − ordinary")
                                                          for x in ("passage_ce_diff", "distance"))
    assert (p.n == len(SEEDS)).all()
    report = (out / "report.md").read_text().splitlines()
    assert report[0] == "# Does a passage seen three times differ from one seen once?"
    shown = p.set_index(["comparison", "measure"]).shown[("thrice − once", "passage_ce_diff")]
    assert report[2].startswith(f"**Answer: {'yes' if shown else 'not shown'}.**")  # the answer first
    assert sum(line.startswith("|---") for line in report) == 1  # one table


def first_difference(manifests: dict, a: str, b: str) -> int:
    """The first step whose weights differ between the runs of arms a and b."""
    return next(t for t in range(S, END + 1) if manifests[a][str(t)] != manifests[b][str(t)])


def test_once_is_the_twin_at_the_fork_step_and_each_arm_differs_where_it_injects(design):
    out, _ = design
    for k in SEEDS:
        m = {a: json.loads((out / f"seed-{k}" / a / "manifest.json").read_text()) for a in ("twin", "once", "thrice", "ordinary")}
        assert all(m[a][str(S)] == m["twin"][str(S)] for a in m)  # bitwise the twin before s: one copy of the prefix
        assert first_difference(m, "once", "twin") == first_difference(m, "ordinary", "twin") == S + 1
        assert first_difference(m, "once", "ordinary") == S + 1
        assert first_difference(m, "thrice", "once") == S + GAP + 1  # the second sighting's batch moves the weights after it


def test_bad_input_is_one_line_and_exit_2(registered, tmp_path, monkeypatch, capsys):
    from seedlab.cli import main

    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"corpus": "c", "passage": PASSAGE, "steps": 14,
                                                       "injection_step": 4, "gap": 6}))
    for args, error in ((["run", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "d")],
                         "error: gap: the third injection (step 16) must come before the end (steps: 14); at most 4"),
                        (["measure", str(tmp_path)], f"error: {tmp_path}: not a repeats design folder (no config.json)")):
        monkeypatch.setattr(sys, "argv", ["seedlab", "repeats", *args])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code == 2 and capsys.readouterr().err == error + "\n"
    assert not (tmp_path / "d").exists()


def test_the_report_loads_no_torch():
    probe = "import sys, repeats.report; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
