"""forks/dose.py: every run that leaves the prefix at s writes its dose there — θ, AdamW's m and v after the update
of s against the twin's — the same bytes serial and stacked; the twin and the own-row control are exactly 0, a row
is not; the twin's state is trained again from the prefix when the twin did not pass s + 1 in this process."""

import json
import shutil

import numpy as np
import pytest
import torch

from seedlab.forks.arms import TWIN, injection, nudge, removal
from seedlab.forks.dose import QUANTILES, State, dose
from seedlab.forks.folders import DesignFolder
from seedlab.forks.loop import Recording, run_design
from seedlab.lm.batches import get_batch
from seedlab.lm.trainer import Trainer

from .test_loop import S, TEXT, design

pytestmark = pytest.mark.usefixtures("one_thread")
END = S + 4


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    from seedlab.corpus import load

    return load(twins_inputs[0])


def arms_of(corpus, seed: int):
    x, y = get_batch(corpus.train, seed, S, 4, 32)
    own = [*x[2].tolist(), int(y[2, -1])]  # row 2 of the batch of s, as its 33 tokens: the run is the twin's
    return [TWIN, injection("own-row", own, S, 2), injection("once", TEXT, S, 1), injection("quarter", TEXT, S, 1, weight=0.25),
            nudge("ulp", S, "blocks.0.ln_1.weight", 0), nudge("late", S + 2, "wte.weight", 17),
            removal("early", [(S - 2, 0)], start=S - 2)]


def dose_design(corpus, root, **over):
    d = design(corpus, root, [], **{"seeds": [0, 1], "replicas": [0], "steps": END, **over})
    d.arms = lambda seed: arms_of(corpus, seed)
    names = [a.name for a in arms_of(corpus, 0)]
    d.recording = Recording(hashed=dict.fromkeys(names, frozenset({S, S + 1, END})))
    return d


def doses(root) -> dict:
    """Every dose.json under ``root``, as bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.glob("seed-*/*/dose.json"))}


@pytest.fixture(scope="module")
def designs(corpus, tmp_path_factory):
    """The design serial and in stacks of 3 (the second seed's twin at the last position of a stack its arms are
    not in, the replica beside the first's)."""
    root = tmp_path_factory.mktemp("dose")
    run_design(dose_design(corpus, root / "serial", arm_batch=1))
    run_design(dose_design(corpus, root / "stacked", arm_batch=3))
    return root


def test_serial_and_stacked_write_the_same_doses(designs):
    a, b = doses(designs / "serial"), doses(designs / "stacked")
    names = {"twin", "own-row", "once", "quarter", "ulp", "late"}  # not "early" (it is not the twin at s), nor the replica
    assert set(a) == {f"seed-{k}/{n}/dose.json" for k in (0, 1) for n in names}
    assert a == b


def test_the_twin_and_the_own_row_are_zero_a_row_is_not(designs):
    f = DesignFolder(designs / "stacked")
    read = lambda seed, arm: json.loads(f.run(seed, arm).dose.read_text())
    for seed in (0, 1):
        twin = read(seed, "twin")
        assert twin["step"] == S and set(twin) == {"step", "theta", "exp_avg", "exp_avg_sq"}
        for name in ("twin", "own-row", "late"):  # the late nudge is the twin through s + 1
            rec = read(seed, name)
            assert rec["theta"]["l2"] == rec["exp_avg"]["l2"] == rec["exp_avg_sq"]["l2"] == 0.0
            assert rec["theta"]["changed_fraction"] == 0.0 and set(rec["theta"]["abs_quantiles"].values()) == {0.0}
            assert set(rec["theta"]["per_tensor"]) == set(twin["theta"]["per_tensor"])
        once, quarter, ulp = read(seed, "once"), read(seed, "quarter"), read(seed, "ulp")
        for rec in (once, quarter, ulp):
            assert rec["theta"]["l2"] > 0 and rec["exp_avg"]["l2"] > 0 and rec["exp_avg_sq"]["l2"] >= 0
            assert 0 < rec["theta"]["changed_fraction"] <= 1
            q = [rec["theta"]["abs_quantiles"][str(x)] for x in QUANTILES]
            assert q == sorted(q) and q[-1] > 0
        assert quarter["exp_avg"]["l2"] < once["exp_avg"]["l2"]  # a quarter of the row's gradient
        assert ulp["theta"]["l2"] < 1e-3 * once["theta"]["l2"]
        assert not f.run(seed, "early").dose.is_file() and not f.replica(seed).dose.is_file()


def test_the_dose_is_theta_m_and_v_after_the_update_of_s(corpus, designs):
    """Computed another way: the prefix trained to s, the twin's and the row's updates of s taken solo, the
    differences of every parameter and both moments concatenated; the quantiles numpy's."""
    d = dose_design(corpus, "unused")
    t = Trainer(d.cfg, d.gcfg, 1, corpus.train)
    while t.step < S:
        t.advance()
    twin, row = t.fork(), t.fork()
    twin.advance(None, pad_id=corpus.eot_id)
    row.advance({1: TEXT}, pad_id=corpus.eot_id)
    got = json.loads(DesignFolder(designs / "serial").run(1, "once").dose.read_text())
    flat = lambda xs: torch.cat([x.detach().double().reshape(-1) for x in xs])
    delta = flat(row.params) - flat(twin.params)
    assert got["theta"]["l2"] == pytest.approx(float(delta.norm()), rel=1e-12)
    assert got["theta"]["changed_fraction"] == float((delta != 0).double().mean())
    want = np.quantile(delta.abs().numpy(), QUANTILES)
    assert [got["theta"]["abs_quantiles"][str(q)] for q in QUANTILES] == pytest.approx(want.tolist(), rel=1e-12, abs=0)
    for k in ("exp_avg", "exp_avg_sq"):
        m = flat(row.opt.state[p][k] for p in row.params) - flat(twin.opt.state[p][k] for p in twin.params)
        assert got[k]["l2"] == pytest.approx(float(m.norm()), rel=1e-12)
    name = "blocks.1.mlp.c_fc.weight"
    a, b = (dict(t.model.named_parameters())[name].detach() for t in (row, twin))
    assert got["theta"]["per_tensor"][name] == pytest.approx(float((a.double() - b.double()).norm()), rel=1e-12)
    assert dose(State.of(twin), State.of(twin), S)["theta"]["l2"] == 0.0


@pytest.mark.parametrize("arm_batch", [1, 3])
def test_without_the_twin_in_memory_its_state_is_trained_again(corpus, designs, tmp_path, arm_batch):
    """Seed 1's "once" started again after its twin finished (serial: read back; stacked: not trained here): its
    dose comes from the twin's update of s trained again from the kept prefix, and is the same bytes."""
    root = tmp_path / "d"
    shutil.copytree(designs / "stacked", root)
    shutil.rmtree(root / "seed-1" / "once")
    run_design(dose_design(corpus, root, arm_batch=arm_batch))
    assert doses(root) == doses(designs / "stacked")
