"""The twins design as one config: what is trained (``TwinsConfig``), what is measured
(``MeasureConfig``), and which outcomes are primary (pre-registered before training).

Every field's help is its ``description`` (``seedlab presets show``, ``--help``); numbers the
paper does not state are fields with a default and a ``(not stated)`` there; docs/assumptions.md lists them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from seedlab.config import Strict
from seedlab.forks.design import ForkDesign, Pos
from seedlab.store import content_hash
from seedlab.twins.variants import FLUENT, ORDINARY, VARIANTS, names  # noqa: F401 (FLUENT: re-exported)

#: the twin, the passage conditions and the null arms, as registered (twins/variants.py: a condition's name,
#: channel, arms, text, colour and description live there, once); the default design trains all of them
CONDITIONS = tuple(VARIANTS)
INJECTED = CONDITIONS[1:]
PASSAGES = tuple(names("passage"))  # a text in the injected row, measured on every run
NULLS = tuple(names("null"))
#: condition names no longer accepted, and what to name instead (the noise null was split by channel)
RENAMED = {"matched-noise": "'matched-gradient' (the gradient-channel noise null, the default) and/or 'weight-kick' "
                            "(the weight kick matched-noise was)"}


def ordinary_names(k: int) -> list[str]:
    """The arms of the ordinary-row null: ``ordinary-row.0`` .. ``ordinary-row.<k-1>``, one held-out stretch each."""
    return [f"{ORDINARY}.{i}" for i in range(k)]


def is_ordinary(name: str) -> bool:
    """An arm of the ordinary-row null (``ordinary-row.<i>``; ``ordinary-row`` itself in runs measured when it was
    one row)."""
    return VARIANTS[ORDINARY].owns(name)


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

    alphas: list[float] = Field([i / 10 for i in range(11)], description="interpolation grid, endpoints 0 and 1 included")
    heldout_rows: Pos = Field(64, description="held-out rows (block_size tokens each) for the barrier and held-out CE")
    probe_rows: Pos = Field(16, description="held-out rows whose representations CKA compares")
    eval_rows: Pos = Field(16, description="rows per forward pass while evaluating (memory, not results)")
    seed: int = Field(0, description="which held-out rows are drawn (the same rows for every model)")
    smooth_steps: Pos = Field(25, description="rolling mean of |loss − twin's loss| before finding its peak (steps)")
    smooth_steps_alt: Pos = Field(5, description="a second, narrower window: the peak / trough ratio under both (not stated)")
    just_after_steps: Pos = Field(5, description='the steps after the injected batch that define "just after the injection"')
    equivalence_frac: float = Field(0.5, gt=0, le=1, description=(
        '"lost" at the end: per seed, the end effect is tested against this fraction of the s + 50 effect (one-sided paired '
        "tests of end − frac × s50 < 0, twins.stats.lost_test); the name is kept from the TOST it replaced (not stated)"))
    ordinary_margin: float | None = Field(0.25, gt=0, description=(
        "the TOST margin of \"is it any row's?\": a passage is called equal to the ordinary rows on a measure only when "
        "a TOST shows, seed by seed, |passage − mean of the ordinary rows| below this fraction of the ordinary rows' own "
        "effect (|value|; 1 − CKA for the CKA; twins.stats.ordinary_tost); null: no equivalence test, the report says "
        "\"not shown\" (not stated)"))

    @model_validator(mode="after")
    def _grid(self) -> MeasureConfig:
        a = self.alphas
        if len(a) < 3 or a[0] != 0 or a[-1] != 1 or any(x >= y for x, y in zip(a, a[1:])):
            raise ValueError(f"alphas: must rise strictly from 0 to 1 with at least one point between, got {a}")
        return self


class NullsConfig(Strict):
    """The null arms: how each is drawn (none of it stated; the paper has no such controls)."""

    ordinary_rows: Pos = Field(4, description=(
        "ordinary-row: how many arms, ordinary-row.0 .. ordinary-row.<K-1>, each a different held-out stretch as long "
        "as the fabricated passage in the injected row, drawn from the held-out split's reserved slice (twins.heldout), "
        "which no evaluation or probe row touches; the report compares each passage with their distribution"))
    ordinary_row_seed: int = Field(0, description="which stretches of the reserved slice the ordinary rows are (random.Random(this))")
    ordinary_rows_per_seed: bool = Field(False, description=(
        "true: every training seed draws its own ordinary rows, ordinary_rows of them from the same reserved slice "
        "(random.Random(\"ordinary-row <ordinary_row_seed> seed <seed>\"), twins.heldout.ordinary_draw), so the "
        "ordinary-row distribution spans texts as well as seeds (inputs.json records each seed's); the arms keep their "
        "names ordinary-row.<i>. false (the default): every seed injects the same rows, as every run and kept scale "
        "cell measured so far did, so those re-render unchanged (not stated)"))
    nudge_tensor: str = Field("blocks.0.ln_1.weight", description=(
        "the one weight element that moves by one unit in the last place, at s (a gain: every row of every batch passes "
        "through it)"))
    nudge_index: int = Field(0, description="that element's flat index in nudge_tensor (moved toward +inf: torch.nextafter)")
    noise_seed: int = Field(0, description="the random direction of matched-gradient and weight-kick (with the training "
                                           "seed; the same direction for both)")
    noise_like: Literal["fluent-fabricated", "fluent-attested", "random-chars", "ordinary-row"] = Field(
        "fluent-fabricated", description=(
            "whose effect at s the noise's norm equals: matched-gradient, its batch-gradient difference; weight-kick, its "
            "update difference (ordinary-row: ordinary-row.0's)"))


class TwinsConfig(ForkDesign):
    """The design every fork-at-injection study shares (:class:`~seedlab.forks.design.ForkDesign`:
    corpus, model, schedule, injection step and row, replicas, device) and the twins' own fields."""

    conditions: list[str] = Field(list(CONDITIONS), description=(
        "the arms trained per seed: the twin, the passages and the nulls (each registered in twins/variants.py)"))
    passages: dict[str, str] = Field({}, description="condition -> text file, relative to the config file (they travel with it)")
    subjects: dict[str, str] = Field({}, description="condition -> the passage's subject, checked against the corpus")
    random_chars_tokens: Pos | None = Field(None, description="the random-chars passage's length, in tokens; null: the fabricated (else attested) passage's")
    random_chars_seed: int = Field(0, description="the random keyboard text is drawn from random.Random(this)")
    checkpoint_every: Pos | None = Field(None, description="a weights checkpoint every this many updates, plus injection, "
                                                            "injection + 50, mid-point and final")
    nulls: NullsConfig = Field(NullsConfig(), description="the null arms: how each is drawn")
    row_weights: list[Annotated[float, Field(gt=0, lt=1)]] = Field([], description=(
        "loss weights w of the injected row: each passage condition and ordinary-row.0 is trained once more per w, its "
        "text in the injected row at loss weight w (the batch loss (Σ_{i≠r} ℓ_i + (1 − w)·ℓ_r + w·ℓ_text)/N, "
        "forks/arms.py; w = 1 is the plain arm), as the arm <arm>@w<w> (fluent-fabricated@w0.25, ordinary-row.0@w0.5): "
        "a dose axis at a fixed text; [] none (not stated)"))
    keep: list[Literal["prefix", "final"]] = Field(["prefix"], description=(
        "complete training states (weights + AdamW) kept after a run: the shared prefix at s (gradmatch's update "
        "difference, forks), each condition's end"))
    outcomes: dict[str, Label] = Field(dict(OUTCOMES), description="measure -> label, pre-registered when the run starts")
    measure: MeasureConfig = Field(MeasureConfig(), description="how `seedlab twins measure` evaluates the finished design")

    @model_validator(mode="after")
    def _check(self) -> TwinsConfig:
        old = [c for c in self.conditions if c in RENAMED]
        if old:
            raise ValueError(f"conditions: {old[0]!r} is no longer a condition (the noise null was split by channel): "
                             f"name {RENAMED[old[0]]}")
        bad = [c for c in self.conditions if c not in VARIANTS]
        if bad:
            raise ValueError(f"conditions: must be among {', '.join(VARIANTS)}, got {bad[0]!r}")
        twice = [c for i, c in enumerate(self.conditions) if c in self.conditions[:i]]
        if twice:
            raise ValueError(f"conditions: {twice[0]!r} is named twice (each condition is one run per seed)")
        if "twin" not in self.conditions:
            raise ValueError("conditions: must include 'twin', the baseline every condition is compared with")
        noise = [c for c in self.conditions if VARIANTS[c].sized]
        if noise and self.nulls.noise_like not in self.conditions:
            raise ValueError(f"nulls.noise_like: {noise[0]} takes its size from {self.nulls.noise_like!r}, "
                             "which must be one of the conditions")
        if len(set(self.row_weights)) != len(self.row_weights):
            raise ValueError(f"row_weights: each weight once, got {self.row_weights}")
        if self.row_weights and not any(VARIANTS[c].row_weighted for c in self.conditions):
            weighed = ", ".join(v.name for v in VARIANTS.values() if v.row_weighted)
            raise ValueError(f"row_weights: the design has no condition whose row is weighed ({weighed}); add one to "
                             "conditions, or leave row_weights empty")
        unknown = [k for k in self.outcomes if k not in OUTCOMES]
        if unknown:
            raise ValueError(f"outcomes: measures are {', '.join(OUTCOMES)}, got {unknown[0]!r}")
        return self

    @property
    def arm_names(self) -> list[str]:
        """Every run of a seed, as its folder is named: the conditions in order, each as its variant's arms
        (``ordinary-row`` as its ``nulls.ordinary_rows`` arms, :func:`ordinary_names`), then the row-weight arms
        (``row_weights``: twins/variants.py ``weighted_name``), condition by condition."""
        plain = [a for c in self.conditions for a in VARIANTS[c].arm_names(self)]
        return plain + [a for c in self.conditions for a in VARIANTS[c].weighted_names(self)]

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
