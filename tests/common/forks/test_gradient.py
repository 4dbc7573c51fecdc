"""forks/arms.py's gradient channel (issue 32): a perturbation added to the raw batch gradient of s, where a
row's own gradient difference enters, so it passes through the clip and AdamW's moments as a row does.
``matched_gradient``: its norm is the passage's batch-gradient difference at θ_s; the run is bitwise the twin
through s and differs from s + 1 on; it is bitwise reproducible, and the serial loop and the stacks agree."""

import json
import math

import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, Perturbation, gradient_difference, injection, matched_gradient, sign_gradient, weight_kick
from seedlab.forks.folders import DesignFolder
from seedlab.forks.loop import run_design
from seedlab.forks.prefix import advance_to
from seedlab.lm.batches import get_batch
from seedlab.lm.gradients import gradient_delta
from seedlab.lm.trainer import Trainer

from .test_loop import END, S, TEXT, design, first_difference_step
from .test_stacked import folder_record, without_stack

pytestmark = pytest.mark.usefixtures("one_thread")
ROW = 1


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    from seedlab.corpus import load

    return load(twins_inputs[0])


def gradient_arms() -> list[Arm]:
    like = injection("once", TEXT, S, ROW)
    return [TWIN, like, matched_gradient("grad", like, S, seed=0), weight_kick("kick", like, S, seed=0)]


def at_s(corpus, seed: int = 0) -> Trainer:
    """The design's run at θ_s (the prefix trained here, as the loop trains it)."""
    d = design(corpus, "unused", [])
    trainer = Trainer(d.cfg, d.gcfg, seed, corpus.train)
    advance_to(trainer, S)
    return trainer


def test_matched_gradient_is_the_twin_through_s_differs_after_and_has_the_passages_norm(corpus, tmp_path):
    run_design(design(corpus, tmp_path / "d", gradient_arms(), arm_batch=1))  # the serial loop
    f = DesignFolder(tmp_path / "d")
    m = {a.name: f.run(0, a.name).read_manifest() for a in gradient_arms()}
    assert m["grad"][str(S)] == m["twin"][str(S)]  # bitwise the twin at s (hashes of every tensor)
    assert first_difference_step(m["twin"], m["grad"]) == S + 1  # every step hashed: the first difference at s + 1
    assert all(m["grad"][str(t)] != m["twin"][str(t)] for t in range(S + 1, END + 1))
    assert first_difference_step(m["kick"], m["grad"]) == S + 1  # not the weight kick either
    rec = json.loads(f.run(0, "grad").perturbation.read_text())
    assert rec["step"] == S and rec["channel"] == "gradient" and rec["like"] == "once"
    # the passage's batch-gradient difference at θ_s, computed another way (lm/gradients.py: one row's
    # gradients in float64, (G_passage − G_row)/N): the recorded norm is it, and so is the delta's own
    trainer = at_s(corpus)
    x, y = get_batch(corpus.train, 0, S, trainer.cfg.batch_size, trainer.model.config.block_size)
    delta = gradient_delta(trainer.model, x, y, ROW, TEXT, corpus.eot_id)
    assert rec["like_norm"] == pytest.approx(delta.norm, rel=1e-4)
    assert rec["norm"] == pytest.approx(rec["like_norm"], rel=1e-6)  # float32 rounding of the scaled direction
    kick = json.loads(f.run(0, "kick").perturbation.read_text())
    assert kick["moved"] > 0  # the weight kick moves the weights at s, by the passage's update difference
    assert rec["like_update_norm"] == pytest.approx(kick["norm"], rel=1e-6) and rec["update_norm"] > 0  # sizes, at s + 1


def test_the_gradient_channel_is_where_a_row_enters(corpus):
    """Adding the passage's own batch-gradient difference there reproduces the passage's update: weights and
    both AdamW moments after s + 1 equal the injected run's to float rounding (and are far from the twin's)."""
    trainer = at_s(corpus)
    rows = {ROW: TEXT}
    a, b, twin = trainer.fork(), trainer.fork(), trainer.fork()
    probe = trainer.fork()
    probe.backward(rows, pad_id=corpus.eot_id)
    with_row = [q.grad.detach().clone() for q in probe.params]
    probe.backward(None, pad_id=corpus.eot_id)
    diff = [w - q.grad.detach() for w, q in zip(with_row, probe.params)]
    a.advance(rows, pad_id=corpus.eot_id)
    b.advance(None, pad_id=corpus.eot_id, grad_delta=diff)
    twin.advance(None, pad_id=corpus.eot_id)

    def gap(x: Trainer, y: Trainer, what: str) -> float:
        """‖x − y‖ over every parameter's weights (``what`` = "weights") or one AdamW moment."""
        get = (lambda tr, q: q.detach()) if what == "weights" else (lambda tr, q: tr.opt.state[q][what])
        return float(torch.sqrt(sum(((get(x, p) - get(y, q)).double() ** 2).sum() for p, q in zip(x.params, y.params))))

    for what in ("weights", "exp_avg", "exp_avg_sq"):
        assert gap(a, b, what) < 1e-3 * gap(a, twin, what), what  # the row's own update, to float rounding


def test_matched_gradient_is_reproducible_and_the_stacks_are_the_serial_loop(corpus, tmp_path):
    """Two seeds, twice in the serial loop and once in stacks of 3 (every seed's arms mixed): every manifest
    (every step), loss, checkpoint and perturbation record is the same, bit for bit."""
    runs = {}
    for name, batch in (("serial", 1), ("again", 1), ("stacked", 3)):
        d = design(corpus, tmp_path / name, gradient_arms(), arm_batch=batch, seeds=[0, 1])
        runs[name] = without_stack(run_design(d)[0])
    records = {name: folder_record(tmp_path / name) for name in runs}
    for name in ("again", "stacked"):
        assert {k: v for k, v in records[name].items() if k != "integrity"} == \
               {k: v for k, v in records["serial"].items() if k != "integrity"}, name
        assert runs[name] == runs["serial"]
    assert records["serial"]["seed-1/grad/perturbation"]["channel"] == "gradient"
    assert records["serial"]["seed-0/grad/perturbation"] != records["serial"]["seed-1/grad/perturbation"]  # per seed


def test_a_gradient_delta_for_no_parameter_and_an_unknown_channel_are_refused(corpus, tmp_path):
    bad = Arm("bad", perturbation=Perturbation(S, {"wte": torch.zeros(1)}, channel="gradient"))
    with pytest.raises(SeedlabError, match=r"^arm bad: a delta for 'wte' of shape"):
        run_design(design(corpus, tmp_path / "a", [TWIN, bad]))
    odd = Arm("odd", perturbation=Perturbation(S, {}, channel="moments"))
    with pytest.raises(SeedlabError, match=r"^arm odd: a perturbation's channel is one of weights, gradient, got 'moments'"):
        run_design(design(corpus, tmp_path / "b", [TWIN, odd]))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_sign_gradient_keeps_the_passages_size_in_every_coordinate_and_only_drops_its_direction(corpus, tmp_path):
    """sign_gradient: δ_i = ±|Δg_i| — the passage's batch-gradient difference with random signs: the same absolute
    value in every coordinate (so the same norm and the same δ² entering AdamW's v), nearly orthogonal to Δg; the
    run is bitwise the twin through s and differs from s + 1 on, reproducibly; and its update at s is about the
    passage's size, where matched_gradient's isotropic direction of the same norm moves the weights several times more."""
    like = injection("once", TEXT, S, ROW)
    arms = [TWIN, like, sign_gradient("sign", like, S, seed=0), matched_gradient("grad", like, S, seed=0)]
    for name in ("a", "b"):
        run_design(design(corpus, tmp_path / name, arms, arm_batch=1))
    f, g = DesignFolder(tmp_path / "a"), DesignFolder(tmp_path / "b")
    m = {a.name: f.run(0, a.name).read_manifest() for a in arms}
    assert m["sign"][str(S)] == m["twin"][str(S)] and first_difference_step(m["twin"], m["sign"]) == S + 1
    assert m["sign"] == g.run(0, "sign").read_manifest()  # bitwise reproducible
    rec = json.loads(f.run(0, "sign").perturbation.read_text())
    assert rec["channel"] == "gradient" and rec["norm"] == pytest.approx(rec["like_norm"], rel=1e-5)
    assert abs(rec["cosine"]) < 0.2  # the direction is gone (a random-sign sum; Δg's own cosine is 1)
    trainer = at_s(corpus)
    delta, again = arms[2].perturbation.due(trainer)
    diff = gradient_difference(trainer, like, S, corpus.eot_id)
    named = [k for k, _ in trainer.model.named_parameters()]
    for k, d in zip(named, diff):
        assert torch.equal(delta[k].abs(), d.abs().to(delta[k].dtype)), k  # |δ| = |Δg|, coordinate by coordinate
    assert again["update_norm"] == pytest.approx(rec["update_norm"], rel=1e-6)
    iso = json.loads(f.run(0, "grad").perturbation.read_text())
    sign_ratio, iso_ratio = rec["update_norm"] / rec["like_update_norm"], iso["update_norm"] / iso["like_update_norm"]
    assert abs(math.log(sign_ratio)) < abs(math.log(iso_ratio)), (sign_ratio, iso_ratio)
