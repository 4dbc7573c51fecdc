"""The attribution bank as one config: the pre-training design every fork shares
(:class:`~seedlab.forks.design.ForkDesign`), the candidates that replace the injected row, the
queries whose loss change is measured, the horizons, and how the estimators are run.

Every field's help is its ``description`` (``seedlab presets show``, ``--help``); numbers the
twins paper does not state are fields with a default and a ``(not stated)`` there; docs/assumptions.md
lists them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from seedlab.attribution.bank.removals import check
from seedlab.config import Strict
from seedlab.forks.design import ForkDesign, Pos

NonNeg = Annotated[int, Field(ge=0)]
Horizon = Annotated[int, Field(gt=0)] | Literal["mid", "end"]
#: the smallest row weight (candidates.weights): below it float32 loses w·δ in the batch gradient's rounding
#: (at 1/64 the weighted gradient is the swap's to 5e-6 per unit weight: tests/common/forks/test_weights.py)
MIN_WEIGHT = 1e-4


class CandidatesConfig(Strict):
    """What replaces row ``injection_row`` of the batch of step s, one forked run each."""

    file: str | None = Field(None, description=(
        'passages: .txt (separated by blank lines) or .jsonl ({"text": ..., "name": optional}), relative to the config file'))
    heldout: NonNeg = Field(16, description="K rows drawn from the held-out split, block_size + 1 tokens each: ordinary data "
                                            "(not stated)")
    seed: int = Field(0, description="which held-out rows are drawn (the same rows for every training seed) (not stated)")
    own_row: bool = Field(False, description="a control candidate equal to the replaced row: its runs must be bitwise the "
                                             "twin's (measured 0)")
    replicate_row: NonNeg | None = Field(None, description="every candidate once more, in row r' of the same batch "
                                                           "(measured_replicate); null: off (not stated)")
    pairs: NonNeg | list[tuple[str, str]] = Field(0, description=(
        "forks carrying two candidates at once, the first in row r, the second in r': P distinct pairs drawn (seeded by "
        "seed) from the non-control candidates (disjoint while 2P fits them), or [[first, second], ...] by name; needs "
        "replicate_row (not stated)"))
    weights: list[Annotated[float, Field(gt=0, le=1)]] = Field([1.0], description=(
        "loss weights w of the candidate's row: each candidate (and the own-row control) is forked once per w, its "
        "batch loss (Σ_{i≠r} ℓ_i + (1 − w)·ℓ_r + w·ℓ_c)/N; 1 is the swap (the replicates and pairs use it only), "
        "w → 0 the infinitesimal one (weighted.parquet); must include 1 (not stated)"))

    @model_validator(mode="after")
    def _weights(self) -> CandidatesConfig:
        if 1.0 not in self.weights:
            raise ValueError("weights: must include 1 (the swap itself, which the replicates, pairs and estimators use)")
        if len(set(self.weights)) != len(self.weights):
            raise ValueError(f"weights: each weight once, got {self.weights}")
        if min(self.weights) < MIN_WEIGHT:
            raise ValueError(f"weights: at least {MIN_WEIGHT:g}, got {min(self.weights):g} (a float32 run cannot hold a smaller "
                             "one: w·(∇ℓ_c − ∇ℓ_r)/N falls below the rounding of the batch gradient)")
        return self

    @model_validator(mode="after")
    def _pairs(self) -> CandidatesConfig:
        """Pairs need their second row; a listed pair is two different candidates, listed once (the
        names and texts are checked against the candidates by texts.py ``pairs_of``)."""
        if self.pairs and self.replicate_row is None:
            raise ValueError("pairs: needs candidates.replicate_row, the pair's second row")
        if isinstance(self.pairs, list):
            same = next((p for p in self.pairs if p[0] == p[1]), None)
            if same is not None:
                raise ValueError(f"pairs: a pair of identical candidates ({same[0]!r} twice)")
            twice = next((p for i, p in enumerate(self.pairs) if p in self.pairs[:i]), None)
            if twice is not None:
                raise ValueError(f"pairs: the pair ({twice[0]!r}, {twice[1]!r}) is listed twice")
        return self


class QueriesConfig(Strict):
    """The texts whose loss change L_query(candidate run) − L_query(twin) is measured."""

    own: bool = Field(True, description="each candidate's own text (self-influence)")
    heldout: NonNeg = Field(8, description="M held-out rows, block_size + 1 tokens each, disjoint from the candidate rows "
                                           "(not stated)")
    probes: str | None = Field(None, description="user-supplied probe texts, same formats as candidates.file, relative to "
                                                 "the config file")


class ChaosConfig(Strict):
    """The nudge arms (training's own sensitivity, forks/arms.py ``nudge``) and the distances every arm's
    weights keep from the twin's (forks/distances.py)."""

    nudges: list[str] = Field(["blocks.0.mlp.c_fc.weight", "blocks.0.attn.c_attn.weight"], description=(
        "tensors nudged by one unit in the last place at s, one arm each (arm nudge.<tensor>); []: none (not stated)"))
    index: NonNeg = Field(0, description="the flat index of the nudged element in each tensor (not stated)")
    every: Annotated[int, Field(gt=0)] = Field(1, description=(
        "every arm's distance to the twin recorded every this many updates from s (memory: one copy of the weights "
        "per recorded step while a seed trains); distances.parquet (not stated)"))


class LooConfig(Strict):
    """Leave-one-out by age (attribution/bank/removals.py): rows of the twin's own batches removed one at a
    time (the row's loss weight set to 0, no text), measured at every horizon after the row's step."""

    steps: list[int | str] = Field(["early", "s", "late"], description=(
        "the steps t whose rows are removed: updates completed (an int), or s, s+n, s-n, end-n, early (s // 2), late "
        "(s + (end - s) // 2); a step before s forks from the prefix's own state at t (not stated)"))
    rows: Annotated[int, Field(gt=0)] = Field(4, description=(
        "rows removed per step, one arm each: the first rows of its batch (a random sample: rows are independent "
        "draws); arms per seed = steps x rows, each end - t updates (not stated)"))


class GroupsConfig(Strict):
    """Random groups of training rows removed at once (attribution/bank/removals.py): the LDS's subsets."""

    alphas: list[Annotated[float, Field(gt=0, lt=1)]] = Field([0.01, 0.05], description=(
        "α: the fraction of the R = (end - s)·B rows of steps s .. end - 1 each subset removes (round(α·R) rows); "
        "α·R < 1 is refused (not stated)"))
    subsets: Annotated[int, Field(gt=0)] = Field(50, description=(
        "subsets per α and seed, one arm each of end - s updates (the LDS literature: >= 50; not stated)"))
    seed: int = Field(0, description="which subsets are drawn (with the training seed, α and the subset's index) (not stated)")


class CeilingConfig(Strict):
    """The removals again on a nudged twin (attribution/bank/removals.py): every leave-one-out row and the first group
    subsets left out of the run nudged by one ulp at s (arm ``retest.<removal>``), each measured against that nudged
    twin, so every removal's measured effect has a test–retest partner (retest.parquet; attribution/analyses/ceiling.py)."""

    nudge: str | None = Field(None, description=(
        "the tensor of chaos.nudges whose nudged twin (arm nudge.<tensor>) the removals are repeated on; null: the "
        "first of chaos.nudges (not stated)"))
    subsets: NonNeg | None = Field(None, description=(
        "the first this many group subsets per α repeated (0: the leave-one-out rows only); null: every subset; "
        "each one more run of end - s updates (not stated)"))


class TrakConfig(Strict):
    """TRAK's LDS (Park et al. 2023; attribution/bank/removals.py): random subsets that each *keep* a fraction of the
    rows of steps s .. end - 1 (the other rows left out of the loss), each retrained from the shared prefix at s
    ``retrains`` times, the queries' losses averaged over the retrainings (trak.parquet; attribution/analyses/lds.py)."""

    keep: list[Annotated[float, Field(gt=0, lt=1)]] = Field([0.5], description=(
        "α_keep: the fraction of the R = (end - s)·B rows of steps s .. end - 1 each subset keeps (round(α_keep·R) "
        "rows kept, the rest removed at once; TRAK's LDS: 0.5)"))
    subsets: Pos = Field(20, description=(
        "subsets per α_keep and seed, each retrained `retrains` times, one arm of end - s updates each (TRAK: 50 and "
        "more; not stated)"))
    retrains: Pos = Field(2, description=(
        "retrainings of every subset, its outputs averaged (TRAK's average over training seeds): the first plain, the "
        "r-th after it nudged by one ulp at s at element chaos.index + r - 1 of `nudge` (after the shared prefix the "
        "bank's training is deterministic, and a training seed also fixes the rows, so a nudge is the retraining's "
        "seed) (not stated)"))
    nudge: str | None = Field(None, description=(
        "the tensor the retrainings past the first nudge; null: the first of chaos.nudges (not stated)"))
    seed: int = Field(0, description=(
        "which subsets are drawn (with the training seed, α_keep and the subset's index) (not stated)"))


class AttributeConfig(Strict):
    """How ``seedlab attribution attribute`` runs the estimators on the bank (none of it stated)."""

    estimators: list[str] | None = Field(None, description=(
        "the estimators run, by name (package.module:function: a plug-in); null: the default estimators and baselines "
        "that apply and are installed"))
    tracin_every: Pos | None = Field(None, description="extra twin checkpoints for tracin-cp every this many updates; null: "
                                                       "s and the horizons only")
    influence_at: Literal["horizon", "injection"] = Field("horizon", description=(
        "EK-FAC/K-FAC at the twin's weights at each horizon, or once at θ_s"))
    damping: float | None = Field(None, description="λ of EK-FAC/K-FAC; null: kronfluence's heuristic (0.1 × mean eigenvalue)")
    modules: Literal["all", "mlp"] = Field("all", description="the blocks' Linear modules the influence is computed over")
    train_rows: Pos | None = Field(None, description="D of the influence formula; null: the batch's rows (ranks are "
                                                     "unchanged by it)")
    fit_rows: Pos = Field(256, description=(
        "rows EK-FAC/K-FAC's curvature (TRAK's ΦᵀΦ) is fitted on, drawn from the training batches of steps 0 .. h "
        "(h: the weights' step)"))
    unroll_chunk: Pos | None = Field(16, description=(
        "candidates per vmapped JVP of unroll (memory: ~chunk x a batch's logits x a few); null: all at once"))
    h_star_rho: Annotated[float, Field(gt=0, lt=1)] = Field(0.5, description=(
        "a descriptive threshold: the first horizon whose within-seed Spearman(measured, unroll) falls below it (the "
        "pre-registration's H1 uses it); h* itself is the verdict's rule, attribution/analyses/horizon.py (not stated)"))
    metagrad_window: Pos = Field(10, description=(
        "W of the estimator metagrad-trunc: a row (the swapped one at s, or one of the run's own) gets metagrad's value "
        "at a horizon at most W updates after its step, 0 later; 10: the linear horizon measured at B 8, lr 1e-2 "
        "(unroll's within-seed rho on held-out rows first below 0.5 at s+10: docs/results/attribution.md) (not stated)"))


class AttributionConfig(ForkDesign):
    """The bank: the fork design (:class:`~seedlab.forks.design.ForkDesign`) with its candidates, queries,
    horizons and how the estimators run."""

    seeds: list[int] = Field([0, 1, 2, 3], description="training seeds; the across-seed reliability needs at least 2 "
                                                       "(not stated)")
    steps: Pos = Field(250, description="optimizer updates of the schedule (its cosine ends here unless decay_steps is set)")
    stop: Pos | None = Field(None, description='the last update trained (the "end" horizon); null: steps. Cuts a long '
                                               "schedule short")
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="sgd: plain SGD (no momentum), for the first-order check")
    horizons: list[Horizon] = Field([1, 50, "mid", "end"], description='updates after the injection (s + n), "mid", "end"')
    candidates: CandidatesConfig = Field(CandidatesConfig(), description="what replaces the injected row, one forked run each")
    queries: QueriesConfig = Field(QueriesConfig(), description="the texts whose loss change is measured")
    attribute: AttributeConfig = Field(AttributeConfig(), description="how `seedlab attribution attribute` runs the estimators")
    chaos: ChaosConfig = Field(ChaosConfig(), description="nudge arms and every arm's distance to the twin")
    loo: LooConfig | None = Field(None, description=(
        "leave-one-out arms by the row's age (loo.parquet); null: none (e.g. --set loo.rows=4 for the defaults)"))
    groups: GroupsConfig | None = Field(None, description=(
        "group arms: random α-fractions of the rows after s removed (groups.parquet, the LDS); null: none "
        "(e.g. --set groups.subsets=50)"))
    ceiling: CeilingConfig | None = Field(None, description=(
        "the removals repeated on a nudged twin, their test-retest (retest.parquet); null: none (e.g. --set "
        "ceiling.subsets=10 with loo or groups)"))
    trak: TrakConfig | None = Field(None, description=(
        "TRAK's LDS: retained subsets of the rows after s, each retrained and averaged (trak.parquet); null: none "
        "(e.g. --set trak.subsets=20)"))

    @model_validator(mode="after")
    def _check(self) -> AttributionConfig:
        s, end = self.injection_step, self.end
        if self.stop is not None and not s < self.stop <= self.steps:
            raise ValueError(f"stop: must be after the injection step and within the schedule ({s + 1} .. {self.steps}), got {self.stop}")
        if not self.horizons:
            raise ValueError("horizons: name at least one (updates after the injection, mid or end)")
        late = [h for h in self.horizons if isinstance(h, int) and s + h > end]
        if late:
            raise ValueError(f"horizons: s + {late[0]} is after the end (step {end}); at most {end - s}")
        if self.candidates.file is None and self.candidates.heldout == 0 and not self.candidates.own_row:
            raise ValueError("candidates: name a file, or draw held-out rows (heldout > 0)")
        r2 = self.candidates.replicate_row
        if r2 is not None and (r2 == self.injection_row or r2 >= self.batch_size):
            what = "candidates.replicate_row (also the pairs' second row)" if self.candidates.pairs else "candidates.replicate_row"
            raise ValueError(f"{what}: another row of the batch than injection_row {self.injection_row} "
                             f"(0 .. {self.batch_size - 1}), got {r2}")
        if not (self.queries.own or self.queries.heldout or self.queries.probes):
            raise ValueError("queries: at least one kind (own, heldout or probes)")
        if self.loo is not None or self.groups is not None or self.ceiling is not None or self.trak is not None:
            check(self)
        return self

    @property
    def end(self) -> int:
        """The last update trained: ``stop``, else the schedule's end."""
        return self.stop or self.steps

    def horizon_steps(self) -> dict[int, str]:
        """``{updates completed: label}`` of every horizon, sorted ("s+1", "s+50", "mid", "end";
        a step named twice keeps its first label)."""
        out: dict[int, str] = {}
        for h in self.horizons:
            t = self.end if h == "end" else self.mid if h == "mid" else self.injection_step + h
            out.setdefault(t, h if isinstance(h, str) else f"s+{h}")
        return dict(sorted(out.items()))

    def distance_steps(self) -> list[int]:
        """Where every arm's distance to the twin is recorded: s, every ``chaos.every`` updates after it, and the end."""
        s, end = self.injection_step, self.end
        return sorted({*range(s, end + 1, self.chaos.every), end})

    def twin_steps(self) -> list[int]:
        """The twin's saved weights: s (TracIn's first checkpoint, the estimators' θ_s), every
        horizon, and every ``attribute.tracin_every`` updates after s."""
        s, every = self.injection_step, self.attribute.tracin_every
        steps = {s, *self.horizon_steps()}
        if every:
            steps |= set(range(s, self.end + 1, every))
        return sorted(steps)
