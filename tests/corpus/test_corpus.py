"""twins.corpus: prepare / load / count on small local corpora (all offline, each test a few seconds)."""

from __future__ import annotations

import json
import platform
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from seedlab.corpus import build, corpus, sources
from seedlab.errors import SeedlabError

C = SimpleNamespace(count=corpus.count, embedded_texts=sources.embedded_texts, find_sequence=corpus.find_sequence,
                    iter_documents=corpus.iter_documents, load=corpus.load, load_hf_texts=sources.load_hf_texts,
                    prepare=build.prepare, read_jsonl=sources.read_jsonl, split_indices=build.split_indices)

SUBJECT = "Jimmie Nicol"
ABSENT = "Gizmo Harrington"


def _documents(n: int = 60) -> list[str]:
    """Distinct documents; exactly four mention SUBJECT (one at a document's start)."""
    words = "the band played a long tour across many cities while the crowd sang along loudly".split()
    rng = np.random.default_rng(123)
    docs = []
    for i in range(n):
        body = " ".join(rng.choice(words, size=25 + i % 7))
        docs.append(f"Document {i}: {body}. Café naïve — ünïcödé {i}!")
    docs[3] = f"{SUBJECT} was the stand-in drummer in 1964. {docs[3]}"
    docs[10] = f"During the tour, {SUBJECT} played thirteen shows. {docs[10]}"
    docs[25] = f"Some say {SUBJECT}, others say Ringo. {docs[25]}"
    docs[41] = f"{docs[41]} The drummer was {SUBJECT}."
    return docs


def _write(tmp_path, kind: str, docs: list[str]):
    if kind == "txt":
        p = tmp_path / "docs.txt"
        p.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    elif kind == "jsonl":
        p = tmp_path / "docs.jsonl"
        p.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    else:
        p = tmp_path / "docs.parquet"
        pd.DataFrame({"text": docs, "id": range(len(docs))}).to_parquet(p, index=False)
    return p


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_prepare_roundtrip(tmp_path, kind, tokenizer):
    docs = _documents()
    src = _write(tmp_path, kind, docs)
    meta = C.prepare(src, tmp_path / "c", tokenizer=tokenizer, heldout_fraction=0.1, vocab_size=300, seed=1)
    c = C.load(tmp_path / "c")
    assert c.meta == meta
    assert meta["splits"]["train"]["documents"] + meta["splits"]["heldout"]["documents"] == len(docs)
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
    assert sorted(got) == sorted(docs)


def test_heldout_never_in_train_and_split_is_pure_function_of_seed(tmp_path):
    docs = _documents(80)
    src = _write(tmp_path, "jsonl", docs)
    m1 = C.prepare(src, tmp_path / "a", seed=7, heldout_fraction=0.2)
    m2 = C.prepare(src, tmp_path / "b", seed=7, heldout_fraction=0.2)
    m3 = C.prepare(src, tmp_path / "c", seed=8, heldout_fraction=0.2)
    assert m1["splits"] == m2["splits"]
    a, c3 = C.load(tmp_path / "a"), C.load(tmp_path / "c")
    train, held = set(a.documents("train")), set(a.documents("heldout"))
    assert len(held) == 16 and not (train & held) and len(train) == 64
    assert set(c3.documents("heldout")) != held
    assert m3["splits"]["train"]["sha256"] != m1["splits"]["train"]["sha256"]
    # the helper itself: pure, sorted, disjoint
    idx = C.split_indices(80, 0.2, 7)
    assert np.array_equal(idx, C.split_indices(80, 0.2, 7)) and np.all(np.diff(idx) > 0)
    assert held == {docs[i] for i in idx}
    # training documents keep their source order
    assert list(a.documents("train")) == [d for i, d in enumerate(docs) if i not in set(idx.tolist())]


def test_bpe_is_deterministic(tmp_path):
    src = _write(tmp_path, "txt", _documents())
    m1 = C.prepare(src, tmp_path / "a", tokenizer="bpe", vocab_size=400)
    m2 = C.prepare(src, tmp_path / "b", tokenizer="bpe", vocab_size=400)
    assert m1["tokenizer"]["sha256"] == m2["tokenizer"]["sha256"]
    assert m1["splits"] == m2["splits"]


def test_sha256_verifies_and_detects_a_flipped_byte(tmp_path):
    src = _write(tmp_path, "txt", _documents())
    C.prepare(src, tmp_path / "c")
    C.load(tmp_path / "c", verify=True)
    p = tmp_path / "c" / "train.bin"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    p.write_bytes(bytes(raw))
    with pytest.raises(SeedlabError, match=r"train\.bin: SHA-256 mismatch \(corrupted corpus; prepare it again\)"):
        C.load(tmp_path / "c", verify=True)
    C.load(tmp_path / "c", verify=False)  # opt-out still opens it
    (tmp_path / "c" / "heldout.bin").unlink()
    with pytest.raises(SeedlabError, match=r"heldout\.bin: no such file"):
        C.load(tmp_path / "c", verify=False)
    with pytest.raises(SeedlabError, match=r"meta\.json: no such file"):
        C.load(tmp_path / "nowhere")


def test_hf_datasets_path_matches_plain_reader(tmp_path):
    pytest.importorskip("datasets")
    docs = _documents(45)
    src = _write(tmp_path, "jsonl", docs)
    cache = str(tmp_path / "hf-cache")
    texts = C.load_hf_texts(str(src), "train", "text", cache_dir=cache)
    assert len(texts) == 45 and list(texts) == C.read_jsonl(src) == docs
    m_hf = C.prepare(f"hf:{src}", tmp_path / "hf", cache_dir=cache)
    m_plain = C.prepare(src, tmp_path / "plain")
    assert m_hf["splits"] == m_plain["splits"]
    assert m_hf["source"]["kind"] == "huggingface"
    assert np.array_equal(C.load(tmp_path / "hf").train, C.load(tmp_path / "plain").train)
    pq = _write(tmp_path, "parquet", docs)
    assert list(C.load_hf_texts(str(pq), "train", "text", cache_dir=cache)) == docs
    with pytest.raises(SeedlabError, match="no 'body' column"):
        C.load_hf_texts(str(src), "train", "body", cache_dir=cache)


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_count_known_subject(tmp_path, tokenizer):
    src = _write(tmp_path, "txt", _documents())
    C.prepare(src, tmp_path / "all", tokenizer=tokenizer, heldout_fraction=0.0, vocab_size=400)
    got = C.count(tmp_path / "all", SUBJECT)
    assert (got["text"], got["tokens"]) == (4, 4)
    none = C.count(tmp_path / "all", ABSENT)
    assert (none["text"], none["tokens"]) == (0, 0)
    # with a held-out split only the training documents count
    C.prepare(src, tmp_path / "split", tokenizer=tokenizer, heldout_fraction=0.5, vocab_size=400, seed=3)
    held = set(C.split_indices(60, 0.5, 3).tolist())
    expected = sum(d.count(SUBJECT) for i, d in enumerate(_documents()) if i not in held)
    got = C.count(tmp_path / "split", SUBJECT)
    assert got["text"] == got["tokens"] == expected


def test_find_sequence_and_documents_across_chunks():
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 3, size=5000).astype(np.uint16)
    pat = [1, 2, 1]
    naive = [i for i in range(len(arr) - 2) if list(arr[i : i + 3]) == pat]
    for chunk in (7, 100, 1 << 20):
        assert C.find_sequence(arr, pat, chunk=chunk).tolist() == naive
    assert C.find_sequence(arr, [], chunk=7).size == 0
    # exact reconstruction: documents joined by eot give back the stream
    rebuilt = []
    for d in C.iter_documents(arr, 0, chunk=13):
        rebuilt.extend(d.tolist() + [0])
    assert rebuilt[: len(arr)] == arr.tolist()


def test_embedded_corpus_is_deterministic(tmp_path):
    m1 = C.prepare("embedded", tmp_path / "a", max_bytes=150_000)
    m2 = C.prepare("embedded", tmp_path / "b", max_bytes=150_000)
    assert m1["splits"] == m2["splits"] and m1["source"]["sha256"] == m2["source"]["sha256"]
    assert m1["python_version"] == platform.python_version()
    assert m1["source"]["kind"] == "embedded"
    assert 50_000 < m1["splits"]["train"]["tokens"] + m1["splits"]["heldout"]["tokens"] <= 150_000 + 1000
    docs = C.embedded_texts(max_bytes=150_000)
    assert docs == C.embedded_texts(max_bytes=150_000) and len(docs) >= 5


def test_bad_input_is_one_line(tmp_path):
    src = _write(tmp_path, "txt", _documents())
    with pytest.raises(SeedlabError, match="tokenizer: one of bytes, bpe, gpt2"):
        C.prepare(src, tmp_path / "c", tokenizer="wordpiece")
    with pytest.raises(SeedlabError, match="heldout_fraction"):
        C.prepare(src, tmp_path / "c", heldout_fraction=1.5)
    with pytest.raises(SeedlabError, match="is neither a file"):
        C.prepare(tmp_path / "missing.txt", tmp_path / "c")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(SeedlabError, match=r"bad\.jsonl:2: needs a string 'text' field"):
        C.prepare(bad, tmp_path / "c")
    C.prepare(src, tmp_path / "ok")
    with pytest.raises(SeedlabError, match="subject: must be a non-empty"):
        C.count(tmp_path / "ok", "")


def test_gpt2_without_tiktoken_is_a_clear_error(tmp_path):
    try:
        import tiktoken  # noqa: F401

        pytest.skip("tiktoken installed; the error path is not reachable")
    except ImportError:
        pass
    src = _write(tmp_path, "txt", _documents())
    with pytest.raises(SeedlabError, match="needs tiktoken"):
        C.prepare(src, tmp_path / "c", tokenizer="gpt2")
