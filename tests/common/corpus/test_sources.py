"""seedlab.corpus.sources: Hugging Face datasets read like the plain files; the embedded (offline) corpus."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from seedlab.corpus import build, corpus, sources
from seedlab.errors import SeedlabError


def test_hf_datasets_path_matches_plain_reader(tmp_path, docs):
    pytest.importorskip("datasets")
    documents = docs.documents(45)
    src = docs.write(tmp_path, "jsonl", documents)
    cache = str(tmp_path / "hf-cache")
    texts = sources.load_hf_texts(str(src), "train", "text", cache_dir=cache)
    assert len(texts) == 45 and list(texts) == sources.read_jsonl(src) == documents
    m_hf = build.prepare(f"hf:{src}", tmp_path / "hf", cache_dir=cache)
    m_plain = build.prepare(src, tmp_path / "plain")
    assert m_hf["splits"] == m_plain["splits"]
    assert m_hf["source"]["kind"] == "huggingface"
    assert np.array_equal(corpus.load(tmp_path / "hf").train, corpus.load(tmp_path / "plain").train)
    pq = docs.write(tmp_path, "parquet", documents)
    assert list(sources.load_hf_texts(str(pq), "train", "text", cache_dir=cache)) == documents
    with pytest.raises(SeedlabError, match="no 'body' column"):
        sources.load_hf_texts(str(src), "train", "body", cache_dir=cache)


def test_embedded_corpus_is_deterministic(tmp_path):
    m1 = build.prepare("embedded", tmp_path / "a", max_bytes=150_000)
    m2 = build.prepare("embedded", tmp_path / "b", max_bytes=150_000)
    assert m1["splits"] == m2["splits"] and m1["source"]["sha256"] == m2["source"]["sha256"]
    assert m1["python_version"] == platform.python_version()
    assert m1["source"]["kind"] == "embedded"
    assert 50_000 < m1["splits"]["train"]["tokens"] + m1["splits"]["heldout"]["tokens"] <= 150_000 + 1000
    texts = sources.embedded_texts(max_bytes=150_000)
    assert texts == sources.embedded_texts(max_bytes=150_000) and len(texts) >= 5
