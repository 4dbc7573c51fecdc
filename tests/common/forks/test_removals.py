"""Row removal (forks/arms.py ``Arm.removals``, lm/trainer.py ``Trainer.backward(removed=)``): a removed row is the
row's loss weight set to 0 with no text, the batch loss Σ_{i∉removed} ℓ_i / N with N = B·T unchanged. An arm that
removes nothing is the twin bit for bit; a removal at step t is the twin through t and differs after; the loss and
the gradient are the hand-computed ones; an arm may leave the prefix before s (``Arm.start``) from the prefix's own
state there, the serial loop and the stacks alike; bad removals are refused in one line before anything runs."""

import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, check_arms, injection, removal
from seedlab.forks.folders import DesignFolder
from seedlab.forks.loop import run_design
from seedlab.lm.batches import get_batch
from seedlab.lm.model import masked_ce_sum
from seedlab.lm.stack import Stack
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes

from .test_loop import END, S, TEXT, design, first_difference_step

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    from seedlab.corpus import load

    return load(twins_inputs[0])


def trainer_at(corpus, step: int) -> Trainer:
    d = design(corpus, "unused", [TWIN])
    t = Trainer(d.cfg, d.gcfg, 0, corpus.train)
    while t.step < step:
        t.advance()
    return t


def flat_grad(t: Trainer, **kw) -> tuple[torch.Tensor, float]:
    t = t.fork()
    loss = t.backward(pad_id=0, **kw)
    return torch.cat([p.grad.detach().reshape(-1).double() for p in t.params]), loss


def test_the_removed_loss_and_gradient_are_the_hand_computed_ones(corpus):
    """loss = Σ_{i∉R} ℓ_i / N with N = B·T (not the mean of the rows kept); its gradient the ordinary one less
    ∇ℓ_r / N per removed row: the limit w → 0 of weighing the row's own loss by w."""
    t = trainer_at(corpus, S)
    x, y = get_batch(corpus.train, 0, S, 4, 32)
    N = x.numel()
    t.model.eval()
    with torch.no_grad():
        rows = [float(masked_ce_sum(t.model(x[i:i + 1])[0], y[i:i + 1], torch.ones(1, 32, dtype=torch.bool)))
                for i in range(4)]
    t.model.train()
    g0, l0 = flat_grad(t)
    g1, l1 = flat_grad(t, removed={1})
    g13, l13 = flat_grad(t, removed={1, 3})
    assert l1 == pytest.approx((sum(rows) - rows[1]) / N, rel=1e-5)
    assert l13 == pytest.approx((rows[0] + rows[2]) / N, rel=1e-5)
    assert l0 == pytest.approx(sum(rows) / N, rel=1e-5)
    # the row's own gradient / N, one row at a time (Trainer._row_gradient: the kernels of a weighted row)
    own = torch.cat([g.reshape(-1).double() for g in t._row_gradient(x[1:2], y[1:2], torch.ones(1, 32, dtype=torch.bool), N)[0]])
    assert float((g0 - g1 - own).norm() / own.norm()) < 1e-5
    # additive in the rows removed (exactly so in the loss; to float32 rounding in the gradient)
    own3 = torch.cat([g.reshape(-1).double() for g in t._row_gradient(x[3:4], y[3:4], torch.ones(1, 32, dtype=torch.bool), N)[0]])
    assert float((g0 - g13 - own - own3).norm() / (own + own3).norm()) < 1e-5


def test_removing_nothing_is_the_ordinary_step_bitwise_and_a_removal_is_refused_where_it_cannot_be(corpus):
    t = trainer_at(corpus, S)
    a, b = t.fork(), t.fork()
    la, lb = a.advance(None), b.advance(None, removed=frozenset())
    assert la == lb and tensor_hashes(a.weights()) == tensor_hashes(b.weights())
    with pytest.raises(SeedlabError, match="row 4 is not in a batch of rows 0 .. 3"):
        t.fork().advance(None, removed={4})
    with pytest.raises(SeedlabError, match="row 1 is both replaced and removed"):
        t.fork().advance({1: TEXT}, removed={1})


def test_a_stack_removes_a_row_as_the_solo_trainer_does(corpus):
    t = trainer_at(corpus, S)
    solo = t.fork()
    solo.advance(None, removed={2})
    stack = Stack([t.fork(), t.fork()])
    stack.advance([None, None], removed=[None, {2}])
    assert tensor_hashes(stack.weights(1)) == tensor_hashes(solo.weights())
    plain = t.fork()
    plain.advance(None)
    assert tensor_hashes(stack.weights(0)) == tensor_hashes(plain.weights())


def early_arms():
    return [TWIN, Arm("nothing", removals=frozenset()), removal("at-s", [(S, 1)]), removal("late", [(S + 5, 0), (S + 5, 3)]),
            removal("early", [(2, 1)], start=2), removal("early-then-s", [(1, 0), (S, 2)], start=1),
            Arm("start-only", start=2), injection("once", TEXT, S, 1)]


def test_removal_arms_serial_and_stacked_are_the_twin_exactly_until_their_row(corpus, tmp_path):
    """Removing nothing: the twin at every step. A removal at t: the twin through t, different from t + 1 on (the
    serial loop and the stacks write the same hashes). An arm that leaves the prefix at t < s is the prefix's state
    at t, its removal shows from t + 1, and it is left out of the comparison at s; one that removes nothing there is
    the twin at s and after (the prefix's earlier state is the same run)."""
    out = {}
    for how, batch in (("serial", 1), ("stacked", None)):
        arms = early_arms()
        d = design(corpus, tmp_path / how, arms, arm_batch=batch)
        every = frozenset(range(0, END + 1))
        d.recording = type(d.recording)(hashed=dict.fromkeys([a.name for a in arms], every))
        integrity, losses = run_design(d)
        f = DesignFolder(tmp_path / how)
        out[how] = {a.name: f.run(0, a.name).read_manifest() for a in arms}
        rec = integrity["seeds"]["0"]
        assert rec["early_starts"]["arms"] == {"early": 2, "early-then-s": 1, "start-only": 2}
        assert rec["arms"]["late"]["removals"] == [{"step": S + 5, "row": 0}, {"step": S + 5, "row": 3}]
        assert rec["arms"]["early"]["start"] == 2
        assert f.prefix_at(0, 2).is_file() and f.prefix_at(0, 1).is_file()
        assert len(losses[losses.arm == "early"]) == END and len(losses[losses.arm == "twin"]) == END
    assert out["serial"] == out["stacked"]
    m = out["serial"]
    twin = m["twin"]
    assert m["nothing"] == twin
    assert first_difference_step(twin, m["at-s"]) == S + 1
    assert first_difference_step(twin, m["late"]) == S + 6
    # from the prefix's state at 2, ordinary batches: the twin's run from s on (and hashed from 2)
    assert sorted(map(int, m["start-only"])) == list(range(2, END + 1))
    assert {t: h for t, h in m["start-only"].items() if int(t) >= S} == twin
    # an early arm: its own hashes from its start (the prefix's there) on; the twin's manifest starts at s
    ref = trainer_at(corpus, 2)
    assert m["early"]["2"] == tensor_hashes(ref.weights())
    ref.advance(None)
    assert m["early"]["3"] != tensor_hashes(ref.weights())
    assert m["early"][str(S)] != twin[str(S)] and m["early-then-s"][str(S)] != twin[str(S)]
    assert m["early"][str(END)] != m["early-then-s"][str(END)]


def test_a_kept_prefix_resumes_the_early_arms_to_the_same_bytes(corpus, tmp_path):
    """The prefix's earlier states are read back when they were saved, and trained again from step 0 when not
    (a deleted file): the early arm's run is the same, bit for bit."""
    arms = [TWIN, removal("early", [(2, 1)], start=2)]
    first = design(corpus, tmp_path / "a", arms, arm_batch=1)
    run_design(first)
    f = DesignFolder(tmp_path / "a")
    want = f.run(0, "early").read_manifest()
    for gone in (False, True):
        (f.run(0, "early").path / "done.json").unlink()
        if gone:
            f.prefix_at(0, 2).unlink()
        run_design(design(corpus, tmp_path / "a", arms, arm_batch=1))
        assert f.run(0, "early").read_manifest() == want


def test_bad_removals_are_refused_before_anything_runs():
    check = lambda arm: check_arms([TWIN, arm], fork=S, end=END, batch_size=4, block_size=32)
    with pytest.raises(SeedlabError, match=rf"removes a row at step {S - 1}, outside the forked run \(steps {S} "):
        check(removal("before", [(S - 1, 0)]))
    with pytest.raises(SeedlabError, match=f"removes a row at step {END}, outside"):
        check(removal("after", [(END, 0)]))
    with pytest.raises(SeedlabError, match="removes row 4, but a batch has rows 0 .. 3"):
        check(removal("wide", [(S, 4)]))
    with pytest.raises(SeedlabError, match="which it also injects into"):
        check(Arm("both", {(S, 1): TEXT}, removals=frozenset({(S, 1)})))
    with pytest.raises(SeedlabError, match="removes a row at step 1, outside the forked run \\(steps 2 "):
        check(removal("too-early", [(1, 0)], start=2))
    with pytest.raises(SeedlabError, match=f"leaves the shared prefix at step {S + 1}"):
        check(removal("starts-late", [(S + 2, 0)], start=S + 1))
    with pytest.raises(SeedlabError, match="injects at step 1, outside"):
        check(Arm("inject-early", {(1, 1): TEXT}, start=2))
