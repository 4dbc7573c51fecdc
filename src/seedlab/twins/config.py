"""The twins design as one config: what is trained (``TwinsConfig``), what is measured
(``MeasureConfig``), and which outcomes are primary (pre-registered before training).

Numbers the paper does not state are fields with a default and a ``(not stated)``
comment; docs/assumptions.md lists them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from seedlab.config import Strict
from seedlab.lm.model import PRESETS, GPTConfig
from seedlab.lm.schedule import default_warmup
from seedlab.store import content_hash

CONDITIONS = ("twin", "fluent-fabricated", "fluent-attested", "random-chars")
INJECTED = CONDITIONS[1:]
Pos = Annotated[int, Field(gt=0)]
Label = Literal["primary", "secondary", "exploratory"]

#: the paper's pre-registration: barrier primary, held-out CE secondary, the rest exploratory
OUTCOMES: dict[str, Label] = {
    "barrier": "primary",
    "heldout_ce": "secondary",
    "distance": "exploratory",
    "cka": "exploratory",
    "passage_ce": "exploratory",
}


class MeasureConfig(Strict):
    """How ``seedlab twins measure`` evaluates a finished design (all not stated by the paper)."""

    alphas: list[float] = [i / 10 for i in range(11)]  # interpolation grid, endpoints 0 and 1 included
    heldout_rows: Pos = 64  # held-out rows (block_size tokens each) for the barrier and held-out CE
    probe_rows: Pos = 16  # held-out rows whose representations CKA compares
    eval_rows: Pos = 16  # rows per forward pass while evaluating (memory, not results)
    seed: int = 0  # which held-out rows are drawn (the same rows for every model)
    smooth_steps: Pos = 25  # rolling mean of |loss − twin's loss| before finding its peak (steps)
    just_after_steps: Pos = 5  # the steps after the injected batch that define "just after the injection"

    @model_validator(mode="after")
    def _grid(self) -> MeasureConfig:
        a = self.alphas
        if len(a) < 3 or a[0] != 0 or a[-1] != 1 or any(x >= y for x, y in zip(a, a[1:])):
            raise ValueError(f"alphas: must rise strictly from 0 to 1 with at least one point between, got {a}")
        return self


class TwinsConfig(Strict):
    corpus: str  # a prepared corpus folder (seedlab corpus prepare), relative to the current folder like --out
    model: str = "mini"  # a preset of seedlab.lm.model.PRESETS
    block_size: Pos | None = None  # tokens per row; null: the preset's (row length: not stated)
    seeds: list[int] = [0, 1]
    steps: Pos = 300  # optimizer updates per run (paper: 9,536)
    batch_size: Pos = 16  # rows per batch, over all ranks (paper: 256)
    micro_batch: Pos | None = None  # rows per forward/backward on one rank (gradient accumulation); null: all of them
    injection_step: int = 100  # updates completed before the injected batch (paper: 200)
    injection_row: int = 0  # which row of that batch is replaced (under torchrun: in rank row // (batch/world))
    peak_lr: float = 6e-4  # (paper: 6e-4)
    min_lr: float = 6e-5  # end of the cosine decay (not stated)
    warmup: Pos | None = None  # null: ends at the injection step, so it happens at peak LR (not stated)
    weight_decay: float = 0.1  # (not stated; nanoGPT)
    beta1: float = 0.9
    beta2: float = 0.95  # (not stated; nanoGPT)
    grad_clip: float = 1.0  # (not stated; nanoGPT)
    conditions: list[str] = list(CONDITIONS)
    passages: dict[str, str] = {}  # condition -> text file, relative to the config file (they travel with it)
    subjects: dict[str, str] = {}  # condition -> the passage's subject, checked against the corpus
    random_chars_tokens: Pos | None = None  # null: the fabricated (else attested) passage's token length
    random_chars_seed: int = 0  # the random keyboard text is drawn from random.Random(this)
    checkpoint_every: Pos | None = None  # plus injection, injection + 50, mid-point and final
    midpoint: Pos | None = None  # the "mid-point" checkpoint (updates completed); null: half-way from s to the end
    replicas: list[int] | None = None  # seeds whose twin is trained twice after the injection (the replica control); null: the first seed
    keep: list[Literal["prefix", "final"]] = ["prefix"]  # complete training states (weights + AdamW) kept after a run: the shared prefix at s (gradmatch's update difference, forks), each condition's end
    device: str = "auto"  # "auto": cuda:<LOCAL_RANK> when there is a GPU, else cpu
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16 = autocast; fp32 keeps CPU runs bitwise reproducible
    threads: Pos | None = None  # torch CPU threads per process; null: torch's default
    outcomes: dict[str, Label] = dict(OUTCOMES)  # measure -> label, pre-registered when the run starts
    measure: MeasureConfig = MeasureConfig()

    @model_validator(mode="after")
    def _check(self) -> TwinsConfig:
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad:
            raise ValueError(f"conditions: must be among {', '.join(CONDITIONS)}, got {bad[0]!r}")
        if "twin" not in self.conditions:
            raise ValueError("conditions: must include 'twin', the baseline every condition is compared with")
        if self.model not in PRESETS:
            raise ValueError(f"model: must be one of {', '.join(PRESETS)}, got {self.model!r}")
        if not 0 < self.injection_step < self.steps:
            raise ValueError(f"injection_step: must be inside the run (1 .. {self.steps - 1}), got {self.injection_step}")
        if not 0 <= self.injection_row < self.batch_size:
            raise ValueError(f"injection_row: must be in 0 .. {self.batch_size - 1}, got {self.injection_row}")
        if self.midpoint is not None and not self.injection_step < self.midpoint < self.steps:
            raise ValueError(f"midpoint: must be between the injection step and the end, got {self.midpoint}")
        if self.replicas is not None:
            if not self.replicas:
                raise ValueError("replicas: every design includes a replica control: name at least one seed (null: the first)")
            stray = [k for k in self.replicas if k not in self.seeds]
            if stray:
                raise ValueError(f"replicas: must be among the seeds {self.seeds}, got {stray[0]!r}")
        unknown = [k for k in self.outcomes if k not in OUTCOMES]
        if unknown:
            raise ValueError(f"outcomes: measures are {', '.join(OUTCOMES)}, got {unknown[0]!r}")
        return self

    @property
    def warmup_steps(self) -> int:
        """The warm-up's length: ``warmup``, else up to the injection step (so it runs at peak LR)."""
        return self.warmup or default_warmup(self.injection_step)

    @property
    def replica_seeds(self) -> list[int]:
        """The seeds of the replica control: ``replicas``, else the first seed."""
        return list(self.replicas) if self.replicas is not None else self.seeds[:1]

    @property
    def mid(self) -> int:
        return self.midpoint or (self.injection_step + self.steps) // 2

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        """The GPT this design trains: the ``model`` preset with the corpus's vocabulary (and ``block_size``, if set)."""
        update = {"vocab_size": vocab_size, **({"block_size": self.block_size} if self.block_size else {})}
        return PRESETS[self.model].model_copy(update=update)

    def checkpoint_steps(self) -> list[int]:
        """Updates completed at each saved checkpoint: s, s + 50, mid-point, final, and the cadence."""
        s = self.injection_step
        steps = {s, min(s + 50, self.steps), self.mid, self.steps}
        if self.checkpoint_every:
            steps |= set(range(self.checkpoint_every, self.steps + 1, self.checkpoint_every))
        return sorted(steps)

    def preregistration(self) -> dict:
        """What is fixed before training: the outcomes' labels and how they are measured."""
        body = {"outcomes": self.outcomes, "measure": self.measure.model_dump(mode="json")}
        return body | {"hash": content_hash(body)}
