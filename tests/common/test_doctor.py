"""seedlab doctor: the machine's CPU, devices and the fp32/bf16 matmul peaks measured here."""

import pytest
import torch

from seedlab import doctor


def test_examine_measures_every_device_in_both_precisions():
    report = doctor.examine(n=64, repeats=1)
    assert report["torch"] == torch.__version__ and report["cpu"]["cores"] == __import__("os").cpu_count()
    assert set(report["cpu"]["flags"]) <= set(doctor.FLAGS)
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


def test_the_command(seedlab_cli):
    rc, out, err = seedlab_cli("doctor", "--size", "64")
    assert rc == 0, err
    assert out.splitlines()[0].startswith("torch ") and "cpu (" in out and "suggests precision" in out
    rc, _, err = seedlab_cli("doctor", "--size", "8")
    assert rc == 2 and err == "error: --size: at least 16, got 8\n"


def test_bf16_where_it_is_emulated_warns_with_the_measured_slowdown(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "matmul_gflops", lambda dt, dev, n, r: 20.0 if dt == torch.bfloat16 else 100.0)
    monkeypatch.setattr(doctor, "cpu", lambda: {"model": "Old CPU", "flags": ["avx2"]})
    msg = doctor.check_precision("bf16", "cpu")
    assert msg.startswith("warning: precision bf16 on this CPU (Old CPU; no AVX-512 BF16 or AMX) multiplies 5.0x slower")
    assert doctor.check_precision("fp32", "cpu") is None
    monkeypatch.setattr(doctor, "matmul_gflops", lambda dt, dev, n, r: 250.0 if dt == torch.bfloat16 else 100.0)
    assert doctor.check_precision("bf16", "cpu") is None  # native bf16: nothing to say


def test_bf16_on_a_cuda_device_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    with pytest.raises(doctor.SeedlabError, match="^precision bf16: Tesla V100 has no bfloat16 support; use fp32$"):
        doctor.check_precision("bf16", "cuda")


def test_a_bf16_run_on_an_emulating_cpu_says_so_once(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "check_precision", lambda p, d: "warning: slow" if p == "bf16" else None)
    doctor.warn_precision.cache_clear()
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.shortcut.train import train_ensemble

    cfg = EnsembleConfig.model_validate({"data": {"n_train": 32, "n_val": 8, "n_adv": 8, "vocab": 10},
                                         "train": {"epochs": 1, "precision": "bf16"}, "model": {"layers": 1}})
    train_ensemble(cfg, progress=False)
    train_ensemble(cfg, progress=False)
    assert capsys.readouterr().err.count("warning: slow") == 1
    doctor.warn_precision.cache_clear()
