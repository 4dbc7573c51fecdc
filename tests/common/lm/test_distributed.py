"""seedlab.lm.distributed, through the twins runner under torchrun: 2 gloo processes on the CPU split every batch."""

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from helpers import tiny_twins

# several processes of their own (gloo ranks): run in make test's serial phase, not beside another worker
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def design(tmp_path_factory, twins_inputs):
    base = tmp_path_factory.mktemp("ddp")
    corpus, files = twins_inputs
    cfg = tiny_twins(corpus, files, steps=16, injection_step=6,
                     injection_row=3,  # row 3 of 4: in rank 1's half
                     conditions=["twin", "fluent-fabricated", "fluent-attested"])
    path = base / "ddp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return base, path


def _run(path, out, *launcher):
    cmd = [*launcher, "-m", "seedlab", "twins", "run", str(path), "--out", str(out), "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")


def _manifest(out, cond):
    return json.loads((out / "seed-3" / cond / "manifest.json").read_text())


def test_two_gloo_ranks_identical_twins_and_reproducible(design, tmp_path):
    base, path = design
    _run(path, tmp_path / "a", *TORCHRUN)
    _run(path, tmp_path / "b", *TORCHRUN)
    record = json.loads((tmp_path / "a" / "config.json").read_text())
    assert record["world_size"] == 2 and record["injection_rank"] == 1
    twin = _manifest(tmp_path / "a", "twin")
    for cond in ("twin", "fluent-fabricated", "fluent-attested"):
        m = _manifest(tmp_path / "a", cond)
        assert m["6"] == twin["6"]  # identical before the injection (every tensor's SHA-256)
        if cond != "twin":
            assert m["16"] != twin["16"]  # and the injected row, on rank 1, changed the run
        assert m == _manifest(tmp_path / "b", cond)  # two identical runs: identical weights at every step

    # the split is the whole batch's update: the same losses as one process, to float rounding
    _run(path, tmp_path / "solo", sys.executable)
    for cond in ("twin", "fluent-attested"):
        dist = pd.read_parquet(tmp_path / "a" / "seed-3" / cond / "losses.parquet")
        solo = pd.read_parquet(tmp_path / "solo" / "seed-3" / cond / "losses.parquet")
        assert (dist.loss - solo.loss).abs().max() < 1e-5


def test_kill9_under_torchrun_then_resume_is_bitwise(design, tmp_path):
    """Kill every rank mid-fork (SIGKILL to the process group), start again: the same weights at every step."""
    import os
    import signal
    import time

    base, path = design
    cfg = yaml.safe_load(path.read_text()) | {"steps": 80, "checkpoint_every": 5, "conditions": ["twin", "fluent-fabricated"]}
    long = base / "ddp-long.yaml"
    long.write_text(yaml.safe_dump(cfg))
    _run(long, tmp_path / "ref", *TORCHRUN)
    out = tmp_path / "killed"
    cmd = [*TORCHRUN, "-m", "seedlab", "twins", "run", str(long), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = out / "seed-3" / "fluent-fabricated" / "step-20.safetensors"
    deadline = time.time() + 120
    while not target.exists() and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "seed-3" / "fluent-fabricated" / "done.json").exists()  # it really was interrupted
    _run(long, out, *TORCHRUN)
    for cond in ("twin", "fluent-fabricated"):
        assert _manifest(out, cond) == _manifest(tmp_path / "ref", cond), cond
        a = pd.read_parquet(out / "seed-3" / cond / "losses.parquet")
        pd.testing.assert_frame_equal(a, pd.read_parquet(tmp_path / "ref" / "seed-3" / cond / "losses.parquet"))
