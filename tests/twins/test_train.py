"""Twins runs: bitwise identical before the injection step, different after, reproducible; resumed
after kill -9 to the same weights; inputs checked before anything is written."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from seedlab.config import parse
from seedlab.errors import SeedlabError
from seedlab.lm.distributed import World
from seedlab.twins.config import TwinsConfig
from seedlab.twins.train import run_twins

from helpers import tiny_twins


@pytest.fixture(scope="module")
def setup(tmp_path_factory, twins_inputs):
    base = tmp_path_factory.mktemp("twins")
    corpus, files = twins_inputs
    cfg = tiny_twins(corpus, files)
    return base, cfg


def _manifest(out, seed, cond):
    return json.loads((out / f"seed-{seed}" / cond / "manifest.json").read_text())


def test_identical_before_injection_and_different_after(setup, tmp_path):
    base, cfg = setup
    losses = run_twins(parse(TwinsConfig, cfg), tmp_path, base=base, progress=False)
    twin = _manifest(tmp_path, 3, "twin")
    for cond in ("fluent-fabricated", "fluent-attested", "random-chars", "ordinary-row.0", "ordinary-row.3", "nudge",
                 "matched-gradient", "weight-kick"):
        m = _manifest(tmp_path, 3, cond)
        assert m["8"] == twin["8"]  # every tensor's SHA-256 equal at the injection step
        assert m["12"] != twin["12"] and m["24"] != twin["24"]  # the injected row changed the run
        assert (tmp_path / "seed-3" / cond / "step-8.safetensors").is_file()
    l = losses.pivot_table(index="step", columns="condition", values="loss")
    assert len(l) == 24
    assert (l.loc[:7].nunique(axis=1) == 1).all()  # the same prefix losses
    assert l.loc[8, "fluent-fabricated"] != l.loc[8, "twin"]  # the injected batch differs
    assert list(pd.read_parquet(tmp_path / "seed-3" / "twin" / "losses.parquet").columns) == ["step", "loss"]


def test_the_null_arms_are_what_they_say(setup, tmp_path):
    """ordinary-row: K arms, each a different held-out stretch of the reserved slice as long as the fabricated
    passage, in the injected row only; nudge: one element one ulp up at s (bitwise the twin at s, different after);
    matched-gradient: the raw gradient of s gains a random direction as long as the fabricated passage's own
    batch-gradient difference at θ_s (the twin's weights at s, different after); weight-kick: the same direction
    in the weights at s, as long as the fabricated passage's update difference from this θ_s."""
    from seedlab.corpus import load
    from seedlab.forks.prefix import SharedPrefix
    from seedlab.lm.batches import get_batch
    from seedlab.lm.gradients import gradient_delta
    from seedlab.lm.trainer import Trainer
    from seedlab.twins.heldout import ordinary_ranges
    from seedlab.twins.train import conditions, load_inputs

    base, raw = setup
    cfg = parse(TwinsConfig, raw | {"steps": 12, "keep": ["prefix"], "nulls": {"ordinary_rows": 3},
                                    "conditions": ["twin", "fluent-fabricated", "ordinary-row", "nudge", "matched-gradient",
                                                   "sign-gradient", "weight-kick"]})
    run_twins(cfg, tmp_path, base=base, progress=False)
    corpus, gcfg, passages, _ = load_inputs(cfg, base, World())
    held, n = load(cfg.corpus).heldout, len(passages["fluent-fabricated"])
    ranges = ordinary_ranges(len(held), gcfg.block_size, n, 3, cfg.nulls.ordinary_row_seed)
    names = ["ordinary-row.0", "ordinary-row.1", "ordinary-row.2"]
    assert [passages[k] for k in names] == [held[r.start:r.stop].tolist() for r in ranges]  # held-out text, K stretches
    assert len({tuple(passages[k]) for k in names}) == 3 and len({r.start for r in ranges}) == 3  # each a different one
    arms = {a.name: a for a in conditions(cfg, passages, corpus.eot_id)}
    assert list(arms) == ["twin", "fluent-fabricated", *names, "nudge", "matched-gradient", "sign-gradient", "weight-kick"]
    for k in names:
        assert arms[k].injections == {(8, 0): passages[k]}  # the injected row, at s, only
    twin, integrity = _manifest(tmp_path, 3, "twin"), json.loads((tmp_path / "integrity.json").read_text())
    done = integrity["seeds"]["3"]["perturbations"]
    for null in ("nudge", "matched-gradient", "sign-gradient", "weight-kick"):
        m = _manifest(tmp_path, 3, null)
        assert m["8"] == twin["8"] and m["10"] != twin["10"]  # the twin at s (before the update), different after
        assert done[null] == json.loads((tmp_path / "seed-3" / null / "perturbation.json").read_text())
    prefix, _ = SharedPrefix(tmp_path / "seed-3" / "prefix.safetensors", lambda: Trainer(cfg, gcfg, 3, corpus.train), 8).kept()
    w = prefix.weights()["blocks.0.ln_1.weight"].reshape(-1)[0]
    ulp = float(torch.nextafter(w, torch.tensor(float("inf"))) - w)
    assert done["nudge"]["moved"] == done["nudge"]["norm"] == ulp > 0
    a, b = prefix.fork(), prefix.fork()  # Trainer.fork: copies at s
    a.advance({0: passages["fluent-fabricated"]}, pad_id=corpus.eot_id)
    b.advance()
    pairs = zip(a.model.parameters(), b.model.parameters())
    size = float(torch.sqrt(sum(((x.detach() - y.detach()).double() ** 2).sum() for x, y in pairs)))
    assert done["weight-kick"]["norm"] == pytest.approx(size, rel=1e-6)  # the fabricated update difference's norm
    assert done["weight-kick"]["moved"] == pytest.approx(size, rel=1e-4)  # what the float32 weights actually moved
    # matched-gradient: the fabricated passage's batch-gradient difference at θ_s, computed another way (one row's
    # gradients, lm/gradients.py), is the recorded norm, and the delta added has it
    x, y = get_batch(corpus.train, 3, 8, cfg.batch_size, gcfg.block_size)
    fab = gradient_delta(prefix.model, x, y, 0, passages["fluent-fabricated"], corpus.eot_id)
    g = done["matched-gradient"]
    assert g["channel"] == "gradient" and g["like"] == "fluent-fabricated" and g["step"] == 8
    assert g["like_norm"] == pytest.approx(fab.norm, rel=1e-4) and g["norm"] == pytest.approx(g["like_norm"], rel=1e-6)
    assert "moved" not in g  # the weights did not move at s: the update did
    sg = done["sign-gradient"]  # the same passage's gradient difference, its signs redrawn: the same norm, another direction
    assert sg["channel"] == "gradient" and sg["like_norm"] == pytest.approx(fab.norm, rel=1e-4)
    assert sg["norm"] == pytest.approx(sg["like_norm"], rel=1e-5) and abs(sg["cosine"]) < 0.2


def test_one_ordinary_row_and_too_many(setup, tmp_path):
    """nulls.ordinary_rows: 1 is one arm, ordinary-row.0 (a single row, not a distribution); more rows than the
    reserved slice holds are refused in one line, before anything is written."""
    from seedlab.twins.heldout import RESERVED_ROWS
    from seedlab.twins.train import conditions, load_inputs

    base, raw = setup
    one = parse(TwinsConfig, raw | {"nulls": {"ordinary_rows": 1}, "conditions": ["twin", "fluent-fabricated", "ordinary-row"]})
    assert one.arm_names == ["twin", "fluent-fabricated", "ordinary-row.0"]
    corpus, _, passages, _ = load_inputs(one, base, World())
    assert [a.name for a in conditions(one, passages, corpus.eot_id)] == one.arm_names
    n = len(passages["fluent-fabricated"])
    slots = RESERVED_ROWS * (128 + 1) // n
    many = parse(TwinsConfig, raw | {"nulls": {"ordinary_rows": slots + 1}})
    with pytest.raises(SeedlabError, match=rf"^nulls.ordinary_rows: {slots + 1} ordinary rows of {n} tokens do not fit the "
                                           rf"held-out split's reserved slice \({RESERVED_ROWS * 129} tokens: at most {slots};"):
        run_twins(many, tmp_path / "o", base=base, progress=False)
    assert not (tmp_path / "o").exists()


def test_independent_audit_reproduces_the_forked_runs_bitwise(setup, tmp_path):
    base, cfg = setup
    run_twins(parse(TwinsConfig, cfg), tmp_path / "fork", base=base, progress=False)
    run_twins(parse(TwinsConfig, cfg), tmp_path / "indep", base=base, independent=True, progress=False)
    for cond in ("twin", "fluent-attested"):
        assert _manifest(tmp_path / "fork", 3, cond) == _manifest(tmp_path / "indep", 3, cond)


@pytest.mark.parametrize(
    "over,msg",
    [
        ({"injection_step": 24}, "error: injection_step: must be inside the run"),
        ({"conditions": ["twin", "fluent-fake"]}, "error: conditions: must be among"),
        ({"conditions": ["twin", "fluent-fabricated", "matched-noise"]},
         "error: conditions: 'matched-noise' is no longer a condition (the noise null was split by channel): name "
         "'matched-gradient'"),
        ({"block_size": 32}, "error: passages.fluent-fabricated: 86 tokens do not fit a row of block_size+1 = 33"),
    ],
)
def test_bad_input(setup, tmp_path, seedlab_main, over, msg):
    base, cfg = setup
    path = base / f"bad-{len(over)}-{list(over)[0]}.yaml"
    path.write_text(yaml.safe_dump(cfg | over))
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(tmp_path / "out"), "--no-progress")
    assert rc == 2 and err.startswith(msg), err
    assert not (tmp_path / "out").exists()


def test_kill9_then_resume_gives_bitwise_identical_weights(setup, tmp_path, seedlab_main):
    """A run killed mid-way and started again ends with the same weights as an uninterrupted one.
    The killed run is a real process; the reference and the resume run in this one (seedlab_main), all three on
    one thread (the thread count is part of the environment a resume must match)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    base, cfg = setup
    path = base / "resume.yaml"
    path.write_text(yaml.safe_dump(cfg | {"steps": 40, "injection_step": 10, "checkpoint_every": 5, "threads": 1}))
    cmd = lambda out: [sys.executable, "-m", "seedlab", "twins", "run", str(path), "--out", str(out), "--no-progress"]
    rc, _, err = seedlab_main(*cmd(tmp_path / "ref")[3:])
    assert rc == 0, err
    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd(out), start_new_session=True)
    target = out / "seed-3" / "fluent-attested" / "state.safetensors"  # the second fork, mid-way
    deadline = time.time() + 120
    while not target.exists() and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "seed-3" / "random-chars" / "done.json").exists()  # it really was interrupted
    rc, _, err = seedlab_main(*cmd(out)[3:])
    assert rc == 0, err
    for cond in ("twin", "fluent-fabricated", "fluent-attested", "random-chars"):
        assert _manifest(out, 3, cond) == _manifest(tmp_path / "ref", 3, cond), cond  # every step, every tensor
        a = pd.read_parquet(out / "seed-3" / cond / "losses.parquet")
        b = pd.read_parquet(tmp_path / "ref" / "seed-3" / cond / "losses.parquet")
        pd.testing.assert_frame_equal(a, b)


def test_a_corrupted_checkpoint_is_refused(setup, tmp_path, seedlab_main):
    """Resuming reads the kept prefix state; one flipped byte there is an exit-2 error, not a silent run."""
    import shutil

    base, cfg = setup
    path = base / "corrupt.yaml"
    path.write_text(yaml.safe_dump(cfg | {"steps": 10, "injection_step": 4, "conditions": ["twin", "fluent-attested"]}))
    out = tmp_path / "o"
    assert seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress")[0] == 0
    shutil.rmtree(out / "seed-3" / "fluent-attested")  # as if interrupted before this fork started
    prefix = out / "seed-3" / "prefix.safetensors"
    data = bytearray(prefix.read_bytes())
    data[-3] ^= 0x01  # inside the last tensor
    prefix.write_bytes(bytes(data))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock"}  # the lock holds its holder's pid
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress")
    assert rc == 2 and "prefix.safetensors: tensor" in err and "corrupted checkpoint" in err, err
    assert len(err.strip().splitlines()) == 1
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p in before} == before  # nothing overwritten
    assert not (out / "seed-3" / "fluent-attested").exists()


def _noisy_forward(monkeypatch):
    """A deliberately non-deterministic operation: every forward adds noise from torch's global
    generator, whose state differs between any two runs of the same steps."""
    from seedlab.lm.model import GPT

    forward = GPT.forward

    def noisy(self, idx, *args, **kwargs):
        logits, loss = forward(self, idx, *args, **kwargs)
        return logits + 1e-3 * torch.rand_like(logits), loss

    monkeypatch.setattr(GPT, "forward", noisy)


def test_the_replica_control_is_recorded(setup, tmp_path):
    base, cfg = setup
    run_twins(parse(TwinsConfig, cfg | {"steps": 12, "conditions": ["twin", "fluent-attested"]}), tmp_path, base=base, progress=False)
    rec = json.loads((tmp_path / "integrity.json").read_text())
    assert rec["mode"] == "fork"
    seed = rec["seeds"]["3"]
    assert seed["identical_at_injection"].startswith("by construction")
    assert seed["replica"].pop("position") == "2 of a stack of 3"  # the twin's stack: twin, fluent-attested, replica
    assert seed["replica"] == {"bitwise_equal_to_twin": True, "steps_compared": [8, 10, 12]}  # s, the mid-point, the end
    assert seed["stack"] == {"arm_batch": 3, "solo_check": {"step": 10, "bitwise_equal_to_solo": True}, "group_runs": 3,
                             "head_runs": 1, "layer_norm": "per run",
                             "guarantee": "the same kernels and shapes at every position (groups padded to one size)"}
    assert not list((tmp_path / "seed-3" / "replica").glob("*.safetensors"))  # hashes only
    assert (tmp_path / "seed-3" / "prefix.safetensors").is_file()  # keep: [prefix], the default


@pytest.mark.parametrize("arm_batch", [1, None])
def test_the_replica_control_catches_a_non_deterministic_operation(setup, tmp_path, monkeypatch, arm_batch):
    """Noise in every forward pass, in the serial loop (the GPT's) and in a stack (lm/stack.py's trunk)."""
    from seedlab.lm.stack import Stack

    base, cfg = setup
    _noisy_forward(monkeypatch)
    trunk = Stack.trunk
    monkeypatch.setattr(Stack, "trunk", lambda self, *a, **k: (h := trunk(self, *a, **k)) + 1e-3 * torch.rand_like(h))
    design = parse(TwinsConfig, cfg | {"steps": 12, "conditions": ["twin", "fluent-attested"], "arm_batch": arm_batch})
    with pytest.raises(SeedlabError, match=r"^seed 3: the replica control( \(position 2 of a stack of 3\))? differs from "
                                           r"the twin at step 10 in tensor") as err:
        run_twins(design, tmp_path, base=base, progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "integrity.json").exists()


def test_independent_stops_at_the_injection_step_on_a_mismatch(setup, tmp_path, monkeypatch):
    """--independent compares each condition's hashes at s as soon as it gets there: the second
    condition's different prefix stops the run before any condition trains past s."""
    base, cfg = setup
    _noisy_forward(monkeypatch)
    with pytest.raises(SeedlabError, match=r"^seed 3: fluent-fabricated differs from twin at step 8 in tensor"):
        run_twins(parse(TwinsConfig, cfg), tmp_path, base=base, independent=True, progress=False)
    for cond in ("twin", "fluent-fabricated"):
        assert list(_manifest(tmp_path, 3, cond)) == ["8"]  # its checkpoint at s, nothing after
    assert not (tmp_path / "seed-3" / "fluent-attested").exists()


def test_cuda_settings_are_hard_errors(monkeypatch, setup, tmp_path):
    """On CUDA: deterministic algorithms required (not warned about) and cuBLAS's workspace pinned;
    an operation without a deterministic kernel is a one-line error naming it."""
    from seedlab.lm.determinism import settle
    from seedlab.lm.trainer import Trainer

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        settle(torch.device("cpu"))
        assert torch.are_deterministic_algorithms_enabled() == before[0]  # CPU: nothing changes
        settle(torch.device("cuda"))
        assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:  # the process's settings as they were (later tests record them in environment.json)
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn

    def raises(self, *a, **k):  # what PyTorch raises for such an operation under warn_only=False
        raise RuntimeError("index_add_cuda_ does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this operation...")

    monkeypatch.setattr(Trainer, "advance", raises)
    base, cfg = setup
    with pytest.raises(SeedlabError, match=r"^non-deterministic operation: index_add_cuda_ does not have a deterministic") as err:
        run_twins(parse(TwinsConfig, cfg | {"steps": 12}), tmp_path, base=base, progress=False)
    assert "\n" not in str(err.value)


def test_resume_refuses_edited_inputs(setup, tmp_path, seedlab_main):
    """A folder is resumed only with the passages and corpus it was started with; inputs.json is never rewritten."""
    import shutil

    base, cfg = setup
    passages = {c: base / f"copy-{Path(f).name}" for c, f in cfg["passages"].items()}
    for c, f in cfg["passages"].items():
        shutil.copy(f, passages[c])
    path = base / "edit.yaml"
    path.write_text(yaml.safe_dump(cfg | {"steps": 10, "injection_step": 4, "passages": {c: str(p) for c, p in passages.items()}}))
    out = tmp_path / "o"
    assert seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress")[0] == 0
    shutil.rmtree(out / "seed-3" / "random-chars")  # as if interrupted
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock"}  # the lock holds its holder's pid
    passages["fluent-attested"].write_text(passages["fluent-attested"].read_text().replace("care", "caution"))
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress")
    assert rc == 2 and err.startswith("error: passages.fluent-attested: the passage was edited since"), err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock"} == before  # nothing written


def test_the_disk_plan_is_what_the_run_writes(setup, tmp_path):
    """The estimate printed before training bounds what a finished design holds (weight checkpoints
    and kept complete states; small JSON/parquet aside), for each `keep`."""
    from seedlab.corpus import load
    from seedlab.twins.rundir import RunDir

    base, cfg = setup
    for keep in ([], ["prefix", "final"]):
        design = parse(TwinsConfig, cfg | {"steps": 12, "conditions": ["twin", "fluent-attested"], "keep": keep})
        out = tmp_path / "-".join(keep or ["none"])
        run_twins(design, out, base=base, progress=False)
        plan = RunDir(out).disk_plan(design, design.gpt_config(load(cfg["corpus"]).vocab_size), independent=False)
        big = sum(p.stat().st_size for p in out.rglob("*.safetensors"))
        assert abs(big - plan["kept"]) <= 0.02 * plan["kept"]  # the safetensors headers: a few kB
        assert plan["total"] > plan["kept"]  # the resume state (and an unkept prefix) for a while
        assert (out / "seed-3" / "prefix.safetensors").is_file() == ("prefix" in keep)
        assert (out / "seed-3" / "twin" / "final.safetensors").is_file() == ("final" in keep)


def test_a_design_the_disk_cannot_hold_is_refused(setup, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    base, cfg = setup
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 5000, 5000))
    with pytest.raises(SeedlabError, match=r"^disk: this design needs .* MB more in .*, only 5.0 kB free there"):
        run_twins(parse(TwinsConfig, cfg), tmp_path / "o", base=base, progress=False)
    assert not (tmp_path / "o").exists()
