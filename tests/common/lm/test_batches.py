"""seedlab.lm.batches: the batch of a step is a pure function of (seed, step); the injected row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import batch_indices, check_passage, get_batch, inject
from seedlab.lm.model import GPT, PRESETS

MINI = PRESETS["mini"]


def test_batch_indices_pure_function_of_seed_and_step():
    kw = dict(n_tokens=10_000, batch_size=16, block_size=64)
    s5 = batch_indices(3, 5, **kw)
    s3 = batch_indices(3, 3, **kw)
    assert np.array_equal(batch_indices(3, 3, **kw), s3) and np.array_equal(batch_indices(3, 5, **kw), s5)
    assert not np.array_equal(s3, s5)
    assert not np.array_equal(batch_indices(4, 5, **kw), s5)
    assert s5.shape == (16,) and s5.dtype == np.int64
    big = batch_indices(0, 0, n_tokens=100, batch_size=5000, block_size=10)
    assert big.min() == 0 and big.max() == 100 - 10 - 1  # every row has block_size+1 tokens
    with pytest.raises(SeedlabError, match="corpus"):
        batch_indices(0, 0, n_tokens=10, batch_size=1, block_size=10)


def test_get_batch_reads_shifted_rows_from_memmap(tmp_path):
    data = np.arange(5000, dtype=np.uint16)
    data.tofile(tmp_path / "train.bin")
    mm = np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")
    x, y = get_batch(mm, 1, 2, 8, 32)
    assert x.shape == y.shape == (8, 32) and x.dtype == y.dtype == torch.int64
    offs = batch_indices(1, 2, n_tokens=5000, batch_size=8, block_size=32)
    assert torch.equal(x[:, 0], torch.from_numpy(offs))
    assert torch.equal(y, x + 1)
    x2, y2 = get_batch(mm, 1, 2, 8, 32)
    assert torch.equal(x, x2) and torch.equal(y, y2)


def test_inject_places_passage_and_masks_padding():
    B, T, pad = 4, 10, 999
    x = torch.arange(B * T).view(B, T)
    y = x + 1
    passage = [11, 12, 13, 14, 15]
    xi, yi, mask = inject(x, y, 2, passage, pad)
    assert torch.equal(x, torch.arange(B * T).view(B, T))  # inputs untouched
    assert xi[2].tolist() == [11, 12, 13, 14] + [pad] * 6
    assert yi[2].tolist() == [12, 13, 14, 15] + [pad] * 6
    assert mask[2].tolist() == [True] * 4 + [False] * 6
    others = [0, 1, 3]
    assert mask[others].all() and torch.equal(xi[others], x[others]) and torch.equal(yi[others], y[others])
    # a passage of exactly block_size+1 tokens fills the row with no padding
    full = list(range(T + 1))
    xf, yf, mf = inject(x, y, 0, np.array(full), pad)
    assert xf[0].tolist() == full[:-1] and yf[0].tolist() == full[1:] and mf.all()
    with pytest.raises(SeedlabError, match=r"passage: 12 tokens do not fit a row of block_size\+1 = 11"):
        inject(x, y, 0, list(range(T + 2)), pad)
    with pytest.raises(SeedlabError, match="row"):
        inject(x, y, B, passage, pad)


def test_injected_padding_does_not_affect_loss():
    m = GPT(MINI, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (3, 20), generator=g)
    y = torch.randint(0, 256, (3, 20), generator=g)
    passage = torch.randint(0, 256, (8,), generator=g)
    xa, ya, ma = inject(x, y, 1, passage, pad_id=256)
    xb, yb, mb = inject(x, y, 1, passage, pad_id=0)
    assert torch.equal(ma, mb)
    assert torch.equal(m(xa, ya, ma)[1], m(xb, yb, mb)[1])


def test_check_passage_needs_one_target_and_one_row():
    check_passage(2, 10)  # the shortest passage: one next-token target
    check_passage(11, 10)  # the longest: exactly block_size + 1 tokens
    with pytest.raises(SeedlabError, match=r"passages\.twin: 12 tokens do not fit a row of block_size\+1 = 11"):
        check_passage(12, 10, "passages.twin")
    with pytest.raises(SeedlabError, match=r"passage: needs at least 2 tokens \(one next-token target\), got 1"):
        check_passage(1, 10)
