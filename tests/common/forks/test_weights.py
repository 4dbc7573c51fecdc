"""Row weights (forks/arms.py, lm/trainer.py ``Trainer.backward``): an injected row with loss weight w trains on
(Σ_{i≠r} ℓ_i + (1 − w)·ℓ_r + w·ℓ_passage)/N. w = 1 is the plain swap bit for bit; a passage equal to its row
leaves the run bitwise the twin at every w; the update's gradient is the ordinary one plus w times the swap's;
bad weights are refused before anything runs."""

import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, check_arms, injection
from seedlab.forks.loop import run_design
from seedlab.lm.batches import get_batch
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes

from .test_loop import END, S, TEXT, design

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    from seedlab.corpus import load

    return load(twins_inputs[0])


def trainer_at_s(corpus):
    d = design(corpus, "unused", [TWIN])
    t = Trainer(d.cfg, d.gcfg, 0, corpus.train)
    while t.step < S:
        t.advance()
    return t


def grads_after(trainer: Trainer, **kw) -> list[torch.Tensor]:
    t = trainer.fork()
    t.backward(pad_id=0, **kw)
    return [p.grad.detach().clone().double() for p in t.params]


def test_the_weighted_gradient_is_the_ordinary_one_plus_w_times_the_swap(corpus):
    t = trainer_at_s(corpus)
    plain = grads_after(t)
    swap = grads_after(t, rows={1: TEXT})
    flat = lambda ts: torch.cat([x.reshape(-1) for x in ts])
    a, b = flat(plain), flat(swap)
    for w in (1.0, 0.5, 0.0625, 0.015625):
        g = flat(grads_after(t, rows={1: TEXT}, weights={1: w}))
        # per unit weight, the weighted step's gradient difference is the swap's, to float32 rounding of the batch
        # gradient (~1e-7 of ‖a‖ per element, divided by w)
        err = float(((g - a) / w - (b - a)).norm() / (b - a).norm())
        assert err < 1e-6 / w
        # the loss: L_ordinary + w·(L_swap − L_ordinary)
        l0, l1, lw = (t.fork().backward(pad_id=0, **kw) for kw in ({}, {"rows": {1: TEXT}},
                                                                  {"rows": {1: TEXT}, "weights": {1: w}}))
        assert abs(lw - (l0 + w * (l1 - l0))) < 1e-6


def test_weight_one_is_the_plain_swap_and_the_own_row_is_the_ordinary_step_bitwise(corpus):
    t = trainer_at_s(corpus)
    a, b = t.fork(), t.fork()
    a.advance({1: TEXT}, pad_id=0)
    b.advance({1: TEXT}, pad_id=0, weights={1: 1.0})
    assert tensor_hashes(a.weights()) == tensor_hashes(b.weights())
    x, y = get_batch(corpus.train, 0, S, 4, 32)
    own = [*x[2].tolist(), int(y[2, -1])]
    plain, weighted = t.fork(), t.fork()
    l0 = plain.advance(None, pad_id=0)
    lw = weighted.advance({2: own}, pad_id=0, weights={2: 0.25})
    assert lw == l0 and tensor_hashes(plain.weights()) == tensor_hashes(weighted.weights())
    assert tensor_hashes(plain.opt.state_dict()["state"][0]) == tensor_hashes(weighted.opt.state_dict()["state"][0])


def test_a_design_with_weighted_rows_runs_alike_serial_and_stacked(corpus, tmp_path):
    """The weighted arm differs from the twin from s+1 on, less than the plain swap does at s+1, its
    record says its weight; the serial loop and the stacks write the same hashes."""
    arms = [TWIN, injection("swap", TEXT, S, 1), injection("quarter", TEXT, S, 1, weight=0.25),
            injection("tiny", TEXT, S, 1, weight=2 ** -10)]
    out = {}
    for how, batch in (("serial", 1), ("stacked", None)):
        integrity, _ = run_design(design(corpus, tmp_path / how, arms, arm_batch=batch))
        from seedlab.forks.folders import DesignFolder
        f = DesignFolder(tmp_path / how)
        out[how] = {a.name: f.run(0, a.name).read_manifest() for a in arms}
        rec = integrity["seeds"]["0"]["arms"]
        assert rec["quarter"]["injections"][0]["weight"] == 0.25 and "weight" not in rec["swap"]["injections"][0]
    assert out["serial"] == out["stacked"]
    m = out["serial"]
    for name in ("swap", "quarter", "tiny"):
        assert m[name][str(S)] == m["twin"][str(S)] and m[name][str(S + 1)] != m["twin"][str(S + 1)]


def test_bad_weights_are_refused_before_anything_runs(corpus):
    check = lambda arm: check_arms([TWIN, arm], fork=S, end=END, batch_size=4, block_size=32)
    for w in (0.0, -0.5, 1.5):
        with pytest.raises(SeedlabError, match=r"loss weight must lie in \(0, 1\]"):
            check(injection("bad", TEXT, S, 1, weight=w))
    with pytest.raises(SeedlabError, match="where it injects nothing"):
        check(Arm("stray", {(S, 1): TEXT}, weights={(S, 2): 0.5}))
    t = trainer_at_s(corpus)
    with pytest.raises(SeedlabError, match="has a weight but no passage"):
        t.fork().advance({1: TEXT}, weights={2: 0.5})
