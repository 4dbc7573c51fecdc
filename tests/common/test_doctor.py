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
        assert d["suggest"] == ("bf16" if d["bf16_gflops"] >= 2 * d["fp32_gflops"] else "fp32")


@pytest.mark.parametrize("fp32, bf16, suggest", [(100.0, 250.0, "bf16"), (100.0, 150.0, "fp32"), (300.0, 90.0, "fp32")])
def test_the_suggestion_follows_the_measured_ratio(monkeypatch, fp32, bf16, suggest):
    monkeypatch.setattr(doctor, "matmul_gflops", lambda dt, dev, n, r: bf16 if dt == torch.bfloat16 else fp32)
    report = doctor.examine()
    assert report["devices"][0]["suggest"] == suggest
    line = doctor.lines(report)[2]
    assert f"fp32 {fp32:.0f} GFLOP/s, bf16 {bf16:.0f} GFLOP/s ({bf16 / fp32:.2f}x): suggests precision {suggest}" in line


def test_the_command(seedlab_main):
    rc, out, err = seedlab_main("doctor", "--size", "64")
    assert rc == 0, err
    assert out.splitlines()[0].startswith("torch ") and "cpu (" in out and "suggests precision" in out
    rc, _, err = seedlab_main("doctor", "--size", "8")
    assert rc == 2 and err == "error: --size: at least 16, got 8\n"
