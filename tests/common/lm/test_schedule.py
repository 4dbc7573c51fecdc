"""seedlab.lm.schedule: linear warm-up to the peak, cosine decay to the floor, the default warm-up."""

from __future__ import annotations

import pytest

from seedlab.errors import SeedlabError
from seedlab.lm.schedule import default_warmup, lr_at


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
