"""benchmarks/timing.py and benchmarks/ab_env.py: the rules every speed claim is measured by
(docs/benchmarks.md, "How to measure") — best of repeated runs, never the mean; A/B interleaved; one thread
count set explicitly for every side; the load average before and after; a subprocess's page faults."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


timing = _load("timing")


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_interleaved_takes_turns_keeps_the_best_and_sets_the_threads(threads_restored):
    calls: list[tuple[str, int]] = []
    sleeps = {"A": iter([0.03, 0.01, 0.02]), "B": iter([0.02, 0.04, 0.015])}

    def fn(name: str):
        def run() -> dict:
            calls.append((name, torch.get_num_threads()))
            torch.set_num_threads(2)  # a side that changes the count must not carry it to the next call
            return {"seconds": next(sleeps[name]), "faults": len(calls)}

        return run

    t = timing.interleaved({"A": fn("A"), "B": fn("B")}, 3, threads=1)
    assert [c[0] for c in calls] == ["A", "B"] * 3  # A, B, A, B, A, B
    assert all(c[1] == 1 for c in calls)  # every call at the count asked for
    assert t.best == {"A": 0.01, "B": 0.015}  # the minimum, not the mean
    assert t.times == {"A": [0.03, 0.01, 0.02], "B": [0.02, 0.04, 0.015]}
    assert t.ratio("B", "A") == pytest.approx(1.5)
    assert t.round_ratios("B", "A") == pytest.approx([0.02 / 0.03, 4.0, 0.75])
    assert t.best_stats("A") == {"seconds": 0.01, "faults": 3}
    assert t.rounds == 3 and t.threads == 1
    line = t.conditions()
    assert "interleaved, best of 3 each, 1 thread each" in line and "load average" in line and "before" in line and "after" in line


def test_interleaved_times_the_wall_and_warms_up_untimed(threads_restored):
    n = {"x": 0}

    def work() -> None:
        n["x"] += 1
        sum(range(20_000))

    t = timing.interleaved({"x": work}, 2, threads=1, warmup=2)
    assert n["x"] == 4 and len(t.times["x"]) == 2 and all(s > 0 for s in t.times["x"])
    assert t.stats == {}
    b = timing.best_of(work, 3, threads=1, warmup=0)
    assert b.best["run"] == min(b.times["run"])


def test_interleaved_refuses_what_it_cannot_measure():
    with pytest.raises(ValueError):
        timing.interleaved({"a": lambda: None}, 0, threads=1)
    with pytest.raises(ValueError):
        timing.interleaved({"a": lambda: None}, 1, threads=0)
    with pytest.raises(ValueError):
        timing.interleaved({}, 1, threads=1)


def test_matmul_rate_is_positive():
    assert timing.matmul_rate(torch.device("cpu"), n=64, reps=3) > 0


def test_run_command_reports_the_childs_page_faults_and_threads(tmp_path):
    out = tmp_path / "env.txt"
    code = ("import os, sys; b = bytearray(32 << 20); b[::4096] = b'x' * len(b[::4096]); "
            "open(sys.argv[1], 'w').write(os.environ['OMP_NUM_THREADS'] + ' ' + os.environ['MKL_NUM_THREADS'] + ' ' + os.environ['XYZ'])")
    r = timing.run_command([sys.executable, "-c", code, str(out)], threads=3, env={"XYZ": "7"})
    assert out.read_text() == "3 3 7"
    assert r["minflt"] > 32 * 256 // 2  # 32 MiB touched page by page: thousands of minor faults
    assert r["seconds"] > 0 and r["user_s"] >= 0 and r["sys_s"] >= 0 and r["majflt"] >= 0
    with pytest.raises(RuntimeError, match="exit 3"):
        timing.run_command([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], threads=1)


def test_results_digest_reads_tables_and_manifests_not_the_replica(tmp_path):
    import pandas as pd

    for name in ("a", "b"):
        d = tmp_path / name
        (d / "replica").mkdir(parents=True)
        pd.DataFrame({"x": [1.0, 2.0]}).to_parquet(d / "t.parquet")
        (d / "manifest.json").write_text('{"1": "h"}')
        (d / "replica" / "manifest.json").write_text(name)  # the replica's record names its place: left out
    assert timing.results_digest(tmp_path / "a") == timing.results_digest(tmp_path / "b")
    pd.DataFrame({"x": [1.0, 2.5]}).to_parquet(tmp_path / "b" / "t.parquet")
    assert timing.results_digest(tmp_path / "a") != timing.results_digest(tmp_path / "b")


def test_ab_env_times_both_sides_interleaved_and_checks_the_bits(tmp_path, capsys):
    ab = _load("ab_env")
    same = "import json, os, sys; os.makedirs(sys.argv[1]); open(sys.argv[1] + '/manifest.json', 'w').write('{}')"
    rc = ab.main(["--threads", "1", "--repeats", "2", "--", sys.executable, "-c", same, "{out}"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "A: SEEDLAB_MALLOC=0; B: SEEDLAB_MALLOC=1" in text and "interleaved, best of 2 each, 1 thread each" in text
    assert "minor faults" in text and "the same bits in all 4 runs" in text and "A/B wall" in text
    # the side's environment reaches the command: its result differs between A and B
    differ = ("import os, sys; os.makedirs(sys.argv[1]); "
              "open(sys.argv[1] + '/manifest.json', 'w').write(os.environ['SEEDLAB_MALLOC'])")
    assert ab.main(["--threads", "1", "--repeats", "1", "--", sys.executable, "-c", differ, "{out}"]) == 1
    assert "DIFFER" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ab.main(["--threads", "1"])  # no command


def test_query_share_is_the_texts_part_of_a_forks_and_the_twins_time():
    share = _load("query_share").shares(0.02, 0.01, 0.04, horizons=4, after=100, end=200)
    assert share["fork"] == pytest.approx(0.04 / (2.0 + 0.04))  # 4 horizons x 10 ms beside 100 updates x 20 ms
    assert share["twin"] == pytest.approx(0.16 / (4.0 + 0.16))
