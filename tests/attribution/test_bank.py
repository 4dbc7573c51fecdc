"""The counterfactual bank and the attribute stage: layout and hashes, the own-row control (measured
and estimated exactly 0), plain SGD's first step against the one-step estimate, the replica control
catching a non-deterministic op, resume after an interruption, the replicate arms and seeds in
parallel processes (bitwise the sequential bank), bad input (one line, nothing written)."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from seedlab.attribution.estimators.attribute import COLUMNS, DEFAULT, attribute
from seedlab.attribution.estimators.registry import available
from seedlab.attribution.bank.run import run_bank
from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.rundir import BankDir
from seedlab.config import load_config, parse
from seedlab.errors import SeedlabError
from seedlab.lm.model import GPT
from seedlab.lm.stack import Stack
from seedlab.lm.trainer import Trainer
from seedlab.store import LOCK

pytestmark = pytest.mark.usefixtures("one_thread")


def _files(folder):
    """Every file and its mtime, but the lock file (it holds the pid of the last command that locked it)."""
    return sorted((p.relative_to(folder).as_posix(), p.stat().st_mtime_ns) for p in folder.rglob("*")
                  if p.is_file() and p.name != LOCK)


# --------------------------------------------------------------------------- what a bank holds


def test_layout_hashes_and_measured(tiny_bank):
    rd = BankDir(tiny_bank / "bank")
    cfg = parse(AttributionConfig, rd.read_config())
    s, horizons = cfg.injection_step, list(cfg.horizon_steps())
    assert horizons == [5, 7, 9, 14]  # s+1, s+3, mid = (4 + 14) // 2, end
    inputs = rd.read_inputs()
    names = [t["name"] for t in inputs["candidates"]]
    assert names == ["passage-0", "passage-1", "passage-2", "heldout-0", "heldout-1", "heldout-2"]
    assert [t["name"] for t in inputs["queries"]] == ["query-0", "query-1", "probe-gizmo"]
    assert [len(q["tokens"]) for q in inputs["queries"]][:2] == [33, 33]
    for seed in cfg.seeds:
        twin = rd.twin(seed)
        assert sorted(map(int, twin.read_manifest())) == cfg.twin_steps() == [s, *horizons]
        assert set(twin.weights(horizons[-1])) == set(GPT(cfg.gpt_config(257)).state_dict())  # hash-checked read
        for name in [*names, "own-row"]:
            where = rd.candidate(seed, name)
            assert where.finished and sorted(map(int, where.read_manifest())) == [s, *horizons]
            assert not list(where.path.glob("*.safetensors"))  # no candidate weights are stored
            # forked from one prefix: every run is bitwise the twin at s
            assert where.read_manifest()[str(s)] == twin.read_manifest()[str(s)]
    integrity = json.loads(rd.integrity.read_text())["seeds"]
    replica = integrity["0"]["replica"]  # trained inside the twin's stack (forks/stacked.py), at its far end
    assert replica.pop("position").endswith(f"of a stack of {integrity['0']['stack']['arm_batch']}")
    assert replica == {"bitwise_equal_to_twin": True, "steps_compared": [s, *horizons]}
    assert "replica" not in integrity["1"] and integrity["1"]["own_row"]["bitwise_equal_to_twin"]

    m = pd.read_parquet(rd.measured)
    assert len(m) == 2 * 7 * 4 * 4  # seeds x candidates (own row included) x (self + 2 rows + 1 probe) x horizons
    assert set(m.query_kind) == {"self", "heldout", "probe"} and set(m.label) == {"s+1", "s+3", "mid", "end"}
    assert np.array_equal(m.measured, m.loss - m.twin_loss)
    learned = m[(m["query"] == "self") & (m.label == "s+1") & (m.candidate_kind != "control")]
    assert (learned.measured < 0).all()  # one update on a text lowers its own loss


def test_the_own_row_control_is_exactly_zero_measured_and_estimated(tiny_bank):
    df = pd.read_parquet(BankDir(tiny_bank / "bank").attribution)
    assert list(df.columns) == COLUMNS
    own = df[df.candidate == "own-row"]
    assert set(own.estimator) == set(DEFAULT) & set(available())  # baselines included: −(score(c) − score(r)) = 0
    assert set(own.label) == {"s+1", "s+3", "mid", "end"} and set(own.seed) == {0, 1}
    assert (own.measured == 0).all() and (own.estimate == 0).all()
    others = df[(df.candidate != "own-row") & (df.query == "self") & (df.estimator != "length")]  # rows: T + 1 tokens
    assert (others.measured != 0).all() and (others.estimate != 0).all()


def test_plain_sgd_first_step_matches_the_one_step_estimate(tmp_path, design):
    # plain SGD (no momentum, decay or clipping) at a tiny rate: the measured Δ L_query at s + 1 is
    # −lr·⟨∇L_q, δ_c⟩ up to O(lr²) curvature and float32 round-off (observed 7.5e-4 of the largest effect)
    cfg, base = design(optimizer="sgd", peak_lr=1e-4, min_lr=0.0, weight_decay=0.0,
                        grad_clip=1e9, steps=8, horizons=[1], seeds=[0],
                        candidates={"file": "candidates.txt", "heldout": 2})
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    df = attribute(tmp_path / "bank", estimators=["sgd"], progress=False)
    assert len(df) == 5 * 4 and set(df.label) == {"s+1"}
    err = np.abs(df.estimate - df.measured).max() / np.abs(df.measured).max()
    assert err < 1e-2
    big = df[df.measured.abs() > 0.01 * df.measured.abs().max()]
    assert (np.sign(big.estimate) == np.sign(big.measured)).all()


@pytest.mark.parametrize("arm_batch", [1, None])
def test_the_replica_control_catches_a_non_deterministic_op(tmp_path, design, monkeypatch, arm_batch):
    """Noise in the forward pass (a non-deterministic kernel), in the serial loop (the GPT's forward) and in a
    stack (lm/stack.py's trunk): the replica control stops the bank at the first horizon."""
    if arm_batch == 1:
        forward = GPT.forward

        def noisy(self, *args, **kwargs):
            logits, loss = forward(self, *args, **kwargs)
            return logits + 1e-3 * torch.rand_like(logits), loss

        monkeypatch.setattr(GPT, "forward", noisy)
    else:
        trunk = Stack.trunk
        monkeypatch.setattr(Stack, "trunk", lambda self, *a, **k: (h := trunk(self, *a, **k)) + 1e-3 * torch.rand_like(h))
    cfg, base = design(seeds=[0], arm_batch=arm_batch)
    with pytest.raises(SeedlabError, match=r"seed 0: the replica control.* differs .* at step 5 in tensor"):
        run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    assert not BankDir(tmp_path / "bank").replica(0).finished


class Killed(Exception):
    pass


def test_resume_after_an_interruption_gives_identical_results(tmp_path, design, tiny_bank, monkeypatch):
    """The serial loop (arm_batch: 1), killed in the twin, resumes to the stacked reference bank's bits."""
    cfg, base = design(arm_batch=1)
    advance, calls = Trainer.advance, [0]

    def counted(self, *args, kill_at=None, **kwargs):
        calls[0] += 1
        if calls[0] == kill_at:
            raise Killed
        return advance(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "advance", lambda self, *a, **k: counted(self, *a, kill_at=4 + 7, **k))
    with pytest.raises(Killed):  # in seed 0's twin, after 7 of its 10 updates (its weights at s, s+1, s+3 saved)
        run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    rd = BankDir(tmp_path / "bank")
    assert rd.prefix(0).is_file() and rd.twin(0).checkpoint(7).is_file() and not rd.twin(0).finished
    calls[0] = 0
    monkeypatch.setattr(Trainer, "advance", lambda self, *a, **k: counted(self, *a, **k))
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    assert calls[0] == 11 * 10 + (4 + 10 * 10)  # twin, replica, 7 candidates, 2 nudges; seed 0's prefix read back
    # the clock: what the resume trained (the twin cut short and the prefix before it never finished a run)
    assert json.loads(rd.training.read_text())["run_updates"] == calls[0]
    ref = BankDir(tiny_bank / "bank")
    pd.testing.assert_frame_equal(pd.read_parquet(rd.measured), pd.read_parquet(ref.measured))
    for seed in (0, 1):
        assert rd.twin(seed).read_manifest() == ref.twin(seed).read_manifest()
        for name in ("passage-0", "heldout-2", "own-row"):
            assert rd.candidate(seed, name).read_manifest() == ref.candidate(seed, name).read_manifest()
    # a finished bank run again trains nothing
    calls[0] = 0
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    assert calls[0] == 0


def test_a_stacked_bank_killed_mid_stack_resumes_to_the_same_results(tmp_path, design, tiny_bank, monkeypatch):
    """Stacks of 4, killed in the second stack: the twin's stack is done, the candidates there start again from
    the prefix (the bank keeps no resumable state of theirs), and the bank is bitwise the reference."""
    cfg, base = design(arm_batch=4)
    advance, seen = Stack.advance, []

    def killed(self, rows, **kw):
        seen.append(self.step)
        if seen.count(7) == 2:  # the second stack, after 3 of its updates
            raise Killed
        return advance(self, rows, **kw)

    monkeypatch.setattr(Stack, "advance", killed)
    with pytest.raises(Killed):
        run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    rd = BankDir(tmp_path / "bank")
    assert rd.twin(0).finished and rd.replica(0).finished and not rd.candidate(0, "heldout-2").finished
    monkeypatch.setattr(Stack, "advance", advance)
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    ref = BankDir(tiny_bank / "bank")
    pd.testing.assert_frame_equal(pd.read_parquet(rd.measured), pd.read_parquet(ref.measured))
    assert _manifests(tmp_path / "bank") == _manifests(tiny_bank / "bank")


# --------------------------------------------------------------------------- replicates, seeds in parallel


def _shown(bank: BankDir) -> dict:
    """integrity.json less how the runs were stacked (forks/stacked.py: the stack sizes, the replica's position)."""
    record = json.loads(bank.integrity.read_text())
    for seed in record["seeds"].values():
        seed.pop("stack", None)
        seed.get("replica", {}).pop("position", None)
    return record


def _manifests(root):
    return {p.relative_to(root).as_posix(): json.loads(p.read_text()) for p in root.rglob("manifest.json")}


def test_replicates_and_parallel_seeds_are_bitwise_the_sequential_bank(tmp_path, design, tiny_bank):
    cfg, base = design(candidates={"file": "candidates.txt", "heldout": 1, "own_row": True, "replicate_row": 2})
    run_bank(cfg, tmp_path / "one", base=base, progress=False)
    run_bank(cfg, tmp_path / "two", base=base, progress=False, jobs=2)  # each seed in a process of its own
    one, two, ref = (BankDir(p) for p in (tmp_path / "one", tmp_path / "two", tiny_bank / "bank"))
    hashes = _manifests(one.root)
    assert len(hashes) == 2 * (1 + 5 + 5 + 2) + 1  # seeds x (twin, candidates, replicates, nudges) + seed 0's replica
    assert hashes == _manifests(two.root) and "seed-1/replicates/own-row/manifest.json" in hashes
    assert _shown(one) == _shown(two)  # how the runs were stacked differs (one stack of both seeds, or one per process)
    pd.testing.assert_frame_equal(pd.read_parquet(one.measured), pd.read_parquet(two.measured))
    # the clocks: the seeds apart timed the updates the seeds in turn did, each process in its seed's record, and
    # each process's own solo check (forks/stacked.py: the first twin it trains, again alone from s to that step)
    clocks = [json.loads(b.training.read_text()) for b in (one, two)]
    solo = [sum(seed["stack"]["solo_check"]["step"] - cfg.injection_step
                for seed in json.loads(b.integrity.read_text())["seeds"].values() if "solo_check" in seed["stack"])
            for b in (one, two)]
    assert clocks[0]["run_updates"] - solo[0] == clocks[1]["run_updates"] - solo[1] and clocks[1]["clocks"] == 2
    # the replicates change no other run: the twin and the candidates hash as in the bank without them
    without = _manifests(ref.root)
    assert {k: v for k, v in hashes.items() if "replicates/" not in k} == {k: without[k] for k in hashes if k in without}
    arm = json.loads(one.integrity.read_text())["seeds"]["0"]["arms"]["replicate.passage-0"]["injections"]
    assert [(i["step"], i["row"]) for i in arm] == [(cfg.injection_step, 2)]

    m = pd.read_parquet(one.measured)
    assert m.measured_replicate.notna().all() and pd.read_parquet(ref.measured).measured_replicate.isna().all()
    self_ = m[m["query"] == "self"]  # a replicate's self query is its candidate's own text
    assert (self_[(self_.label == "s+1") & (self_.candidate_kind != "control")].measured_replicate < 0).all()
    own = self_[self_.candidate == "own-row"]  # row 0's text in row 2: no longer the twin
    assert (own.measured == 0).all() and (own.measured_replicate != 0).all()


def test_a_failing_parallel_seed_is_one_line(seedlab_cli, tmp_path, design):
    cfg, base = design(candidates={"heldout": 1}, queries={"heldout": 1})
    run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    rd = BankDir(tmp_path / "bank")
    rd.prefix(1).write_bytes(b"not a training state")  # seed 1's twin, trained again, forks from it
    shutil.rmtree(rd.twin(1).path)
    rc, _, err = seedlab_cli("attribution", "bank", str(base / "design.yaml"), "--out", str(rd.root), "--jobs", "2",
                             "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert err.startswith("error: seed 1: ")


def test_cli_replicate_row_on_the_injected_row_one_line_exit_2(seedlab_main, tmp_path, twins_inputs, bank_design):
    path = bank_design.write(tmp_path, twins_inputs[0])
    rc, _, err = seedlab_main("attribution", "bank", str(path), "--out", str(tmp_path / "bank"),
                             "--set", "candidates.replicate_row=0", "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert "candidates.replicate_row: another row of the batch than injection_row 0" in err
    assert not (tmp_path / "bank").exists()


# --------------------------------------------------------------------------- bad input: one line, nothing written


@pytest.mark.parametrize("candidates, probes, match", [
    ('{"text": ""}\n', None, r"candidates.file: .*cands\.jsonl:1: 'passage-0' is an empty passage"),
    ('{"text": 3}\n', None, r"candidates.file: .*cands\.jsonl:1: needs a string 'text' field"),
    ('{"text": "ok"}\n{oops\n', None, r"candidates.file: .*cands\.jsonl:2: not valid JSON"),
    ("", None, "holds no passage"),
    ("a\n", None, r"candidates.passage-0: needs at least 2 tokens"),
    ("x" * 40 + "\n", None, r"candidates.passage-0: 40 tokens do not fit a row of block_size\+1 = 33"),
    ("ok text\n", '{"name": "long", "text": "' + "y" * 34 + '"}\n', r"queries.long: 34 tokens do not fit a row"),
    ('{"text": "ok", "name": "a/b"}\n', None, "letters, digits"),
    ('{"text": "ok", "name": "replicate.x"}\n', None, "'replicate.x' is taken .* the prefixes 'replicate.'"),
])
def test_bad_texts_write_nothing(tmp_path, design, candidates, probes, match):
    cfg, base = design(candidates={"file": "cands.jsonl" if "{" in candidates else "c.txt"},
                        queries={"heldout": 1, **({"probes": "p.jsonl"} if probes else {})})
    (base / ("cands.jsonl" if "{" in candidates else "c.txt")).write_text(candidates)
    if probes:
        (base / "p.jsonl").write_text(probes)
    with pytest.raises(SeedlabError, match=match) as err:
        run_bank(cfg, tmp_path / "bank", base=base, progress=False)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "bank").exists()


def test_cli_over_long_candidate_one_line_exit_2(seedlab_main, tmp_path, twins_inputs, bank_design):
    path = bank_design.write(tmp_path, twins_inputs[0], candidates={"file": "c.txt"})
    (tmp_path / "c.txt").write_text("z" * 50)
    rc, _, err = seedlab_main("attribution", "bank", str(path), "--out", str(tmp_path / "bank"), "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert err.startswith("error: candidates.passage-0: 50 tokens do not fit a row")
    assert not (tmp_path / "bank").exists()


def test_a_bank_folder_of_another_design_is_refused(seedlab_main, tiny_bank, tmp_path):
    bank = tiny_bank / "bank"
    before = _files(bank)
    rc, _, err = seedlab_main("attribution", "bank", str(tiny_bank / "design.yaml"), "--out", str(bank), "--set", "steps=16")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert "holds another attribution design" in err
    # the same config with an edited candidate file: inputs.json differs
    cfg, _ = load_config(AttributionConfig, "attribution", tiny_bank / "design.yaml")
    (tmp_path / "candidates.txt").write_text("Gizmo mends watches.\n\nReturns a list of names.\n\nq8#Lm vP!2 zx&Rt\n")
    (tmp_path / "probes.jsonl").write_text((tiny_bank / "probes.jsonl").read_text())
    with pytest.raises(SeedlabError, match=r"candidates.passage-0: was edited since .*a bank from a different design"):
        run_bank(cfg, bank, base=tmp_path, progress=False)
    assert _files(bank) == before


def test_estimator_errors_write_nothing(seedlab_main, tiny_bank, monkeypatch):
    bank = tiny_bank / "bank"
    before = _files(bank)
    rc, _, err = seedlab_main("attribution", "attribute", str(bank), "--estimators", "sgd,tracein", "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0 and "estimator: must be one of" in err and "'tracein'" in err
    monkeypatch.setitem(sys.modules, "kronfluence", None)  # as if not installed
    with pytest.raises(SeedlabError, match=r"estimator 'ekfac' needs kronfluence, which is not installed: install seedlab\[attribution\]"):
        attribute(bank, estimators=["sgd", "ekfac"], progress=False)
    assert _files(bank) == before


def test_sgd_bank_refuses_the_adam_estimator(bank_design):
    cfg = parse(AttributionConfig, {**bank_design.config, "corpus": "x", "optimizer": "sgd"})
    from seedlab.attribution.estimators.attribute import choose_estimators

    for name in ("adam", "adam-linear", "adam-cosine"):
        with pytest.raises(SeedlabError, match=f"{name} needs an AdamW step's state"):
            choose_estimators(cfg, [name])
    assert not {"adam", "adam-cosine"} & set(choose_estimators(cfg))


def test_not_a_bank_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"corpus": "c", "conditions": ["twin"]}))
    with pytest.raises(SeedlabError, match="not an attribution bank folder"):
        attribute(tmp_path, progress=False)


@pytest.mark.parametrize("over, match", [
    ({"horizons": [20]}, r"horizons: s \+ 20 is after the end"),
    ({"stop": 3}, "stop: must be after the injection step"),
    ({"midpoint": 14}, "midpoint: must be between"),
    ({"candidates": {"heldout": 0}}, "candidates: name a file"),
    ({"queries": {"own": False, "heldout": 0}}, "queries: at least one kind"),
    ({"optimizer": "adam"}, "optimizer"),
    ({"horizons": ["late"]}, "horizons"),
    ({"candidates": {"heldout": 1, "replicate_row": 0}}, r"candidates.replicate_row: another row .* \(0 .. 3\), got 0"),
    ({"candidates": {"heldout": 1, "replicate_row": 4}}, r"candidates.replicate_row: .*got 4"),
])
def test_config_errors(bank_design, over, match):
    with pytest.raises(SeedlabError, match=match):
        parse(AttributionConfig, {**bank_design.config, "corpus": "x", **over})


def test_attribute_in_parallel_processes_and_add(tmp_path, tiny_bank):
    # seeds in processes of their own give the very same numbers; --add keeps the other estimators' rows
    bank = shutil.copytree(tiny_bank / "bank", tmp_path / "bank")
    before = pd.read_parquet(bank / "attribution.parquet")
    one = attribute(bank, estimators=["adam", "unroll"], progress=False, add=True)
    assert set(one.estimator) == set(before.estimator) | {"unroll"}
    pd.testing.assert_frame_equal(one[one.estimator == "sgd"].reset_index(drop=True),
                                  before[before.estimator == "sgd"].reset_index(drop=True))
    assert json.loads((bank / "attribution.json").read_text())["estimators"][-2:] == ["adam", "unroll"]
    two = attribute(bank, estimators=["adam", "unroll"], progress=False, jobs=2)
    assert set(two.estimator) == {"adam", "unroll"}
    pd.testing.assert_frame_equal(two.reset_index(drop=True),
                                  one[one.estimator.isin(["adam", "unroll"])].reset_index(drop=True))


def test_a_nudge_arm_lives_where_nudge_names_it_and_its_name_is_checked(tmp_path):
    """BankDir.run's nudge branch and BankDir.nudge name one folder; a name that is not a folder name is refused."""
    rd = BankDir(tmp_path / "bank")
    assert rd.run(3, "nudge.transformer.h.0.attn.c_attn.weight").path == rd.nudge(3, "transformer.h.0.attn.c_attn.weight").path
    assert rd.nudge(3, "w").path == tmp_path / "bank" / "seed-3" / "nudges" / "w"
    with pytest.raises(SeedlabError, match="letters, digits"):
        rd.run(3, "nudge.a/b")
