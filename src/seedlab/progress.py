"""One progress bar for long work: label, bar, done/total unit, elapsed, ETA, and a status note."""

from __future__ import annotations


class Bar:
    def __init__(self, label: str, total: int, unit: str, *, note: str = "", done: int = 0, enabled: bool = True):
        self.enabled = enabled
        if enabled:
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
            )
            self.task = self.p.add_task(label, total=total, completed=done, note=note)
        self.sub = None

    def __enter__(self) -> Bar:
        if self.enabled:
            self.p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.p.__exit__(*exc)

    def update(self, done: int | None = None, note: str | None = None) -> None:
        if self.enabled:
            self.p.update(self.task, completed=done, **({} if note is None else {"note": note}))

    def set_total(self, total: int) -> None:
        """The work's size, once it is known."""
        if self.enabled:
            self.p.update(self.task, total=total)

    def advance(self, n: int = 1) -> None:
        if self.enabled:
            self.p.advance(self.task, n)
            if self.sub is not None:
                self.p.advance(self.sub, n)

    def step(self, note: str) -> None:
        """One unit of work done, showing ``note`` (e.g. after every update of a training run)."""
        self.update(note=note)
        self.advance()

    def start_sub(self, label: str, total: int, done: int = 0) -> None:
        """A second line for the piece of work in progress (e.g. one run of a design); it
        advances with the main bar and is replaced by the next ``start_sub``."""
        if self.enabled:
            if self.sub is not None:
                self.p.remove_task(self.sub)
            self.sub = self.p.add_task(label, total=total, completed=done, note="")
