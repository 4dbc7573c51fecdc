"""forks/stacked.py: a design's runs trained in stacks write, bit for bit, what the serial loop writes; the
replica control holds inside a stack and catches a stack that mixes its runs; the own-row control is exactly
the twin; a killed stacked design resumes to the same bytes."""

import json

import pandas as pd
import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, Perturbation, injection, matched_gradient, nudge, weight_kick
from seedlab.forks.folders import DesignFolder
from seedlab.forks.loop import Recording, run_design
from seedlab.lm.batches import get_batch
from seedlab.lm.stack import Stack
from safetensors.torch import load_file

from seedlab.store import is_done, tensor_hashes

from .test_loop import END, S, TEXT, design

pytestmark = pytest.mark.usefixtures("one_thread")
W = "blocks.0.mlp.c_fc.weight"


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    from seedlab.corpus import load

    return load(twins_inputs[0])


def arms_of(corpus, seed: int) -> list[Arm]:
    """Every kind of arm: a row, two rows, a passage at two steps, the row replaced by itself, a fixed delta
    and a computed one (one ulp), a row at loss weight 1/4 and the row itself at 1/16, and the two noise nulls
    sized by the row's effect at s: a weight kick and a gradient-channel delta (issue 32)."""
    x, y = get_batch(corpus.train, seed, S, 4, 32)
    own = [*x[2].tolist(), int(y[2, -1])]  # row 2 of the batch of s, as its 33 tokens
    return [TWIN, injection("once", TEXT, S, 1), Arm("two-rows", {(S, 0): TEXT, (S, 3): TEXT[:9]}),
            Arm("twice", {(S, 1): TEXT, (S + 10, 1): TEXT}), injection("own-row", own, S, 2),
            Arm("kick", perturbation=Perturbation(S, {W: torch.zeros(256, 64).index_fill_(0, torch.tensor([3]), 1e-3)})),
            nudge("ulp", S + 2, "wte.weight", 17), injection("quarter", TEXT, S, 1, weight=0.25),
            injection("own-row-weighted", own, S, 2, weight=0.0625),
            weight_kick("weight-kick", injection("once", TEXT, S, 1), S, seed=0),
            matched_gradient("matched-gradient", injection("once", TEXT, S, 1), S, seed=0)]


def stacked_design(corpus, root, *, recording=None, **over):
    d = design(corpus, root, [], **{"seeds": [0, 1], "replicas": [0, 1], **over})
    d.arms = lambda seed: arms_of(corpus, seed)
    names = [a.name for a in arms_of(corpus, 0)]
    d.recording = recording or Recording(hashed=dict.fromkeys(names, frozenset(range(S, END + 1))),
                                         saved={"twin": frozenset({S + 6, END}), "once": frozenset({S + 6, S + 12})},
                                         resume=True)
    return d


def folder_record(root) -> dict:
    """Every run's manifest, losses, perturbation record and checkpoint tensors (bits), and integrity.json."""
    f, out = DesignFolder(root), {}
    for run in sorted(root.glob("seed-*/*/")):
        key = run.relative_to(root).as_posix()
        out[key + "/manifest"] = json.loads((run / "manifest.json").read_text())
        if (run / "losses.parquet").is_file():
            out[key + "/losses"] = pd.read_parquet(run / "losses.parquet").to_dict("list")
        if (run / "perturbation.json").is_file():
            out[key + "/perturbation"] = json.loads((run / "perturbation.json").read_text())
        for ckpt in sorted(run.glob("step-*.safetensors")):
            out[f"{key}/{ckpt.name}"] = tensor_hashes(load_file(ckpt))
        assert is_done(run), key
    out["integrity"] = json.loads(f.integrity.read_text())
    return out


def without_stack(integrity: dict) -> dict:
    """integrity.json less what only says how the runs were trained (stacked or not)."""
    out = {k: v for k, v in integrity.items() if k != "arms"}
    seeds = {}
    for seed, rec in integrity["seeds"].items():
        rec = {k: v for k, v in rec.items() if k not in ("stack", "replica_early")}
        if "replica" in rec:
            rec["replica"] = {k: v for k, v in rec["replica"].items() if k != "position"}
        seeds[seed] = rec
    return out | {"seeds": seeds}


def test_a_stacked_design_writes_what_the_serial_loop_writes_bitwise(corpus, tmp_path):
    """Two seeds x eleven arms (rows, two rows, two steps, own row, a fixed delta, one ulp, weighted rows, a weight
    kick and a gradient-channel delta) and two replicas,
    in stacks of 5 (so stacks mix seeds) and in the serial loop: every manifest (weights hashed at every step),
    loss, checkpoint, perturbation record and integrity entry is the same."""
    serial, _ = run_design(stacked_design(corpus, tmp_path / "serial", arm_batch=1))
    stacked, losses = run_design(stacked_design(corpus, tmp_path / "stacked", arm_batch=5))
    a, b = folder_record(tmp_path / "serial"), folder_record(tmp_path / "stacked")
    assert set(a) == set(b) and len(a) > 30
    assert {k: v for k, v in a.items() if k != "integrity"} == {k: v for k, v in b.items() if k != "integrity"}
    assert without_stack(serial) == without_stack(stacked) == without_stack(a["integrity"])
    assert "arms" not in serial and stacked["arms"].startswith("stacked")
    for seed in ("0", "1"):
        rec = stacked["seeds"][seed]
        assert rec["stack"]["arm_batch"] == 5
        assert rec["replica"]["steps_compared"] == list(range(S, END + 1))
    assert stacked["seeds"]["0"]["stack"]["solo_check"] == {"step": S + 1, "bitwise_equal_to_solo": True}
    assert set(losses.arm) == {a.name for a in arms_of(corpus, 0)} and len(losses) == 2 * 11 * END


def test_the_own_row_control_is_the_twin_inside_a_stack(corpus, tmp_path):
    run_design(stacked_design(corpus, tmp_path / "d"))
    f = DesignFolder(tmp_path / "d")
    for seed in (0, 1):
        assert f.run(seed, "own-row").read_manifest() == f.run(seed, "twin").read_manifest()
        assert f.run(seed, "own-row-weighted").read_manifest() == f.run(seed, "twin").read_manifest()
        assert f.run(seed, "once").read_manifest() != f.run(seed, "twin").read_manifest()


def test_the_replica_inside_a_stack_catches_a_stack_that_mixes_its_runs(corpus, tmp_path, monkeypatch):
    """A kernel that lets one position of the axis drift (here: the last, where the replica sits) stops the
    design at the first recorded step after s, naming the replica's position."""
    advance = Stack.advance

    def mixing(self, rows, **kw):
        out = advance(self, rows, **kw)
        if self.step > S:
            with torch.no_grad():
                self.p["ln_f.bias"][-1] += 1e-6
        return out

    monkeypatch.setattr(Stack, "advance", mixing)
    with pytest.raises(SeedlabError, match=rf"^seed 0: the replica control \(position 4 of a stack of 5\) differs from "
                                           rf"the twin at step {S + 1} in tensor 'ln_f.bias'"):
        run_design(stacked_design(corpus, tmp_path / "d", arm_batch=5))


class Killed(Exception):
    pass


def test_a_killed_stacked_design_resumes_to_the_same_bytes(corpus, tmp_path, monkeypatch):
    """Killed in its second stack (one run resumable at s+6, the other not), the design resumes: the laggard
    catches up alone, and every file is what an uninterrupted run writes."""
    whole, _ = run_design(stacked_design(corpus, tmp_path / "whole", arm_batch=2))
    advance, seen = Stack.advance, []

    def killed(self, rows, **kw):
        if self.step == S + 9:
            seen.append(self.size)
            if len(seen) == 2:  # the second stack: [once, two-rows] (the first is [twin, replica])
                raise Killed
        return advance(self, rows, **kw)

    monkeypatch.setattr(Stack, "advance", killed)
    with pytest.raises(Killed):
        run_design(stacked_design(corpus, tmp_path / "d", arm_batch=2))
    f = DesignFolder(tmp_path / "d")
    assert f.run(0, "twin").finished and not f.run(0, "once").finished and f.run(0, "once").state.is_file()
    assert not f.run(0, "two-rows").state.is_file()
    monkeypatch.setattr(Stack, "advance", advance)
    again, _ = run_design(stacked_design(corpus, tmp_path / "d", arm_batch=2))
    resumed, uninterrupted = folder_record(tmp_path / "d"), folder_record(tmp_path / "whole")
    stack = resumed.pop("integrity")["seeds"]["0"]["stack"]
    assert stack["arm_batch"] == stack["group_runs"] == 2 and "solo_check" not in stack  # its solo check ran before the kill
    assert resumed == {k: v for k, v in uninterrupted.items() if k != "integrity"}
    assert without_stack(again) == without_stack(whole)
