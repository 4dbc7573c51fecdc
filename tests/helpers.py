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


#: the tiny fork design the twins tests share: GPT mini on 128-token rows, 4 rows a batch, one seed,
#: the fork at step 8 of 24, a checkpoint every 4 updates (seconds on one core)
TINY_FORK = {"model": "mini", "block_size": 128, "seeds": [3], "steps": 24, "batch_size": 4, "injection_step": 8,
             "checkpoint_every": 4}


def tiny_twins(corpus, files: dict, **over) -> dict:
    """A twins config on TINY_FORK: the corpus folder, the passage files {condition: path}, and ``over``."""
    return {"corpus": str(corpus), **TINY_FORK, "passages": {c: str(f) for c, f in files.items()}, **over}
