"""The fields every fork-at-injection design shares: one GPT pre-trained per seed on the
(seed, step) batches of a prepared corpus, a shared prefix up to the injection step ``s``, and
runs forked from it that differ in row ``injection_row`` of the batch of step s.

:class:`ForkDesign` is a :class:`~seedlab.config.Strict` config holding those fields (and their
checks); it satisfies :class:`seedlab.lm.trainer.Settings`. A study's config derives from it and
adds its own (the twins' conditions, the attribution bank's candidates and queries); what its
runs differ in are arms (forks/arms.py). Every field's help is its
``description`` (``seedlab presets show``, ``--help``); numbers the twins paper does not state say
``(not stated)`` there, and docs/assumptions.md lists them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from seedlab.config import Strict
from seedlab.lm.gptconfig import PRESETS, GPTConfig
from seedlab.lm.schedule import decay_end, default_warmup, midpoint

Pos = Annotated[int, Field(gt=0)]


class ForkDesign(Strict):
    corpus: str = Field(description="a prepared corpus folder (seedlab corpus prepare), relative to the current folder like --out")
    model: str = Field("mini", description="a preset of seedlab.lm.model.PRESETS")
    block_size: Pos | None = Field(None, description="tokens per row; null: the preset's (row length: not stated)")
    seeds: list[int] = Field([0, 1], description="training seeds: each one's init and batches (seed, step)")
    steps: Pos = Field(300, description="optimizer updates of the schedule (paper: 9,536)")
    batch_size: Pos = Field(16, description="rows per batch, over all ranks (paper: 256)")
    micro_batch: Pos | None = Field(None, description="rows per forward/backward on one rank (gradient accumulation); null: all of them")
    injection_step: int = Field(100, description="updates completed before the injected batch (paper: 200)")
    midpoint: Pos | None = Field(None, description='the "mid-point" checkpoint / horizon (updates completed); null: half-way from s '
                                                   "to the end (not stated)")
    injection_row: int = Field(0, description="which row of that batch is replaced (under torchrun: in rank row // (batch/world))")
    peak_lr: float = Field(6e-4, description="learning rate at the end of the warm-up (paper: 6e-4)")
    min_lr: float = Field(6e-5, description="end of the cosine decay (not stated)")
    warmup: Pos | None = Field(None, description="warm-up updates; null: ends at the injection step, so it happens at peak LR (not stated)")
    decay_steps: Pos | None = Field(None, description=(
        "the update count at which the cosine decay reaches min_lr, the rate staying there after it; null: steps, the "
        "decay ending with the run (not stated). Must end after the warm-up and the injection step; may exceed steps "
        "(the run then ends part-way down that decay)"))
    weight_decay: float = Field(0.1, description="AdamW's decoupled weight decay, on matrices and embeddings only (not stated; nanoGPT)")
    beta1: float = Field(0.9, description="AdamW's first-moment decay (not stated; nanoGPT)")
    beta2: float = Field(0.95, description="AdamW's second-moment decay (not stated; nanoGPT)")
    grad_clip: float = Field(1.0, description="the gradients' global norm is clipped to this (not stated; nanoGPT)")
    replicas: list[int] | None = Field(None, description="seeds whose twin is trained twice after the injection (the replica "
                                                         "control); null: the first seed")
    device: str = Field("auto", description='"auto": cuda:<LOCAL_RANK> when there is a GPU, else cpu')
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16 = autocast; fp32 keeps CPU runs bitwise reproducible")
    threads: Pos | None = Field(None, description="torch CPU threads per process; null: torch's default")
    arm_batch: Pos | None = Field(None, description="runs trained together in one stack of tensors (forks/stacked.py: a seed's "
                                                   "arms and replica, and other seeds'); 1: one after another (the serial loop); "
                                                   "null: as many as fit stack_memory")
    stack_memory: Annotated[float, Field(gt=0)] = Field(2.0, description="GiB a stack may hold (weights, gradients, AdamW "
                                                                          "moments of its runs, and one group's activations); "
                                                                          "sizes arm_batch when it is null")

    @model_validator(mode="after")
    def _fork_design(self) -> ForkDesign:
        if self.model not in PRESETS:
            raise ValueError(f"model: must be one of {', '.join(PRESETS)}, got {self.model!r}")
        if not 0 < self.injection_step < self.steps:
            raise ValueError(f"injection_step: must be inside the run (1 .. {self.steps - 1}), got {self.injection_step}")
        if self.decay_steps is not None and self.decay_steps <= max(self.warmup_steps, self.injection_step):
            raise ValueError(f"decay_steps: the decay must end after the warm-up ({self.warmup_steps}) and the injection "
                             f"step ({self.injection_step}): at least {max(self.warmup_steps, self.injection_step) + 1}, "
                             f"got {self.decay_steps}")
        if not 0 <= self.injection_row < self.batch_size:
            raise ValueError(f"injection_row: must be in 0 .. {self.batch_size - 1}, got {self.injection_row}")
        if self.midpoint is not None and not self.injection_step < self.midpoint < self.end:
            raise ValueError(f"midpoint: must be between the injection step and the end "
                             f"({self.injection_step + 1} .. {self.end - 1}), got {self.midpoint}")
        if not self.seeds:
            raise ValueError("seeds: name at least one")
        for name, values in (("seeds", self.seeds), ("replicas", self.replicas or [])):
            twice = next((k for i, k in enumerate(values) if k in values[:i]), None)
            if twice is not None:
                raise ValueError(f"{name}: seed {twice} is named twice (each seed is one folder of runs)")
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
    def decay_end(self) -> int:
        """Where the cosine reaches ``min_lr``: ``decay_steps``, else ``steps`` (lm/schedule.py ``decay_end``)."""
        return decay_end(self)

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
