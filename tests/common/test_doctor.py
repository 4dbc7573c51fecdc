"""seedlab doctor: the machine's CPU, devices and the fp32/bf16 matmul peaks measured here (it only
reports: the precision policy a run is held to is tests/common/test_precision.py's)."""

import pytest
import torch

from seedlab import doctor, machine


def test_examine_measures_every_device_in_both_precisions():
    report = doctor.examine(n=64, repeats=1)
    assert report["torch"] == torch.__version__ and report["cpu"]["cores"] == __import__("os").cpu_count()
    assert set(report["cpu"]["flags"]) <= set(machine.FLAGS) and report["cpu"] == machine.cpu()
    devices = [d["device"] for d in report["devices"]]
    assert devices[0] == "cpu" and len(devices) == 1 + torch.cuda.device_count()
    for d in report["devices"]:
        assert d["fp32_gflops"] > 0 and d["bf16_gflops"] > 0
        assert d["fast_bf16"] == (d["bf16_gflops"] >= 2 * d["fp32_gflops"])


RESULTS = "precision fp32 for results (every preset's: bf16 is not recommended for them, docs/results/precision.md)"


@pytest.mark.parametrize("fp32, bf16, says", [
    (100.0, 250.0, f"{RESULTS}, bf16 for fast exploration (--set precision=bf16; shortcut: --set train.precision=bf16)"),
    (100.0, 150.0, "precision fp32 (every preset's; bf16 is not markedly faster here)"),
    (300.0, 90.0, "precision fp32 (every preset's; bf16 is not markedly faster here)")])
def test_the_precision_line_follows_the_measured_ratio_and_says_one_thing(monkeypatch, fp32, bf16, says):
    """fp32 for results everywhere; bf16, where it is at least twice as fast, for exploration: never
    'suggests bf16' beside 'bf16 is not recommended'."""
    monkeypatch.setattr(doctor, "matmul_gflops", lambda dt, dev, n, r: bf16 if dt == torch.bfloat16 else fp32)
    report = doctor.examine()
    assert report["devices"][0]["fast_bf16"] == (bf16 >= 2 * fp32)
    line = doctor.lines(report)[2]
    assert line.endswith(f"fp32 {fp32:.0f} GFLOP/s, bf16 {bf16:.0f} GFLOP/s ({bf16 / fp32:.2f}x): {says}")
    assert "suggest" not in line


def test_the_command(seedlab_main):
    rc, out, err = seedlab_main("doctor", "--size", "64")
    assert rc == 0, err
    assert out.splitlines()[0].startswith("torch ") and "cpu (" in out and ": precision fp32" in out
    rc, _, err = seedlab_main("doctor", "--size", "8")
    assert rc == 2 and err == "error: --size: at least 16, got 8\n"
