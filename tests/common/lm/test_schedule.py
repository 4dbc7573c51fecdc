"""seedlab.lm.schedule: linear warm-up to the peak, cosine decay to the floor, the default warm-up,
a config's rate at a step (the trainer's) and the mid-point."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from seedlab.errors import SeedlabError
from seedlab.lm.model import PRESETS
from seedlab.lm.schedule import default_warmup, lr_at, lr_of, midpoint
from seedlab.lm.trainer import Trainer


def test_lr_schedule_shape():
    peak, warm, total, floor = 6e-4, 200, 9536, 6e-5
    f = lambda t: lr_at(t, peak_lr=peak, warmup=warm, total=total, min_lr=floor)
    assert f(0) == 0.0
    assert f(1) == peak / warm
    assert f(warm) == peak
    assert f(total) == pytest.approx(floor, abs=1e-15) and f(total + 100) == floor
    up = [f(t) for t in range(warm + 1)]
    assert all(a < b for a, b in zip(up, up[1:]))
    down = [f(t) for t in range(warm, total + 1)]
    assert all(a > b for a, b in zip(down, down[1:]))  # strictly decreasing after warm-up
    assert f((warm + total) // 2) == pytest.approx((peak + floor) / 2, rel=1e-3)  # cosine midpoint
    assert default_warmup(200) == 200
    assert lr_at(200, peak_lr=peak, warmup=default_warmup(200), total=total) == peak
    assert lr_at(0, peak_lr=peak, warmup=0, total=10) == peak
    with pytest.raises(SeedlabError, match="total"):
        lr_at(0, peak_lr=peak, warmup=10, total=5)
    with pytest.raises(SeedlabError, match="min_lr"):
        lr_at(0, peak_lr=peak, warmup=10, total=20, min_lr=1.0)


@dataclass
class Design:
    """A config with a schedule (the trainer's Settings): the warm-up defaults to the injection step."""

    steps: int = 12
    peak_lr: float = 1e-2
    min_lr: float = 1e-3
    injection_step: int = 4
    warmup: int | None = None
    decay_steps: int | None = None
    batch_size: int = 4
    micro_batch: int | None = None
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    device: str = "cpu"
    precision: str = "fp32"

    @property
    def warmup_steps(self) -> int:
        return self.warmup or default_warmup(self.injection_step)


def _before(step, peak_lr, warmup, total, min_lr):
    """The schedule as it was before decay_steps (the cosine ending at total), kept here to hold it bit for bit."""
    import math

    if step < warmup:
        return peak_lr * step / warmup
    if step == warmup:
        return peak_lr
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak_lr - min_lr)


def test_no_decay_length_is_the_schedule_before_it_bit_for_bit():
    for peak, warm, total, floor in ((6e-4, 200, 9536, 6e-5), (1e-2, 100, 300, 1e-3), (1e-2, 100, 1100, 1e-3)):
        for t in range(total + 5):
            want = _before(t, peak, warm, total, floor).hex()
            assert lr_at(t, peak_lr=peak, warmup=warm, total=total, min_lr=floor).hex() == want
            assert lr_at(t, peak_lr=peak, warmup=warm, total=total, min_lr=floor, decay=total).hex() == want


def test_a_decay_shorter_than_the_run_ends_at_the_floor_and_a_longer_one_is_cut_by_the_run():
    kw = dict(peak_lr=1e-2, warmup=100, min_lr=1e-3)
    floor = [lr_at(t, total=1100, decay=300, **kw) for t in range(1100)]
    short = [lr_at(t, total=300, **kw) for t in range(300)]
    assert floor[:300] == short  # scale-b16's rate at every update to its end
    assert floor[300:] == [1e-3] * 800  # then the floor
    assert floor[299] > 1e-3 and floor[100] == 1e-2
    mirror = [lr_at(t, total=300, decay=1100, **kw) for t in range(300)]
    long = [lr_at(t, total=1100, **kw) for t in range(1100)]
    assert mirror == long[:300]  # the long cell's rates, the run stopped at 300
    assert mirror[-1] == pytest.approx(9.1e-3, abs=1e-4)
    # summed over the updates after s = 100: scale-b16 1.10, the long cell 5.0x it, its two halves ~1.7-1.8x
    after = lambda r: sum(r[100:])
    assert after(long) / after(short) == pytest.approx(4.98, abs=0.01)
    assert after(floor) / after(short) == pytest.approx(1.72, abs=0.01)
    assert after(mirror) / after(short) == pytest.approx(1.76, abs=0.01)
    with pytest.raises(SeedlabError, match=r"^decay: must be >= warmup=100, got 50$"):
        lr_at(0, total=300, decay=50, **kw)


def test_lr_of_reads_decay_steps_and_a_config_without_it_decays_to_its_steps():
    from types import SimpleNamespace

    from seedlab.lm.schedule import decay_end

    cfg = Design(steps=12, decay_steps=8)
    assert [lr_of(cfg, t) for t in range(12)] == [
        lr_at(t, peak_lr=1e-2, warmup=4, total=12, min_lr=1e-3, decay=8) for t in range(12)]
    assert lr_of(cfg, 8) == lr_of(cfg, 11) == 1e-3 and lr_of(Design(), 8) > 1e-3
    old = SimpleNamespace(steps=12, peak_lr=1e-2, min_lr=1e-3, warmup_steps=4)  # no such field: as before it
    assert [lr_of(old, t) for t in range(14)] == [lr_of(Design(), t) for t in range(14)]
    assert (decay_end(old), decay_end(cfg), decay_end(Design())) == (12, 8, 12)


def test_lr_of_is_lr_at_with_the_configs_schedule():
    for cfg, warm in ((Design(), 4), (Design(warmup=2), 2)):
        assert [lr_of(cfg, t) for t in range(16)] == [
            lr_at(t, peak_lr=cfg.peak_lr, warmup=warm, total=cfg.steps, min_lr=cfg.min_lr) for t in range(16)]
    assert lr_of(Design(), 4) == 1e-2  # the default warm-up: the injected update at exactly the peak
    with pytest.raises(SeedlabError, match="total"):
        lr_of(Design(steps=3), 0)


@pytest.mark.parametrize("decay", [None, 4, 9])
def test_trainer_lr_is_lr_of_its_config_at_its_step(decay):
    cfg = Design(steps=6, injection_step=2, decay_steps=decay)
    gcfg = PRESETS["mini"].model_copy(update={"n_layer": 1, "n_embd": 16, "block_size": 8})
    tokens = np.random.default_rng(0).integers(0, 256, size=1000).astype(np.uint16)
    t = Trainer(cfg, gcfg, 0, tokens)
    for step in range(cfg.steps + 1):
        assert t.step == step and t.lr == lr_of(cfg, step)
        t.advance()
        assert {g["lr"] for g in t.opt.param_groups} == {lr_of(cfg, step)}  # the rate the update ran at
    if decay == 4:
        assert t.lr == lr_of(cfg, 5) == 1e-3  # at the floor after step 4


def test_midpoint_is_named_or_half_way():
    assert midpoint(4, 14) == 9
    assert midpoint(4, 15) == 9  # rounded down
    assert midpoint(200, 9536, 5050) == 5050  # a named mid-point wins
    assert midpoint(4, 14, None) == 9
