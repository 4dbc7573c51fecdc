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


def test_lr_of_is_lr_at_with_the_configs_schedule():
    for cfg, warm in ((Design(), 4), (Design(warmup=2), 2)):
        assert [lr_of(cfg, t) for t in range(16)] == [
            lr_at(t, peak_lr=cfg.peak_lr, warmup=warm, total=cfg.steps, min_lr=cfg.min_lr) for t in range(16)]
    assert lr_of(Design(), 4) == 1e-2  # the default warm-up: the injected update at exactly the peak
    with pytest.raises(SeedlabError, match="total"):
        lr_of(Design(steps=3), 0)


def test_trainer_lr_is_lr_of_its_config_at_its_step():
    cfg = Design(steps=6, injection_step=2)
    gcfg = PRESETS["mini"].model_copy(update={"n_layer": 1, "n_embd": 16, "block_size": 8})
    tokens = np.random.default_rng(0).integers(0, 256, size=1000).astype(np.uint16)
    t = Trainer(cfg, gcfg, 0, tokens)
    for step in range(cfg.steps + 1):
        assert t.step == step and t.lr == lr_of(cfg, step)
        t.advance()
        assert {g["lr"] for g in t.opt.param_groups} == {lr_of(cfg, step)}  # the rate the update ran at


def test_midpoint_is_named_or_half_way():
    assert midpoint(4, 14) == 9
    assert midpoint(4, 15) == 9  # rounded down
    assert midpoint(200, 9536, 5050) == 5050  # a named mid-point wins
    assert midpoint(4, 14, None) == 9
