"""Tokenizers of a corpus: UTF-8 bytes, a byte-level BPE trained on the corpus (HF ``tokenizers``),
or GPT-2's BPE (``tiktoken``). All share one small interface (:class:`Tokenizer`)."""

from __future__ import annotations

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
