"""experiments/compare_folders.py: two run folders are the same results, or it says which file differs."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import save_file

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "compare_folders.py"
_spec = importlib.util.spec_from_file_location("compare_folders", SCRIPT)
compare_folders = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_folders)


def _folder(root: Path) -> Path:
    (root / "seed-0" / "twin").mkdir(parents=True)
    pd.DataFrame({"step": [0, 1], "loss": [2.5, 2.25]}).to_parquet(root / "seed-0" / "twin" / "losses.parquet")
    (root / "seed-0" / "twin" / "manifest.json").write_text(json.dumps({"1": {"w": "ab"}}))
    save_file({"w": torch.tensor([1.0, -0.0])}, root / "seed-0" / "twin" / "step-1.safetensors", {"step": "1", "run": "twin"})
    (root / "inputs.json").write_text(json.dumps({"corpus": str(root), "eot_id": 0}))
    (root / "environment.json").write_text(json.dumps({"cpu": "one"}))
    (root / "report.md").write_text("# R\n\n## A\n\n| a | 1 |\n\n## B\n\n| b | 2 |\n")
    return root


def _compare(a: Path, b: Path, capsys) -> tuple[int, str]:
    """The script's exit code and what it printed."""
    rc = compare_folders.main([str(a), str(b)])
    return rc, capsys.readouterr().out


def test_the_same_results_in_another_order_and_machine_pass(tmp_path, capsys):
    a, b = _folder(tmp_path / "a"), tmp_path / "b"
    shutil.copytree(a, b)
    (b / "environment.json").write_text(json.dumps({"cpu": "another"}))  # the machine is not a result
    (b / "report.md").write_text("# R\n\n## B\n\n| b | 2 |\n\n## A, reworded\n\n| a | 1 |\n")  # reordered, same rows
    (b / ".lock").write_text("123")
    rc, out = _compare(a, b, capsys)
    assert rc == 0, out
    assert "reordered: report.md" in out and "0 differences" in out


def test_a_changed_value_a_changed_hash_or_a_missing_file_fails(tmp_path, capsys):
    a = _folder(tmp_path / "a")
    for change in ("value", "hash", "missing", "row", "tensor", "record"):
        b = tmp_path / change
        shutil.copytree(a, b)
        twin = b / "seed-0" / "twin"
        if change == "value":
            pd.DataFrame({"step": [0, 1], "loss": [2.5, 2.2500000000000004]}).to_parquet(twin / "losses.parquet")
        elif change == "hash":
            (twin / "manifest.json").write_text(json.dumps({"1": {"w": "ac"}}))
        elif change == "tensor":  # +0.0 for -0.0: equal as numbers, not bit for bit
            save_file({"w": torch.tensor([1.0, 0.0])}, twin / "step-1.safetensors", {"step": "1", "run": "twin"})
        elif change == "record":
            (b / "inputs.json").write_text(json.dumps({"corpus": str(b), "eot_id": 1}))
        elif change == "missing":
            (twin / "losses.parquet").unlink()
        else:
            (b / "report.md").write_text("# R\n\n## A\n\n| a | 1.0 |\n\n## B\n\n| b | 2 |\n")
        rc, out = _compare(a, b, capsys)
        assert rc == 1, (change, out)
        assert ("only in before" if change == "missing" else "differs:") in out, (change, out)
