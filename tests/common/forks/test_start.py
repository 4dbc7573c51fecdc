"""forks/start.py: the one start of every fork command (claim, inputs, settle, environment, the
study's checks, lock, first files), from Python as from the CLI; the environment record every study
shares (seedlab/machine.py), and an older record lacking a key resuming with the key reported."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from seedlab import machine
from seedlab.config import parse
from seedlab.errors import SeedlabError
from seedlab.forks import start
from seedlab.forks.folders import DesignFolder
from seedlab.store import LOCK, folder_lock
from seedlab.twins.config import TwinsConfig
from seedlab.twins.train import run_twins

from helpers import tiny_twins

pytestmark = pytest.mark.usefixtures("one_thread")

BANK = {  # a bank as small as tests/attribution/conftest.py's TINY_BANK
    "model": "mini", "block_size": 32, "batch_size": 4, "steps": 14, "injection_step": 4, "seeds": [0],
    "horizons": [1, "end"], "peak_lr": 1e-2, "threads": 1,
    "candidates": {"file": "candidates.txt", "heldout": 2}, "queries": {"heldout": 2},
}


def _files(folder):
    return sorted((p.relative_to(folder).as_posix(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file())


def _twins(twins_inputs, **over) -> TwinsConfig:
    corpus, files = twins_inputs
    return parse(TwinsConfig, tiny_twins(corpus, files, threads=1, **over))


# --------------------------------------------------------------------------- the sequence, in one place


def test_begin_runs_the_steps_in_order_and_writes_the_first_files_when_asked(tmp_path, monkeypatch):
    steps = []
    folder = DesignFolder(tmp_path / "d")
    for name in ("claim", "check_inputs", "check_environment"):
        method = getattr(DesignFolder, name)
        monkeypatch.setattr(DesignFolder, name, lambda self, *a, _m=method, _n=name, **k: steps.append(_n) or _m(self, *a, **k))
    settle = start.settle
    monkeypatch.setattr(start, "settle", lambda *a: steps.append("settle") or settle(*a))
    lock = start.folder_lock
    monkeypatch.setattr(start, "folder_lock", lambda *a: steps.append("lock") or lock(*a))
    with start.begin(folder, {"design": 1}, {"corpus_sha256": {}, "eot_id": 0, "corpus": "c"}, device=torch.device("cpu"),
                     precision="fp32", threads=None, checks=[lambda: steps.append("study's check")]) as started:
        assert steps == ["claim", "check_inputs", "settle", "check_environment", "study's check", "lock"]
        assert not folder.config.exists()  # nothing written until the design asks (its arms checked)
        started.first_files()
    assert started.env == machine.environment(torch.device("cpu"), "fp32")
    assert json.loads(folder.config.read_text()) == {"design": 1}
    assert json.loads(folder.environment.read_text()) == {"environment": started.env, "changes": []}


def test_every_fork_command_goes_through_begin(tmp_path, monkeypatch, twins_inputs):
    """twins run, twins match and the bank each reach the folder through forks/start.py ``begin``
    (claim is its first step: stopped there, nothing is written), from Python."""
    from seedlab.attribution.bank.run import run_bank
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.twins.match import match_passages

    class Stop(Exception):
        pass

    callers = []

    def claim(self, record, *, force, world=None):
        caller = sys._getframe(1).f_code
        callers.append((type(self).__name__, os.path.basename(caller.co_filename), caller.co_name))
        raise Stop

    monkeypatch.setattr(DesignFolder, "claim", claim)
    corpus, _ = twins_inputs
    (tmp_path / "candidates.txt").write_text("Gizmo mends clocks.\n\nReturns a list of names.\n")
    bank = parse(AttributionConfig, BANK | {"corpus": str(corpus)})
    commands = {
        "RunDir": lambda out: run_twins(_twins(twins_inputs), out, progress=False),
        "MatchDir": lambda out: match_passages(_twins(twins_inputs), out, progress=False),
        "BankDir": lambda out: run_bank(bank, out, base=tmp_path, progress=False),
    }
    for i, command in enumerate(commands.values()):
        with pytest.raises(Stop):
            command(tmp_path / f"out-{i}")
        assert not (tmp_path / f"out-{i}").exists()
    assert callers == [(name, "start.py", "begin") for name in commands]


def test_no_command_starts_by_hand():
    """The steps of the start are called in forks/start.py alone (and folder_lock by the shortcut's sweep)."""
    import seedlab

    src = os.path.dirname(seedlab.__file__)
    calls = {".claim(": [], ".check_environment(": [], "folder_lock(": []}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                text = open(path).read()
                for call, where in calls.items():
                    if call in text:
                        where.append(os.path.relpath(path, src))
    assert calls[".claim("] == calls[".check_environment("] == ["forks/start.py"]
    assert sorted(calls["folder_lock("]) == ["forks/start.py", "shortcut/rundir.py", "store.py"]


# --------------------------------------------------------------------------- run_twins from Python


def test_run_twins_refuses_a_folder_holding_another_design(tmp_path, twins_inputs):
    out = tmp_path / "o"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"another": "design"}))
    before = _files(out)
    with pytest.raises(SeedlabError, match=rf"^--out: {out} holds another twins design \(config.json differs\); "
                                           r"use another folder, or --force to overwrite it$") as err:
        run_twins(_twins(twins_inputs), out, progress=False)
    assert "\n" not in str(err.value) and _files(out) == before


def test_run_twins_refuses_a_folder_in_use(tmp_path, twins_inputs):
    """Another process holds the folder's lock (here: this one, through another handle): one line,
    nothing written but the lock file it holds (which alone does not make the folder "used")."""
    out = tmp_path / "o"
    with folder_lock(out):
        with pytest.raises(SeedlabError, match=rf"^--out: {out} is in use by another run \(pid {os.getpid()}\); "
                                               "wait for it or stop it$"):
            run_twins(_twins(twins_inputs), out, progress=False)
        assert [p.name for p in out.iterdir()] == [LOCK]


def test_force_never_removes_a_folder_in_use(tmp_path, twins_inputs):
    """--force on a folder another process trains in: refused before the claim removes anything."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"another": "design"}))
    with folder_lock(out):
        before = _files(out)
        with pytest.raises(SeedlabError, match=r"is in use by another run"):
            run_twins(_twins(twins_inputs), out, progress=False, force=True)
        assert _files(out) == before


def test_force_keeps_the_lock_file_it_holds(tmp_path):
    """--force removes what another design left, but not the lock its own command holds."""
    out = tmp_path / "o"
    (out / "seed-0").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"another": "design"}))
    with folder_lock(out):
        DesignFolder(out).claim({"design": 1}, force=True)
        assert [p.name for p in out.iterdir()] == [LOCK]


# --------------------------------------------------------------------------- the environment record


def test_one_environment_record_with_the_cpu_model():
    env = machine.environment(torch.device("cpu"), "bf16")
    c = machine.cpu()
    assert env["cpu"] == c["model"] and env["cpu_flags"] == c["flags"] and env["cpu_capability"] == c["capability"]
    assert env["device"] == "cpu" and "device_name" not in env  # a GPU's name, on CUDA only
    assert env["precision"] == "bf16" and env["threads"] == torch.get_num_threads() and env["torch"] == torch.__version__
    assert set(machine.determinism()) <= set(env)


def test_the_allocator_is_recorded_and_a_resume_under_another_setting_goes_on(tmp_path):
    """The allocator changes where memory comes from, never a bit (tests/shortcut/test_bits.py): a folder started
    with glibc's defaults resumes with them tuned, and the other way round; threads still count."""
    env = machine.environment(torch.device("cpu"), "fp32")
    assert "allocator" in env
    folder = DesignFolder(tmp_path)
    folder.start({"design": 1}, {}, env | {"allocator": {}})
    assert folder.check_environment(env | {"allocator": {"M_TRIM_THRESHOLD": 2 ** 31 - 1}}, allow_change=False) is None
    with pytest.raises(SeedlabError, match=r"^environment: .* was started with threads = "):
        folder.check_environment(env | {"threads": env["threads"] + 1}, allow_change=False)


def test_a_record_lacking_a_key_resumes_with_the_key_reported(tmp_path):
    env = machine.environment(torch.device("cpu"), "fp32")
    older = {k: v for k, v in env.items() if k not in ("cpu", "cpu_flags")} | {"device_name": "x86_64"}
    folder = DesignFolder(tmp_path)
    folder.start({"design": 1}, {}, older)
    note = folder.check_environment(env, allow_change=False)
    assert note == (f"note: environment: {tmp_path} was started by another seedlab (cpu, cpu_flags not recorded then; "
                    "device_name no longer recorded): not compared")
    with pytest.raises(SeedlabError, match=r"^environment: .* was started with threads = "):
        folder.check_environment(env | {"threads": env["threads"] + 1}, allow_change=False)  # a value still counts
    assert folder.check_environment(older, allow_change=False) is None


def test_an_older_twins_run_resumes_with_the_missing_key_on_stderr(tmp_path, twins_inputs, capfd):
    """A twins run whose environment.json an older seedlab wrote (no CPU model) resumes: the key is
    reported in one line; the runs are read back unchanged."""
    cfg = _twins(twins_inputs, steps=10, injection_step=4, checkpoint_every=5, conditions=["twin", "fluent-attested"])
    out = tmp_path / "o"
    run_twins(cfg, out, progress=False)
    path = out / "environment.json"
    record = json.loads(path.read_text())
    del record["environment"]["cpu"]
    path.write_text(json.dumps(record))
    manifests = {p: p.read_text() for p in out.rglob("manifest.json")}
    capfd.readouterr()
    run_twins(cfg, out, progress=False)
    err = [line for line in capfd.readouterr().err.splitlines() if not line.startswith("warning: subjects")]
    assert err[0] == f"note: environment: {out} was started by another seedlab (cpu not recorded then): not compared"
    assert {p: p.read_text() for p in out.rglob("manifest.json")} == manifests
    assert json.loads(path.read_text())["changes"] == [machine.environment(torch.device("cpu"), "fp32")]


def test_a_bank_seed_process_checks_the_banks_environment(tmp_path):
    env = start.settled(torch.device("cpu"), 1, "fp32")
    assert start.settled(torch.device("cpu"), 1, "fp32", like=env) == env
    with pytest.raises(SeedlabError, match=r"^environment: cpu = .* in its process, 'Another CPU' in the bank's$"):
        start.settled(torch.device("cpu"), 1, "fp32", like=env | {"cpu": "Another CPU"}, of="the bank's")

