"""The replica control cannot pass without comparing, and holds where a run sits alone at the end of a
stack: stacks of one run (a model larger than ``stack_memory``) train the replica after its twin and compare
every recorded step; a replica that differs stops the design; a record with no compared step is a failure;
at two threads, under a concurrent CPU load, a replica alone in the last group of its stack (lm/stack.py pads
the group) is bitwise its twin at every step."""

import json
import subprocess
import sys

import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.forks import stacked
from seedlab.forks.arms import TWIN, Arm, injection
from seedlab.forks.folders import DesignFolder
from seedlab.forks.loop import Observer, run_design
from seedlab.forks.records import finish_replica
from seedlab.lm import stack as stack_module

from .test_loop import END, S, TEXT, design


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    from seedlab.corpus import load

    return load(twins_inputs[0])


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield lambda n: torch.set_num_threads(n)
    torch.set_num_threads(before)


def arms() -> list[Arm]:
    return [TWIN, injection("once", TEXT, S, 1), Arm("two-rows", {(S, 0): TEXT, (S, 3): TEXT[:9]}),
            injection("quarter", TEXT, S, 1, weight=0.25)]


def integrity(root) -> dict:
    return json.loads((root / "integrity.json").read_text())["seeds"]["0"]


def test_stacks_of_one_compare_the_replica_at_every_recorded_step(corpus, tmp_path, threads):
    """A stack_memory smaller than one run: every run in a stack of its own, the replica in the one after its
    twin's, compared at every step the twin recorded (s to the end)."""
    threads(1)
    run_design(design(corpus, tmp_path / "d", arms()[:2], replicas=[0], stack_memory=1e-9))
    rec = integrity(tmp_path / "d")
    assert rec["stack"]["arm_batch"] == 1
    assert rec["replica"]["steps_compared"] == list(range(S, END + 1))
    assert rec["replica"]["position"] == "0 of a stack of 1"


def test_a_replica_that_differs_in_a_stack_of_one_stops_the_design(corpus, tmp_path, monkeypatch, threads):
    threads(1)
    start = stacked._Loop._start

    def corrupted(self, r):
        start(self, r)
        if r.replica:
            with torch.no_grad():
                r.trainer.model.ln_f.bias.add_(1e-6)

    monkeypatch.setattr(stacked._Loop, "_start", corrupted)
    with pytest.raises(SeedlabError, match=rf"^seed 0: the replica control \(position 0 of a stack of 1\) differs from the "
                                           rf"twin at step {S} in tensor 'ln_f.bias'"):
        run_design(design(corpus, tmp_path / "d", arms()[:2], replicas=[0], stack_memory=1e-9))
    assert not DesignFolder(tmp_path / "d").replica(0).finished


def test_a_replica_record_with_no_compared_step_is_a_failed_control(tmp_path):
    class D:
        class world:
            main = True

    where = DesignFolder(tmp_path).replica(0)
    with pytest.raises(SeedlabError, match="compared no step with its twin"):
        finish_replica(D, where, {"bitwise_equal_to_twin": True, "steps_compared": []})
    assert not where.manifest.exists() and not where.finished


def test_the_replica_alone_in_the_last_group_under_load_is_its_twin_at_every_step(corpus, tmp_path, monkeypatch, threads):
    """Four arms and the replica in one stack computed two runs at a time: the replica (position 4) is alone in
    the last group, padded to two. At two threads, beside a process that keeps both cores busy, it is bitwise
    its twin at every step after s (the design stops otherwise), and the record says how the stack computed."""
    for module in (stacked, stack_module):
        monkeypatch.setattr(module, "groups", lambda device, cfg, gcfg, runs: (2, 1))
    threads(2)
    load = subprocess.Popen([sys.executable, "-c", "import torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\n"
                             "while True: a = torch.tanh(a @ a)"])
    try:
        run_design(design(corpus, tmp_path / "d", arms(), replicas=[0], arm_batch=5))
    finally:
        load.kill()
        load.wait()
    rec = integrity(tmp_path / "d")
    assert rec["replica"]["position"] == "4 of a stack of 5"
    assert rec["replica"]["steps_compared"] == list(range(S, END + 1))
    assert rec["stack"]["group_runs"] == 2 and rec["stack"]["head_runs"] == 1
    assert rec["stack"]["guarantee"].startswith("the same kernels and shapes at every position")


class Counting(Observer):
    def __init__(self):
        self.total, self.done = None, 0

    def started(self, total: int) -> None:
        self.total = total

    def step(self, label: str) -> None:
        self.done += 1

    def skip(self, steps: int) -> None:
        self.done += steps


@pytest.mark.parametrize("arm_batch", [None, 1])
def test_the_progress_total_counts_every_update_the_design_trains(corpus, tmp_path, threads, arm_batch):
    """The bar's total is every update trained, the stacked loop's solo check included (it once ended at total + 1),
    and a resumed design counts what it reads back."""
    threads(1)
    for _ in range(2):  # the second run reads everything back
        seen = Counting()
        run_design(design(corpus, tmp_path / "d", arms()[:2], replicas=[0], observer=seen, arm_batch=arm_batch))
        assert seen.done == seen.total
