"""The repeats study: does a passage seen three times differ from one seen once? Its design and its folder.

A fork design (seedlab.forks): per seed a shared prefix to the fork step s, then four arms forked there,

- ``twin``      the ordinary batches;
- ``once``      the passage in row ``injection_row`` of the batch of s;
- ``thrice``    the same row of the batches of s, s + gap and s + 2·gap (:attr:`RepeatsConfig.schedule`);
- ``ordinary``  the null of ``once``: that one row of s replaced by an ordinary stretch of the held-out
                split as long as the passage (a row replaced through the same channel, with nothing
                particular in it),

and the replica control (the twin trained again, bitwise). Every field is the fork design's
(forks/design.py) but three: the passage, the gap, and where the ordinary stretch is drawn.

The folder is the fork design's (forks/folders.py) with the study's two tables and report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from seedlab.config import parse
from seedlab.forks.design import ForkDesign, Pos
from seedlab.forks.folders import DesignFolder

#: the arms of every seed, the twin first
ARMS = ("twin", "once", "thrice", "ordinary")
#: the level of every test (repeats/measure.py)
ALPHA = 0.05


class RepeatsConfig(ForkDesign):
    passage: str = Field(description="the injected text, encoded with the corpus's tokenizer (it must fit one row: "
                                     "block_size + 1 tokens)")
    gap: Pos = Field(10, description="updates between the thrice arm's injections: the batches of s, s + gap and s + 2·gap")
    ordinary_seed: int = Field(0, description="where in the held-out split the ordinary arm's stretch starts "
                                              "(random.Random(ordinary_seed))")

    @model_validator(mode="after")
    def _repeats(self) -> RepeatsConfig:
        if self.schedule[-1] >= self.end:
            raise ValueError(f"gap: the third injection (step {self.schedule[-1]}) must come before the end "
                             f"(steps: {self.end}); at most {(self.end - 1 - self.injection_step) // 2}")
        if len(self.seeds) < 2:
            raise ValueError("seeds: the comparisons are paired over seeds: name at least two")
        return self

    @property
    def schedule(self) -> list[int]:
        """The steps whose batch carries the passage in the thrice arm (the first is also once's)."""
        return [self.injection_step + i * self.gap for i in range(3)]


def config_record(cfg: RepeatsConfig, world_size: int) -> dict[str, Any]:
    """config.json: the resolved config and how many ranks split each batch (what makes a folder
    hold the same design: the folder's claim compares it)."""
    return cfg.model_dump(mode="json") | {"world_size": world_size}


def read_config(record: dict[str, Any]) -> RepeatsConfig:
    """The config a config.json holds (a one-line error when it is not a repeats design's)."""
    return parse(RepeatsConfig, {k: v for k, v in record.items() if k != "world_size"})


class RepeatsFolder(DesignFolder):
    """A repeats design's folder: the fork design's files, and::

        DIR/measures.parquet   one row per seed x arm but the twin (repeats/measure.py)
        DIR/paired.parquet     the paired comparisons over seeds
        DIR/report.md          the report
    """

    study = "repeats"

    @property
    def measures(self) -> Path:
        return self.root / "measures.parquet"

    @property
    def paired(self) -> Path:
        return self.root / "paired.parquet"
