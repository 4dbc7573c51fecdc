"""executors.py: jobs here or in processes, their results in the specs' order, and the progress they report while
they run (``run_local(..., on_progress=)``; forks/loop.py ``Reported`` is what a bank seed reports with)."""

from __future__ import annotations

import time

from helpers import reporting_job

from seedlab import executors
from seedlab.forks.loop import Reported


def _run(jobs: int):
    seen, done = [], []
    specs = [("a", 6, 0.2), ("b", 3, 0.2)]
    out = executors.run_local(reporting_job, specs, lambda spec: done.append((spec[0], len(seen))), jobs=jobs,
                              on_progress=lambda key, n: seen.append((key, n)))
    return out, seen, done


def test_reports_reach_the_caller_while_the_jobs_run_in_processes():
    out, seen, done = _run(jobs=2)
    assert out == [("a", 6), ("b", 3)]  # the specs' order, whichever finished first
    assert sorted(k for k, _ in done) == ["a", "b"]
    # a job reports before it ends: the caller saw some of a's units before a was done (a runs 1.2 s, the poll 0.5 s)
    assert dict(done)["a"] > 0
    totals = {k: sum(n for key, n in seen if key == k) for k in ("a", "b")}
    assert totals == {"a": 6, "b": 3}  # every report arrives by the time run_local returns


def test_reports_of_jobs_run_here_go_straight_to_the_caller():
    out, seen, done = _run(jobs=1)
    assert out == [("a", 6), ("b", 3)] and done == [("a", 6), ("b", 9)]  # in order, every unit before its job's end
    assert executors._reports is None  # nothing left listening after it returns
    executors.report("x", 1)  # outside run_local: a no-op


def test_a_seed_in_a_worker_reports_its_updates_gathered(monkeypatch):
    sent = []
    monkeypatch.setattr(executors, "_reports", type("Sink", (), {"put": staticmethod(sent.append)})())
    r = Reported(7, every=0.05)
    for _ in range(5):
        r.step("twin")
    r.skip(10)  # resumed updates count too
    time.sleep(0.06)
    r.step("twin")
    assert sent and all(k == 7 for k, _ in sent) and sum(n for _, n in sent) == 16  # gathered, none lost at a flush


def test_a_tally_ends_at_each_jobs_total_whatever_arrived():
    moved = []
    t = executors.Tally(moved.append, total=lambda key: {"a": 10, "b": 4}[key])
    t.progress("a", 3)
    t.progress("b", 6)  # more than its total arrived before it ended: nothing taken back
    t.done("a")  # a's 7 unsent units settled at its end
    t.progress("a", 2)  # a late report of a settled job: dropped
    t.done("b")
    assert moved == [3, 6, 7] and sum(moved) == 16


def test_run_tallied_ends_the_bar_at_every_jobs_total():
    moved = []
    out = executors.run_tallied(reporting_job, [("a", 4, 0.0), ("b", 2, 0.0)], moved.append,
                                total=lambda key: {"a": 5, "b": 2}[key], jobs=1, key=lambda spec: spec[0])
    assert out == [("a", 4), ("b", 2)] and sum(moved) == 7  # a reported 4 of its 5: the fifth settled at its end
