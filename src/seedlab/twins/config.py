"""The twins design as one config: what is trained (``TwinsConfig``), what is measured
(``MeasureConfig``), and which outcomes are primary (pre-registered before training).

Numbers the paper does not state are fields with a default and a ``(not stated)``
comment; docs/assumptions.md lists them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from seedlab.config import Strict
from seedlab.forks.design import ForkDesign, Pos
from seedlab.store import content_hash

CONDITIONS = ("twin", "fluent-fabricated", "fluent-attested", "random-chars")
INJECTED = CONDITIONS[1:]
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
    # "lost" at the end: the TOST margin as a fraction of the same condition's mean passage effect at s + 50
    equivalence_frac: float = Field(0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _grid(self) -> MeasureConfig:
        a = self.alphas
        if len(a) < 3 or a[0] != 0 or a[-1] != 1 or any(x >= y for x, y in zip(a, a[1:])):
            raise ValueError(f"alphas: must rise strictly from 0 to 1 with at least one point between, got {a}")
        return self


class TwinsConfig(ForkDesign):
    """The design every fork-at-injection study shares (:class:`~seedlab.forks.design.ForkDesign`:
    corpus, model, schedule, injection step and row, replicas, device) and the twins' own fields."""

    conditions: list[str] = list(CONDITIONS)
    passages: dict[str, str] = {}  # condition -> text file, relative to the config file (they travel with it)
    subjects: dict[str, str] = {}  # condition -> the passage's subject, checked against the corpus
    random_chars_tokens: Pos | None = None  # null: the fabricated (else attested) passage's token length
    random_chars_seed: int = 0  # the random keyboard text is drawn from random.Random(this)
    checkpoint_every: Pos | None = None  # plus injection, injection + 50, mid-point and final
    keep: list[Literal["prefix", "final"]] = ["prefix"]  # complete training states (weights + AdamW) kept after a run: the shared prefix at s (gradmatch's update difference, forks), each condition's end
    outcomes: dict[str, Label] = dict(OUTCOMES)  # measure -> label, pre-registered when the run starts
    measure: MeasureConfig = MeasureConfig()

    @model_validator(mode="after")
    def _check(self) -> TwinsConfig:
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad:
            raise ValueError(f"conditions: must be among {', '.join(CONDITIONS)}, got {bad[0]!r}")
        if "twin" not in self.conditions:
            raise ValueError("conditions: must include 'twin', the baseline every condition is compared with")
        unknown = [k for k in self.outcomes if k not in OUTCOMES]
        if unknown:
            raise ValueError(f"outcomes: measures are {', '.join(OUTCOMES)}, got {unknown[0]!r}")
        return self

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
