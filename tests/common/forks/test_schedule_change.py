"""The schedule as its own axis in the fork design: ``decay_steps`` (where the cosine reaches min_lr, apart from the
run's length) in ForkDesign, recorded in every run's config, refused in one line (exit 2, nothing written) where the
decay would not end after the warm-up and the injection step; and forks/prefix.py's check that a kept prefix may be
reused by a design whose schedule differs only after s, and is refused, naming the field, where a rate before s
changes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from seedlab.config import load_config, with_new_defaults
from seedlab.errors import SeedlabError
from seedlab.forks.design import ForkDesign
from seedlab.forks.prefix import SCHEDULE_FIELDS, SharedPrefix, check_prefix_reuse, prefix_rates, schedule_change
from seedlab.lm.model import GPTConfig
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes

pytestmark = pytest.mark.usefixtures("one_thread")

#: a design's record as config.json holds it: scale-b16's schedule (warm-up to s = 100, the cosine to step 300)
B16 = {"corpus": "c", "model": "mini", "batch_size": 16, "steps": 300, "injection_step": 100, "peak_lr": 1e-2,
       "min_lr": 1e-3, "warmup": None, "decay_steps": None, "weight_decay": 0.1}
FIELDS = list(B16)


# ---------------------------------------------------------------- the field


def test_decay_steps_must_end_after_the_warm_up_and_the_injection_and_may_outlast_the_run():
    base = dict(corpus="c", steps=300, injection_step=100)
    assert ForkDesign(**base).decay_end == 300 and ForkDesign(**base).decay_steps is None  # null: the run's end
    assert ForkDesign(**base, decay_steps=101).decay_end == 101
    assert ForkDesign(**base, decay_steps=1100).decay_end == 1100  # the run stops part-way down
    for bad, at_least in ((100, 101), (50, 101), (1, 101)):
        with pytest.raises(ValueError, match=rf"decay_steps: the decay must end after the warm-up \(100\) and the "
                                             rf"injection step \(100\): at least {at_least}, got {bad}"):
            ForkDesign(**base, decay_steps=bad)
    with pytest.raises(ValueError, match=r"decay_steps: .* warm-up \(150\) .* at least 151, got 120"):
        ForkDesign(**base, warmup=150, decay_steps=120)  # a warm-up that ends after s: the decay after it
    assert ForkDesign(**base, warmup=50, decay_steps=101).decay_end == 101


def test_decay_steps_is_recorded_in_every_run_config_and_an_older_record_reads_it_null():
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.twins.config import TwinsConfig
    from seedlab.twins.rundir import prefix_record

    twins, _ = load_config(TwinsConfig, "twins", "mini", ["decay_steps=250"])
    bank, _ = load_config(AttributionConfig, "attribution", "mini", ["decay_steps=150"])
    assert twins.model_dump(mode="json")["decay_steps"] == 250 and prefix_record(twins)["decay_steps"] == 250
    assert bank.model_dump(mode="json")["decay_steps"] == 150
    old = {k: v for k, v in twins.model_dump(mode="json").items() if k != "decay_steps"}
    assert with_new_defaults(TwinsConfig, old)["decay_steps"] is None  # a run started before the field: resumes


@pytest.mark.parametrize("args, words", [
    (["twins", "run", "mini", "--set", "decay_steps=100"], "at least 101, got 100"),
    (["twins", "run", "mini", "--set", "decay_steps=40"], "at least 101, got 40"),
    (["twins", "run", "mini", "--set", "warmup=150", "--set", "decay_steps=120"], "at least 151, got 120"),
    (["twins", "match", "mini", "--set", "decay_steps=99"], "at least 101, got 99"),
    (["attribution", "bank", "mini", "--set", "decay_steps=60"], "at least 101, got 60"),
])
def test_a_decay_that_does_not_end_after_s_is_one_line_exit_2_nothing_written(seedlab_main, tmp_path, args, words):
    out = tmp_path / "out"
    rc, _, err = seedlab_main(*args, "--out", str(out))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: decay_steps: the decay must end after"), err
    assert lines[0].endswith(words) and "Traceback" not in err
    assert not out.exists()


# ---------------------------------------------------------------- reusing a kept prefix


def test_a_schedule_that_differs_only_after_s_keeps_every_rate_of_the_prefix():
    """With the warm-up ending at s, the decay's length, the run's and the floor change nothing before s: scale-b16,
    scale-b16-long, scale-b16-floor and scale-b16-longdecay share their prefix."""
    for change in ({"decay_steps": 1100}, {"steps": 1100}, {"steps": 1100, "decay_steps": 300},
                   {"decay_steps": 1100, "steps": 300}, {"min_lr": 0.0}, {"decay_steps": 101}):
        assert schedule_change(B16, B16 | change, 100) is None
        check_prefix_reuse(B16, B16 | change, 100, FIELDS)
    assert prefix_rates(B16, 100) == [1e-2 * t / 100 for t in range(100)]  # the warm-up's rates, t = 0 .. s-1
    assert prefix_rates(B16 | {"decay_steps": 150}, 101)[100] == 1e-2  # the update of s at the peak: not the prefix's


@pytest.mark.parametrize("kept, change, field, t", [
    ({}, {"peak_lr": 3e-3, "min_lr": 3e-4}, "peak_lr", 1),  # the warm-up's rates scale with the peak
    ({}, {"warmup": 50}, "warmup", 1),
    ({"warmup": 50}, {"decay_steps": 1100}, "decay_steps", 51),  # the decay starts before s: a longer one moves it
    ({"warmup": 50}, {"steps": 1100}, "steps", 51),
    ({"warmup": 50}, {"min_lr": 0.0}, "min_lr", 51),
])
def test_a_schedule_change_before_s_is_refused_naming_the_field(kept, change, field, t):
    a, b = B16 | kept, B16 | kept | change
    why = schedule_change(a, b, 100)
    assert why.startswith(f"{field}: {a[field]!r} -> {b[field]!r} changes the rate of update t = {t} (")
    assert why.endswith("before the fork step s = 100")
    with pytest.raises(SeedlabError, match=rf"^{field}: .* before the fork step s = 100: not the schedule of the kept "
                                           r"prefix \(only the schedule after s may differ\)$"):
        check_prefix_reuse(a, b, 100, FIELDS)


def test_a_change_outside_the_schedule_is_refused_naming_the_field():
    assert "batch_size" not in SCHEDULE_FIELDS
    with pytest.raises(SeedlabError, match=r"^batch_size: this design has 64, against 16 for the prefixes kept in X "
                                           r"\(only the schedule after s may differ\)$"):
        check_prefix_reuse(B16, B16 | {"batch_size": 64, "decay_steps": 1100}, 100, FIELDS,
                           what="the prefixes kept in X")


GCFG = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
TOKENS = np.random.default_rng(0).integers(0, 16, 400).astype(np.uint16)


def _settings(**over) -> SimpleNamespace:
    cfg = dict(steps=12, batch_size=2, micro_batch=None, peak_lr=1e-2, min_lr=1e-3, weight_decay=0.1, beta1=0.9,
               beta2=0.95, grad_clip=1.0, device="cpu", precision="fp32", warmup_steps=4, decay_steps=None)
    return SimpleNamespace(**cfg | over)


def _record(cfg: SimpleNamespace) -> dict:
    return {"steps": cfg.steps, "peak_lr": cfg.peak_lr, "min_lr": cfg.min_lr, "warmup": cfg.warmup_steps,
            "injection_step": 4, "decay_steps": cfg.decay_steps}


def test_the_check_agrees_with_training_a_kept_prefix_is_the_other_schedules_own(tmp_path):
    """What the check passes trains the same prefix bit for bit (the rates are all it reads of the schedule), and
    the runs part after s; what it refuses trains another."""
    path = tmp_path / "prefix.safetensors"
    kept, _ = SharedPrefix(path, lambda: Trainer(_settings(), GCFG, 0, TOKENS), 4).kept()
    for over, same in (({"decay_steps": 20, "steps": 24}, True), ({"decay_steps": 6}, True), ({"min_lr": 0.0}, True),
                       ({"peak_lr": 5e-3}, False), ({"warmup_steps": 2, "decay_steps": 20}, False)):
        other = _settings(**over)
        assert (schedule_change(_record(_settings()), _record(other), 4) is None) == same
        own, _ = SharedPrefix(None, lambda other=other: Trainer(other, GCFG, 0, TOKENS), 4).kept()
        assert (tensor_hashes(own.weights()) == tensor_hashes(kept.weights())) == same, over
        if same:  # read back from the kept file by the other schedule's trainer, it goes on on its own rates
            reader = Trainer(other, GCFG, 0, TOKENS)
            SharedPrefix(path, lambda reader=reader: reader, 4).kept()
            assert reader.lr == own.lr
