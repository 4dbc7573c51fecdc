"""A prepared corpus (see build.py) as one object: memory-mapped splits, the manifest and the
tokenizer. ``load`` opens it (verifying the SHA-256 of every file); ``count`` says how often a
subject occurs in the training split.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seedlab.corpus.tokenizers import tokenizer_for
from seedlab.errors import SeedlabError
from seedlab.store import file_sha256, write_json

_CHUNK = 1 << 23  # tokens read per chunk when scanning a split


@dataclass
class Corpus:
    """A prepared corpus: memory-mapped splits, the manifest and its tokenizer."""

    path: Path
    meta: dict[str, Any]
    train: np.ndarray
    heldout: np.ndarray
    tokenizer: Any = field(repr=False)

    @property
    def eot_id(self) -> int:
        return int(self.meta["tokenizer"]["eot_id"])

    @property
    def vocab_size(self) -> int:
        return int(self.meta["tokenizer"]["vocab_size"])

    def split_hashes(self) -> dict[str, str]:
        """``{split: SHA-256}`` of every split's token file, as meta.json records them (what a run
        folder's inputs.json keeps as ``corpus_sha256``, to tell the corpus it was trained on)."""
        return {name: s["sha256"] for name, s in self.meta["splits"].items()}

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(ids)

    def documents(self, split: str = "train") -> Iterator[str]:
        """Decoded documents of a split, in order."""
        for ids in iter_documents(self.split(split), self.eot_id):
            yield self.decode(ids)

    def split(self, name: str) -> np.ndarray:
        if name not in ("train", "heldout"):
            raise SeedlabError(f"split: 'train' or 'heldout', got {name!r}")
        return self.train if name == "train" else self.heldout


def load(corpus_dir: str | Path, verify: bool = True) -> Corpus:
    """Open a prepared corpus; ``verify`` recomputes the SHA-256 of every file against meta.json."""
    d = Path(corpus_dir)
    mpath = d / "meta.json"
    if not mpath.is_file():
        raise SeedlabError(f"{mpath}: no such file (not a prepared corpus; run prepare first)")
    try:
        meta = json.loads(mpath.read_text())
        dtype = np.dtype(meta["dtype"])
        splits = meta["splits"]
        _ = meta["tokenizer"]["name"], meta["tokenizer"]["eot_id"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise SeedlabError(f"{mpath}: not a corpus manifest (prepare it again)") from None
    arrays = {}
    for name in ("train", "heldout"):
        s = splits[name]
        p = d / s["file"]
        if not p.is_file():
            raise SeedlabError(f"{p}: no such file (incomplete corpus; prepare it again)")
        if p.stat().st_size != int(s["tokens"]) * dtype.itemsize:
            raise SeedlabError(f"{p}: size does not match meta.json (corrupted corpus; prepare it again)")
        if verify and file_sha256(p) != s["sha256"]:
            raise SeedlabError(f"{p}: SHA-256 mismatch (corrupted corpus; prepare it again)")
        arrays[name] = (
            np.memmap(p, dtype=dtype, mode="r", shape=(int(s["tokens"]),)) if int(s["tokens"]) else np.zeros(0, dtype)
        )
    tf = meta["tokenizer"].get("file")
    if verify and tf:
        tp = d / tf
        if not tp.is_file():
            raise SeedlabError(f"{tp}: no such file (incomplete corpus; prepare it again)")
        if file_sha256(tp) != meta["tokenizer"]["sha256"]:
            raise SeedlabError(f"{tp}: SHA-256 mismatch (corrupted corpus; prepare it again)")
    tok = tokenizer_for(d, meta)
    return Corpus(path=d, meta=meta, train=arrays["train"], heldout=arrays["heldout"], tokenizer=tok)


def iter_documents(arr: np.ndarray, eot_id: int, chunk: int = _CHUNK) -> Iterator[np.ndarray]:
    """Token arrays of the documents of a stream (split at end-of-text), read chunk by chunk."""
    carry = np.zeros(0, dtype=arr.dtype)
    for start in range(0, len(arr), chunk):
        block = np.concatenate([carry, np.asarray(arr[start : start + chunk])])
        cuts = np.flatnonzero(block == eot_id)
        prev = 0
        for c in cuts.tolist():
            yield block[prev:c]
            prev = c + 1
        carry = block[prev:]
    if carry.size:
        yield carry


def find_sequence(arr: np.ndarray, pattern: Sequence[int], chunk: int = _CHUNK) -> np.ndarray:
    """Start positions of every (possibly overlapping) occurrence of ``pattern`` in ``arr``, vectorized."""
    pat = np.asarray(pattern, dtype=np.int64)
    m, n = int(pat.size), len(arr)
    if m == 0 or n < m:
        return np.zeros(0, dtype=np.int64)
    found = []
    for start in range(0, n - m + 1, chunk):
        stop = min(start + chunk, n - m + 1)  # candidate starts in [start, stop)
        block = np.asarray(arr[start : stop + m - 1]).astype(np.int64)
        cand = np.flatnonzero(block[: stop - start] == pat[0])
        for j in range(1, m):
            if cand.size == 0:
                break
            cand = cand[block[cand + j] == pat[j]]
        found.append(cand + start)
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def whole_word(subject: str) -> re.Pattern[str]:
    """``subject`` as a whole word (or words): not preceded or followed by a letter, digit or
    underscore, so "Nicol" does not match inside "Nicolson" or "MacNicol"."""
    return re.compile(rf"(?<!\w){re.escape(subject)}(?!\w)")


def occurrences(corpus: Corpus, subject: str) -> np.ndarray:
    """Token spans ``[start, end)`` [n, 2] (int64, sorted) of the whole-word occurrences of
    ``subject`` in the training token stream: matches of ``encode(subject)`` or, for subword
    tokenizers, ``encode(" " + subject)``, whose neighbouring tokens do not continue a word
    (the decoded token before does not end, and the one after does not start, with a word
    character). An occurrence found by both sequences is counted once (by its end)."""
    if not subject:
        raise SeedlabError("subject: must be a non-empty string")
    seqs: list[list[int]] = []
    for s in (subject, " " + subject):
        ids = corpus.encode(s)
        if ids and ids not in seqs:
            seqs.append(ids)
    word = re.compile(r"\w")
    spans: dict[int, int] = {}  # end -> start
    for ids in seqs:
        for start in find_sequence(corpus.train, ids).tolist():
            end = start + len(ids)
            before = corpus.decode([int(corpus.train[start - 1])]) if start > 0 else ""
            after = corpus.decode([int(corpus.train[end])]) if end < len(corpus.train) else ""
            leading_space = corpus.decode(ids[:1]).startswith(" ")
            if (after and word.match(after[0])) or (not leading_space and before and word.match(before[-1])):
                continue
            spans.setdefault(end, start)
    out = np.array(sorted((st, en) for en, st in spans.items()), dtype=np.int64)
    return out.reshape(-1, 2)


def count(corpus_dir: str | Path | Corpus, subject: str, *, verify: bool = False) -> dict[str, Any]:
    """How often ``subject`` occurs, as a whole word, in the TRAINING split.

    ``text``: case-sensitive, non-overlapping whole-word matches (:func:`whole_word`) over the
    decoded training documents. ``tokens``: the whole-word token spans of :func:`occurrences`.
    ``variants`` lists each token sequence that was searched for and its raw (substring) count.
    """
    if not subject:
        raise SeedlabError("subject: must be a non-empty string")
    c = corpus_dir if isinstance(corpus_dir, Corpus) else load(corpus_dir, verify=verify)
    pattern = whole_word(subject)
    text_n = sum(len(pattern.findall(doc)) for doc in c.documents("train"))
    variants = []
    for s in dict.fromkeys((subject, " " + subject)):
        ids = c.encode(s)
        if ids and all(v["ids"] != ids for v in variants):
            variants.append({"text": c.decode(ids), "ids": ids, "count": int(find_sequence(c.train, ids).size)})
    return {"subject": subject, "text": int(text_n), "tokens": len(occurrences(c, subject)), "variants": variants}


#: the file in a corpus folder that records subjects' counts (``seedlab corpus count --record``)
COUNTS = "counts.json"


def record_count(corpus_dir: str | Path, result: dict[str, Any]) -> Path:
    """Keep :func:`count`'s ``result`` in ``corpus_dir/counts.json`` (one entry per subject, beside the
    training split's SHA-256 it was counted on; a subject counted again is replaced). meta.json is left
    as it is: a corpus's identity does not depend on which subjects were looked up in it."""
    c = load(corpus_dir, verify=False)
    path = Path(corpus_dir) / COUNTS
    counts = json.loads(path.read_text()) if path.is_file() else {}
    counts[result["subject"]] = {"text": result["text"], "tokens": result["tokens"],
                                 "train_sha256": c.meta["splits"]["train"]["sha256"]}
    return write_json(path, counts)
