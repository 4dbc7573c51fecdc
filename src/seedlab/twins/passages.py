"""The injected passages: each injected condition's token ids, and the attestation check.

- ``fluent-fabricated`` and ``fluent-attested`` are text files named in the config
  (``passages``, relative to the config file), encoded with the corpus's tokenizer.
- ``random-chars`` is random keyboard text (``random.Random(random_chars_seed)``) grown until
  it has ``random_chars_tokens`` tokens (default: as many as the fabricated, else the attested, passage).
- ``ordinary-row`` (a null) is ``nulls.ordinary_rows`` arms, ``ordinary-row.0`` .. ``ordinary-row.<K-1>``: each a
  different stretch of the held-out split's reserved slice (twins/heldout.py, which no evaluation or probe row
  touches) as long as the fabricated passage.
- Each fluent passage must mention its subject (``subjects``), as a whole word. A fabricated
  subject must not occur in the training split; an attested one should (whole-word token spans,
  corpus.occurrences). ``attestation`` reports, per subject, its occurrences and each seed's
  **exposure**: how many times the seed's ordinary batches held a whole occurrence, before,
  at and after the injection step (from the pure batch function, lm/batches.py).
"""

from __future__ import annotations

import random
import string
import sys
from pathlib import Path

import numpy as np

from seedlab.corpus import occurrences, whole_word
from seedlab.errors import SeedlabError
from seedlab.lm.batches import batch_indices
from seedlab.twins.config import ORDINARY, TwinsConfig, ordinary_names
from seedlab.twins.heldout import ordinary_rows


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
            text = path.read_text().strip()
            subject = cfg.subjects.get(cond)
            if subject and not whole_word(subject).search(text):
                raise SeedlabError(f"passages.{cond}: {str(path)!r} does not mention its subject {subject!r} (subjects.{cond})")
            out[cond] = corpus.encode(text)
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
    if ORDINARY in cfg.conditions or cfg.nulls.noise_like == ORDINARY:
        out |= ordinary_passages(cfg, corpus, out)
    return out


def ordinary_passages(cfg: TwinsConfig, corpus, passages: dict[str, list[int]]) -> dict[str, list[int]]:
    """The ``ordinary-row`` null's arms, ``{ordinary-row.<i>: token ids}``: ``nulls.ordinary_rows`` different
    stretches of the held-out split's reserved slice (never trained on, never evaluated on: twins/heldout.py
    ``ordinary_rows``), each as long as the fabricated (else attested, else random-chars) passage, chosen by
    ``random.Random(nulls.ordinary_row_seed)``: ordinary rows of the corpus's own text in place of the passage."""
    like = next((passages[c] for c in ("fluent-fabricated", "fluent-attested", "random-chars") if c in passages), None)
    n = len(like) if like else cfg.random_chars_tokens
    if n is None:
        raise SeedlabError("random_chars_tokens: set the passage length when the design has no passage (ordinary-row)")
    block = cfg.gpt_config(corpus.vocab_size).block_size
    rows = ordinary_rows(corpus.heldout, block, n, cfg.nulls.ordinary_rows, cfg.nulls.ordinary_row_seed)
    return dict(zip(ordinary_names(cfg.nulls.ordinary_rows), rows))


def attestation(cfg: TwinsConfig, corpus, block_size: int, warn: bool = True) -> dict[str, dict]:
    """Check every subject against the training split and measure each seed's exposure to it.

    A fabricated subject that occurs is an error; an attested one that does not, a warning.
    Returns ``{condition: {"subject", "occurrences", "exposure": [{seed, before, at_injection, after}]}}``,
    where exposure counts (row, occurrence) pairs: a row of step t's ordinary batch holding the
    whole occurrence (its ``block_size + 1`` tokens include the span)."""
    out = {}
    for cond, subject in cfg.subjects.items():
        spans = occurrences(corpus, subject)
        n = len(spans)
        if cond == "fluent-fabricated" and n > 0:
            raise SeedlabError(f"subjects.fluent-fabricated: {subject!r} occurs {n} times in the training split (not fabricated)")
        if cond == "fluent-attested" and n == 0 and warn:
            print(f"warning: subjects.fluent-attested: {subject!r} does not occur in the training split", file=sys.stderr)
        out[cond] = {"subject": subject, "occurrences": n, "exposure": [exposure(cfg, len(corpus.train), spans, block_size, k)
                                                                         for k in cfg.seeds]}
    return out


def exposure(cfg: TwinsConfig, n_tokens: int, spans: np.ndarray, block_size: int, seed: int) -> dict[str, int]:
    """How many times seed ``seed``'s ordinary batches held one of ``spans`` whole: summed over
    the steps before the injection step, at it (every row, the one an injected passage replaces
    included) and after it."""
    counts = {"seed": seed, "before": 0, "at_injection": 0, "after": 0}
    if len(spans) == 0:
        return counts
    s = cfg.injection_step
    for t in range(cfg.steps):
        o = batch_indices(seed, t, n_tokens=n_tokens, batch_size=cfg.batch_size, block_size=block_size)[:, None]
        n = int(((spans[None, :, 0] >= o) & (spans[None, :, 1] <= o + block_size + 1)).sum())
        counts["before" if t < s else "at_injection" if t == s else "after"] += n
    return counts
