"""benchmarks/metagrad_cost.py, metagrad's cost like for like: its tiny default design runs end to end (one round of
each side, interleaved by benchmarks/timing.py) and reports both times, their ratio, the conditions and metagrad's
counts; the JSON it writes holds the same."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_tiny_design_times_both_sides_and_writes_the_result(tmp_path, capsys, threads_restored):
    spec = importlib.util.spec_from_file_location("bench_metagrad_cost", ROOT / "benchmarks" / "metagrad_cost.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    out = tmp_path / "cost.json"
    assert mod.main(["--repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "one training run:" in text and "metagrad, one query, one horizon:" in text and "ratio" in text
    assert "interleaved, best of 1 each, 1 thread each, load average" in text
    r = json.loads(out.read_text())
    assert r["horizon"] == 14 and r["threads"] == 1 and r["query"] == "query-0"
    assert len(r["times"]["train"]) == len(r["times"]["metagrad"]) == 1
    assert r["ratio"] == pytest.approx(r["best"]["metagrad"] / r["best"]["train"]) and r["ratio"] > 1
    # the whole run: 14 updates replayed, one VJP per update, every state kept (they fit in 1 GiB)
    m = r["metagrad"]
    assert {k: m[k] for k in ("every", "updates_replayed", "vjps", "states_held")} == {
        "every": 1, "updates_replayed": 14, "vjps": 14, "states_held": 14}
    assert 0 < m["replay_s"] and 0 < m["backward_s"] and m["replay_s"] + m["backward_s"] <= r["best"]["metagrad"]
    assert "of metagrad's best round: the replay" in text
