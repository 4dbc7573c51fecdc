"""twins/heldout.py: the held-out split's reserved slice (the ordinary rows' source) and every evaluation and probe
row are disjoint, as token-position ranges, for the shipped presets' layouts and for the rows measure really reads;
the ordinary rows lie inside the slice and apart from each other. (The twins study has no query rows: the held-out
split's only other readers are the evaluation and probe rows.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from seedlab.config import load_config, parse
from seedlab.errors import SeedlabError
from seedlab.twins.config import MeasureConfig, TwinsConfig
from seedlab.twins.heldout import (RESERVED_ROWS, evaluation_ranges, evaluation_rows, ordinary_ranges, ordinary_rows,
                                   reserved)


def _disjoint(a: range, b: range) -> bool:
    return a.stop <= b.start or b.stop <= a.start


def _check_layout(n: int, block: int, m: MeasureConfig, length: int, k: int, seed: int = 0) -> None:
    res = reserved(n, block)
    assert res.stop == n and len(res) == RESERVED_ROWS * (block + 1)
    rows = evaluation_ranges(n, m.seed, m.heldout_rows, block)
    probes = rows[: m.probe_rows]  # CKA's probe batch: the first evaluation rows
    assert len(rows) == m.heldout_rows and len(probes) == min(m.probe_rows, m.heldout_rows)
    for r in rows:
        assert 0 <= r.start and r.stop <= res.start and len(r) == block + 1 and _disjoint(r, res)
    ordinary = ordinary_ranges(n, block, length, k, seed)
    assert len(ordinary) == k
    for i, o in enumerate(ordinary):
        assert res.start <= o.start and o.stop <= res.stop and len(o) == length
        assert all(_disjoint(o, r) for r in rows)  # no evaluation (or probe) row reads an ordinary row's token
        assert all(_disjoint(o, p) for p in ordinary[i + 1:])  # each a different stretch


@pytest.mark.parametrize("preset, heldout_tokens, length", [
    ("mini", 33_107, 78),  # the embedded BPE corpus's held-out split, the fabricated passage's length
    ("mini-long", 33_107, 78),
    ("gpt2-124m", 10_000_000, 194),  # OpenWebText's held-out split: millions of tokens
])
def test_the_presets_reserved_slice_is_apart_from_every_evaluation_and_probe_row(preset, heldout_tokens, length):
    cfg, _ = load_config(TwinsConfig, "twins", preset)
    block = cfg.block_size
    for seed in (0, 1, 7):  # measure.seed: which rows are drawn
        m = cfg.measure.model_copy(update={"seed": seed})
        _check_layout(heldout_tokens, block, m, length, cfg.nulls.ordinary_rows)


def test_the_rows_measure_reads_are_those_ranges(twins_inputs):
    """twins.measure.Evaluator's held-out rows and probe batch are the tokens at evaluation_ranges (on the test
    corpus), and the ordinary rows are the tokens at ordinary_ranges, none of them shared."""
    from seedlab.corpus import load
    from seedlab.twins.measure import Evaluator

    corpus = load(twins_inputs[0])
    held, block = corpus.heldout, 128
    m = MeasureConfig(heldout_rows=32, probe_rows=8)
    cfg = parse(TwinsConfig, {"corpus": str(twins_inputs[0]), "block_size": block, "measure": m.model_dump()})
    run = SimpleNamespace(cfg=cfg, gcfg=cfg.gpt_config(corpus.vocab_size), corpus=corpus)
    ev = Evaluator(run, torch.device("cpu"))
    ranges = evaluation_ranges(len(held), m.seed, m.heldout_rows, block)
    want = torch.tensor(np.stack([np.asarray(held[r.start:r.stop], dtype=np.int64) for r in ranges]))
    assert torch.equal(ev.x, want[:, :-1]) and torch.equal(ev.y, want[:, 1:])
    assert torch.equal(ev.probe, ev.x[: m.probe_rows])
    assert torch.equal(evaluation_rows(held, m.seed, m.heldout_rows, block)[0], ev.x)
    _check_layout(len(held), block, m, 60, 8)
    rows = ordinary_rows(held, block, 60, 8, 0)
    spans = ordinary_ranges(len(held), block, 60, 8, 0)
    assert rows == [held[r.start:r.stop].tolist() for r in spans]


def test_a_split_too_small_and_too_many_rows_are_one_line_errors():
    with pytest.raises(SeedlabError, match=r"^corpus: its held-out split has 4000 tokens; the ordinary rows' reserved "
                                           r"slice takes 4128 \(32 rows of block_size \+ 1 = 129\)"):
        reserved(4000, 128)
    slots = RESERVED_ROWS * 129 // 100
    assert len(ordinary_ranges(50_000, 128, 100, slots, 0)) == slots  # every slot of the grid
    with pytest.raises(SeedlabError, match=rf"^nulls.ordinary_rows: {slots + 1} ordinary rows of 100 tokens do not fit"):
        ordinary_ranges(50_000, 128, 100, slots + 1, 0)
