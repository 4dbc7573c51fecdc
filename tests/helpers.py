"""Plain helper functions shared by test files (importable as ``helpers``: pyproject's pytest
``pythonpath`` puts tests/ on sys.path; fixtures live in conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd


def summary_of_cells(cells, task="sum2-max", **extra) -> pd.DataFrame:
    """A summary frame from (layers, ratio, k, n) cells: k of the n members generalized."""
    rows = []
    for layers, ratio, k, n in cells:
        rows += [dict(task=task, ratio=ratio, layers=layers, heads=1, weight_decay=0.1, generalized=i < k, **extra)
                 for i in range(n)]
    return pd.DataFrame(rows)


def copy_run(design: Path, tmp_path: Path) -> Path:
    """A copy of a twins test design's run folder, to change (files removed, corrupted, ...)
    without touching the session's shared one."""
    shutil.copytree(design / "run", tmp_path / "run")
    return tmp_path / "run"
