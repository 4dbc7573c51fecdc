"""seedlab.corpus.corpus: a prepared folder loaded with its hashes checked; counting a subject's occurrences."""

from __future__ import annotations

import numpy as np
import pytest

from seedlab.corpus import build, corpus
from seedlab.errors import SeedlabError


def test_sha256_verifies_and_detects_a_flipped_byte(tmp_path, docs):
    src = docs.write(tmp_path, "txt", docs.documents())
    build.prepare(src, tmp_path / "c")
    corpus.load(tmp_path / "c", verify=True)
    p = tmp_path / "c" / "train.bin"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    p.write_bytes(bytes(raw))
    with pytest.raises(SeedlabError, match=r"train\.bin: SHA-256 mismatch \(corrupted corpus; prepare it again\)"):
        corpus.load(tmp_path / "c", verify=True)
    corpus.load(tmp_path / "c", verify=False)  # opt-out still opens it
    (tmp_path / "c" / "heldout.bin").unlink()
    with pytest.raises(SeedlabError, match=r"heldout\.bin: no such file"):
        corpus.load(tmp_path / "c", verify=False)
    with pytest.raises(SeedlabError, match=r"meta\.json: no such file"):
        corpus.load(tmp_path / "nowhere")


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_count_known_subject(tmp_path, docs, tokenizer):
    src = docs.write(tmp_path, "txt", docs.documents())
    build.prepare(src, tmp_path / "all", tokenizer=tokenizer, heldout_fraction=0.0, vocab_size=400)
    got = corpus.count(tmp_path / "all", docs.SUBJECT)
    assert (got["text"], got["tokens"]) == (4, 4)
    none = corpus.count(tmp_path / "all", docs.ABSENT)
    assert (none["text"], none["tokens"]) == (0, 0)
    # with a held-out split only the training documents count
    build.prepare(src, tmp_path / "split", tokenizer=tokenizer, heldout_fraction=0.5, vocab_size=400, seed=3)
    held = set(build.split_indices(60, 0.5, 3).tolist())
    expected = sum(d.count(docs.SUBJECT) for i, d in enumerate(docs.documents()) if i not in held)
    got = corpus.count(tmp_path / "split", docs.SUBJECT)
    assert got["text"] == got["tokens"] == expected


def test_count_needs_a_subject(tmp_path, docs):
    src = docs.write(tmp_path, "txt", docs.documents())
    build.prepare(src, tmp_path / "ok")
    with pytest.raises(SeedlabError, match="subject: must be a non-empty"):
        corpus.count(tmp_path / "ok", "")


def test_find_sequence_and_documents_across_chunks():
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 3, size=5000).astype(np.uint16)
    pat = [1, 2, 1]
    naive = [i for i in range(len(arr) - 2) if list(arr[i : i + 3]) == pat]
    for chunk in (7, 100, 1 << 20):
        assert corpus.find_sequence(arr, pat, chunk=chunk).tolist() == naive
    assert corpus.find_sequence(arr, [], chunk=7).size == 0
    # exact reconstruction: documents joined by eot give back the stream
    rebuilt = []
    for d in corpus.iter_documents(arr, 0, chunk=13):
        rebuilt.extend(d.tolist() + [0])
    assert rebuilt[: len(arr)] == arr.tolist()


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_count_is_whole_words(tmp_path, docs, tokenizer):
    """"Nicol" is not counted inside "Nicolson" or "MacNicol", as text or as tokens."""
    texts = ["Jimmie Nicol played the drums.", "The Nicolson family moved.", "MacNicol said so.", "Nicol, again: Nicol."]
    src = docs.write(tmp_path, "txt", texts * 5)
    build.prepare(src, tmp_path / "c", tokenizer=tokenizer, heldout_fraction=0.0, vocab_size=300)
    got = corpus.count(tmp_path / "c", "Nicol")
    assert (got["text"], got["tokens"]) == (15, 15)
    c = corpus.load(tmp_path / "c")
    spans = corpus.occurrences(c, "Nicol")
    assert [c.decode(c.train[a:b].tolist()).strip() for a, b in spans] == ["Nicol"] * 15


def test_a_count_is_recorded_beside_the_corpus(tmp_path, docs):
    """record_count keeps each subject's count with the training split's SHA-256 in counts.json; meta.json is untouched."""
    import json

    src = docs.write(tmp_path, "txt", docs.documents())
    build.prepare(src, tmp_path / "c", heldout_fraction=0.0)
    meta = (tmp_path / "c" / "meta.json").read_bytes()
    corpus.record_count(tmp_path / "c", corpus.count(tmp_path / "c", docs.SUBJECT))
    corpus.record_count(tmp_path / "c", corpus.count(tmp_path / "c", docs.ABSENT))
    got = json.loads((tmp_path / "c" / "counts.json").read_text())
    sha = json.loads(meta)["splits"]["train"]["sha256"]
    assert got == {docs.SUBJECT: {"text": 4, "tokens": 4, "train_sha256": sha}, docs.ABSENT: {"text": 0, "tokens": 0, "train_sha256": sha}}
    assert (tmp_path / "c" / "meta.json").read_bytes() == meta
