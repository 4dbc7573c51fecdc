"""lm/stack.py: A runs in one set of tensors are, bit for bit, the solo trainers they came from — whatever
their position, their neighbours, their rows, seeds or micro-batches — and leave the stack as solo trainers."""

import numpy as np
import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.model import GPTConfig
from seedlab.lm.stack import Stack
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes

pytestmark = pytest.mark.usefixtures("one_thread")
GCFG = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=97)
TOKENS = np.random.default_rng(0).integers(0, 97, 20_000).astype(np.int64)


class Cfg:
    steps, batch_size, micro_batch = 30, 4, None
    peak_lr, min_lr, weight_decay, beta1, beta2, grad_clip = 1e-2, 1e-3, 0.1, 0.9, 0.95, 0.05  # a clip that bites
    device, precision, warmup_steps = "cpu", "fp32", 3


def trainers(seed: int, cfg=None, steps: int = 4) -> Trainer:
    t = Trainer(cfg or Cfg(), GCFG, seed, TOKENS)
    for _ in range(steps):
        t.advance()
    return t


def same(a: dict, b: dict) -> bool:
    return tensor_hashes(a) == tensor_hashes(b)


@pytest.mark.parametrize("micro, groups", [(None, None), (2, None), (None, (2, 1)), (2, (3, 2))])
def test_each_run_in_the_stack_is_its_solo_run_bitwise(micro, groups):
    """Five runs (two seeds; the ordinary batch, a row replaced, two rows replaced, the same run twice at
    positions 0 and 4) trained 6 updates stacked and solo, whole or in groups of runs (forward and backward;
    the head): every weight, loss and AdamW moment equal."""
    cfg = Cfg()
    cfg.micro_batch = micro
    a, b = trainers(0, cfg), trainers(1, cfg)
    rows = [None, {0: list(range(10))}, {1: [5] * 17, 3: [7, 8]}, None, None]
    starts = [a, a, b, b, a]
    solo = [s.fork() for s in starts]
    group, head = groups or (None, None)
    stack = Stack([s.fork() for s in starts], group_runs=group, head_runs=head)
    for _ in range(6):
        losses = stack.advance(rows)
        assert losses == [s.advance(r) for s, r in zip(solo, rows)]
        assert all(same(stack.weights(i), s.weights()) for i, s in enumerate(solo))
    assert same(stack.weights(0), stack.weights(4)) and not same(stack.weights(0), stack.weights(1))
    back = stack.member(2)
    assert back.step == solo[2].step == 4 + 6 and same(back.weights(), solo[2].weights())
    for (i, x), (j, y) in zip(back.opt.state_dict()["state"].items(), solo[2].opt.state_dict()["state"].items()):
        assert i == j and all(torch.equal(x[k], y[k]) for k in x)
    assert back.advance() == solo[2].advance()  # the solo copy goes on as its solo run does
    assert same(back.weights(), solo[2].weights())


def test_a_run_put_back_after_a_change_trains_on_from_it():
    a = trainers(0)
    solo, stack = a.fork(), Stack([a.fork(), a.fork()])
    moved = stack.member(1)
    with torch.no_grad():
        moved.model.wte.weight[3, 4] += 1e-3
        solo.model.wte.weight[3, 4] += 1e-3
    stack.put(1, moved)
    stack.advance([None, None])
    solo.advance()
    assert same(stack.weights(1), solo.weights()) and not same(stack.weights(0), solo.weights())


def test_runs_from_step_zero_stack_without_optimizer_state():
    cfg = Cfg()
    fresh = [Trainer(cfg, GCFG, s, TOKENS) for s in (0, 1)]
    solo = [Trainer(cfg, GCFG, s, TOKENS) for s in (0, 1)]
    stack = Stack(fresh)
    for _ in range(3):
        stack.advance([None, None])
        [s.advance() for s in solo]
    assert all(same(stack.weights(i), s.weights()) for i, s in enumerate(solo))


def test_runs_that_cannot_stack_are_refused():
    with pytest.raises(SeedlabError, match="same config, shape, device and step"):
        cfg = Cfg()
        Stack([trainers(0, cfg, steps=1), trainers(0, cfg, steps=2)])
    with pytest.raises(SeedlabError, match="no runs"):
        Stack([])
    with pytest.raises(SeedlabError, match="2 runs' rows for a stack of 1"):
        Stack([trainers(0)]).advance([None, None])


def test_the_batched_layer_norm_is_the_same_for_every_position():
    """The GPU's choice (one layer norm for all runs, then each run's gain): within float rounding of the
    solo run, and a run's numbers do not depend on where it sits in the stack."""
    a = trainers(0)
    stack = Stack([a.fork(), a.fork(), a.fork()], group_runs=3, head_runs=3)
    stack.exact_ln = False
    solo = a.fork()
    for _ in range(3):
        stack.advance([None, {0: list(range(12))}, None])
        solo.advance()
    assert same(stack.weights(0), stack.weights(2)) and not same(stack.weights(0), stack.weights(1))
    assert max(float((stack.weights(0)[k] - v).abs().max()) for k, v in solo.weights().items()) < 1e-4
