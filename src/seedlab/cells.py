"""Kept cell summaries: a cell of a sweep (one measured run folder of a study) summarised into a small folder that
outlives its run folder, so a table across cells can be built over many sessions; and the loop the drivers share
(experiments/attribution_grid.py, experiments/twins_scale.py) that runs a cell's stages, summarises it, keeps the
summary and skips what is kept.

A study declares what a summary holds — a dataclass deriving from :class:`Summary`, with its scalar fields
(``scalars``, the stage wall times among them), its named frames (``frames``: name -> columns, in order) and the
frames' column types (``columns``, :class:`Columns`) — and keeps its own content (which frames, which scalars, how
they are computed, the tables across cells). This module writes and reads it, in the folder :class:`CellDir`::

    CELL/cell.json      the scalars, JSON (indent 1), written last: the folder holds a whole summary once it exists
    CELL/<frame>.csv    one CSV per frame: its columns in order, no index

Every CSV cell is read back as text and typed by its column's declared type (:meth:`Columns.typed`): strings ("" for
none), ints, bools, floats (NaN for an empty cell); a float pandas wrote (its shortest repr) reads back to the same
bits, so :meth:`Summary.from_dir` of :meth:`Summary.to_dir` is the summary again and writing it again gives the same
bytes. The table across cells is rendered into a :class:`TableDir` (``<stem>.md``, ``<stem>-<name>.csv``,
``<stem>-<name>.png``).

**The drivers' loop**: :func:`parse_seeds` (their ``--seeds``), :func:`skip_kept` (a cell KEEP holds is not run
again), :func:`run_cell` (the stages as subprocesses, each timed; a stage found done is skipped; the summary into
OUT/summaries/<cell>/ with the stage times, copied to KEEP/<cell>/) and :func:`summaries` (every cell summarised,
KEEP winning over OUT/summaries).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

import numpy as np
import pandas as pd

from seedlab.errors import SeedlabError
from seedlab.store import atomic_write, write_text

#: the summary's record, written last
RECORD = "cell.json"
#: the drivers' folder of summaries below OUT
SUMMARIES = "summaries"


@dataclass(frozen=True)
class CellDir:
    """A kept cell summary's folder (module doc): where its record and its frames live."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / RECORD

    def frame(self, name: str) -> Path:
        """One of the summary's frames, as CSV."""
        return self.root / f"{name}.csv"

    def is_kept(self) -> bool:
        return self.record.is_file()


@dataclass(frozen=True)
class TableDir:
    """Where a table across kept cells is rendered: ``<stem>.md``, ``<stem>-<name>.csv``, ``<stem>-<name>.png``."""

    root: Path
    stem: ClassVar[str] = "table"

    @property
    def report(self) -> Path:
        return self.root / f"{self.stem}.md"

    def table(self, name: str) -> Path:
        return self.root / f"{self.stem}-{name}.csv"

    def figure(self, name: str) -> Path:
        return self.root / f"{self.stem}-{name}.png"


@dataclass(frozen=True)
class Columns:
    """The declared types of a summary's frame columns; a column named in none of them is a float."""

    strings: frozenset[str] = frozenset()
    ints: frozenset[str] = frozenset()
    bools: frozenset[str] = frozenset()

    def typed(self, frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
        """``frame`` with exactly ``columns``, each of its type: strings ("" for none), ints, bools, floats (NaN); a
        column ``frame`` lacks is all none. Takes a frame read as text (:meth:`Summary.from_dir`) or one computed."""
        out = {}
        for c in columns:
            v = frame[c] if c in frame else pd.Series([None] * len(frame), index=frame.index, dtype=object)
            if c in self.strings:
                out[c] = v.map(lambda x: "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x))
                out[c] = out[c].astype(object)
            elif c in self.ints:
                out[c] = pd.to_numeric(v).astype(np.int64)
            elif c in self.bools:
                out[c] = v.map(lambda x: x if isinstance(x, (bool, np.bool_)) else str(x) == "True").astype(bool)
            else:
                out[c] = pd.to_numeric(v.replace("", np.nan) if v.dtype == object else v).astype(np.float64)
        return pd.DataFrame(out, columns=list(columns)).reset_index(drop=True)


S = TypeVar("S", bound="Summary")


class Summary:
    """What a kept cell summary does (module doc), for a dataclass that declares its content as class keywords::

        @dataclass
        class Cell(Summary, scalars=SCALARS, frames=FRAMES, columns=Columns(...), noun="kept grid cell summary"):
            ...  # a field per scalar and per frame

    ``noun`` names the folder in the one-line error of a folder without ``cell.json``."""

    SCALARS: ClassVar[tuple[str, ...]] = ()
    FRAMES: ClassVar[Mapping[str, Sequence[str]]] = {}
    COLUMNS: ClassVar[Columns] = Columns()
    NOUN: ClassVar[str] = "kept cell summary"

    def __init_subclass__(cls, *, scalars: Sequence[str] = (), frames: Mapping[str, Sequence[str]] | None = None,
                          columns: Columns | None = None, noun: str = "kept cell summary", **kw) -> None:
        super().__init_subclass__(**kw)
        cls.SCALARS, cls.FRAMES, cls.NOUN = tuple(scalars), dict(frames or {}), noun
        cls.COLUMNS = columns or Columns()

    def scalars(self) -> dict:
        return {k: getattr(self, k) for k in self.SCALARS}

    def to_dir(self, path: str | Path) -> Path:
        """``path/cell.json`` (the scalars) and one CSV per frame; returns ``path``."""
        d = CellDir(Path(path))
        for name in self.FRAMES:
            frame = getattr(self, name)
            atomic_write(d.frame(name), lambda p, f=frame: f.to_csv(p, index=False))
        write_text(d.record, json.dumps(self.scalars(), indent=1) + "\n")
        return d.root

    @classmethod
    def from_dir(cls: type[S], path: str | Path) -> S:
        """What :meth:`to_dir` wrote, exactly; a folder without ``cell.json`` is a one-line error. A scalar the
        record lacks (a summary written before the study recorded it) takes the dataclass field's default, where it
        has one; one without a default is a one-line error."""
        d = CellDir(Path(path))
        if not d.is_kept():
            raise SeedlabError(f"{d.root}: no {d.record.name} (not a {cls.NOUN})")
        record = json.loads(d.record.read_text())
        fields = getattr(cls, "__dataclass_fields__", {})
        missing = [k for k in cls.SCALARS if k not in record and
                   (k not in fields or (fields[k].default is MISSING and fields[k].default_factory is MISSING))]
        if missing:
            raise SeedlabError(f"{d.record}: no {', '.join(missing)} (not a {cls.NOUN} of this seedlab)")
        frames = {n: cls.COLUMNS.typed(pd.read_csv(d.frame(n), dtype=str, keep_default_na=False), cols)
                  for n, cols in cls.FRAMES.items()}
        return cls(**{k: record[k] for k in cls.SCALARS if k in record}, **frames)

    def equals(self, other: Summary) -> bool:
        """The same scalars and the same frames (NaN equal to NaN)."""
        same = json.dumps(self.scalars(), sort_keys=True) == json.dumps(other.scalars(), sort_keys=True)
        return same and all(getattr(self, n).equals(getattr(other, n)) for n in self.FRAMES)


# ---------------------------------------------------------------- the drivers' loop


def parse_seeds(text: str) -> list[int]:
    """A driver's ``--seeds``: comma-separated integers (argparse's ``type``)."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers, got {text!r}") from None


def log(cell: str, what: str, t0: float) -> None:
    print(f"[{cell}] {what} ({time.time() - t0:.0f} s)", flush=True)


def skip_kept(keep: Path | None, cell: str) -> bool:
    """Whether KEEP holds ``cell``'s summary (then the driver skips it, and this says so)."""
    if keep is None or not CellDir(keep / cell).is_kept():
        return False
    print(f"# {cell}: kept in {keep / cell}, skipped")
    return True


def run_cell(cell: str, commands: Mapping[str, Sequence[str]], summarise: Callable[[], Summary], *, out: Path,
             keep: Path | None = None, skip: Mapping[str, str] | None = None,
             env: Mapping[str, str] | None = None, resumed: Collection[str] = (),
             recorded: Mapping[str, float] | None = None) -> bool:
    """A cell's stages, its summary and its copy: each stage's command in turn as a subprocess (a stage in ``skip``
    is not run, its reason said), timed; then ``summarise()`` with every stage's wall time (``stages``) into
    OUT/summaries/<cell>/, copied to KEEP/<cell>/. A stage in ``resumed`` goes on from an earlier, interrupted
    invocation, so its time is this invocation's alone: it is kept as "<stage> (resumed)". ``recorded``: the wall
    seconds of stages another command ran (a folder adopted as it is), kept beside this call's. False when a stage
    failed (its exit code said)."""
    start, stages, skip = time.time(), dict(recorded or {}), skip or {}
    for stage, cmd in commands.items():
        t0 = time.time()
        if stage in skip:
            log(cell, f"{stage}: {skip[stage]}, skipped", t0)
            continue
        log(cell, f"{stage}: {shlex.join(cmd)}", start)
        done = subprocess.run(list(cmd), env=None if env is None else dict(env))
        if done.returncode:
            log(cell, f"{stage} FAILED with exit code {done.returncode}", t0)
            return False
        key = f"{stage} (resumed)" if stage in resumed else stage
        stages[key] = round(time.time() - t0, 1)
        log(cell, f"{key} done in {stages[key]:.0f} s", start)
    t0 = time.time()
    summary = summarise()
    stages["summarise"] = round(time.time() - t0, 1)
    summary.stages = stages
    where = summary.to_dir(out / SUMMARIES / cell)
    log(cell, f"summary -> {where}", start)
    if keep:
        shutil.copytree(where, keep / cell, dirs_exist_ok=True)
        log(cell, f"kept -> {keep / cell}", start)
    return True


def summaries(out: Path, keep: Path | None) -> dict[str, Path]:
    """Every cell summarised: its name -> KEEP/<cell> if kept there, else OUT/summaries/<cell>; by name."""
    found: dict[str, Path] = {}
    for root in [out / SUMMARIES] + ([keep] if keep else []):  # KEEP last: it wins
        if root.is_dir():
            for d in sorted(root.iterdir()):
                if CellDir(d).is_kept():
                    found[d.name] = d
    return dict(sorted(found.items()))
