"""One progress bar for long work: label, bar, done/total unit, elapsed, ETA, and a status note.

On a terminal (stderr a TTY) it is a rich bar on stderr. Written to a log (stderr a file, a pipe, a
job's captured output) it is lines instead: one when the work starts (entering the bar, or, where its
size is not known then, once :meth:`Bar.set_total` gives it: a design's arms are checked first, and a
bad one stays a one-line error), then one every :data:`EVERY` seconds (``every=``; the environment
variable SEEDLAB_PROGRESS_EVERY sets it for every command) and one at the end, each with done/total,
the rate (of this process: work done before a resume is not counted), the elapsed time and the ETA,
the note and the piece of work in progress, e.g.::

    sweep: 3/22 jobs (14%), 0.25 jobs/min, elapsed 0:12:00, eta 1:16:00; (352 members; this job: epoch 120/300)

A line is due once ``every`` seconds have passed since the last: it is written when the bar next moves
(or its note changes), or by a heartbeat thread when nothing moves (a sweep job longer than a minute).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from seedlab.errors import SeedlabError

#: seconds between two progress lines in a log (SEEDLAB_PROGRESS_EVERY overrides it)
EVERY = 60.0


def every_from_env() -> float:
    """The seconds between progress lines: SEEDLAB_PROGRESS_EVERY if set, else :data:`EVERY`."""
    raw = os.environ.get("SEEDLAB_PROGRESS_EVERY")
    if raw is None:
        return EVERY
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise SeedlabError(f"SEEDLAB_PROGRESS_EVERY: seconds between progress lines (> 0), got {raw!r}")
    return value


def duration(seconds: float) -> str:
    """``h:mm:ss``."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def rate_text(per_second: float, unit: str) -> str:
    """A rate in the largest of per second, minute or hour that makes it at least 1 (three figures)."""
    for scale, per in ((1, "s"), (60, "min"), (3600, "h")):
        if per_second * scale >= 1 or per == "h":
            return f"{per_second * scale:.3g} {unit}/{per}"
    raise AssertionError("unreachable")


class Lines:
    """The bar as lines in a log: the state of the work, and one line when due (module docstring)."""

    def __init__(self, label: str, total: int, unit: str, *, note: str, done: int, every: float,
                 clock: Callable[[], float], stream: TextIO):
        self.label, self.total, self.unit, self.note, self.done = label, total, unit, note, done
        self.every, self.clock, self.stream = every, clock, stream
        self.sub: list | None = None  # [label, total, done] of the piece of work in progress
        self.lock = threading.Lock()
        self.t0 = self.last = clock()
        self.done0 = done
        self.written = False  # a line is out: the work has started

    def line(self) -> str:
        """What the work has come to, now."""
        elapsed = self.clock() - self.t0
        moved = self.done - self.done0
        rate = moved / elapsed if moved > 0 and elapsed > 0 else None
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = ("?" if not rate or not self.total else duration(0) if self.done >= self.total
               else duration((self.total - self.done) / rate))
        text = (f"{self.label}: {self.done}/{self.total} {self.unit}{share}, "
                f"{rate_text(rate, self.unit) if rate else 'rate ?'}, elapsed {duration(elapsed)}, eta {eta}")
        if self.note:
            text += f"; {self.note}"
        if self.sub is not None:
            text += f"; {self.sub[0]} {self.sub[2]}/{self.sub[1]}"
        return text

    def write(self) -> None:
        with self.lock:
            self.last, self.written = self.clock(), True
            print(self.line(), file=self.stream, flush=True)

    def due(self) -> bool:
        return self.clock() - self.last >= self.every

    def maybe(self) -> None:
        """Write a line if one is due."""
        if self.due():
            self.write()


class Bar:
    """A progress bar (module docstring): ``done`` of ``total`` ``unit``, with a ``note``. ``enabled=False``
    shows nothing. ``every``, ``clock`` and ``stream`` are for a log's lines: the seconds between two
    (default :func:`every_from_env`), the clock they are timed by (default ``time.monotonic``; a given
    clock starts no heartbeat thread, whose waits are in real time) and where they go (default stderr)."""

    def __init__(self, label: str, total: int, unit: str, *, note: str = "", done: int = 0, enabled: bool = True,
                 every: float | None = None, clock: Callable[[], float] | None = None, stream: TextIO | None = None):
        self.enabled = enabled
        self.sub = None
        self.lines: Lines | None = None  # a log's lines, where stderr (``stream``) is not a terminal
        self._beats = clock is None  # a heartbeat thread (real time only)
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if not enabled:
            return
        stream = stream or sys.stderr
        if not stream.isatty():
            self.lines = Lines(label, total, unit, note=note, done=done, every=every or every_from_env(),
                               clock=clock or time.monotonic, stream=stream)
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.p = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[note]}"),
            console=Console(file=stream),
        )
        self.task = self.p.add_task(label, total=total, completed=done, note=note)

    def __enter__(self) -> Bar:
        if self.lines is not None:
            lines = self.lines  # timed from here (a bar may be made, or advanced past a resume's done work, before)
            lines.t0, lines.last, lines.done0 = lines.clock(), lines.clock(), lines.done
            if lines.total:
                lines.write()
            if self._beats:
                self._heartbeat = threading.Thread(target=self._beat, name="seedlab-progress", daemon=True)
                self._heartbeat.start()
        elif self.enabled:
            self.p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lines is not None:
            self._stop.set()
            if self._heartbeat is not None:
                self._heartbeat.join()
            if self.lines.written or exc[0] is None:  # where the work ended (an error before it began: its line alone)
                self.lines.write()
        elif self.enabled:
            self.p.__exit__(*exc)

    def _beat(self) -> None:
        """The heartbeat: a line when one is due and nothing moved to write it."""
        lines = self.lines
        while not self._stop.wait(max(0.01, lines.last + lines.every - lines.clock())):
            lines.maybe()

    def update(self, done: int | None = None, note: str | None = None) -> None:
        if self.lines is not None:
            self.lines.done = self.lines.done if done is None else done
            self.lines.note = self.lines.note if note is None else note
            self.lines.maybe()
        elif self.enabled:
            self.p.update(self.task, completed=done, **({} if note is None else {"note": note}))

    def set_total(self, total: int) -> None:
        """The work's size, once it is known."""
        if self.lines is not None:
            self.lines.total = total
            if not self.lines.written:
                self.lines.write()
        elif self.enabled:
            self.p.update(self.task, total=total)

    def advance(self, n: int = 1) -> None:
        if self.lines is not None:
            self.lines.done += n
            if self.lines.sub is not None:
                self.lines.sub[2] += n
            self.lines.maybe()
        elif self.enabled:
            self.p.advance(self.task, n)
            if self.sub is not None:
                self.p.advance(self.sub, n)

    def step(self, note: str) -> None:
        """One unit of work done, showing ``note`` (e.g. after every update of a training run)."""
        if self.lines is not None:
            self.lines.note = note
        else:
            self.update(note=note)
        self.advance()

    def start_sub(self, label: str, total: int, done: int = 0) -> None:
        """A second line for the piece of work in progress (e.g. one run of a design); it
        advances with the main bar and is replaced by the next ``start_sub``."""
        if self.lines is not None:
            self.lines.sub = [label, total, done]
        elif self.enabled:
            if self.sub is not None:
                self.p.remove_task(self.sub)
            self.sub = self.p.add_task(label, total=total, completed=done, note="")
