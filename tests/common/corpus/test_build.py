"""seedlab.corpus.build: ``prepare`` writes train/held-out token files, a pure function of the source and seed."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from seedlab.corpus import build, corpus
from seedlab.errors import SeedlabError


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_prepare_roundtrip(tmp_path, docs, kind, tokenizer):
    documents = docs.documents()
    src = docs.write(tmp_path, kind, documents)
    meta = build.prepare(src, tmp_path / "c", tokenizer=tokenizer, heldout_fraction=0.1, vocab_size=300, seed=1)
    c = corpus.load(tmp_path / "c")
    assert c.meta == meta
    assert meta["splits"]["train"]["documents"] + meta["splits"]["heldout"]["documents"] == len(documents)
    assert meta["splits"]["heldout"]["documents"] == 6
    assert meta["tokenizer"]["name"] == tokenizer
    assert meta["python_version"] == platform.python_version()
    assert isinstance(c.train, np.memmap) and c.train.dtype == np.uint16
    assert len(c.train) == meta["splits"]["train"]["tokens"]
    assert int(c.train[-1]) == c.eot_id and int(c.heldout[-1]) == c.eot_id
    if tokenizer == "bpe":
        assert (tmp_path / "c" / "tokenizer.json").is_file() and c.vocab_size <= 300
    else:
        assert c.vocab_size == 257 and c.eot_id == 256
    text = "Jimmie Nicol — Café naïve, ünïcödé!\n  two  spaces\tand a tab"
    assert c.decode(c.encode(text)) == text
    # every document comes back exactly, each in one split
    got = list(c.documents("train")) + list(c.documents("heldout"))
    assert sorted(got) == sorted(documents)


def test_heldout_never_in_train_and_split_is_pure_function_of_seed(tmp_path, docs):
    documents = docs.documents(80)
    src = docs.write(tmp_path, "jsonl", documents)
    m1 = build.prepare(src, tmp_path / "a", seed=7, heldout_fraction=0.2)
    m2 = build.prepare(src, tmp_path / "b", seed=7, heldout_fraction=0.2)
    m3 = build.prepare(src, tmp_path / "c", seed=8, heldout_fraction=0.2)
    assert m1["splits"] == m2["splits"]
    a, c3 = corpus.load(tmp_path / "a"), corpus.load(tmp_path / "c")
    train, held = set(a.documents("train")), set(a.documents("heldout"))
    assert len(held) == 16 and not (train & held) and len(train) == 64
    assert set(c3.documents("heldout")) != held
    assert m3["splits"]["train"]["sha256"] != m1["splits"]["train"]["sha256"]
    # the helper itself: pure, sorted, disjoint
    idx = build.split_indices(80, 0.2, 7)
    assert np.array_equal(idx, build.split_indices(80, 0.2, 7)) and np.all(np.diff(idx) > 0)
    assert held == {documents[i] for i in idx}
    # training documents keep their source order
    assert list(a.documents("train")) == [d for i, d in enumerate(documents) if i not in set(idx.tolist())]


def test_bad_input_is_one_line(tmp_path, docs):
    src = docs.write(tmp_path, "txt", docs.documents())
    with pytest.raises(SeedlabError, match="tokenizer: one of bytes, bpe, gpt2"):
        build.prepare(src, tmp_path / "c", tokenizer="wordpiece")
    with pytest.raises(SeedlabError, match="heldout_fraction"):
        build.prepare(src, tmp_path / "c", heldout_fraction=1.5)
    with pytest.raises(SeedlabError, match="is neither a file"):
        build.prepare(tmp_path / "missing.txt", tmp_path / "c")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(SeedlabError, match=r"bad\.jsonl:2: needs a string 'text' field"):
        build.prepare(bad, tmp_path / "c")
