"""``seedlab corpus prepare``: text -> token arrays with a SHA-256 manifest, nanoGPT style.

``prepare`` turns text (see sources.py) into

- ``train.bin`` / ``heldout.bin``: flat token streams (``uint16`` when the vocabulary fits, else
  ``uint32``), every document followed by the end-of-text token; read back with ``np.memmap``;
- ``meta.json``: tokenizer name / vocab size / eot id, token and document counts per split and
  the SHA-256 of each ``.bin``;
- ``tokenizer.json`` for the ``bpe`` tokenizer (trained on training documents only).

The held-out split is whole documents chosen by a seeded shuffle; it is never trained on.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from seedlab.corpus.sources import Texts, load_texts
from seedlab.corpus.tokenizers import TOKENIZERS, ByteTokenizer, HFTokenizer, TiktokenGPT2, Tokenizer, token_dtype
from seedlab.errors import SeedlabError
from seedlab.progress import Bar
from seedlab.store import atomic_write, file_sha256, write_json

FORMAT = "seedlab-corpus/1"
_BATCH_DOCS = 1024  # documents tokenized per batch


def split_indices(n_docs: int, heldout_fraction: float, seed: int) -> np.ndarray:
    """Sorted indices of the held-out documents: a pure function of (n_docs, fraction, seed)."""
    if n_docs == 0 or heldout_fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    k = int(round(heldout_fraction * n_docs))
    k = min(max(k, 1), n_docs - 1)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    perm = np.random.default_rng(np.random.SeedSequence([seed, n_docs])).permutation(n_docs)
    return np.sort(perm[:k])


def _iter_split(texts: Texts, heldout: np.ndarray, want_heldout: bool) -> Iterator[str]:
    mask = np.zeros(len(texts), dtype=bool)
    mask[heldout] = True
    for i, t in enumerate(texts):
        if mask[i] == want_heldout:
            yield t


def _advancing(it: Iterable[str], bar: Bar) -> Iterator[str]:
    for x in it:
        yield x
        bar.advance()


def _batched(it: Iterable[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


class _SplitFile:
    """One split's token stream, appended to batch by batch: its bytes, SHA-256 and counts."""

    def __init__(self, f: BinaryIO, dtype: np.dtype, eot_id: int):
        self.f, self.dtype, self.eot = f, dtype, np.array([eot_id], dtype=np.int64)
        self.h = hashlib.sha256()
        self.tokens = self.documents = 0

    def append(self, docs: list[Any]) -> None:
        if not docs:
            return
        pieces = []
        for doc in docs:
            pieces.append(np.asarray(doc, dtype=np.int64))
            pieces.append(self.eot)
        buf = np.concatenate(pieces).astype(self.dtype).tobytes()
        self.f.write(buf)
        self.h.update(buf)
        self.tokens += len(buf) // self.dtype.itemsize
        self.documents += len(docs)

    def stats(self, name: str) -> dict[str, Any]:
        return {"file": name, "tokens": self.tokens, "documents": self.documents, "sha256": self.h.hexdigest()}


def _write_splits(
    out: Path, texts: Texts, n: int, heldout: np.ndarray, tok: Tokenizer, dtype: np.dtype, bar: Bar
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """One pass over ``texts``: every document tokenized once and appended to ``train.bin`` or
    ``heldout.bin``, ``_BATCH_DOCS`` documents at a time (memory does not grow with the corpus);
    returns both splits' stats and the SHA-256 of the source text."""
    is_held = np.zeros(n, dtype=bool)
    is_held[heldout] = True
    source = hashlib.sha256()
    result: dict[str, Any] = {}

    def write(train_tmp: Path, held_tmp: Path) -> None:
        with train_tmp.open("wb") as ft, held_tmp.open("wb") as fh:
            train, held = _SplitFile(ft, dtype, tok.eot_id), _SplitFile(fh, dtype, tok.eot_id)
            i = 0
            for batch in _batched(texts, _BATCH_DOCS):
                if i + len(batch) > n:
                    raise SeedlabError(f"source: more documents than the {n} counted (did it change while read?)")
                for t in batch:
                    b = t.encode("utf-8")
                    source.update(len(b).to_bytes(8, "little"))
                    source.update(b)
                ids = tok.encode_batch(batch)
                mask = is_held[i : i + len(batch)]
                train.append([d for d, h in zip(ids, mask) if not h])
                held.append([d for d, h in zip(ids, mask) if h])
                i += len(batch)
                bar.advance(len(batch))
            if i != n:
                raise SeedlabError(f"source: {i} documents read, {n} counted (did it change while read?)")
            result["train"], result["heldout"] = train.stats("train.bin"), held.stats("heldout.bin")

    atomic_write(out / "train.bin", lambda t: atomic_write(out / "heldout.bin", lambda h: write(t, h)))
    return result["train"], result["heldout"], source.hexdigest()


def prepare(
    source: str | Path,
    out_dir: str | Path,
    *,
    tokenizer: str = "bytes",
    heldout_fraction: float = 0.05,
    vocab_size: int = 4096,
    seed: int = 0,
    text_field: str = "text",
    max_bytes: int | None = None,
    cache_dir: str | None = None,
    progress: bool | None = None,
    allow_partial: bool = False,
) -> dict[str, Any]:
    """Tokenize ``source`` into ``out_dir/{train,heldout}.bin`` + ``meta.json``; returns the metadata.

    ``max_bytes`` limits the ``embedded`` corpus (whole documents); ``cache_dir`` is the
    Hugging Face datasets cache for Hub sources. The source is read in one streamed pass
    (two with ``bpe``: its training reads the training documents first), so memory does not
    grow with the number of documents. ``progress``: a progress bar (default: when stdout is
    a terminal). A partial parquet conversion (the Hub's ``partial-*`` folders: only the first
    ~5 GB of OpenWebText) is a one-line error before anything is written, unless
    ``allow_partial``: then meta.json's ``source`` says ``"partial": true``.
    """
    if tokenizer not in TOKENIZERS:
        raise SeedlabError(f"tokenizer: one of {', '.join(TOKENIZERS)}, got {tokenizer!r}")
    if not 0 <= heldout_fraction < 1:
        raise SeedlabError(f"heldout_fraction: must lie in [0, 1), got {heldout_fraction!r}")
    if tokenizer == "bpe" and not 257 <= vocab_size <= 1 << 20:
        raise SeedlabError(f"vocab_size: a byte-level BPE needs 257..1048576 tokens, got {vocab_size!r}")
    if max_bytes is not None and max_bytes <= 0:
        raise SeedlabError(f"max_bytes: must be positive, got {max_bytes!r}")
    out = Path(out_dir)
    texts, info = load_texts(source, text_field=text_field, max_bytes=max_bytes, cache_dir=cache_dir,
                             allow_partial=allow_partial)
    n = len(texts)
    if n < 2 and heldout_fraction > 0:
        raise SeedlabError(f"source: {source!s} has {n} document(s); a held-out split needs at least 2")
    if n == 0:
        raise SeedlabError(f"source: {source!s} has no documents")
    held = split_indices(n, heldout_fraction, seed)
    if progress is None:
        progress = sys.stdout.isatty()

    tok: Tokenizer
    tok_meta: dict[str, Any] = {"name": tokenizer}
    if tokenizer == "bytes":
        tok = ByteTokenizer()
    elif tokenizer == "gpt2":
        tok = TiktokenGPT2()  # before anything is written: without its files this is a one-line error
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer == "bpe":
        with Bar("training BPE", n - len(held), "documents", enabled=progress) as bar:
            tok = HFTokenizer.train(_advancing(_iter_split(texts, held, False), bar), vocab_size)
        tok_path = out / "tokenizer.json"
        atomic_write(tok_path, lambda p: tok.tok.save(str(p)))  # type: ignore[attr-defined]
        tok_meta.update(file="tokenizer.json", sha256=file_sha256(tok_path), requested_vocab_size=vocab_size)
    tok_meta.update(vocab_size=int(tok.vocab_size), eot_id=int(tok.eot_id))
    dtype = token_dtype(tok.vocab_size)

    with Bar("tokenizing", n, "documents", enabled=progress) as bar:
        train, heldout, source_sha = _write_splits(out, texts, n, held, tok, dtype, bar)
    info["sha256"] = source_sha
    info["documents"] = n
    meta = {
        "format": FORMAT,
        "source": info,
        "tokenizer": tok_meta,
        "dtype": dtype.name,
        "seed": seed,
        "heldout_fraction": heldout_fraction,
        "splits": {"train": train, "heldout": heldout},
        "python_version": platform.python_version(),
    }
    write_json(out / "meta.json", meta)
    return meta
