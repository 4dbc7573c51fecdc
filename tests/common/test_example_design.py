"""A fork design of one's own grown to a small study (examples/repeats): at most five modules and its
pyproject, no study imported, registered through an entry point (seedlab.cli.ENTRY_POINTS) — then seedlab
lists, runs, measures and reports it as any study, through the one start (forks.start.begin) and the one
loop (forks.loop.run_design). docs/forks.md's design in a few lines runs as written."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from example_study import EXAMPLES, PACKAGE, installed, project
from seedlab import cli
from seedlab.cli import ENTRY_POINTS, STUDIES, app

pytestmark = pytest.mark.usefixtures("one_thread")
DOCS = EXAMPLES.parent / "docs" / "forks.md"
STUDY_PACKAGES = ("seedlab.twins", "seedlab.attribution", "seedlab.shortcut")
S, GAP, END, SEEDS = 4, 3, 14, [0, 1]
PASSAGE = "Gizmo Harrington mends clocks."


def test_the_study_is_at_most_five_modules_and_imports_no_study():
    files = sorted(PACKAGE.rglob("*.py"))
    assert 1 <= len(files) <= 5, [p.name for p in files]
    assert sorted(p.name for p in PACKAGE.iterdir() if p.suffix not in (".py",) and p.is_file()) == ["pyproject.toml"]
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
def registered(tmp_path_factory):
    """The study installed as pip install -e leaves it (tests/example_study.py): nothing in seedlab names it."""
    with installed(tmp_path_factory.mktemp("site")):
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


# --------------------------------------------------------------------------- registered through an entry point


def test_the_pyproject_makes_the_folder_a_package_with_its_entry_point():
    p = project()
    assert p["entry-points"] == {ENTRY_POINTS: {"repeats": "repeats.cli"}}
    assert "seedlab" in p["dependencies"]
    setup = __import__("tomllib").loads((PACKAGE / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setup == {"packages": ["repeats"], "package-dir": {"repeats": "."}}  # this folder is the package `repeats`
    assert "repeats" not in STUDIES and "repeats.cli" not in Path(cli.__file__).read_text()  # seedlab does not name it


def test_seedlab_help_lists_the_installed_study(registered, seedlab_main):
    from repeats.cli import HELP

    rc, out, err = seedlab_main("--help")
    assert rc == 0 and err == "", err
    line = next(x for x in out.splitlines() if re.search(r"\brepeats\b", x))
    assert HELP.split()[0] in line, out  # its HELP beside its name
    rc, out, err = seedlab_main("repeats", "--help")
    assert rc == 0 and all(c in out for c in ("run", "measure", "report")), out + err


def test_a_study_that_does_not_load_is_one_line_and_the_rest_works(tmp_path, seedlab_main):
    """An entry point whose module fails to import, one that names a module without app/HELP, one that
    takes a seedlab command's name: one line each on stderr; the other commands run; `seedlab NAME ...`
    is that line, exit 2, nothing written."""
    more = {"broken-study": {ENTRY_POINTS: {"broken": "no_such_module_49.cli"}},
            "half-study": {ENTRY_POINTS: {"half": "repeats.config"}},
            "clash-study": {ENTRY_POINTS: {"twins": "repeats.cli"}}}
    lines = {"broken": "study broken (entry point 'no_such_module_49.cli' of broken-study 1.0) does not load: "
                       "ModuleNotFoundError: No module named 'no_such_module_49'",
             "half": "study half (entry point 'repeats.config' of half-study 1.0) does not load: repeats.config "
                     "defines no app (a typer.Typer with the study's commands)",
             "twins": "study twins (entry point 'repeats.cli' of clash-study 1.0): the name is taken (by seedlab or "
                      "another package); left out"}
    with installed(tmp_path / "site", more):
        rc, out, err = seedlab_main("presets")
        assert rc == 0 and "twins:" in out
        assert sorted(err.splitlines()) == sorted(f"warning: {x}" for x in lines.values())
        rc, out, err = seedlab_main("--help")
        assert rc == 0 and re.search(r"\brepeats\b", out) and not re.search(r"\b(broken|half)\b", out), out
        rc, out, err = seedlab_main("twins", "--help")  # the name stays seedlab's
        assert rc == 0 and "The single-example counterfactual" in out
        before = sorted(tmp_path.rglob("*"))
        for name in ("broken", "half"):
            rc, out, err = seedlab_main(name, "run", "cfg.yaml", "--out", "d")
            warned = [f"warning: {x}" for k, x in lines.items() if k != name]
            assert rc == 2 and out == "" and err.splitlines() == [*warned, f"error: {lines[name]}"], err
        assert sorted(tmp_path.rglob("*")) == before


# --------------------------------------------------------------------------- docs/forks.md's design in a few lines


def _section(title: str) -> str:
    return DOCS.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _block(text: str, lang: str) -> str:
    found = re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)
    assert len(found) == 1, f"{len(found)} ```{lang} blocks"
    return found[0]


def _calls(tree: ast.AST) -> set[str]:
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def test_the_documented_design_is_the_examples_path():
    snippet = ast.parse(_block(_section("A design in a few lines"), "python"))
    train = ast.parse((PACKAGE / "train.py").read_text())
    assert {"begin", "run_design", "Design"} <= _calls(snippet) & _calls(train)  # the one start, the one loop


def test_the_documented_design_runs_as_written(tmp_path, twins_inputs, monkeypatch):
    """docs/forks.md's yaml and python blocks, as written, on a tiny design: begin claims the folder and
    records the environment, the loop trains every arm and the replica, a second run resumes, and another
    design in the folder is refused in one line."""
    from seedlab.errors import SeedlabError

    section = _section("A design in a few lines")
    code = compile(_block(section, "python"), str(DOCS), "exec")
    cfg = yaml.safe_load(_block(section, "yaml")) | {
        "corpus": str(twins_inputs[0]), "model": "mini", "block_size": 32, "batch_size": 4, "steps": 26,
        "injection_step": S, "seeds": [0], "peak_lr": 1e-2, "threads": 1}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "design.yaml").write_text(yaml.safe_dump(cfg))
    ran: dict = {}
    exec(code, ran)
    out = tmp_path / "runs" / "my-design"
    integrity = json.loads((out / "integrity.json").read_text())
    assert integrity == ran["integrity"] and integrity["seeds"]["0"]["replica"]["bitwise_equal_to_twin"]
    assert json.loads((out / "config.json").read_text()) == ran["cfg"].model_dump(mode="json") | {"world_size": 1}
    assert json.loads((out / "inputs.json").read_text())["passage"] == ran["passage"]
    assert json.loads((out / "environment.json").read_text())["environment"]["threads"] == 1
    m = {a: json.loads((out / "seed-0" / a / "manifest.json").read_text()) for a in ("twin", "once", "thrice")}
    diff = lambda a, b: next(t for t in range(S, 27) if m[a][str(t)] != m[b][str(t)])
    assert diff("once", "twin") == S + 1 and diff("thrice", "once") == S + 10 + 1
    written = {p: p.read_bytes() for p in (out / "seed-0").rglob("*") if p.is_file()}
    again: dict = {}
    exec(code, again)  # the same design again: resumed, every run read back as it was
    assert {p: p.read_bytes() for p in (out / "seed-0").rglob("*") if p.is_file()} == written
    assert again["integrity"]["seeds"]["0"]["replica"]["bitwise_equal_to_twin"]
    (tmp_path / "design.yaml").write_text(yaml.safe_dump(cfg | {"steps": 27}))
    with pytest.raises(SeedlabError, match=r"^--out: runs/my-design holds another fork design \(config.json differs\)"):
        exec(code, {})
