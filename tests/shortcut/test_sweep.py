"""Sweeps: planning, kill -9 and resume, the folder lock, the Ray executor, bad input."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from seedlab.config import load_config, parse
from seedlab.shortcut.config import SweepConfig
from seedlab.shortcut.rundir import SweepDir
from seedlab.shortcut.sweep import plan

SMALL = {
    "data": {"n_train": 128, "n_val": 32, "n_adv": 32, "vocab": 10},
    "train": {"epochs": 4, "eval_every": 2, "threads": 1},
    "grid": {"task": ["sum2-max", "sum3-first"], "ratio": [0.5, 0.9], "layers": [1, 2], "heads": [1], "seed": 3},
    "max_members": 4,
}


def _write(tmp_path, cfg, name="sweep.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_plan_groups_by_architecture_and_caps_size():
    jobs = plan(parse(SweepConfig, SMALL))
    # 2 architectures x 2 class counts x 6 members each, in ensembles of <= 4
    assert len(jobs) == 2 * 2 * 2
    assert sum(len(j.config["members"]) for j in jobs) == 2 * 2 * 2 * 3
    for j in jobs:
        ms = j.config["members"]
        assert len(ms) <= 4
        assert len({m["task"][:4] for m in ms}) == 1  # one class count per ensemble
    assert len({j.key for j in jobs}) == len(jobs)
    assert [j.key for j in plan(parse(SweepConfig, SMALL))] == [j.key for j in jobs]  # stable hashes
    # seeds are the outer loop: the first job holds seed 0 of every cell before seed 1
    assert [m["seed"] for m in jobs[0].config["members"]] == [0, 0, 1, 1]


def _sweep_cmd(cfg_path, out, *extra):
    return [sys.executable, "-m", "seedlab", "shortcut", "sweep", str(cfg_path), "--out", str(out), "--no-progress", *extra]


def test_kill9_and_resume(tmp_path, seedlab_main):
    cfg = SMALL | {"train": SMALL["train"] | {"epochs": 30}, "max_members": 2}
    path, out = _write(tmp_path, cfg), tmp_path / "sweep"
    n_jobs = len(plan(parse(SweepConfig, cfg)))
    proc = subprocess.Popen(_sweep_cmd(path, out), start_new_session=True)
    deadline = time.time() + 120
    while len(list(out.glob("jobs/*/done.json"))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = {p: p.stat().st_mtime_ns for p in out.glob("jobs/*/done.json")}
    assert 2 <= len(done_before) < n_jobs
    # the restart (in process: the kill above is the real one) finishes without redoing finished jobs
    rc, _, err = seedlab_main(*_sweep_cmd(path, out)[3:])
    assert rc == 0, err
    assert all(p.stat().st_mtime_ns == t for p, t in done_before.items())
    assert len(list(out.glob("jobs/*/done.json"))) == n_jobs
    s = pd.read_parquet(out / "summary.parquet")
    assert len(s) == 24 and s.member.is_unique
    assert not s.duplicated(["task", "ratio", "layers", "heads", "seed"]).any()
    c = pd.read_parquet(out / "curves.parquet")
    assert len(c) == 24 * 3 * (30 // 2 + 1)
    assert not c.duplicated(["member", "epoch", "split"]).any()


def test_second_sweep_on_same_folder_is_refused(tmp_path):
    out = tmp_path / "sweep"
    with SweepDir(out).lock():
        r = subprocess.run(_sweep_cmd(_write(tmp_path, SMALL), out), capture_output=True, text=True)
    assert r.returncode == 2
    assert f"in use by another sweep (pid {os.getpid()})" in r.stderr
    assert not (out / "sweep.yaml").exists()


@pytest.mark.serial  # a Ray cluster's processes of its own
def test_ray_executor_matches_local(tmp_path, seedlab_main):
    pytest.importorskip("ray")
    path = _write(tmp_path, SMALL)
    rc, _, err = seedlab_main(*_sweep_cmd(path, tmp_path / "local")[3:])  # here; Ray's workers are other processes
    assert rc == 0, err
    ray_run = subprocess.run(_sweep_cmd(path, tmp_path / "ray", "--executor", "ray"), capture_output=True, text=True)
    assert ray_run.returncode == 0, ray_run.stderr
    a = pd.read_parquet(tmp_path / "local" / "curves.parquet")
    b = pd.read_parquet(tmp_path / "ray" / "curves.parquet")
    pd.testing.assert_frame_equal(a, b)  # same jobs, same threads: the same numbers


@pytest.mark.parametrize(
    "over,msg",
    [
        ({"grid": SMALL["grid"] | {"ratio": []}}, "error: grid.ratio: empty grid axis"),
        ({"grid": SMALL["grid"] | {"seed": []}}, "error: grid.seed"),
        ({"grid": SMALL["grid"] | {"ratio": [0.5, 1.5]}}, "error: grid.ratio: must be in [0, 1]"),
        ({"grid": SMALL["grid"] | {"layrs": [1]}}, "error: grid.layrs: unknown field"),
        ({"grid": SMALL["grid"] | {"heads": [3]}}, "error: grid.heads: must divide d_model"),
    ],
)
def test_bad_sweep_config(tmp_path, over, msg, seedlab_main):
    out = tmp_path / "sweep"
    rc, _, err = seedlab_main(*_sweep_cmd(_write(tmp_path, SMALL | over), out)[3:])
    assert rc == 2 and err.startswith(msg), err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_unreachable_ray_address(tmp_path, seedlab_main):
    pytest.importorskip("ray")
    out = tmp_path / "sweep"
    rc, _, err = seedlab_main(*_sweep_cmd(_write(tmp_path, SMALL), out, "--executor", "ray", "--ray-address", "127.0.0.1:9")[3:])
    assert rc == 2 and "no Ray cluster answers" in err
    assert not out.exists()


def test_several_grids_union_without_duplicates():
    cfg = SMALL | {"grid": [{"ratio": [0.5, 0.9], "layers": [1, 2], "seed": 2}, {"ratio": [0.9, 0.15], "layers": [2], "seed": 3}]}
    members = [(j.config["model"]["layers"], m["ratio"], m["seed"]) for j in plan(parse(SweepConfig, cfg)) for m in j.config["members"]]
    assert len(members) == len(set(members)) == 4 + 4 + 4  # 2L r=0.9 seeds 0-1 appear in both grids


def test_paper_preset_plans():

    cfg, _ = load_config(SweepConfig, "shortcut", "paper")
    jobs = plan(cfg)
    assert cfg.data.n_train == 16384 and cfg.train.epochs == 15000 and cfg.train.batch_size is None
    assert sum(len(j.config["members"]) for j in jobs) == 1140
    # "100% at any point": adversarial accuracy every epoch; gradients and checkpoints through the phases
    assert cfg.train.adv_every == 1 and cfg.train.gradients.enabled
    assert len([e for e in cfg.train.checkpoint_epochs if e <= 1000]) >= 8


def test_quick_flip_is_quick_with_weight_decay_one():
    """The confirmed flip protocol (docs/results.md) differs from quick in the weight decay alone."""
    quick, _ = load_config(SweepConfig, "shortcut", "quick")
    flip, _ = load_config(SweepConfig, "shortcut", "quick-flip")
    assert flip.optim.weight_decay == 1.0 and quick.optim.weight_decay == 0.1
    assert flip.model_dump() == quick.model_dump() | {"optim": quick.optim.model_dump() | {"weight_decay": 1.0}}


@pytest.mark.serial  # a Ray cluster's processes of its own
def test_ray_executor_joins_a_running_cluster(tmp_path):
    """`--ray-address` connects to a cluster started beforehand with `ray start --head`."""
    pytest.importorskip("ray")
    ray_bin = str(Path(sys.executable).parent / "ray")
    start = subprocess.run([ray_bin, "start", "--head", "--port", "6391", "--num-cpus", "2", "--include-dashboard=false"], capture_output=True, text=True)
    assert start.returncode == 0, start.stderr
    try:
        r = subprocess.run(_sweep_cmd(_write(tmp_path, SMALL), tmp_path / "s", "--executor", "ray", "--ray-address", "auto"), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert len(pd.read_parquet(tmp_path / "s" / "summary.parquet")) == 24
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True)


def test_analyze_a_sweep_uses_global_member_ids(tmp_path, seedlab_main):
    cfg = SMALL | {"train": SMALL["train"] | {"checkpoint_epochs": [0, 4]}, "grid": SMALL["grid"] | {"task": ["sum2-max"], "seed": 2}}
    out = tmp_path / "s"
    assert seedlab_main(*_sweep_cmd(_write(tmp_path, cfg), out)[3:])[0] == 0
    rc, _, err = seedlab_main("shortcut", "analyze", str(out), "--n", "16")
    assert rc == 0, err
    c = pd.read_parquet(out / "circuits.parquet")
    s = pd.read_parquet(out / "summary.parquet")
    assert set(c.member) == set(s.member) and set(c.epoch) == {0, 4}
    assert set(c.merge(s, on=["member", "job"]).layers) == {1, 2}
    # the report picks the circuits up: fingerprint evolution and ablation heatmaps
    from seedlab.shortcut.report import write_report

    text = write_report(out).read_text()
    for png in ("fingerprints.png", "ablation.png"):
        assert f"({png})" in text and (out / png).stat().st_size > 1000


def test_ray_tasks_ask_for_a_gpu_share_when_training_on_cuda(tmp_path, monkeypatch):
    """train.device cuda: each Ray task asks for gpus_per_job GPUs (a fraction shares one); on CPU, none."""
    pytest.importorskip("ray")
    from seedlab import executors
    from seedlab.shortcut.sweep import run_sweep

    asked = []
    monkeypatch.setattr(executors, "run_ray", lambda fn, specs, on_done, **kw: asked.append(kw["gpus_per_job"]))
    cuda = parse(SweepConfig, SMALL | {"train": SMALL["train"] | {"device": "cuda"}, "gpus_per_job": 0.25})
    run_sweep(cuda, tmp_path / "gpu", executor="ray", progress=False)
    run_sweep(parse(SweepConfig, SMALL | {"gpus_per_job": 0.25}), tmp_path / "cpu", executor="ray", progress=False)
    assert asked == [0.25, 0.0]
    with pytest.raises(Exception, match="gpus_per_job"):
        parse(SweepConfig, SMALL | {"gpus_per_job": 2})


def test_the_chunk_follows_the_device():
    from seedlab.shortcut.config import CHUNK_CPU, CHUNK_CUDA, TrainConfig

    assert TrainConfig().chunk_rows() == CHUNK_CPU == 8192
    assert TrainConfig(device="cuda:1").chunk_rows() == CHUNK_CUDA
    assert TrainConfig(chunk=512, device="cuda").chunk_rows() == 512 and TrainConfig(chunk=None).chunk_rows() is None


def test_a_preregistration_is_kept_before_the_first_member_and_quoted_by_the_report(tmp_path, seedlab_main):
    """--preregistration: a missing file writes nothing; the text and its SHA-256 are kept before training and
    quoted by the report; it cannot change on resume, nor be added to a sweep that already has members."""
    from seedlab.store import file_sha256

    cfg = SMALL | {"grid": SMALL["grid"] | {"task": ["sum2-max"], "ratio": [0.9], "layers": [1], "seed": 2}}
    path, out = _write(tmp_path, cfg), tmp_path / "confirm"
    pre = tmp_path / "pre.md"
    pre.write_text("# Hypotheses\n\nP1: the rate rises.\n")
    rc, _, err = seedlab_main("shortcut", "sweep", str(path), "--out", str(out), "--no-progress", "--preregistration", str(tmp_path / "nope.md"))
    assert rc == 2 and "--preregistration: no such file" in err and not out.exists()
    rc, _, err = seedlab_main("shortcut", "sweep", str(path), "--out", str(out), "--no-progress", "--preregistration", str(pre))
    assert rc == 0, err
    sweep = SweepDir(out)
    assert sweep.preregistration_path.read_text() == pre.read_text()
    assert yaml.safe_load(sweep.preregistration_record.read_text())["sha256"] == file_sha256(pre)
    assert seedlab_main("shortcut", "report", str(out))[0] == 0
    text = (out / "report.md").read_text()
    assert "## Pre-registration: a confirmatory sweep" in text and "> P1: the rate rises." in text and "unchanged since" in text
    other = tmp_path / "other.md"
    other.write_text("P1: the rate falls.\n")
    rc, _, err = seedlab_main("shortcut", "sweep", str(path), "--out", str(out), "--no-progress", "--preregistration", str(other))
    assert rc == 2 and "was pre-registered with another text" in err
    assert sweep.preregistration_path.read_text() == pre.read_text()
    plain = tmp_path / "plain"  # members first, pre-registration after: refused
    assert seedlab_main("shortcut", "sweep", str(path), "--out", str(plain), "--no-progress")[0] == 0
    rc, _, err = seedlab_main("shortcut", "sweep", str(path), "--out", str(plain), "--no-progress", "--preregistration", str(pre))
    assert rc == 2 and "must come before the first one" in err and not SweepDir(plain).preregistration_record.exists()


def test_a_field_added_later_renames_no_job_at_its_old_value():
    from seedlab.shortcut.config import LATER_FIELDS, REPORT_ONLY
    from seedlab.store import content_hash

    fp32 = plan(parse(SweepConfig, SMALL))
    for job in fp32:  # the key is the hash of the config as it was before the fields existed
        train = {k: v for k, v in job.config["train"].items() if ("train", k) not in LATER_FIELDS}
        train["gradients"] = {k: v for k, v in train["gradients"].items() if ("train", "gradients", k) not in REPORT_ONLY}
        assert job.key == content_hash({**job.config, "train": train})
    # a report-only field never renames a job, at any value
    threshold = SMALL | {"train": SMALL["train"] | {"gradients": {"saturated_loss": 0.01}}}
    assert [j.key for j in plan(parse(SweepConfig, threshold))] == [j.key for j in fp32]
    bf16 = plan(parse(SweepConfig, SMALL | {"train": SMALL["train"] | {"precision": "bf16"}}))
    assert not {j.key for j in bf16} & {j.key for j in fp32}  # another value: other jobs
