"""seedlab.progress: written to a log (not a terminal), a bar is one line at the start, one a minute (or
``every`` / SEEDLAB_PROGRESS_EVERY seconds) with done/total, the rate and the ETA, and one at the end."""

from __future__ import annotations

import io
import time

import pytest

from seedlab.errors import SeedlabError
from seedlab.progress import Bar, duration, every_from_env, rate_text


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _bar(**kw):
    clock, log = Clock(), io.StringIO()
    return Bar(**{"label": "sweep", "total": 10, "unit": "jobs", "clock": clock, "stream": log, **kw}), clock, log


def test_a_log_gets_a_line_at_the_start_then_one_a_minute_then_one_at_the_end():
    bar, clock, log = _bar(note="(40 members)")
    bar.advance()  # before the work starts (a resume's bookkeeping): no line yet
    assert log.getvalue() == ""
    with bar:
        assert log.getvalue().splitlines() == ["sweep: 1/10 jobs (10%), rate ?, elapsed 0:00:00, eta ?; (40 members)"]
        clock.t += 30
        bar.advance()
        bar.update(note="(40 members; this job: epoch 5/10)")
        assert len(log.getvalue().splitlines()) == 1  # not a minute yet
        clock.t += 31
        bar.advance()  # 2 jobs in 61 s: 1.97/min, 7 left: 213.5 s
        clock.t += 29
        bar.update(note="(40 members; this job: epoch 9/10)")
        clock.t += 31  # a minute after the last line
        bar.update(done=5)
    lines = log.getvalue().splitlines()
    assert lines[1:] == [
        "sweep: 3/10 jobs (30%), 1.97 jobs/min, elapsed 0:01:01, eta 0:03:34; (40 members; this job: epoch 5/10)",
        "sweep: 5/10 jobs (50%), 1.98 jobs/min, elapsed 0:02:01, eta 0:02:31; (40 members; this job: epoch 9/10)",
        "sweep: 5/10 jobs (50%), 1.98 jobs/min, elapsed 0:02:01, eta 0:02:31; (40 members; this job: epoch 9/10)"]


def test_the_cadence_is_configurable_and_a_run_in_progress_is_named(monkeypatch):
    monkeypatch.setenv("SEEDLAB_PROGRESS_EVERY", "10")
    bar, clock, log = _bar(total=0, unit="steps")
    with bar:
        assert log.getvalue() == ""  # its size not known yet: nothing started
        bar.set_total(400)
        bar.start_sub("seed 0 twin", 200)
        for _ in range(100):
            clock.t += 0.25
            bar.step("loss 3.2")
    lines = log.getvalue().splitlines()
    assert lines[0] == "sweep: 0/400 steps (0%), rate ?, elapsed 0:00:00, eta ?"
    assert len(lines) == 2 + 2  # at 10 s and 20 s, and the end at 25 s
    assert lines[1] == "sweep: 40/400 steps (10%), 4 steps/s, elapsed 0:00:10, eta 0:01:30; loss 3.2; seed 0 twin 40/200"
    assert lines[-1].startswith("sweep: 100/400 steps (25%), 4 steps/s, elapsed 0:00:25, eta 0:01:15")
    assert every_from_env() == 10
    for bad in ("0", "-1", "abc"):
        monkeypatch.setenv("SEEDLAB_PROGRESS_EVERY", bad)
        with pytest.raises(SeedlabError, match=rf"^SEEDLAB_PROGRESS_EVERY: seconds between progress lines \(> 0\), got '{bad}'$"):
            _bar()


def test_an_error_before_the_work_starts_stays_its_one_line():
    bar, _, log = _bar(total=0)
    with pytest.raises(SeedlabError), bar:
        raise SeedlabError("arms: two arms named once")  # a design's arms are checked before set_total
    assert log.getvalue() == ""


def test_the_heartbeat_writes_when_nothing_moves():
    log = io.StringIO()
    with Bar("sweep", 4, "jobs", every=0.05, stream=log):
        time.sleep(0.5)  # one long job: no event
    lines = log.getvalue().splitlines()
    assert len(lines) >= 4 and all(x.startswith("sweep: 0/4 jobs (0%), rate ?, elapsed ") for x in lines)


def test_a_terminal_gets_the_bar_and_disabled_is_silent():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert Bar("x", 3, "u", stream=Tty()).lines is None
    log = io.StringIO()
    with Bar("x", 3, "u", stream=log, enabled=False) as bar:
        bar.advance()
    assert log.getvalue() == ""


@pytest.mark.parametrize(("per_second", "text"), [(4.0, "4 u/s"), (2 / 61, "1.97 u/min"), (1 / 7200, "0.5 u/h"),
                                                  (1e-5, "0.036 u/h")])
def test_rates_and_durations(per_second, text):
    assert rate_text(per_second, "u") == text
    assert duration(3 * 3600 + 62.4) == "3:01:02"
