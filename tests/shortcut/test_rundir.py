"""Run, sweep and data folders: where each file lives, the overwrite policy, checkpoint manifests."""

import json
import os

import pytest
import torch
from safetensors import safe_open

from seedlab.errors import SeedlabError
from seedlab.shortcut.rundir import RunDir, SweepDir, data_files, open_folder, refuse_overwrite
from seedlab.store import tensor_hashes


def test_run_folder_layout(tiny_run):
    root = tiny_run([0, 4])
    run = RunDir(root)
    for path in (run.config_path, run.summary_path, run.curves_path, run.meta_path, run.manifest_path):
        assert path.is_file(), path
    assert run.checkpoint(4) == root / "checkpoints" / "epoch-000004.safetensors"
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == [
        "epoch-000000.safetensors", "epoch-000004.safetensors", "manifest.json"]
    assert run.figure("curves.png") == root / "curves.png" and run.report_path == root / "report.md"
    assert run.circuits_path == root / "circuits.parquet" and run.gradients_path == root / "gradients.parquet"
    assert run.gradients_heads_path == root / "gradients_heads.parquet"
    assert isinstance(open_folder(root), RunDir)


def test_manifest_records_every_tensor_of_every_checkpoint(tiny_run):
    run = RunDir(tiny_run([0, 4]))
    manifest = json.loads(run.manifest_path.read_text())
    assert sorted(manifest) == ["0", "4"] and run.checkpoint_epochs() == [0, 4]
    with safe_open(run.checkpoint(4), "pt") as f:
        on_disk = {k: f.get_tensor(k) for k in f.keys()}
        assert f.metadata()["epoch"] == "4"
    assert manifest["4"] == tensor_hashes(on_disk)
    state, meta = run.load_checkpoint(4)
    assert set(state) == set(on_disk) and all(torch.equal(state[k], on_disk[k]) for k in state)
    assert json.loads(meta["members"])[1]["seed"] == 1
    with pytest.raises(SeedlabError, match="no checkpoint at epoch 2"):
        run.load_checkpoint(2)


def test_corrupted_checkpoint_is_a_one_line_error(tiny_run, seedlab_main):
    root = tiny_run([0, 4])
    run = RunDir(root)
    path = run.checkpoint(4)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor's data
    path.write_bytes(bytes(data))
    with pytest.raises(SeedlabError, match=r"does not match its recorded SHA-256 \(corrupted checkpoint\)"):
        run.load_checkpoint(4)
    rc, _, err = seedlab_main("shortcut", "analyze", str(root), "--n", "8")
    assert rc == 2, err
    assert err.startswith("error: ") and "corrupted checkpoint" in err and len(err.strip().splitlines()) == 1
    assert not run.circuits_path.exists()


def test_checkpoints_without_a_manifest_are_refused(tiny_run):
    run = RunDir(tiny_run([0]))
    os.remove(run.manifest_path)
    with pytest.raises(SeedlabError, match="without a manifest.json"):
        run.checkpoint_epochs()


def test_a_new_run_forgets_the_manifest_of_an_earlier_one(tiny_run):
    run = RunDir(tiny_run([0, 4]))
    tiny_run([4])  # trained again into the same folder, with other checkpoint epochs
    assert run.checkpoint_epochs() == [4]  # the stale epoch-0 file is not part of this run


def test_overwrite_policy(tmp_path):
    run = RunDir(tmp_path)
    run.refuse_overwrite(force=False)  # nothing there yet
    run.summary_path.write_text("")
    with pytest.raises(SeedlabError) as e:
        run.refuse_overwrite(force=False)
    assert str(e.value) == f"--out: {tmp_path / 'summary.parquet'} already exists (use --force to overwrite)"
    run.refuse_overwrite(force=True)
    files = data_files(tmp_path / "d")
    assert list(files) == ["train", "val", "adv"] and files["val"] == tmp_path / "d" / "val.npz"
    files["adv"].parent.mkdir()
    files["adv"].write_text("")
    with pytest.raises(SeedlabError, match="adv.npz already exists"):
        refuse_overwrite(list(files.values()), force=False)


def test_sweep_folder_layout(tmp_path):
    sweep = SweepDir(tmp_path)
    assert sweep.config_path == tmp_path / "sweep.yaml"
    job = sweep.job("abc123")
    assert isinstance(job, RunDir) and job.root == tmp_path / "jobs" / "abc123"
    assert not job.is_done()
    job.root.mkdir(parents=True)
    job.mark_done({"members": 2})
    assert job.is_done() and json.loads((job.root / "done.json").read_text()) == {"members": 2}
    assert sweep.table("curves") == sweep.curves_path == tmp_path / "curves.parquet"
    assert isinstance(open_folder(tmp_path), RunDir)  # no sweep.yaml yet
    sweep.config_path.write_text("{}")
    assert isinstance(open_folder(tmp_path), SweepDir)
    busy = f"in use by another sweep \\(pid {os.getpid()}\\)"
    with sweep.lock(), pytest.raises(SeedlabError, match=busy), SweepDir(tmp_path).lock():
        pass
    job.clear()
    assert not job.root.exists()
