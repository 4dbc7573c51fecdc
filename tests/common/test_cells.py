"""seedlab/cells.py: a kept cell summary (scalars + named frames) written as cell.json and one CSV per frame and read
back exactly with its declared column types; the drivers' keep/skip loop (stages as subprocesses, the summary kept,
what is kept skipped). The studies' own kept cells are tested in their tests (test_grid.py, test_scale.py), against
the summaries committed under docs/results."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from seedlab import cells
from seedlab.cells import CellDir, Columns, Summary, TableDir
from seedlab.errors import SeedlabError

ROWS = ["kind", "step", "ok", "value"]
COLUMNS = Columns(strings=frozenset({"kind"}), ints=frozenset({"step"}), bools=frozenset({"ok"}))


@dataclass
class Toy(Summary, scalars=["name", "seeds", "rate", "stages"], frames={"rows": ROWS}, columns=COLUMNS,
          noun="kept toy summary"):
    name: str
    seeds: list[int]
    rate: float
    rows: pd.DataFrame
    stages: dict[str, float] = field(default_factory=dict)


def toy(name: str = "a", rate: float = 0.1) -> Toy:
    rows = pd.DataFrame({"kind": ["x", None, "1.5"], "step": [1, 2, 3], "ok": [True, False, True],
                         "value": [1 / 3, math.nan, 1e-300]})
    return Toy(name=name, seeds=[0, 1], rate=rate, rows=COLUMNS.typed(rows, ROWS))


def test_typed_gives_every_column_its_declared_type_and_fills_a_missing_one():
    t = COLUMNS.typed(pd.DataFrame({"kind": ["x", None], "step": ["3", "4"], "ok": ["True", "False"]}), ROWS)
    assert list(t.columns) == ROWS and list(t.kind) == ["x", ""] and t.kind.dtype == object
    assert t.step.dtype == np.int64 and list(t.ok) == [True, False] and t.value.isna().all()


def test_a_summary_round_trips_through_its_folder_exactly_and_writes_the_same_bytes(tmp_path):
    c = toy()
    where = c.to_dir(tmp_path / "a")
    assert sorted(p.name for p in where.iterdir()) == ["cell.json", "rows.csv"]  # nothing half-written left
    back = Toy.from_dir(where)
    assert back.equals(c) and back.seeds == [0, 1] and back.rows.kind.tolist() == ["x", "", "1.5"]
    pd.testing.assert_frame_equal(back.rows, c.rows, check_exact=True)
    again = back.to_dir(tmp_path / "b")
    for name in ("cell.json", "rows.csv"):
        assert (again / name).read_bytes() == (where / name).read_bytes()
    assert not toy(rate=0.2).equals(c)
    with pytest.raises(SeedlabError, match=r"no cell.json \(not a kept toy summary\)"):
        Toy.from_dir(tmp_path / "nothing")


def test_a_summary_older_than_a_scalar_reads_it_at_its_default_and_one_without_a_required_one_is_refused(tmp_path):
    """A scalar the record lacks (written before the study recorded it) takes the field's default; a required one
    (no default) missing is one line naming it."""
    import json

    where = toy().to_dir(tmp_path / "a")
    record = json.loads((where / "cell.json").read_text())
    (where / "cell.json").write_text(json.dumps({k: v for k, v in record.items() if k != "stages"}))
    assert Toy.from_dir(where).stages == {}
    (where / "cell.json").write_text(json.dumps({k: v for k, v in record.items() if k != "rate"}))
    with pytest.raises(SeedlabError, match=r"cell.json: no rate \(not a kept toy summary of this seedlab\)$"):
        Toy.from_dir(where)


def test_the_folders_name_their_files(tmp_path):
    assert CellDir(tmp_path).record == tmp_path / "cell.json" and CellDir(tmp_path).frame("x") == tmp_path / "x.csv"

    class Grid(TableDir):
        stem = "grid"

    g = Grid(tmp_path)
    assert (g.report.name, g.table("law").name, g.figure("rho").name) == ("grid.md", "grid-law.csv", "grid-rho.png")


def test_summaries_finds_every_kept_cell_keep_winning(tmp_path, capsys):
    out, keep = tmp_path / "out", tmp_path / "keep"
    toy("a").to_dir(out / cells.SUMMARIES / "a")
    toy("b").to_dir(out / cells.SUMMARIES / "b")
    toy("b").to_dir(keep / "b")
    (keep / "c").mkdir()  # no cell.json: not a summary
    assert cells.summaries(out, keep) == {"a": out / "summaries" / "a", "b": keep / "b"}
    assert cells.summaries(out, None) == {"a": out / "summaries" / "a", "b": out / "summaries" / "b"}
    assert cells.skip_kept(keep, "b") and not cells.skip_kept(keep, "c") and not cells.skip_kept(None, "b")
    assert capsys.readouterr().out == f"# b: kept in {keep / 'b'}, skipped\n"


def _stage(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_run_cell_runs_the_stages_times_them_and_keeps_the_summary(tmp_path, capsys):
    out, keep = tmp_path / "out", tmp_path / "keep"
    ran = tmp_path / "ran"
    stages = {"train": _stage(f"open({str(ran)!r}, 'w').write('1')"), "measure": _stage("raise SystemExit(5)")}
    assert cells.run_cell("a", stages, toy, out=out, keep=keep, skip={"measure": "measured already"})
    assert ran.is_file() and "[a] measure: measured already, skipped" in capsys.readouterr().out
    kept = Toy.from_dir(keep / "a")
    assert kept.stages.keys() == {"train", "summarise"} and kept.equals(Toy.from_dir(out / "summaries" / "a"))
    assert not cells.run_cell("b", stages, toy, out=out, keep=keep)  # measure fails: nothing summarised or kept
    assert "[b] measure FAILED with exit code 5" in capsys.readouterr().out
    assert not (keep / "b").exists() and not (out / "summaries" / "b").exists()


def test_a_resumed_stage_is_timed_under_its_own_name(tmp_path):
    """Its time is that invocation's alone, so the summary must not call it the stage's time."""
    stages = {"train": _stage("pass"), "measure": _stage("pass")}
    assert cells.run_cell("a", stages, toy, out=tmp_path / "out", resumed={"train"})
    assert Toy.from_dir(tmp_path / "out" / "summaries" / "a").stages.keys() == {"train (resumed)", "measure",
                                                                                  "summarise"}


def test_run_cell_passes_the_environment(tmp_path):
    where = tmp_path / "env"
    stage = _stage(f"import os; open({str(where)!r}, 'w').write(os.environ['SEEDLAB_TEST_VALUE'])")
    assert cells.run_cell("a", {"s": stage}, toy, out=tmp_path / "out", env={"SEEDLAB_TEST_VALUE": "7"})
    assert where.read_text() == "7" and not Path(tmp_path / "keep").exists()


def test_parse_seeds_is_comma_separated_integers():
    import argparse

    assert cells.parse_seeds("0, 1,2,") == [0, 1, 2]
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated integers, got 'a'"):
        cells.parse_seeds("a")
