"""Hyperparameters of the shortcut study, as strict pydantic dataclasses.

``EnsembleConfig`` is one ensemble (``seedlab shortcut train``): one architecture, many
members. ``SweepConfig`` is a grid of them (``seedlab shortcut sweep``). Every value the
paper does not state is a field here with its default, and is listed in
docs/assumptions.md. Every field's help is its ``description`` (``seedlab presets show``,
``--help``), with its units.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from seedlab.config import Strict
from seedlab.shortcut.tasks import TASKS


# validators shared by the member grid, the member list and the sweep grid
def _task_name(v: str) -> str:
    if v not in TASKS:
        raise ValueError(f"must be one of {', '.join(TASKS)}, got {v!r}")
    return v


def _ratio(v: float) -> float:
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"must be in [0, 1], got {v!r}")
    return v


Pos = Annotated[int, Field(gt=0)]  # a positive integer
PosFloat = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]
Beta = Annotated[float, Field(ge=0, lt=1)]


class ModelConfig(Strict):
    """The transformer every member of an ensemble shares."""

    layers: Pos = Field(2, description="transformer blocks (paper: 1 or 2)")
    heads: Pos = Field(2, description="attention heads per block (paper: 1 or 2)")
    d_model: Pos = Field(64, description="residual width (paper)")
    d_ff: Pos = Field(128, description="MLP hidden width (paper)")
    act: Literal["relu", "gelu"] = Field("relu", description="MLP nonlinearity (not stated)")
    layer_norm: bool = Field(True, description="pre-LN blocks + final LN (not stated)")
    causal: bool = Field(False, description="attention mask; the readout token sits last (not stated)")
    init_std: PosFloat = Field(0.02, description="std of N(0, s^2) for every weight matrix; biases 0, LN gains 1")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.heads:
            raise ValueError(f"heads: must divide d_model={self.d_model}, got {self.heads}")
        return self


class DataConfig(Strict):
    """The three splits of a task (train, val at r = 1, adv at r = 0)."""

    length: Pos = Field(5, description='integers per sequence ("five numbers", plain-language summary)')
    vocab: Annotated[int, Field(ge=2)] = Field(16, description="integers are drawn from 0 .. vocab-1 (not stated)")
    n_train: Pos = Field(16384, description="training samples (paper)")
    n_val: Pos = Field(2048, description="validation samples, r = 1 (not stated)")
    n_adv: Pos = Field(2048, description="adversarial samples, r = 0 (not stated)")
    data_seed: int = Field(0, description="fixes the three splits of an experiment (shared by all model seeds)")


class OptimConfig(Strict):
    """AdamW (torch.optim.AdamW semantics). Members may override lr and weight_decay."""

    lr: PosFloat = Field(1e-3, description="learning rate, constant: no schedule (not stated)")
    beta1: Beta = Field(0.9, description="Adam's first-moment decay (not stated; torch default)")
    beta2: Beta = Field(0.999, description="Adam's second-moment decay (not stated; torch default)")
    eps: PosFloat = Field(1e-8, description="Adam's epsilon (not stated; torch default)")
    weight_decay: NonNeg = Field(0.1, description="AdamW weight decay, decoupled; applied to every parameter as torch does (paper: 0.1, high 0.4)")

    def for_member(self, weight_decay: float | None, lr: float | None) -> tuple[float, float]:
        """The (weight decay, lr) a member trains with: the values it names, this optimizer's for those left null."""
        return (self.weight_decay if weight_decay is None else weight_decay, self.lr if lr is None else lr)


class GradientsConfig(Strict):
    """Gradient dynamics measured during training (-> gradients.parquet); see shortcut/gradients.py."""

    enabled: bool = Field(False, description="measure the gradient dynamics (gradients.parquet)")
    every: Pos = Field(50, description="epochs between measurements (and epoch 0)")
    sample: Annotated[int, Field(ge=0)] = Field(64, description="examples per group for per-example gradient norms (0: skip)")
    saturated_loss: Annotated[float, Field(gt=0, lt=1)] = Field(0.05, description=(
        "nats: the report's saturated window is the measured epochs at which the majority group's mean training loss "
        "(shortcut-consistent at r >= 1/2) is below this; read by the report only, training does not use it"))


#: fields added after sweeps were on record (a path into the config), with the value every older config meant: a
#: job's folder is the hash of its config without these when they hold that value, so adding a field renames no job
LATER_FIELDS: dict[tuple[str, ...], object] = {("train", "precision"): "fp32"}
#: fields only the report reads: never part of a job's hash, so changing one re-reports without retraining
REPORT_ONLY: set[tuple[str, ...]] = {("train", "gradients", "saturated_loss")}

CHUNK_CPU, CHUNK_CUDA = 8192, 262144  # member-rows per piece for chunk: "auto"


class TrainConfig(Strict):
    """How an ensemble is trained and evaluated."""

    epochs: Pos = Field(15000, description="passes over the training split (paper)")
    batch_size: Pos | None = Field(None, description="samples per step; null = full batch (not stated)")
    chunk: Pos | Literal["auto"] | None = Field("auto", description=(
        "a batch is run in pieces of about `chunk` member-rows (chunk // members rows each); the pieces' gradients are "
        "summed: same math. \"auto\": 8,192 on CPU (activations stay cache-sized, benchmarks/), 262,144 on CUDA (a "
        "paper-scale full-batch step of 64 members x 16,384 rows in 4 pieces, ~2 GB of activations, not thousands of "
        "small kernel launches); null: the whole batch at once"))
    eval_every: Pos = Field(10, description="epochs between evaluations of train/val/adv (the curves)")
    adv_every: Pos | None = Field(None, description=(
        "epochs between checks of adversarial accuracy alone, between evaluations: the paper counts a member as "
        'generalized when it reaches 100% "at any point", so short-lived hits are not missed; null: only at the '
        "evaluations"))
    stop_when_decided: bool = Field(False, description="stop once every member has generalized")
    checkpoint_epochs: list[int] = Field([], description="epochs at which all members' weights are saved")
    device: str = Field("cpu", description='"cpu", "cuda", "cuda:1", ...')
    threads: Pos | None = Field(None, description="torch intra-op threads on CPU; null = torch's default")
    precision: Literal["fp32", "bf16"] = Field("fp32", description=(
        "bf16: the training step's matmuls in bfloat16, on CPU as on CUDA (shortcut/train.py Bf16Step: the layer norms' "
        "gains and 1/sqrt(d_head) folded into the projections, cast once per step); master weights, AdamW "
        "state, the loss, every evaluation and the gradient measurements stay fp32. fp32 (every preset's default) is "
        'what docs/results/shortcut.md was measured with; see docs/results/precision.md "Does precision change the science?" before '
        "choosing bf16, and `seedlab doctor` for the speed"))
    gradients: GradientsConfig = Field(GradientsConfig(), description="gradient dynamics measured during training")

    def chunk_rows(self) -> int | None:
        """Member-rows per forward piece on this config's device (see ``chunk``)."""
        if self.chunk != "auto":
            return self.chunk
        return CHUNK_CUDA if self.device.startswith("cuda") else CHUNK_CPU

    @field_validator("checkpoint_epochs")
    @classmethod
    def _ckpt(cls, v: list[int]) -> list[int]:
        bad = [e for e in v if e < 0]
        if bad:
            raise ValueError(f"must be epochs >= 0, got {bad[0]}")
        return sorted(set(v))


class MemberGrid(Strict):
    """Members of one ensemble: every combination of the lists below.

    ``weight_decay`` and ``lr`` default to the optimizer's single value.
    """

    task: list[str] = Field(["sum2-max"], description="tasks (seedlab.shortcut.tasks.TASKS), all with the same number of classes")
    ratio: list[float] = Field([0.9], description="fractions of shortcut-consistent training samples")
    seed: list[int] = Field([0], description="model seeds (initialization and batch order)")
    weight_decay: list[NonNeg] | None = Field(None, description="weight decays; null: optim.weight_decay")
    lr: list[PosFloat] | None = Field(None, description="learning rates; null: optim.lr")

    @field_validator("task")
    @classmethod
    def _tasks(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("must list at least one task")
        return [_task_name(t) for t in v]

    @field_validator("ratio")
    @classmethod
    def _ratios(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("must list at least one ratio")
        return [_ratio(r) for r in v]

    @field_validator("seed")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("must list at least one seed")
        return v

    @field_validator("weight_decay", "lr")
    @classmethod
    def _nonempty(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and not v:
            raise ValueError("must be null or a non-empty list")
        return v


class MemberSpec(Strict):
    """One member, listed explicitly (sweeps write their ensembles this way)."""

    task: str = Field(description="the task (seedlab.shortcut.tasks.TASKS)")
    ratio: float = Field(description="fraction of shortcut-consistent training samples")
    seed: int = Field(description="model seed (initialization and batch order)")
    weight_decay: NonNeg | None = Field(None, description="weight decay; null: optim.weight_decay")
    lr: PosFloat | None = Field(None, description="learning rate; null: optim.lr")

    _t = field_validator("task")(classmethod(lambda cls, v: _task_name(v)))
    _r = field_validator("ratio")(classmethod(lambda cls, v: _ratio(v)))


@dataclass(frozen=True)
class Member:
    """One model of an ensemble: everything but the architecture may differ between members."""

    task: str
    ratio: float
    seed: int
    weight_decay: float
    lr: float


# a grid (mapping) or an explicit list; the discriminator keeps errors about the form the user wrote
Members = Annotated[
    Annotated[MemberGrid, Tag("as-grid")] | Annotated[list[MemberSpec], Tag("as-list")],
    Discriminator(lambda v: "as-list" if isinstance(v, list) else "as-grid"),
]


class EnsembleConfig(Strict):
    """``seedlab shortcut train CONFIG``: one architecture, many members."""

    model: ModelConfig = Field(ModelConfig(), description="the architecture")
    data: DataConfig = Field(DataConfig(), description="the task's splits")
    optim: OptimConfig = Field(OptimConfig(), description="AdamW")
    train: TrainConfig = Field(TrainConfig(), description="training and evaluation")
    members: Members = Field(MemberGrid(), description="a grid, or an explicit list")

    @model_validator(mode="after")
    def _same_classes(self) -> EnsembleConfig:
        tasks = self.members.task if isinstance(self.members, MemberGrid) else [m.task for m in self.members]
        if not tasks:
            raise ValueError("members: must list at least one member")
        if len({TASKS[t].n_classes for t in tasks}) > 1:
            raise ValueError(
                "members.task: tasks in one ensemble must have the same number of classes"
                f" (binary sum2-* or ternary sum3-*), got {sorted(set(tasks))}"
            )
        return self

    def expand(self) -> list[Member]:
        """The members, in order: a list's as listed, a grid's as every combination (seeds innermost)."""
        o, g = self.optim, self.members
        if isinstance(g, list):
            return [Member(m.task, m.ratio, m.seed, *o.for_member(m.weight_decay, m.lr)) for m in g]
        # an axis left null is one value left null: the optimizer's
        axes = itertools.product(g.task, g.ratio, g.weight_decay or [None], g.lr or [None], g.seed)
        return [Member(t, r, s, *o.for_member(wd, lr)) for t, r, wd, lr, s in axes]


class SweepGrid(Strict):
    """One grid of a sweep: every combination of the lists below (seeds outermost)."""

    task: list[str] = Field(["sum2-max"], description="tasks (seedlab.shortcut.tasks.TASKS)")
    ratio: list[float] = Field([0.5, 0.9], description="fractions of shortcut-consistent training samples")
    layers: list[Pos] = Field([1, 2], description="transformer blocks (model.layers)")
    heads: list[Pos] = Field([1], description="attention heads per block (model.heads)")
    weight_decay: list[NonNeg] | None = Field(None, description="weight decays; null: optim.weight_decay")
    lr: list[PosFloat] | None = Field(None, description="learning rates; null: optim.lr")
    seed: list[int] | Pos = Field(8, description="model seeds: a list, or a count n meaning 0..n-1")

    @field_validator("task")
    @classmethod
    def _tasks(cls, v: list[str]) -> list[str]:
        return [_task_name(t) for t in v]

    @field_validator("ratio")
    @classmethod
    def _ratios(cls, v: list[float]) -> list[float]:
        return [_ratio(r) for r in v]

    @field_validator("task", "ratio", "layers", "heads", "weight_decay", "lr")
    @classmethod
    def _nonempty(cls, v: list | None) -> list | None:
        if v is not None and not v:
            raise ValueError("empty grid axis: list at least one value")
        return v

    @field_validator("seed")
    @classmethod
    def _seeds(cls, v: list[int] | int) -> list[int] | int:
        if isinstance(v, list) and not v:
            raise ValueError("empty grid axis: list at least one seed (or give a count)")
        return v

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed)) if isinstance(self.seed, int) else self.seed


# one grid (mapping) or several (a list): the discriminator keeps errors about the form the user wrote
Grids = Annotated[
    Annotated[SweepGrid, Tag("as-grid")] | Annotated[list[SweepGrid], Tag("as-list")],
    Discriminator(lambda v: "as-list" if isinstance(v, list) else "as-grid"),
]


class SweepConfig(Strict):
    """``seedlab shortcut sweep CONFIG``: shared hyperparameters plus the grid."""

    model: ModelConfig = Field(ModelConfig(), description="the architecture; layers/heads here are overridden by the grid")
    data: DataConfig = Field(DataConfig(), description="the tasks' splits")
    optim: OptimConfig = Field(OptimConfig(), description="AdamW")
    train: TrainConfig = Field(TrainConfig(), description="training and evaluation")
    grid: Grids = Field(SweepGrid(), description="one grid, or several (their union, duplicates dropped)")
    max_members: Pos = Field(64, description="members per ensemble job (bounds memory)")
    gpus_per_job: Annotated[float, Field(gt=0, le=1)] = Field(1.0, description=(
        "GPUs a Ray task asks for when train.device is CUDA: 1, or a fraction so that several ensemble jobs share one "
        "GPU (0.25: four per GPU); ignored on CPU (and by the local executor)"))
