"""The shortcut report's data: every table it renders and every series its figures draw, computed.

The report (:mod:`seedlab.shortcut.report`) and the figures (:mod:`seedlab.shortcut.figures`) only
word, tabulate and draw what the functions here return; the tests and decisions they apply are in
:mod:`seedlab.shortcut.stats`, the circuit tables in :mod:`seedlab.shortcut.circuit_data`.

- what the folder holds, the paper's own numbers and the headline tables;
- the statistics' tables: the Fisher contrasts, the rate under each criterion;
- transience and phases per cell;
- gradient conflict by outcome and amplification in the saturated window; the conflict within each
  member's shortcut head against its other heads (:func:`head_conflict`, :func:`head_control`);
- the cadence's sensitivity table;
- what the figures draw: the members each panel shows, the medians and epochs it marks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.shortcut.circuit_data import shortcut_heads
from seedlab.shortcut.stats import (
    CAPACITY,
    CELL,
    PAPER_TASK,
    PAPER_WD,
    Shape,
    answer_group,
    at_evaluations,
    by_cell,
    conflict_shape,
    in_group,
    kept_to_end,
    paper_order,
    ratio_contrasts,
    slopes_or_none,
)
from seedlab.stats import mean_ci, wilson

# ---------------------------------------------------------------- what the folder holds


def overview(summary: pd.DataFrame) -> dict:
    """What a summary holds: ``tasks``, ``capacities`` ((layers, heads) pairs), ``ratios`` and
    ``weight_decays`` (each sorted), ``members``, ``generalized`` (how many) and ``jobs`` (1 for a
    run folder's summary, which has no ``job`` column)."""
    return {
        "tasks": sorted(summary["task"].unique()),
        "capacities": sorted(summary[CAPACITY].drop_duplicates().itertuples(index=False, name=None)),
        "ratios": sorted(summary["ratio"].unique()),
        "weight_decays": sorted(summary["weight_decay"].unique()),
        "members": len(summary),
        "generalized": int(summary["generalized"].sum()),
        "jobs": summary["job"].nunique() if "job" in summary else 1,
    }


# ---------------------------------------------------------------- the paper's numbers

# The paper's headline (task sum2-max, weight decay 0.1, :data:`~seedlab.shortcut.stats.PAPER_TASK` and
# ``PAPER_WD``): (layers, ratio) -> % of seeds that generalize.
PAPER = {(2, 0.5): 0, (2, 0.9): 77, (1, 0.5): 33, (1, 0.9): 0}


def paper_pct(task: str, wd: float, layers: int, ratio: float) -> int | None:
    """The paper's rate (%) for this cell, or None when it reports none."""
    if task != PAPER_TASK or not np.isclose(wd, PAPER_WD):
        return None
    for (lay, r), v in PAPER.items():
        if lay == layers and np.isclose(r, ratio):
            return v
    return None


# ---------------------------------------------------------------- the headline tables


@dataclass(frozen=True)
class Headline:
    """One headline table (a task and weight decay): its ratios (columns), capacities (rows, :func:`~seedlab.shortcut.stats.paper_order`) and
    per (layers, heads, ratio) the cell's row of :func:`~seedlab.shortcut.stats.rate_cells` (None where the sweep has no such cell) and the
    paper's own rate in percent (None where the paper does not report the cell)."""

    ratios: list[float]
    capacities: list[tuple[int, int]]
    cells: dict[tuple[int, int, float], tuple[pd.Series | None, int | None]]


def headline(task: str, wd: float, cells: pd.DataFrame) -> Headline:
    """The :class:`Headline` of one group's cells of :func:`~seedlab.shortcut.stats.rate_cells`."""
    ratios = sorted(cells["ratio"].unique())
    caps = sorted(cells[CAPACITY].drop_duplicates().itertuples(index=False, name=None), key=paper_order)
    grid = {}
    for layers, heads in caps:
        for r in ratios:
            hit = cells[(cells["layers"] == layers) & (cells["heads"] == heads) & np.isclose(cells["ratio"], r)]
            grid[layers, heads, r] = (hit.iloc[0] if len(hit) else None, paper_pct(task, wd, layers, r))
    return Headline(ratios, caps, grid)


def definition_counts(definitions: list[str]) -> list[tuple[str, int]]:
    """Each distinct meaning of ``generalized`` among the jobs' (:func:`seedlab.shortcut.rundir.generalized_definitions`)
    with how many jobs trained under it, most first."""
    return [(str(d), int(n)) for d, n in pd.Series(definitions).value_counts().items()]


# ---------------------------------------------------------------- the statistics' tables

#: the contrasts table's rows: capacities within a task (1L first), weight decays innermost
CONTRAST_ROWS = ["task", *CAPACITY, "weight_decay"]


def contrast_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The report's Fisher contrasts: :func:`~seedlab.shortcut.stats.ratio_contrasts` with ``fragility``, sorted by :data:`CONTRAST_ROWS`, and
    ``reverse`` (p >= 0.05: its fragility is the reverse one, the changes that would make it significant)."""
    con = ratio_contrasts(summary, fragility=True).sort_values(CONTRAST_ROWS, kind="stable")
    return con.assign(reverse=con["p"] >= 0.05)


def criterion_rates(summary: pd.DataFrame, criteria: dict) -> list[tuple[tuple, list[tuple[float, float, float]]]]:
    """Per cell (in :func:`~seedlab.shortcut.stats.cell_order`), the share of its members that meet each criterion (a boolean per member) with
    its 95% Wilson interval: ``[(cell key, [(rate, lo, hi) per criterion])]``."""
    out = []
    for key, d in by_cell(summary):
        rates = []
        for met in criteria.values():
            k, n = int(met[d.index].sum()), len(d)
            rates.append((k / n, *wilson(k, n)))
        out.append((key, rates))
    return out


# ---------------------------------------------------------------- transience and phases


def transience(summary: pd.DataFrame) -> pd.DataFrame:
    """Per cell (in :func:`~seedlab.shortcut.stats.cell_order`): ``*CELL, members, generalized`` (at some evaluation), ``retained`` (of those,
    still at 100% adversarial accuracy at the end) and ``lost`` (the rest: transient generalization)."""
    rows = []
    for key, d in by_cell(summary):
        k, kept = kept_to_end(d)
        rows.append((*key, len(d), k, kept, k - kept))
    return pd.DataFrame(rows, columns=[*CELL, "members", "generalized", "retained", "lost"])


PHASES = ["shortcut_epoch", "phase2_epoch", "gen_epoch"]  # the columns of :mod:`seedlab.shortcut.phases`


def phase_medians(summary: pd.DataFrame) -> pd.DataFrame:
    """Per capacity and ratio (tasks and weight decays pooled; 2L first): ``layers, heads, ratio, members``;
    ``learned`` (members with a shortcut epoch) and ``learned_median`` (the median of their shortcut epochs); and
    ``complete`` (members with all three of :data:`PHASES`: only generalizing members have a phase 2 onset) with the
    median over those same members of each of :data:`PHASES` (NaN where none). Medians over one set of members keep
    each member's order (shortcut <= phase 2 <= generalization): medians over different members need not."""
    rows = []
    for key, d in sorted(summary.groupby([*CAPACITY, "ratio"]), key=lambda kv: paper_order(kv[0])):
        learned = d["shortcut_epoch"].dropna().astype(float)
        complete = d[d[PHASES].notna().all(axis=1)]
        medians = [float(complete[c].astype(float).median()) if len(complete) else np.nan for c in PHASES]
        rows.append((*key, len(d), len(learned), float(learned.median()) if len(learned) else np.nan, len(complete),
                     *medians))
    return pd.DataFrame(rows, columns=[*CAPACITY, "ratio", "members", "learned", "learned_median", "complete", *PHASES])


# ---------------------------------------------------------------- gradient conflict and amplification

#: the conflict measures within the shortcut head's parameters, per measure over all parameters
HEAD_CONFLICT = {"cosine": "head_cosine", "pair_cosine": "head_pair_cosine"}
#: the columns of :func:`conflict_medians`: both measures over all parameters, then within the shortcut head
CONFLICT = [*HEAD_CONFLICT, *HEAD_CONFLICT.values()]


@dataclass(frozen=True)
class OutcomeConflict:
    """The conflict of one depth's members at the highest ratio that did (not) generalize."""

    ratio: float  # the highest ratio of the gradients' members
    layers: int
    generalized: bool
    members: int
    shapes: dict[str, Shape | None]  # per conflict measure measured: its median over members per epoch


def conflict_by_outcome(summary: pd.DataFrame, grads: pd.DataFrame) -> list[OutcomeConflict]:
    """Members at the highest ratio split by depth (2L first) and outcome (generalized first): the shape of each
    conflict measure's median over members at each measured epoch (gradients.parquet)."""
    g = grads.merge(summary[["member", "layers", "ratio", "generalized"]], on="member")
    measures = [c for c in HEAD_CONFLICT if c in g and g[c].notna().any()]
    top = g[np.isclose(g["ratio"], g["ratio"].max())]
    out = []
    for (layers, gen), d in sorted(top.groupby(["layers", "generalized"]), key=lambda kv: (-kv[0][0], not kv[0][1])):
        med = d.groupby("epoch")[measures].median().sort_index()
        shapes = {c: conflict_shape(med[c]) for c in measures}
        out.append(OutcomeConflict(float(top["ratio"].max()), int(layers), bool(gen), d["member"].nunique(), shapes))
    return out


def majority_loss(g: pd.DataFrame) -> pd.Series:
    """Per row of gradients.parquet merged with the members' ``ratio``: the mean training loss of the member's majority
    group, the shortcut-consistent one at r >= 1/2 and the anti-shortcut one below (in a binary task the flipped
    shortcut: the rule it fits then saturates on the majority all the same)."""
    return g["loss_consistent"].where(g["ratio"] >= 0.5, g["loss_anti"])


#: the amplification ratios of gradients.parquet, by the space they are measured in
AMPLIFICATION = {"logit": "logit_grad_ratio", "param": "per_example_ratio"}
QUARTILES = (25, 50, 75)


def amplification(summary: pd.DataFrame, grads: pd.DataFrame, saturated_loss: float) -> pd.DataFrame:
    """Per task, capacity and ratio (weight decays pooled; :func:`~seedlab.shortcut.stats.paper_order` within a task): ``members`` (measured),
    ``saturated`` (of them, with a measurement in the saturated window: the majority group's mean training loss,
    :func:`majority_loss`, below ``saturated_loss``), the quartiles over those members of each member's median
    anti/consistent ratio in the window, in logit space (``logit_q25, logit_q50, logit_q75``: the mean norm of
    dl/dz, the space of ``expected``) and in parameter space (``param_q25`` ...: the mean per-example gradient
    norm), and ``expected``, a calibrated model's ratio. Empty when gradients.parquet lacks the per-group losses
    (measured by an older seedlab)."""
    keys = ["task", *CAPACITY, "ratio"]
    columns = [*keys, "members", "saturated", *(f"{k}_q{q}" for k in AMPLIFICATION for q in QUARTILES), "expected"]
    if not {"loss_consistent", "loss_anti", *AMPLIFICATION.values()} <= set(grads):
        return pd.DataFrame(columns=columns)
    g = grads.merge(summary[["member", *keys]], on="member")
    g = g.assign(saturated=majority_loss(g) < saturated_loss)
    rows = []
    for key, d in sorted(g.groupby(keys), key=lambda kv: (kv[0][0], paper_order(kv[0][1:3]), kv[0][3])):
        per_member = d[d["saturated"]].groupby("member")[list(AMPLIFICATION.values())].median()
        q = [per_member[c].quantile(p / 100) for c in AMPLIFICATION.values() for p in QUARTILES]
        rows.append((*key, d["member"].nunique(), len(per_member), *q, float(d["expected_ratio"].iloc[0])))
    return pd.DataFrame(rows, columns=columns)


# ---------------------------------------------------------------- the conflict within the shortcut head


def without_shortcut_head(per_head: pd.DataFrame, chosen: pd.DataFrame) -> int:
    """How many members of the per-head gradients have no shortcut head in ``chosen`` (they use every head)."""
    return len(set(per_head["member"]) - set(chosen["member"]))


def conflict_medians(summary: pd.DataFrame, grads: pd.DataFrame, heads: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """Median over members per cell and epoch of both conflict measures over all parameters and within each
    member's shortcut head (``chosen``; members it lacks contribute all their heads, one observation each):
    columns ``*CELL, epoch, members`` and :data:`CONFLICT`."""
    keys = ["member", "layer", "head"]
    rest = heads[~heads["member"].isin(chosen["member"])]
    own = pd.concat([heads.merge(chosen, on=keys), rest]).rename(columns=HEAD_CONFLICT)
    cell = summary[["member", *CELL]]
    by = [*CELL, "epoch"]
    full = grads.merge(cell, on="member").groupby(by)
    head = own.merge(cell, on="member").groupby(by)[list(HEAD_CONFLICT.values())].median()
    members = full["member"].nunique().rename("members")
    return pd.concat([members, full[list(HEAD_CONFLICT)].median(), head], axis=1).reset_index()


#: a member's heads in :func:`head_roles`: its shortcut head, and the rest (the control)
HEAD_ROLES = ("shortcut", "other")


def head_roles(heads: pd.DataFrame, chosen: pd.DataFrame) -> pd.DataFrame:
    """The conflict measures within each member's shortcut head (``chosen``) and, as the control, within its other
    heads: per member that ``chosen`` covers, measured epoch and ``role`` (:data:`HEAD_ROLES`), columns ``member,
    epoch, role`` and :data:`HEAD_CONFLICT`'s keys; "other" is the mean over the member's other heads (one observation
    per member; none for a one-head model)."""
    keys = ["member", "layer", "head"]
    h = heads[heads["member"].isin(chosen["member"])].merge(chosen.assign(role=HEAD_ROLES[0]), on=keys, how="left")
    return h.fillna({"role": HEAD_ROLES[1]}).groupby(["member", "epoch", "role"], as_index=False)[list(HEAD_CONFLICT)].mean()


def head_conflict_intervals(summary: pd.DataFrame, roles: pd.DataFrame) -> pd.DataFrame:
    """Per cell (:func:`~seedlab.shortcut.stats.cell_order`), outcome (``generalized``), measured epoch and role of :func:`head_roles`: the
    ``members`` and, per conflict measure m, the mean over members ``m`` and its 95% t interval ``m_lo, m_hi``
    (:func:`seedlab.stats.mean_ci`; NaN from fewer than two members)."""
    measures = list(HEAD_CONFLICT)
    by = ["generalized", "epoch", "role"]
    rows = [(*key, d["member"].nunique(), *itertools.chain.from_iterable(mean_ci(d[m])[:3] for m in measures))
            for key, d in by_cell(roles.merge(summary[["member", *CELL, "generalized"]], on="member"), *by)]
    return pd.DataFrame(rows, columns=[*CELL, *by, "members", *(f"{m}{e}" for m in measures for e in ("", "_lo", "_hi"))])


def evenly_spaced(d: pd.DataFrame, k: int) -> pd.DataFrame:
    """At most ``k`` rows of ``d`` sorted by epoch, evenly spaced, the first and the last included."""
    d = d.sort_values("epoch")
    return d.iloc[np.unique(np.linspace(0, len(d) - 1, k).round().astype(int))]


SHOWN_EPOCHS = 6  # measured epochs the report shows per cell (evenly spaced, first and last included)


@dataclass(frozen=True)
class HeadConflict:
    """The conflict over all parameters and within each member's shortcut head, in the answer's group."""

    chosen: pd.DataFrame  # each member's shortcut head (:func:`~seedlab.shortcut.circuit_data.shortcut_heads`)
    missing: int  # members of the per-head gradients without one (:func:`without_shortcut_head`)
    task: str
    weight_decay: float
    medians: pd.DataFrame  # :func:`conflict_medians` in the group
    shown: pd.DataFrame  # its rows at :data:`SHOWN_EPOCHS` evenly spaced epochs per cell, in :func:`~seedlab.shortcut.stats.cell_order`


def head_conflict(summary: pd.DataFrame, grads: pd.DataFrame, per_head: pd.DataFrame,
                  circuits: pd.DataFrame | None) -> HeadConflict:
    """:class:`HeadConflict` from gradients.parquet, gradients_heads.parquet and circuits.parquet (None: no shortcut
    head is identified, every head is used)."""
    chosen = shortcut_heads(summary, circuits)
    task, wd = answer_group(summary)
    med = in_group(conflict_medians(summary, grads, per_head, chosen), task, wd)
    shown = [evenly_spaced(d, SHOWN_EPOCHS) for _, d in by_cell(med)]
    return HeadConflict(chosen, without_shortcut_head(per_head, chosen), task, wd, med,
                        pd.concat(shown) if shown else med.iloc[:0])


@dataclass(frozen=True)
class ControlEpoch:
    """One shown epoch of :func:`head_control`: the cell and outcome, the members with a shortcut head, and per role
    of :data:`HEAD_ROLES` the row of :func:`head_conflict_intervals` (absent where no member has the role)."""

    cell: tuple  # (*CELL, generalized)
    epoch: int
    members: int
    at: dict[str, pd.Series]


def head_control(summary: pd.DataFrame, per_head: pd.DataFrame, chosen: pd.DataFrame, task: str,
                 wd: float) -> tuple[list[tuple[str, list[OutcomeConflict]]], list[ControlEpoch]]:
    """The conflict within the shortcut head against the member's other heads (the control), in one group: per role of
    :data:`HEAD_ROLES` the shapes by outcome (:func:`conflict_by_outcome`), and per cell and outcome the means with
    their 95% intervals at :data:`SHOWN_EPOCHS` evenly spaced epochs (:func:`head_conflict_intervals`)."""
    roles = head_roles(per_head, chosen)
    roles = roles[roles["member"].isin(in_group(summary, task, wd)["member"])]
    shapes = [(role, conflict_by_outcome(summary, roles[roles["role"] == role])) for role in HEAD_ROLES]
    epochs = []
    for key, d in by_cell(head_conflict_intervals(summary, roles), "generalized"):
        for e in evenly_spaced(d.drop_duplicates("epoch"), SHOWN_EPOCHS)["epoch"]:
            at = {row.role: row for _, row in d[d["epoch"] == e].iterrows()}
            members = at[HEAD_ROLES[0]]["members"] if HEAD_ROLES[0] in at else 0
            epochs.append(ControlEpoch(key, int(e), int(members), at))
    return shapes, epochs


@dataclass(frozen=True)
class ConflictCheck:
    """One conflict measure against the paper's description, in every 2L cell at the highest ratio."""

    column: str  # a column of :data:`CONFLICT`
    shapes: dict[tuple[int, int], Shape | None]  # per 2L capacity (layers, heads)

    @property
    def matches(self) -> bool:
        """Whether the measure starts negative and resolves toward 0 in every one of the cells."""
        return all(s is not None and s.resolves for s in self.shapes.values())


def conflict_checks(med: pd.DataFrame) -> tuple[float, list[ConflictCheck]] | None:
    """The highest ratio and a :class:`ConflictCheck` per measure of :data:`CONFLICT` with values there, from
    :func:`conflict_medians` (one task and weight decay); None without a 2L cell at that ratio."""
    cells = med[(med["layers"] == 2) & np.isclose(med["ratio"], med["ratio"].max())]
    if cells.empty:
        return None
    checks = []
    for col in CONFLICT:
        shapes = {cap: conflict_shape(d.sort_values("epoch")[col]) for cap, d in cells.groupby(CAPACITY)}
        if any(s is not None for s in shapes.values()):
            checks.append(ConflictCheck(col, shapes))
    return float(cells["ratio"].max()), checks


# ---------------------------------------------------------------- cadence


def cadence_rates(summary: pd.DataFrame, curves: pd.DataFrame) -> tuple[pd.DataFrame, dict | None, dict | None]:
    """What a denser adversarial check adds: per cell ``*CELL, members, generalized`` (every check) ``,
    at_evaluations`` (:func:`~seedlab.shortcut.stats.at_evaluations`) ``, added, rate, rate_at_evaluations`` (the two counts' shares of the
    members); and the flip test (:func:`~seedlab.shortcut.stats.simple_slopes`) of the answer's
    group counted both ways (None where the slopes are not estimable)."""
    evals = at_evaluations(summary, curves)
    rows = [(*key, len(d), int(d["generalized"].sum()), int(evals[d.index].sum()),
             int(d["generalized"].sum() - evals[d.index].sum())) for key, d in by_cell(summary)]
    table = pd.DataFrame(rows, columns=[*CELL, "members", "generalized", "at_evaluations", "added"])
    table = table.assign(rate=table["generalized"] / table["members"],
                         rate_at_evaluations=table["at_evaluations"] / table["members"])
    group = in_group(summary, *answer_group(summary))
    group = group[group["layers"].isin([1, 2])]
    return table, slopes_or_none(group), slopes_or_none(group.assign(generalized=evals[group.index]))


# ---------------------------------------------------------------- what the figures draw


def pick_members(d: pd.DataFrame, k: int) -> pd.DataFrame:
    """Up to k members of ``d``, half from the generalized ones when there are any, so both kinds show."""
    d = d.sort_values("member")
    gen, rest = d[d["generalized"]], d[~d["generalized"]]
    g = gen.head(max(k // 2, k - len(rest)))
    return pd.concat([g, rest.head(k - len(g))]).sort_values("member")


def curve_panels(summary: pd.DataFrame, task: str, wd: float, k: int) -> list[tuple[tuple, pd.DataFrame, int]]:
    """One panel per capacity and ratio of a group: ``((layers, heads, ratio), up to k members (:func:`pick_members`),
    the cell's member count)``."""
    sub = in_group(summary, task, wd)
    return [(key, pick_members(d, k), len(d)) for key, d in sub.groupby([*CAPACITY, "ratio"], sort=True)]


@dataclass(frozen=True)
class GenEpochs:
    """The generalization epochs of one cell (weight decays pooled)."""

    layers: int
    heads: int
    ratio: float
    members: int
    epochs: pd.DataFrame  # the generalizing members' ``weight_decay, gen_epoch`` (float)
    median: float | None  # the median generalization epoch (None: no member generalized)


def gen_epochs(summary: pd.DataFrame) -> dict[str, list[GenEpochs]]:
    """Per task (sorted), per capacity and ratio (:func:`~seedlab.shortcut.stats.paper_order`): :class:`GenEpochs`."""
    out = {}
    for task in sorted(summary["task"].unique()):
        t = summary[summary["task"] == task]
        cells = sorted(t[[*CAPACITY, "ratio"]].drop_duplicates().itertuples(index=False, name=None), key=paper_order)
        out[task] = []
        for layers, heads, r in cells:
            d = t[(t["layers"] == layers) & (t["heads"] == heads) & np.isclose(t["ratio"], r)]
            g = d[d["generalized"] & d["gen_epoch"].notna()]
            epochs = g[["weight_decay"]].assign(gen_epoch=g["gen_epoch"].astype(float))
            median = float(g["gen_epoch"].astype(float).median()) if len(g) else None
            out[task].append(GenEpochs(layers, heads, r, len(d), epochs, median))
    return out


def aligned_curves(summary: pd.DataFrame, curves: pd.DataFrame, k: int) -> list[tuple[tuple[int, int], int, pd.DataFrame]]:
    """Per capacity of the generalizing members (:func:`~seedlab.shortcut.stats.paper_order`): ``((layers, heads), generalized members,
    the curves of up to k of them (:func:`pick_members`) with ``epochs_from_gen`` = epoch − gen_epoch)``, in the
    members' order, val before adv."""
    gen = summary[summary["generalized"]]
    caps = sorted({(int(a), int(b)) for a, b in gen[["layers", "heads"]].itertuples(index=False)}, key=paper_order)
    out = []
    for layers, heads in caps:
        d = gen[(gen["layers"] == layers) & (gen["heads"] == heads)]
        parts = []
        for _, m in pick_members(d, k).iterrows():
            c = curves[curves["member"] == m["member"]]
            for split in ("val", "adv"):
                s = c[c["split"] == split]
                parts.append(s.assign(epochs_from_gen=s["epoch"] - m["gen_epoch"]))
        out.append(((layers, heads), len(d), pd.concat(parts)))
    return out


def conflict_over_training(g: pd.DataFrame, column: str) -> tuple[float, list[tuple[int, list[pd.DataFrame], pd.Series]]]:
    """One conflict measure of gradients.parquet (merged with the members' ``layers, ratio``) at the highest ratio:
    that ratio, and per depth (deepest first) each member's rows and the median over members per epoch."""
    top = g["ratio"].max()
    depths = sorted(g[g["ratio"] == top].groupby("layers"), key=lambda kv: -kv[0])
    return top, [(layers, [m for _, m in d.groupby("member")], d.groupby("epoch")[column].median()) for layers, d in depths]
