"""seedlab.corpus.sources: Hugging Face datasets read like the plain files; parquet shards (OpenWebText as the Hub
converts it) streamed; the embedded (offline) corpus; bad sources -> one line."""

from __future__ import annotations

import platform
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
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


def test_parquet_shards_are_streamed_in_order(tmp_path, docs, monkeypatch):
    documents = docs.documents(50)
    root = tmp_path / "owt"
    docs.shards(root, documents, shards=3, rows_per_group=4)
    texts, info = sources.load_texts(root)
    assert info["kind"] == "folder"
    assert info["files"] == [f"plain_text/train/000{k}.parquet" for k in range(3)]
    opened = []
    real = sources._open_parquet
    monkeypatch.setattr(sources, "_open_parquet", lambda p, f: opened.append(p) or real(p, f))
    it = iter(texts)
    assert next(it) == documents[0] and len(opened) == 1  # one file open, read a batch at a time
    assert len(texts) == 50  # from the footers
    assert [next(it) for _ in range(49)] == documents[1:] and next(it, None) is None
    assert list(texts) == documents  # iterating again reads again
    assert sources.read_parquet(root / "plain_text" / "train" / "0001.parquet") == documents[16:33]


def test_hf_parquet_dataset_is_streamed(tmp_path, docs):
    pytest.importorskip("datasets")
    documents = docs.documents(45)
    root = tmp_path / "owt"
    docs.shards(root, documents)
    texts = sources.load_hf_texts(str(root), "train", "text", cache_dir=str(tmp_path / "hf-cache"))
    assert isinstance(texts, sources.FileTexts) and len(texts) == 45 and list(texts) == documents
    assert not (tmp_path / "hf-cache").exists() or not any((tmp_path / "hf-cache").rglob("*.arrow"))  # no copy
    m_hf = build.prepare(f"hf:{root}", tmp_path / "hf", progress=False)
    m_dir = build.prepare(root, tmp_path / "dir", progress=False)
    assert m_hf["splits"] == m_dir["splits"] and m_hf["source"]["sha256"] == m_dir["source"]["sha256"]
    assert m_hf["source"]["kind"] == "huggingface" and len(m_hf["source"]["files"]) == 3
    with pytest.raises(SeedlabError, match=r"has no split 'test' \(splits: train\)"):
        sources.load_hf_texts(str(root), "test", "text")
    with pytest.raises(SeedlabError, match=r"0000\.parquet: cannot read a 'body' column"):
        sources.load_hf_texts(str(root), "train", "body")


class _FakeBuilder:
    def __init__(self, files):
        self.config = SimpleNamespace(data_files={"train": files})


def test_openwebtext_reads_the_hubs_parquet_conversion(tmp_path, docs, monkeypatch):
    """``openwebtext`` asks datasets for the train files of Skylion007/openwebtext at refs/convert/parquet
    and streams them by URL (here fsspec's in-memory filesystem stands in for the Hub's ``hf://``)."""
    datasets = pytest.importorskip("datasets")
    import fsspec

    documents = docs.documents(60)
    local = docs.shards(tmp_path / "owt", documents)
    fs = fsspec.filesystem("memory")
    urls = []
    for f in sorted(local.iterdir()):
        fs.pipe(f"/owt-test/plain_text/train/{f.name}", f.read_bytes())
        urls.append(f"memory://owt-test/plain_text/train/{f.name}")
    asked = []

    def builder(name, revision=None, cache_dir=None):
        asked.append((name, revision))
        return _FakeBuilder(urls)

    monkeypatch.setattr(datasets, "load_dataset_builder", builder)
    try:
        texts, info = sources.load_texts("openwebtext")
        assert asked == [("Skylion007/openwebtext", "refs/convert/parquet")]
        assert info["revision"] == "refs/convert/parquet" and info["files"] == urls
        assert len(texts) == 60 and list(texts) == documents
        m_hub = build.prepare("openwebtext", tmp_path / "hub", progress=False)
        m_local = build.prepare(local, tmp_path / "local", progress=False)
        assert m_hub["splits"] == m_local["splits"]
        assert sources.load_texts("hf:someone/data@v1.0")[1]["revision"] == "v1.0"
        assert "partial" not in info and "partial" not in m_hub["source"]
        # a partial conversion (the Hub converts only the first ~5 GB of some datasets) is refused unless asked for
        for f in local.iterdir():
            fs.pipe(f"/owt-test/plain_text/partial-train/{f.name}", f.read_bytes())
        urls[:] = [u.replace("/train/", "/partial-train/") for u in urls]
        with pytest.raises(SeedlabError, match=r"^source: dataset 'Skylion007/openwebtext' is a partial parquet "
                                               r"conversion \(3 of 3 files lie under partial-train/: .*--allow-partial") as e:
            sources.load_texts("openwebtext")
        assert "\n" not in str(e.value)
        with pytest.raises(SeedlabError, match=r"--allow-partial"):
            build.prepare("openwebtext", tmp_path / "refused", progress=False)
        assert not (tmp_path / "refused").exists()  # nothing written
        texts, info = sources.load_texts("openwebtext", allow_partial=True)
        assert info["partial"] is True and list(texts) == documents
        m_partial = build.prepare("openwebtext", tmp_path / "partial", progress=False, allow_partial=True)
        assert m_partial["source"]["partial"] is True and m_partial["splits"] == m_local["splits"]
        assert corpus.load(tmp_path / "partial").meta["source"]["partial"] is True  # in meta.json
    finally:
        fs.rm("/owt-test", recursive=True)


@pytest.mark.parametrize(
    ("err", "fix"),
    [
        (
            ConnectionError("Couldn't reach 'Skylion007/openwebtext' on the Hub (ConnectError)\nmore"),
            r"needs the network; without it, download its parquet files .*hf download Skylion007/openwebtext"
            r" --repo-type dataset --revision refs/convert/parquet",
        ),
        (
            RuntimeError("Dataset scripts are no longer supported, but found openwebtext.py"),
            r"read the Hub's parquet conversion instead: hf:Skylion007/openwebtext@refs/convert/parquet",
        ),
    ],
)
def test_hub_failures_are_one_line(monkeypatch, err, fix):
    datasets = pytest.importorskip("datasets")

    def fail(*a, **k):
        raise err

    monkeypatch.setattr(datasets, "load_dataset_builder", fail)
    with pytest.raises(SeedlabError, match=r"source: cannot load dataset 'Skylion007/openwebtext' split 'train'") as e:
        sources.load_texts("hf:Skylion007/openwebtext")
    assert re.search(fix, str(e.value)) and "\n" not in str(e.value)


def test_bad_sources_are_one_line(tmp_path, docs):
    root = tmp_path / "shards"
    docs.shards(root, docs.documents(50))
    no_text = tmp_path / "no-text"
    no_text.mkdir()
    pd.DataFrame({"body": ["a", "b"]}).to_parquet(no_text / "0000.parquet")
    with pytest.raises(SeedlabError, match=r"0000\.parquet: cannot read a 'text' column \(columns: \['body'\]\)"):
        build.prepare(no_text, tmp_path / "c")
    (root / "plain_text" / "train" / "0001.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(SeedlabError, match=r"0001\.parquet: cannot read it as parquet \(ArrowInvalid"):
        build.prepare(root, tmp_path / "c")
    bad = tmp_path / "doc.csv"
    bad.write_text("text\nx\n")
    with pytest.raises(SeedlabError, match=r"doc\.csv is not a \.txt, \.jsonl or \.parquet file"):
        build.prepare(bad, tmp_path / "c")
    with pytest.raises(SeedlabError, match=r"'hf:name@' is not 'hf:NAME' or 'hf:NAME@REVISION'"):
        build.prepare("hf:name@", tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_cli_without_the_hub_exits_2_with_one_line(seedlab_cli, tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as when the Hub cannot be reached, without the retries
    rc, out, err = seedlab_cli(
        "corpus", "prepare", "openwebtext", "--out", str(tmp_path / "owt"), "--tokenizer", "bytes"
    )
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: source: cannot load dataset 'Skylion007/openwebtext'")
    assert not (tmp_path / "owt").exists()


def test_partial_conversion_in_a_folder_is_refused_unless_allowed(tmp_path, docs, seedlab_main):
    """The Hub's partial conversion downloaded to a folder (``plain_text/partial-train/*.parquet``), named by
    the folder above it or by the shards' own folder: exit 2 with one line and nothing written; with
    ``--allow-partial`` prepared, and meta.json says it is partial."""
    documents = docs.documents(45)
    root = tmp_path / "owt"
    shards = docs.shards(root, documents, split="partial-train")
    assert sources.partial_files([shards / "0000.parquet", "hf://datasets/x@refs%2Fconvert%2Fparquet/a/partial-train/0.parquet",
                                  root / "partial-notes.parquet", shards / "notes.txt"]) == [
        str(shards / "0000.parquet"), "hf://datasets/x@refs%2Fconvert%2Fparquet/a/partial-train/0.parquet"]
    for src in (root, shards):
        rc, out, err = seedlab_main("corpus", "prepare", str(src), "--out", str(tmp_path / "c"))
        assert rc == 2 and "Traceback" not in err, err
        assert err.strip().splitlines() == [err.strip().splitlines()[-1]]
        assert err.strip().startswith("error: source: folder ") and "partial parquet conversion (3 of 3 files lie under partial-train/" in err
        assert "--allow-partial" in err and not (tmp_path / "c").exists()
    with pytest.raises(SeedlabError, match=r"^source: file '.*0000\.parquet' is a partial parquet conversion \(1 of 1 files"):
        build.prepare(shards / "0000.parquet", tmp_path / "c")
    rc, out, err = seedlab_main("corpus", "prepare", str(root), "--out", str(tmp_path / "c"), "--allow-partial")
    assert rc == 0, err
    assert "PARTIAL parquet conversion" in out
    meta = corpus.load(tmp_path / "c").meta
    assert meta["source"]["partial"] is True and meta["source"]["documents"] == 45
    whole = build.prepare(docs.shards(tmp_path / "whole", documents), tmp_path / "w", progress=False)
    assert "partial" not in whole["source"] and whole["splits"] == meta["splits"]
