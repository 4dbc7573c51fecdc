"""benchmarks/gpu_check.py, the one GPU check: its dry run (every section at CPU sizes) measures every study
and fails nowhere, its JSON holds what its table prints, and the GPU run's sizes are valid configs (so the day
it meets a GPU it fails only on what only a GPU can show)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


def test_the_dry_run_measures_every_study(check, tmp_path):
    assert check.main(["--dry-run", "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert {"started", "dry_run", "device", "device_name", "environment", "determinism", "peaks_gflops", "sizes",
            "budget_s", "seconds", "sections"} <= set(result)
    assert result["dry_run"] and result["determinism"]["cublas_workspace_config"] == ":4096:8"
    assert {"deterministic_algorithms", "warn_only", "sdpa_backends_training", "allow_tf32_matmul",
            "cuda_started_before_it"} <= set(result["determinism"])
    assert list(result["sections"]) == list(check.STUDIES)
    rows = []
    for study, sec in result["sections"].items():
        assert sec["ok"], sec["traceback"]
        assert {"ok", "error", "seconds", "budget_s", "over_budget", "determinism", "details", "rows"} <= set(sec)
        assert sec["rows"] and all(list(r) == list(check.ROW_KEYS) and r["study"] == study for r in sec["rows"])
        rows += sec["rows"]
    measures = {(r["study"], r["measure"], r["precision"], r["size"]) for r in rows}
    for p in ("fp32", "bf16"):  # a CPU has no TF32
        assert ("shortcut", "plain per-seed loop", p, "1 seed") in measures
        assert {("shortcut", "seedlab ensemble", p, f"S={S}") for S in check.DRY.shortcut_members} <= measures
        assert ("twins", "lm.Trainer mini", p, "4 x 128 tokens") in measures
    names = {(r["study"], r["measure"]) for r in rows}
    assert {("shortcut", "paper table, one GPU, jobs in turn"), ("shortcut", "paper table, one GPU, packed"),
            ("twins", "fork: replica control bitwise"), ("twins", "fork-serial: replica control bitwise"),
            ("twins", "fork: hashes = serial fork's"), ("twins", "independent: hashes = serial fork's"),
            ("attribution", "bank, arm_batch 1"), ("attribution", "bank, arm_batch null"),
            ("attribution", "stacked / serial, one seed"), ("attribution", "unroll, one seed"),
            ("attribution", "whole bank, stacked")} <= names
    assert all(r["value"] is True for r in rows if r["unit"] == "check")  # on a CPU every control holds bitwise
    table = (tmp_path / "out" / "gpu_check.md").read_text().splitlines()
    lines = [line for line in table if line.startswith("| ")]
    assert lines[0] == "| " + " | ".join(check.ROW_KEYS) + " |"
    assert len(lines) == 1 + len(rows)  # a row per measured thing


def test_the_gpu_sizes_are_valid_configs(check, tmp_path):
    from seedlab.attribution.config import AttributionConfig
    from seedlab.config import load_config
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.twins.config import TwinsConfig

    z = check.FULL
    cfg, base = load_config(TwinsConfig, "twins", z.twins_preset, [f"corpus={tmp_path}", "device=cuda", *z.twins_over])
    assert cfg.conditions == ["twin", "fluent-fabricated"] and (base / cfg.passages["fluent-fabricated"]).is_file()
    bank, _ = load_config(AttributionConfig, "attribution", "mini", [f"corpus={tmp_path}", "device=cuda", *z.bank_over])
    assert len(bank.seeds) == 8
    ens, _ = load_config(EnsembleConfig, "shortcut", "paper-ensemble", ["train.device=cuda", "train.chunk=auto", *z.shortcut_data])
    assert ens.data.n_train == 16384 and ens.train.chunk_rows() == 262144


def test_only_names_studies(check, tmp_path):
    with pytest.raises(SystemExit):
        check.main(["--only", "twins,nope", "--out", str(tmp_path)])


def test_a_failing_section_is_recorded_and_the_others_kept(check, tmp_path, monkeypatch):
    def fine(ctx, sec):
        sec.row("measured", 1.0, "s")

    def fails(ctx, sec):
        sec.row("before the failure", 2.0, "s")
        raise RuntimeError("only a GPU shows this\nsecond line")

    monkeypatch.setitem(check.SECTIONS, "shortcut", fine)
    monkeypatch.setitem(check.SECTIONS, "twins", fails)
    assert check.main(["--dry-run", "--device", "cpu", "--only", "shortcut,twins", "--out", str(tmp_path)]) == 1
    sections = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]
    assert list(sections) == ["shortcut", "twins"] and sections["shortcut"]["ok"]
    twins = sections["twins"]
    assert not twins["ok"] and twins["error"] == "RuntimeError: only a GPU shows this" and "Traceback" in twins["traceback"]
    assert [r["measure"] for r in twins["rows"]] == ["before the failure", "FAILED"]
    assert "FAILED: RuntimeError: only a GPU shows this" in (tmp_path / "gpu_check.md").read_text()
