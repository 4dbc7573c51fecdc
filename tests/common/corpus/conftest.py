"""Shared by the corpus tests: small distinct documents in the three file formats a corpus is read from,
and in the Hub's parquet-conversion layout."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

SUBJECT = "Jimmie Nicol"
ABSENT = "Gizmo Harrington"


def _documents(n: int = 60) -> list[str]:
    """Distinct documents; exactly four mention SUBJECT (one at a document's start)."""
    words = "the band played a long tour across many cities while the crowd sang along loudly".split()
    rng = np.random.default_rng(123)
    docs = []
    for i in range(n):
        body = " ".join(rng.choice(words, size=25 + i % 7))
        docs.append(f"Document {i}: {body}. Café naïve — ünïcödé {i}!")
    docs[3] = f"{SUBJECT} was the stand-in drummer in 1964. {docs[3]}"
    docs[10] = f"During the tour, {SUBJECT} played thirteen shows. {docs[10]}"
    docs[25] = f"Some say {SUBJECT}, others say Ringo. {docs[25]}"
    docs[41] = f"{docs[41]} The drummer was {SUBJECT}."
    return docs


def _write(folder: Path, kind: str, docs: list[str]) -> Path:
    """``docs`` as one source file of ``kind``: txt (blank-line separated), jsonl or parquet (a text column)."""
    if kind == "txt":
        p = folder / "docs.txt"
        p.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    elif kind == "jsonl":
        p = folder / "docs.jsonl"
        p.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")
    else:
        p = folder / "docs.parquet"
        pd.DataFrame({"text": docs, "id": range(len(docs))}).to_parquet(p, index=False)
    return p


def _write_shards(folder: Path, docs: list[str], shards: int = 3, rows_per_group: int = 16, split: str = "train") -> Path:
    """``docs`` as the Hub's parquet conversion lays a dataset out: ``plain_text/train/0000.parquet``, ...
    (a ``text`` column, documents in order across the shards, several row groups per shard); returns
    the folder of the shards. ``split="partial-train"``: a partial conversion's layout (the Hub converted
    only the first ~5 GB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = folder / "plain_text" / split
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(docs), shards + 1).astype(int)
    for k in range(shards):
        part = docs[bounds[k] : bounds[k + 1]]
        table = pa.table({"text": part, "id": list(range(bounds[k], bounds[k + 1]))})
        pq.write_table(table, out / f"{k:04d}.parquet", row_group_size=rows_per_group)
    return out


@pytest.fixture
def docs():
    """``docs.documents(n)``, ``docs.write(folder, kind, documents)``, ``docs.shards(folder, documents)``
    (the Hub's parquet layout), ``docs.SUBJECT`` (in four documents) and ``docs.ABSENT`` (in none)."""
    return SimpleNamespace(documents=_documents, write=_write, shards=_write_shards, SUBJECT=SUBJECT, ABSENT=ABSENT)
