"""seedlab/precision.py: the precision policy every trainer is held to (bf16 refused where it cannot
run, a one-line warning where it is emulated, once per process), and that it lives below the
trainers: lm/determinism.py and the shortcut's trainer call it, doctor.py only reports."""

import ast
from pathlib import Path

import pytest
import torch

import seedlab
from seedlab import precision

SRC = Path(seedlab.__file__).resolve().parent


def test_bf16_where_it_is_emulated_warns_with_the_measured_slowdown(monkeypatch, capsys):
    monkeypatch.setattr(precision, "matmul_gflops", lambda dt, dev, n, r: 20.0 if dt == torch.bfloat16 else 100.0)
    monkeypatch.setattr(precision, "cpu", lambda: {"model": "Old CPU", "flags": ["avx2"]})
    msg = precision.check_precision("bf16", "cpu")
    assert msg.startswith("warning: precision bf16 on this CPU (Old CPU; no AVX-512 BF16 or AMX) multiplies 5.0x slower")
    assert precision.check_precision("fp32", "cpu") is None
    monkeypatch.setattr(precision, "matmul_gflops", lambda dt, dev, n, r: 250.0 if dt == torch.bfloat16 else 100.0)
    assert precision.check_precision("bf16", "cpu") is None  # native bf16: nothing to say


def test_bf16_on_a_cuda_device_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    with pytest.raises(precision.SeedlabError, match="^precision bf16: Tesla V100 has no bfloat16 support; use fp32$"):
        precision.check_precision("bf16", "cuda")


def test_a_bf16_run_on_an_emulating_cpu_says_so_once(monkeypatch, capsys):
    monkeypatch.setattr(precision, "check_precision", lambda p, d: "warning: slow" if p == "bf16" else None)
    precision.warn_precision.cache_clear()
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.shortcut.train import train_ensemble

    cfg = EnsembleConfig.model_validate({"data": {"n_train": 32, "n_val": 8, "n_adv": 8, "vocab": 10},
                                         "train": {"epochs": 1, "precision": "bf16"}, "model": {"layers": 1}})
    train_ensemble(cfg, progress=False)
    train_ensemble(cfg, progress=False)
    assert capsys.readouterr().err.count("warning: slow") == 1
    precision.warn_precision.cache_clear()


def test_the_trainers_call_the_policy_not_the_doctor():
    """Nothing in src imports seedlab.doctor but the CLI (doctor.py reports; the policy is precision.py)."""
    importers = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "seedlab.doctor" for n in names):
                importers.append(path.relative_to(SRC).as_posix())
    assert importers == ["cli.py"]
    from seedlab import doctor

    assert not hasattr(doctor, "check_precision") and not hasattr(doctor, "warn_precision")


def test_settle_holds_a_fork_command_to_the_policy(monkeypatch, capsys):
    """lm/determinism.py ``settle`` (every fork command's start) warns through the policy, once."""
    from seedlab.lm.determinism import settle

    monkeypatch.setattr(precision, "check_precision", lambda p, d: f"warning: {p} on {d}" if p == "bf16" else None)
    precision.warn_precision.cache_clear()
    settle(torch.device("cpu"), None, "bf16")
    settle(torch.device("cpu"), None, "bf16")
    settle(torch.device("cpu"), None, "fp32")
    assert capsys.readouterr().err == "warning: bf16 on cpu\n"
    precision.warn_precision.cache_clear()
