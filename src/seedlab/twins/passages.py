"""The injected passages: each injected condition's token ids, and the attestation check.

- ``fluent-fabricated`` and ``fluent-attested`` are text files named in the config
  (``passages``, relative to the config file), encoded with the corpus's tokenizer.
- ``random-chars`` is random keyboard text (``random.Random(random_chars_seed)``) grown until
  it has ``random_chars_tokens`` tokens (default: as many as the fabricated, else the attested, passage).
- A fabricated subject (``subjects``) must not occur in the training split; an attested one should.
"""

from __future__ import annotations

import random
import string
import sys
from pathlib import Path

from seedlab.errors import SeedlabError
from seedlab.twins.config import TwinsConfig


def load_passages(cfg: TwinsConfig, base: Path, corpus) -> dict[str, list[int]]:
    """Token ids of each injected condition's passage; random-chars is random keyboard text
    of ``random_chars_tokens`` tokens (default: as long as the fabricated passage)."""
    out: dict[str, list[int]] = {}
    for cond in ("fluent-fabricated", "fluent-attested"):
        if cond in cfg.conditions:
            if cond not in cfg.passages:
                raise SeedlabError(f"passages.{cond}: name a text file for this condition")
            path = base / cfg.passages[cond]
            if not path.is_file():
                raise SeedlabError(f"passages.{cond}: no such file {str(path)!r}")
            out[cond] = corpus.encode(path.read_text().strip())
    if "random-chars" in cfg.conditions:
        fluent = out.get("fluent-fabricated") or out.get("fluent-attested")
        n = cfg.random_chars_tokens or (len(fluent) if fluent else None)
        if n is None:
            raise SeedlabError("random_chars_tokens: set the passage length when the design has no fluent passage")
        rng = random.Random(cfg.random_chars_seed)
        keys = string.ascii_letters + string.digits + string.punctuation + " "
        ids: list[int] = []
        text = ""
        while len(ids) < n:  # grow random keyboard text until it has the same token length
            text += rng.choice(keys)
            ids = corpus.encode(text)
        out["random-chars"] = ids[:n]
    return out


def check_attestation(cfg: TwinsConfig, corpus, warn: bool = True) -> None:
    """A fabricated subject must not occur in the training split; an attested one should."""
    from seedlab.corpus import count

    for cond, subject in cfg.subjects.items():
        n = count(corpus, subject)["text"]
        if cond == "fluent-fabricated" and n > 0:
            raise SeedlabError(f"subjects.fluent-fabricated: {subject!r} occurs {n} times in the training split (not fabricated)")
        if cond == "fluent-attested" and n == 0 and warn:
            print(f"warning: subjects.fluent-attested: {subject!r} does not occur in the training split", file=sys.stderr)
