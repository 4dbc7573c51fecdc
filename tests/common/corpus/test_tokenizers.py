"""seedlab.corpus.tokenizers: the BPE trained on a corpus is deterministic; GPT-2's BPE needs tiktoken."""

from __future__ import annotations

import pytest

from seedlab.corpus import build
from seedlab.errors import SeedlabError


def test_bpe_is_deterministic(tmp_path, docs):
    src = docs.write(tmp_path, "txt", docs.documents())
    m1 = build.prepare(src, tmp_path / "a", tokenizer="bpe", vocab_size=400)
    m2 = build.prepare(src, tmp_path / "b", tokenizer="bpe", vocab_size=400)
    assert m1["tokenizer"]["sha256"] == m2["tokenizer"]["sha256"]
    assert m1["splits"] == m2["splits"]


def test_gpt2_without_tiktoken_is_a_clear_error(tmp_path, docs):
    try:
        import tiktoken  # noqa: F401

        pytest.skip("tiktoken installed; the error path is not reachable")
    except ImportError:
        pass
    src = docs.write(tmp_path, "txt", docs.documents())
    with pytest.raises(SeedlabError, match="needs tiktoken"):
        build.prepare(src, tmp_path / "c", tokenizer="gpt2")
