"""Corpus.split_hashes: the one reading of a corpus's split hashes (what a run's inputs.json keeps)."""

from __future__ import annotations

import json

from seedlab.corpus import load
from seedlab.store import file_sha256


def test_split_hashes_are_what_meta_json_records(twins_inputs):
    path, _ = twins_inputs
    c = load(path)
    meta = json.loads((path / "meta.json").read_text())
    assert c.split_hashes() == {k: v["sha256"] for k, v in meta["splits"].items()}
    assert c.split_hashes() == {k: file_sha256(path / v["file"]) for k, v in meta["splits"].items()}
    assert set(c.split_hashes()) == {"train", "heldout"}
