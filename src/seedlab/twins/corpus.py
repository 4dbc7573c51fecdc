"""Pre-training corpora on disk, nanoGPT style: token arrays plus a verified manifest.

``prepare`` turns text (local files, a Hugging Face dataset, or the ``embedded``
default that ships with Python itself) into

- ``train.bin`` / ``heldout.bin``: flat token streams (``uint16`` when the
  vocabulary fits, else ``uint32``), every document followed by the end-of-text
  token; read back with ``np.memmap``;
- ``meta.json``: tokenizer name / vocab size / eot id, token and document
  counts per split and the SHA-256 of each ``.bin``;
- ``tokenizer.json`` for the ``bpe`` tokenizer (trained on training documents only).

The held-out split is whole documents chosen by a seeded shuffle; it is never
trained on. ``load`` memory-maps a prepared corpus (verifying the hashes) and
``count`` says how often a subject occurs in the training split.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import re
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from seedlab.errors import SeedlabError
from seedlab.store import atomic_write, write_json

FORMAT = "seedlab-corpus/1"
EOT_TEXT = "<|endoftext|>"
TOKENIZERS = ("bytes", "bpe", "gpt2")
FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")
#: what ``"openwebtext"`` means: the Hub's maintained copy of OpenWebText
OPENWEBTEXT = "Skylion007/openwebtext"
_BATCH_DOCS = 1024  # documents tokenized per batch
_CHUNK = 1 << 23  # tokens read per chunk when scanning a split


# --------------------------------------------------------------------------- sources


class Texts(Protocol):
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[str]: ...


class HFTexts:
    """One text column of a ``datasets.Dataset``, read lazily in order (no full copy in memory)."""

    def __init__(self, ds: Any, text_field: str):
        self.ds = ds.select_columns([text_field])
        self.text_field = text_field

    def __len__(self) -> int:
        return len(self.ds)

    def __iter__(self) -> Iterator[str]:
        for batch in self.ds.iter(batch_size=1000):
            for t in batch[self.text_field]:
                yield "" if t is None else str(t)


def load_hf_texts(
    name_or_path: str, split: str = "train", text_field: str = "text", cache_dir: str | None = None
) -> HFTexts:
    """Load one split of a dataset with ``datasets.load_dataset`` (streaming off).

    A local ``.jsonl``/``.json`` or ``.parquet`` file goes through the ``json`` /
    ``parquet`` builders; anything else is a Hub name (e.g. ``Skylion007/openwebtext``),
    which needs the network or a filled Hugging Face cache.
    """
    try:
        import datasets
    except ImportError:  # pragma: no cover - dependency
        raise SeedlabError("source: Hugging Face datasets need the 'datasets' package (pip install datasets)") from None
    p = Path(name_or_path)
    try:
        if p.is_file() and p.suffix in (".jsonl", ".json"):
            ds = datasets.load_dataset("json", data_files=str(p), split=split, cache_dir=cache_dir)
        elif p.is_file() and p.suffix == ".parquet":
            ds = datasets.load_dataset("parquet", data_files=str(p), split=split, cache_dir=cache_dir)
        else:
            ds = datasets.load_dataset(name_or_path, split=split, cache_dir=cache_dir, streaming=False)
    except Exception as err:  # network, missing dataset, bad split: one line
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SeedlabError(
            f"source: cannot load dataset {name_or_path!r} split {split!r} ({type(err).__name__}: {msg});"
            " a Hub dataset needs the network or a filled Hugging Face cache"
        ) from None
    if text_field not in ds.column_names:
        raise SeedlabError(
            f"source: dataset {name_or_path!r} has no {text_field!r} column (columns: {ds.column_names})"
        )
    return HFTexts(ds, text_field)


def read_txt(path: Path) -> list[str]:
    """Documents of a text file: paragraphs separated by blank lines."""
    text = path.read_text(encoding="utf-8")
    return [d.strip() for d in re.split(r"\n[ \t\r\f\v]*\n", text) if d.strip()]


def read_jsonl(path: Path, text_field: str = "text") -> list[str]:
    out = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise SeedlabError(f"{path}:{i}: not valid JSON") from None
            if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                raise SeedlabError(f"{path}:{i}: needs a string {text_field!r} field")
            out.append(obj[text_field])
    return out


def read_parquet(path: Path, text_field: str = "text") -> list[str]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=[text_field])
    except Exception as err:
        raise SeedlabError(f"{path}: cannot read a {text_field!r} column ({type(err).__name__})") from None
    return ["" if t is None else str(t) for t in table.column(text_field).to_pylist()]


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def embedded_texts(max_bytes: int | None = None) -> list[str]:
    """A corpus that needs no network: the docstrings of the standard library's own sources.

    One document per module (module, class and function docstrings in source order),
    modules in sorted path order, read with ``ast`` (nothing is imported), so it is
    identical on every run of the same Python installation. ``max_bytes`` stops at the
    last whole document that keeps the UTF-8 total within the limit.
    """
    root = _stdlib_root()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    docs: list[str] = []
    total = 0
    for f in files:
        try:
            tree = ast.parse(f.read_bytes(), filename=str(f))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        parts = []
        for node in _docstring_nodes(tree):
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                parts.append(doc.strip())
        if not parts:
            continue
        doc = "\n\n".join(parts)
        n = len(doc.encode("utf-8"))
        if max_bytes is not None and total + n > max_bytes:
            if docs:
                break
            continue  # the first module alone is too big: try a smaller one
        docs.append(doc)
        total += n
    if not docs:
        raise SeedlabError(f"source: no docstrings found under {root} (embedded corpus)")
    return docs


def _docstring_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Module, classes and functions in source (depth-first) order."""
    yield tree
    stack = list(reversed(getattr(tree, "body", [])))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
            stack.extend(reversed(node.body))


def _read_file(path: Path, text_field: str) -> list[str]:
    if path.suffix == ".txt":
        return read_txt(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path, text_field)
    if path.suffix == ".parquet":
        return read_parquet(path, text_field)
    raise SeedlabError(f"source: {path} is not a .txt, .jsonl or .parquet file")


def load_texts(
    source: str | Path, *, text_field: str = "text", max_bytes: int | None = None, cache_dir: str | None = None
) -> tuple[Texts, dict[str, Any]]:
    """Documents of ``source`` in a fixed order, and a description of where they came from."""
    s = str(source)
    info: dict[str, Any] = {"source": s}
    if s == "embedded":
        docs = embedded_texts(max_bytes)
        info.update(kind="embedded", stdlib=str(_stdlib_root()), max_bytes=max_bytes)
        return docs, info
    if s == "openwebtext" or s.startswith("hf:"):
        name = OPENWEBTEXT if s == "openwebtext" else s[3:]
        info.update(kind="huggingface", dataset=name, split="train", text_field=text_field)
        return load_hf_texts(name, "train", text_field, cache_dir=cache_dir), info
    p = Path(s)
    if p.is_file():
        info.update(kind="file")
        return _read_file(p, text_field), info
    if p.is_dir():
        files = sorted(
            (f for f in p.rglob("*") if f.is_file() and f.suffix in FILE_SUFFIXES),
            key=lambda f: f.relative_to(p).as_posix(),
        )
        if not files:
            raise SeedlabError(f"source: folder {s!r} holds no .txt, .jsonl or .parquet files")
        docs = [d for f in files for d in _read_file(f, text_field)]
        info.update(kind="folder", files=[f.relative_to(p).as_posix() for f in files])
        return docs, info
    raise SeedlabError(
        f"source: {s!r} is neither a file, a folder, 'embedded', 'openwebtext' nor 'hf:<dataset>'"
    )


# --------------------------------------------------------------------------- tokenizers


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes: ids 0-255, end-of-text = 256 (decoded as ``<|endoftext|>``)."""

    name = "bytes"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[Any]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > 256):
            raise SeedlabError(f"decode: byte token ids must lie in 0..256, got {int(arr.min())}..{int(arr.max())}")
        cuts = np.flatnonzero(arr == self.eot_id)
        pieces, start = [], 0
        for c in [*cuts.tolist(), arr.size]:
            pieces.append(arr[start:c].astype(np.uint8).tobytes().decode("utf-8", errors="replace"))
            start = c + 1
        return EOT_TEXT.join(pieces)


class HFTokenizer:
    """A byte-level BPE from Hugging Face ``tokenizers`` (special token ``<|endoftext|>``)."""

    name = "bpe"

    def __init__(self, tok: Any):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size()
        eot = tok.token_to_id(EOT_TEXT)
        if eot is None:
            raise SeedlabError(f"tokenizer: tokenizer.json has no {EOT_TEXT} token")
        self.eot_id = int(eot)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> HFTokenizer:
        from tokenizers import Tokenizer as _Tok
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = _Tok(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=[EOT_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: Path) -> HFTokenizer:
        from tokenizers import Tokenizer as _Tok

        if not path.is_file():
            raise SeedlabError(f"{path}: no such file (prepare the corpus again)")
        return cls(_Tok.from_file(str(path)))


class TiktokenGPT2:
    """GPT-2's BPE through ``tiktoken`` (``<|endoftext|>`` = 50256)."""

    name = "gpt2"

    def __init__(self) -> None:
        try:
            import tiktoken
        except ImportError:
            raise SeedlabError(
                "tokenizer: 'gpt2' needs tiktoken and its GPT-2 files (pip install tiktoken; offline, set"
                " TIKTOKEN_CACHE_DIR to a folder holding the cached encoding) — or use 'bytes' or 'bpe'"
            ) from None
        try:
            self.enc = tiktoken.get_encoding("gpt2")
        except Exception as err:
            raise SeedlabError(
                f"tokenizer: 'gpt2' needs tiktoken's GPT-2 files, which could not be loaded ({type(err).__name__});"
                " offline, set TIKTOKEN_CACHE_DIR to a folder holding them — or use 'bytes' or 'bpe'"
            ) from None
        self.vocab_size = int(self.enc.n_vocab)
        self.eot_id = int(self.enc.eot_token)

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode([int(i) for i in ids])


def _dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65536 else np.dtype(np.uint32)


# --------------------------------------------------------------------------- prepare


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
        tok_meta.update(file="tokenizer.json", sha256=_sha256_file(tok_path), requested_vocab_size=vocab_size)
    tok_meta.update(vocab_size=int(tok.vocab_size), eot_id=int(tok.eot_id))
    dtype = _dtype(tok.vocab_size)

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


# --------------------------------------------------------------------------- load


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


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


def _tokenizer_for(path: Path, meta: dict[str, Any]) -> Any:
    name = meta["tokenizer"]["name"]
    if name == "bytes":
        return ByteTokenizer()
    if name == "gpt2":
        return TiktokenGPT2()
    if name == "bpe":
        return HFTokenizer.from_file(path / meta["tokenizer"].get("file", "tokenizer.json"))
    raise SeedlabError(f"{path}/meta.json: unknown tokenizer {name!r}")


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
        if verify and _sha256_file(p) != s["sha256"]:
            raise SeedlabError(f"{p}: SHA-256 mismatch (corrupted corpus; prepare it again)")
        arrays[name] = (
            np.memmap(p, dtype=dtype, mode="r", shape=(int(s["tokens"]),)) if int(s["tokens"]) else np.zeros(0, dtype)
        )
    tf = meta["tokenizer"].get("file")
    if verify and tf:
        tp = d / tf
        if not tp.is_file():
            raise SeedlabError(f"{tp}: no such file (incomplete corpus; prepare it again)")
        if _sha256_file(tp) != meta["tokenizer"]["sha256"]:
            raise SeedlabError(f"{tp}: SHA-256 mismatch (corrupted corpus; prepare it again)")
    tok = _tokenizer_for(d, meta)
    return Corpus(path=d, meta=meta, train=arrays["train"], heldout=arrays["heldout"], tokenizer=tok)


# --------------------------------------------------------------------------- count


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


def count(corpus_dir: str | Path | Corpus, subject: str, *, verify: bool = False) -> dict[str, Any]:
    """How often ``subject`` occurs in the TRAINING split.

    ``text``: case-sensitive, non-overlapping substring count over the decoded
    training documents. ``tokens``: occurrences of ``encode(subject)`` in the training
    token stream; for subword tokenizers, where in-context tokenization differs, the
    occurrences of ``encode(" " + subject)`` are counted too (an occurrence is counted
    once, by its end position). ``variants`` lists the count for each token sequence.
    """
    if not subject:
        raise SeedlabError("subject: must be a non-empty string")
    c = corpus_dir if isinstance(corpus_dir, Corpus) else load(corpus_dir, verify=verify)
    text_n = sum(doc.count(subject) for doc in c.documents("train"))
    seqs: list[list[int]] = []
    for s in (subject, " " + subject):
        ids = c.encode(s)
        if ids and ids not in seqs:
            seqs.append(ids)
    ends: list[np.ndarray] = []
    variants = []
    for ids in seqs:
        starts = find_sequence(c.train, ids)
        variants.append({"text": c.decode(ids), "ids": ids, "count": int(starts.size)})
        ends.append(starts + len(ids))
    tokens_n = int(np.unique(np.concatenate(ends)).size) if ends else 0
    return {"subject": subject, "text": int(text_n), "tokens": tokens_n, "variants": variants}
