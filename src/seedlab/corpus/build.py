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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from seedlab.corpus.sources import Texts, load_texts
from seedlab.corpus.tokenizers import TOKENIZERS, ByteTokenizer, HFTokenizer, TiktokenGPT2, Tokenizer, token_dtype
from seedlab.errors import SeedlabError
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


def _batched(it: Iterable[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _write_split(path: Path, docs: Iterable[str], tok: Tokenizer, dtype: np.dtype) -> dict[str, Any]:
    stats: dict[str, Any] = {"file": path.name, "tokens": 0, "documents": 0}

    def write(tmp: Path) -> None:
        h = hashlib.sha256()
        with tmp.open("wb") as f:
            for batch in _batched(docs, _BATCH_DOCS):
                eot = np.array([tok.eot_id], dtype=np.int64)
                pieces = []
                for doc in tok.encode_batch(batch):
                    pieces.append(np.asarray(doc, dtype=np.int64))
                    pieces.append(eot)
                flat = np.concatenate(pieces)
                buf = flat.astype(dtype).tobytes()
                f.write(buf)
                h.update(buf)
                stats["tokens"] += int(flat.size)
                stats["documents"] += len(batch)
        stats["sha256"] = h.hexdigest()

    atomic_write(path, write)
    return stats


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
) -> dict[str, Any]:
    """Tokenize ``source`` into ``out_dir/{train,heldout}.bin`` + ``meta.json``; returns the metadata.

    ``max_bytes`` limits the ``embedded`` corpus (whole documents); ``cache_dir`` is the
    Hugging Face datasets cache for Hub sources.
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
    texts, info = load_texts(source, text_field=text_field, max_bytes=max_bytes, cache_dir=cache_dir)
    n = len(texts)
    if n < 2 and heldout_fraction > 0:
        raise SeedlabError(f"source: {source!s} has {n} document(s); a held-out split needs at least 2")
    if n == 0:
        raise SeedlabError(f"source: {source!s} has no documents")
    held = split_indices(n, heldout_fraction, seed)
    out.mkdir(parents=True, exist_ok=True)

    tok: Tokenizer
    tok_meta: dict[str, Any] = {"name": tokenizer}
    if tokenizer == "bytes":
        tok = ByteTokenizer()
    elif tokenizer == "gpt2":
        tok = TiktokenGPT2()
    else:
        tok = HFTokenizer.train(_iter_split(texts, held, False), vocab_size)
        tok_path = out / "tokenizer.json"
        atomic_write(tok_path, lambda p: tok.tok.save(str(p)))  # type: ignore[attr-defined]
        tok_meta.update(file="tokenizer.json", sha256=file_sha256(tok_path), requested_vocab_size=vocab_size)
    tok_meta.update(vocab_size=int(tok.vocab_size), eot_id=int(tok.eot_id))
    dtype = token_dtype(tok.vocab_size)

    train = _write_split(out / "train.bin", _iter_split(texts, held, False), tok, dtype)
    heldout = _write_split(out / "heldout.bin", _iter_split(texts, held, True), tok, dtype)
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    info["sha256"] = h.hexdigest()
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
