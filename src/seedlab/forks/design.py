"""The fields every fork-at-injection design shares: one GPT pre-trained per seed on the
(seed, step) batches of a prepared corpus, a shared prefix up to the injection step ``s``, and
runs forked from it that differ in row ``injection_row`` of the batch of step s.

:class:`ForkDesign` is a :class:`~seedlab.config.Strict` config holding those fields (and their
checks); it satisfies :class:`seedlab.lm.trainer.Settings`. A study's config derives from it and
adds its own (the twins' conditions, the attribution bank's candidates and queries); what its
runs differ in are arms (forks/arms.py). Numbers the
twins paper does not state carry a ``(not stated)`` comment; docs/assumptions.md lists them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from seedlab.config import Strict
from seedlab.lm.gptconfig import PRESETS, GPTConfig
from seedlab.lm.schedule import default_warmup, midpoint

Pos = Annotated[int, Field(gt=0)]


class ForkDesign(Strict):
    corpus: str  # a prepared corpus folder (seedlab corpus prepare), relative to the current folder like --out
    model: str = "mini"  # a preset of seedlab.lm.model.PRESETS
    block_size: Pos | None = None  # tokens per row; null: the preset's (row length: not stated)
    seeds: list[int] = [0, 1]
    steps: Pos = 300  # optimizer updates of the schedule (paper: 9,536)
    batch_size: Pos = 16  # rows per batch, over all ranks (paper: 256)
    micro_batch: Pos | None = None  # rows per forward/backward on one rank (gradient accumulation); null: all of them
    injection_step: int = 100  # updates completed before the injected batch (paper: 200)
    midpoint: Pos | None = None  # the "mid-point" checkpoint / horizon (updates completed); null: half-way from s to the end (not stated)
    injection_row: int = 0  # which row of that batch is replaced (under torchrun: in rank row // (batch/world))
    peak_lr: float = 6e-4  # (paper: 6e-4)
    min_lr: float = 6e-5  # end of the cosine decay (not stated)
    warmup: Pos | None = None  # null: ends at the injection step, so it happens at peak LR (not stated)
    weight_decay: float = 0.1  # (not stated; nanoGPT)
    beta1: float = 0.9
    beta2: float = 0.95  # (not stated; nanoGPT)
    grad_clip: float = 1.0  # (not stated; nanoGPT)
    replicas: list[int] | None = None  # seeds whose twin is trained twice after the injection (the replica control); null: the first seed
    device: str = "auto"  # "auto": cuda:<LOCAL_RANK> when there is a GPU, else cpu
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 = autocast; fp32 keeps CPU runs bitwise reproducible
    threads: Pos | None = None  # torch CPU threads per process; null: torch's default

    @model_validator(mode="after")
    def _fork_design(self) -> ForkDesign:
        if self.model not in PRESETS:
            raise ValueError(f"model: must be one of {', '.join(PRESETS)}, got {self.model!r}")
        if not 0 < self.injection_step < self.steps:
            raise ValueError(f"injection_step: must be inside the run (1 .. {self.steps - 1}), got {self.injection_step}")
        if not 0 <= self.injection_row < self.batch_size:
            raise ValueError(f"injection_row: must be in 0 .. {self.batch_size - 1}, got {self.injection_row}")
        if self.midpoint is not None and not self.injection_step < self.midpoint < self.end:
            raise ValueError(f"midpoint: must be between the injection step and the end "
                             f"({self.injection_step + 1} .. {self.end - 1}), got {self.midpoint}")
        if not self.seeds:
            raise ValueError("seeds: name at least one")
        if self.replicas is not None:
            if not self.replicas:
                raise ValueError("replicas: every design includes a replica control: name at least one seed (null: the first)")
            stray = [k for k in self.replicas if k not in self.seeds]
            if stray:
                raise ValueError(f"replicas: must be among the seeds {self.seeds}, got {stray[0]!r}")
        return self

    @property
    def warmup_steps(self) -> int:
        """The warm-up's length: ``warmup``, else up to the injection step (so it runs at peak LR)."""
        return self.warmup or default_warmup(self.injection_step)

    @property
    def end(self) -> int:
        """The last update trained (a study may stop before the schedule's end)."""
        return self.steps

    @property
    def mid(self) -> int:
        """The mid-point (updates completed): ``midpoint``, else half-way from s to the end."""
        return midpoint(self.injection_step, self.end, self.midpoint)

    @property
    def replica_seeds(self) -> list[int]:
        """The seeds of the replica control: ``replicas``, else the first seed."""
        return list(self.replicas) if self.replicas is not None else self.seeds[:1]

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        """The GPT this design trains: the ``model`` preset with the corpus's vocabulary (and ``block_size``, if set)."""
        update = {"vocab_size": vocab_size, **({"block_size": self.block_size} if self.block_size else {})}
        return PRESETS[self.model].model_copy(update=update)
