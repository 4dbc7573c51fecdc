"""Everything the shortcut report says, computed: rates, tests, verdicts, counts and medians.

The report (:mod:`seedlab.shortcut.report`, :mod:`seedlab.shortcut.circuits_report`,
:mod:`seedlab.shortcut.figures`) only words, tabulates and draws what the functions here return. Most take the per-member ``summary`` frame: one row
per trained model (task, ratio, layers, heads, weight_decay, lr, seed, generalized, ...). A
*cell* is the members that share :data:`CELL`: everything but the seed.

- cells            -- :data:`CELL`, the report's order of cells (2L before 1L, as the paper's
  table), the generalization rate per cell, the paper's own numbers.
- the question     -- :func:`flip_answer`: how each depth's rate moves from a balanced to an
  imbalanced ratio (Fisher's test two-sided, and one-sided toward the paper's direction), and whether
  the flip (1L falls, 2L rises) is shown.
- robustness       -- how many members' outcomes would have to change to reverse a verdict: the
  fragility of a Fisher verdict (:func:`seedlab.stats.fisher_fragility`; ``ratio_contrasts(...,
  fragility=True)``, each :class:`Move`) and of the flip verdict (:func:`flip_fragility`).
- statistics       -- ``chance``, ``ratio_contrasts`` (Fisher's test between every pair of ratios
  within each task, weight decay and capacity), ``interaction_logit`` (logistic regression ``generalized ~ dist * cap``,
  dist = |ratio - chance|, cap = 1 for 2 layers: the dist:cap coefficient tests whether distance
  from chance helps a 2-layer model more than a 1-layer one; :func:`seedlab.stats.logit_coefficient`:
  MLE, or Firth's regression when the data are separated), ``simple_slopes`` (the paper's claim
  is a *flip*: distance from chance lowers a 1-layer model's odds (slope < 0) and raises a 2-layer
  model's (slope > 0); both slopes with 95% intervals and one-sided p-values, and the
  intersection-union test of the flip: ``p_flip`` = the larger one-sided p, so the flip is shown at
  level α only when both slopes are, each at α).
- criteria         -- the rate had "generalized" meant a lower accuracy cut-off, or a smaller
  adversarial split.
- transience, phases, gradient conflict and amplification, the shortcut head and the conflict within it
  against the other heads (:func:`head_conflict`, :func:`head_control`).
- circuits         -- each member's last checkpoint, summarized per cell and component; each member's rule
  head, and its heads' roles through training (:func:`aligned_roles`, :func:`role_moments`).
- figures          -- what :mod:`seedlab.shortcut.figures` draws: the members each panel shows, the medians
  and means it marks.

The logistic fits code capacity from ``layers`` and compare only 1- and 2-layer models: they refuse a
frame holding any other depth (a 3-layer model is not a 1-layer one).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.shortcut.tasks import get_task
from seedlab.stats import fisher, fisher_fragility, l1_changes, logit_coefficient, mean_ci, rate_table, separated, wilson

# ---------------------------------------------------------------- cells

CAPACITY = ["layers", "heads"]  # a model's capacity
GROUP = ["task", "weight_decay"]  # one headline table per group; the answer speaks about one group
CELL = [*GROUP, *CAPACITY, "ratio"]  # the columns that identify a cell: members that differ only in their seed


def paper_order(capacity: tuple) -> tuple:
    """Sort key for (layers, heads[, ...]): 2L before 1L, as the paper's table."""
    return (-capacity[0], *capacity[1:])


def cell_order(key: tuple) -> tuple:
    """Sort key for a :data:`CELL` key (and any columns after it): task, weight decay, capacity in
    :func:`paper_order`, ratio, the rest."""
    return (key[:2], paper_order(key[2:4]), key[4:])


def by_cell(df: pd.DataFrame, *more: str) -> list[tuple[tuple, pd.DataFrame]]:
    """``df.groupby([*CELL, *more])`` as a list of (key, rows), in :func:`cell_order`."""
    return sorted(df.groupby([*CELL, *more]), key=lambda kv: cell_order(kv[0]))


def in_group(df: pd.DataFrame, task: str, wd: float) -> pd.DataFrame:
    """The rows of ``df`` of one (task, weight decay) group."""
    return df[(df["task"] == task) & np.isclose(df["weight_decay"], wd)]


def rate_cells(summary: pd.DataFrame) -> pd.DataFrame:
    """The generalization rate of every cell: columns ``*CELL, n, k, rate, lo, hi`` (95% Wilson interval)."""
    return rate_table(summary, by=CELL)


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

# The paper's headline (task sum2-max, weight decay 0.1): (layers, ratio) -> % of seeds that generalize.
PAPER_TASK, PAPER_WD = "sum2-max", 0.1
PAPER = {(2, 0.5): 0, (2, 0.9): 77, (1, 0.5): 33, (1, 0.9): 0}


def paper_pct(task: str, wd: float, layers: int, ratio: float) -> int | None:
    """The paper's rate (%) for this cell, or None when it reports none."""
    if task != PAPER_TASK or not np.isclose(wd, PAPER_WD):
        return None
    for (lay, r), v in PAPER.items():
        if lay == layers and np.isclose(r, ratio):
            return v
    return None


# ---------------------------------------------------------------- the question: does imbalance help 2L and hurt 1L?


@dataclass(frozen=True)
class Headline:
    """One headline table (a task and weight decay): its ratios (columns), capacities (rows, :func:`paper_order`) and
    per (layers, heads, ratio) the cell's row of :func:`rate_cells` (None where the sweep has no such cell) and the
    paper's own rate in percent (None where the paper does not report the cell)."""

    ratios: list[float]
    capacities: list[tuple[int, int]]
    cells: dict[tuple[int, int, float], tuple[pd.Series | None, int | None]]


def headline(task: str, wd: float, cells: pd.DataFrame) -> Headline:
    """The :class:`Headline` of one group's cells of :func:`rate_cells`."""
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


def answer_group(summary: pd.DataFrame) -> tuple[str, float]:
    """The (task, weight decay) the answer speaks about: the paper's when present, else the first."""
    groups = sorted(summary[GROUP].drop_duplicates().itertuples(index=False, name=None))
    for task, wd in groups:
        if task == PAPER_TASK and np.isclose(wd, PAPER_WD):
            return task, wd
    return groups[0]


def contrast_ratios(task: str, ratios: list[float]) -> tuple[float, float] | None:
    """(balanced, imbalanced): the paper's 0.5 / 0.9 for binary tasks when present, else the
    ratio nearest chance and the one farthest from it. None when they coincide."""
    c = chance(task)
    if np.isclose(c, 0.5) and any(np.isclose(r, 0.5) for r in ratios) and any(np.isclose(r, 0.9) for r in ratios):
        return 0.5, 0.9
    if len(ratios) < 2:
        return None
    bal = min(ratios, key=lambda r: abs(r - c))
    imb = max(ratios, key=lambda r: abs(r - c))
    return None if np.isclose(abs(bal - c), abs(imb - c)) else (bal, imb)


def generalized_of(d: pd.DataFrame) -> tuple[int, int]:
    """(members that generalized, members) of ``d``."""
    return int(d["generalized"].sum()), len(d)


def kept_to_end(d: pd.DataFrame) -> tuple[int, int]:
    """(members that generalized, of them still at 100% adversarial accuracy at the end) of ``d``."""
    return int(d["generalized"].sum()), int((d["generalized"] & d["retained"].astype(bool)).sum())


@dataclass(frozen=True)
class Move:
    """How one depth's generalization rate moves from the balanced ratio to the imbalanced one."""

    direction: str  # "rises", "falls" or "stays"
    balanced: float  # the rate at the balanced ratio
    imbalanced: float  # the rate at the imbalanced ratio
    p: float  # Fisher's exact test between the two (two-sided)
    # Fisher's exact test one-sided toward the paper's flip: the rate at the imbalanced ratio is higher than at the
    # balanced one for 2L, lower for 1L
    p_one_sided: float = float("nan")
    fragility: dict | None = None  # :func:`seedlab.stats.fisher_fragility` of the two-sided test


@dataclass(frozen=True)
class Answer:
    """The numbers behind the answer to "does imbalance help a 2-layer model and hurt a 1-layer one?"."""

    task: str  # the group the answer speaks about (:func:`answer_group`)
    weight_decay: float
    ratios: tuple[float, float] | None = None  # (balanced, imbalanced); None: no such pair, or not both 1L and 2L
    empty: tuple[int, float] | None = None  # (layers, ratio) without members: not determinable either
    moves: dict[int, Move] | None = None  # 2L and 1L
    slopes: dict | None = None  # :func:`simple_slopes` of the group's 1L and 2L members; None when not estimable
    verdict: str = ""  # "yes" (the flip is shown), "direction" (in direction only), "partly" or "no"
    kept: tuple[int, int] = (0, 0)  # :func:`kept_to_end` of the group
    flip_fragility: FlipFragility | None = None  # of the slopes' flip verdict; None when the slopes are not estimable

    @property
    def determinable(self) -> bool:
        """Whether the group has 1L and 2L members at both ratios (else ``ratios`` or ``empty`` says what is missing)."""
        return self.moves is not None

    @property
    def transient(self) -> bool:
        """Whether most of the group's generalizing members lost the rule again by the end."""
        k, kept = self.kept
        return k > 0 and kept * 2 < k


def flip_verdict(moves: dict[int, Move], slopes: dict | None) -> str:
    """"yes" when the intersection-union test shows the flip; "direction" when 2L rises and 1L falls without it;
    "partly" when one of the two moves the paper's way; "no" otherwise."""
    if slopes is not None and slopes["flip"]:
        return "yes"
    v2, v1 = moves[2].direction, moves[1].direction
    if (v2, v1) == ("rises", "falls"):
        return "direction"
    return "partly" if v2 == "rises" or v1 == "falls" else "no"


def flip_answer(summary: pd.DataFrame) -> Answer:
    """The answer in the group of :func:`answer_group`, from the data: each depth's move between the balanced and
    the imbalanced ratio (:func:`contrast_ratios`), the simple slopes, the verdict and the group's transience."""
    task, wd = answer_group(summary)
    sub = in_group(summary, task, wd)
    pair = contrast_ratios(task, sorted(sub["ratio"].unique()))
    if pair is None or not {1, 2} <= set(sub["layers"].unique()):
        return Answer(task, wd)
    bal, imb = pair
    moves = {}
    for layers in (2, 1):
        d = sub[sub["layers"] == layers]
        kb, nb = generalized_of(d[np.isclose(d["ratio"], bal)])
        ki, ni = generalized_of(d[np.isclose(d["ratio"], imb)])
        if nb == 0 or ni == 0:
            return Answer(task, wd, pair, empty=(layers, bal if nb == 0 else imb))
        rb, ri = kb / nb, ki / ni
        _, p = fisher(ki, ni, kb, nb)
        _, p_one = fisher(ki, ni, kb, nb, alternative="greater" if layers == 2 else "less")
        moves[layers] = Move("rises" if ri > rb else "falls" if ri < rb else "stays", rb, ri, p, p_one,
                             fisher_fragility(ki, ni, kb, nb))
    pairs = sub[sub["layers"].isin([1, 2])]
    slopes = slopes_or_none(pairs)
    fragile = None if slopes is None else flip_fragility(pairs)
    return Answer(task, wd, pair, None, moves, slopes, flip_verdict(moves, slopes), kept_to_end(sub), fragile)


# ---------------------------------------------------------------- statistics

#: columns of the design matrix of ``interaction_logit``; the tested coefficient is dist:cap
TERMS = ("Intercept", "dist", "cap", "dist:cap")


def chance(task: str) -> float:
    """Chance accuracy of a task from its name prefix: ``sum2-*`` -> 1/2, ``sum3-*`` -> 1/3."""
    prefix = str(task).split("-", 1)[0]
    if prefix == "sum2":
        return 1 / 2
    if prefix == "sum3":
        return 1 / 3
    raise ValueError(f"task: expected a name starting with sum2 or sum3, got {task!r}")


def ratio_contrasts(df: pd.DataFrame, fragility: bool = False) -> pd.DataFrame:
    """Fisher's test between every pair of ratios within each cell but its ratio (task, weight decay, capacity).

    Columns: task, weight_decay, layers, heads, ratio_a, ratio_b (ratio_a < ratio_b), rate_a, rate_b,
    odds_ratio (odds of generalizing at ratio_a over ratio_b), p (two-sided, not adjusted for the
    number of pairs); rows sorted by the first four. With ``fragility``, also ``fragility``: how many
    members' outcomes would have to change to reverse the verdict at level 0.05
    (:func:`seedlab.stats.fisher_fragility`: the fragility index when p < 0.05, the reverse fragility
    index otherwise; <NA> when no table of these sizes has the other verdict).
    """
    within = [c for c in CELL if c != "ratio"]
    rows = []
    for key, grp in rate_cells(df).groupby(within, sort=True):
        grp = grp.sort_values("ratio")
        for a, b in itertools.combinations(grp.itertuples(index=False), 2):
            odds, p = fisher(a.k, a.n, b.k, b.n)
            extra = (fisher_fragility(a.k, a.n, b.k, b.n)["fragility"],) if fragility else ()
            rows.append((*key, a.ratio, b.ratio, a.rate, b.rate, odds, p, *extra))
    columns = [*within, "ratio_a", "ratio_b", "rate_a", "rate_b", "odds_ratio", "p"]
    out = pd.DataFrame(rows, columns=columns + ["fragility"] * fragility)
    if fragility:
        out["fragility"] = out["fragility"].astype("Int64")
    return out


#: the contrasts table's rows: capacities within a task (1L first), weight decays innermost
CONTRAST_ROWS = ["task", *CAPACITY, "weight_decay"]


def contrast_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The report's Fisher contrasts: :func:`ratio_contrasts` with ``fragility``, sorted by :data:`CONTRAST_ROWS`, and
    ``reverse`` (p >= 0.05: its fragility is the reverse one, the changes that would make it significant)."""
    con = ratio_contrasts(summary, fragility=True).sort_values(CONTRAST_ROWS, kind="stable")
    return con.assign(reverse=con["p"] >= 0.05)


def _design(df: pd.DataFrame, reference: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Design matrix ``[1, dist, cap, dist*cap]`` (:data:`TERMS`) and the 0/1 outcome; cap = 1 for
    the depth that is not ``reference`` (so ``dist`` is the reference depth's slope)."""
    depths = set(df["layers"].unique().tolist())
    if not depths <= {1, 2}:
        raise ValueError(f"capacity: compares 1- and 2-layer models, got layers {sorted(depths - {1, 2})}: select those two first")
    dist = np.abs(df["ratio"].to_numpy(float) - np.array([chance(t) for t in df["task"]], float))
    cap = (df["layers"].to_numpy() != reference).astype(float)
    X = np.column_stack([np.ones(len(df)), dist, cap, dist * cap])
    y = df["generalized"].astype(bool).to_numpy(float)
    return X, y


def interaction_logit(df: pd.DataFrame) -> dict:
    """Test whether distance from chance helps 2-layer models more than 1-layer ones.

    Fits ``generalized ~ dist + cap + dist:cap`` with dist = |ratio - chance(task)| and
    cap = 1 if layers == 2 else 0, on all rows of ``df`` (filter to one task / heads / weight decay
    first if they should not be pooled). Returns a dict for the dist:cap coefficient (log-odds per
    unit of dist): ``estimate, ci_low, ci_high`` (95%), ``p`` (two-sided), ``n``, ``method``,
    ``separated``.

    When the maximum-likelihood estimate exists it is used with Wald z inference
    (``method="mle-wald"``). When the data are (quasi-)separated -- detected by a linear program,
    or by statsmodels reporting perfect separation / non-convergence / non-finite standard
    errors -- ``separated`` is True and Firth's bias-reduced logistic regression is used instead,
    with a penalized likelihood-ratio p-value and a profile penalized-likelihood 95% interval
    (``method="firth-profile-lr"``, as in R's logistf).

    Raises ValueError when the interaction is not identified (design not of full rank, e.g. one
    capacity or one distance per capacity) or when ``generalized`` never varies.
    """
    X, y = _design(df)
    n = len(y)
    if n == 0 or np.linalg.matrix_rank(X) < X.shape[1]:
        raise ValueError(
            "interaction_logit: dist:cap not identified (needs two capacities, each at two or more distances)"
        )
    if y.min() == y.max():
        raise ValueError(f"interaction_logit: generalized is {bool(y[0])} for all {n} members; nothing to contrast")
    res = logit_coefficient(X, y, TERMS.index("dist:cap"))
    return {"estimate": res["estimate"], "ci_low": res["ci_low"], "ci_high": res["ci_high"], "p": res["p"], "n": int(n),
            "method": res["method"], "separated": res["separated"]}


def simple_slopes(df: pd.DataFrame) -> dict:
    """The slope of log-odds on dist for 1L and for 2L, from ``generalized ~ dist * cap`` (the same
    fit as :func:`interaction_logit`, with either depth as the reference), and the intersection-union
    test of the flip (1L slope < 0 and 2L slope > 0).

    Returns ``{"1L": {...}, "2L": {...}, "p_flip": ..., "flip": bool}``; each slope has
    ``estimate, ci_low, ci_high`` (95%), ``p`` (two-sided), ``p_one_sided`` (toward the paper's
    sign: < 0 for 1L, > 0 for 2L; half the two-sided p when the estimate has that sign, else
    1 − p/2), ``method``. ``flip`` is ``p_flip < 0.05``."""
    out = {}
    for layers, sign in FLIP_SIGNS:
        X, y = _design(df, reference=layers)
        if len(y) == 0 or np.linalg.matrix_rank(X) < X.shape[1]:
            raise ValueError("simple_slopes: not identified (needs 1L and 2L models, each at two or more distances)")
        if y.min() == y.max():
            raise ValueError(f"simple_slopes: generalized is {bool(y[0])} for all {len(y)} members; nothing to contrast")
        out[f"{layers}L"] = _slope(X, y, sign)
    p_flip = max(out["1L"]["p_one_sided"], out["2L"]["p_one_sided"])
    return out | {"p_flip": float(p_flip), "flip": bool(p_flip < 0.05)}


FLIP_SIGNS = ((1, -1), (2, 1))  # (layers, the sign of its slope in the paper's flip)


def slopes_or_none(df: pd.DataFrame) -> dict | None:
    """:func:`simple_slopes`, or None where they are not estimable."""
    try:
        return simple_slopes(df)
    except ValueError:
        return None


def _slope(X: np.ndarray, y: np.ndarray, sign: int, interval: bool = True) -> dict:
    """The ``dist`` coefficient of the design ``X`` (:func:`_design`) with ``p_one_sided`` toward ``sign``; without
    ``interval``, no 95% interval (NaN bounds; estimate and p unchanged)."""
    res = logit_coefficient(X, y, TERMS.index("dist"), interval=interval)
    toward = np.sign(res["estimate"]) == sign
    res["p_one_sided"] = res["p"] / 2 if toward else 1 - res["p"] / 2
    return res


# ---------------------------------------------------------------- how robust the flip verdict is

FLIP_FRAGILITY_MAX = 6  # the most changes :func:`flip_fragility` tries


@dataclass(frozen=True)
class FlipFragility:
    """How many members' outcomes would have to change to reverse the flip verdict (:func:`flip_fragility`)."""

    shown: bool  # the verdict: the flip is shown (p_flip < alpha)
    p_flip: float  # :func:`simple_slopes`' p_flip of the data
    fragility: int | None  # the fewest changes that reverse the verdict; None: not within ``max_changes``
    max_changes: int  # the search's cap
    # one reversing set of changes: (layers, ratios of the cell, +m: m more members generalized / -m: m fewer)
    changes: tuple[tuple[int, tuple[float, ...], int], ...] = ()
    p_after: float | None = None  # p_flip after those changes; None when the slopes are no longer estimable
    fits: int = 0  # logistic fits the search ran

    @property
    def reached(self) -> bool:
        return self.fragility is not None


def flip_fragility(df: pd.DataFrame, alpha: float = 0.05, max_changes: int = FLIP_FRAGILITY_MAX) -> FlipFragility:
    """How many members' outcomes (generalized True <-> False) would have to change to reverse the flip verdict of
    :func:`simple_slopes` on ``df``: shown (p_flip < alpha) becoming not shown, or not shown becoming shown.

    A *cell* here is the members that share a row of the logistic design -- a depth and a distance from chance, so one
    (layers, ratio) cell of a task's 1L/2L members, heads pooled; the fit sees nothing else of a member, so changes of
    one direction within a cell are interchangeable and only their count matters. One change turns one member's
    outcome; a state is a vector of net changes per cell (+m: m more members generalized), reached by sum |m| changes
    (changing a member and then another of its cell the other way is never shorter). The fit is a logistic regression
    (Firth's when the data are separated), so p_flip need not move monotonically with the changes: the search is
    breadth-first and exhaustive, every state at distance 1 (each cell and direction: 8 with four cells), then every
    state at distance 2 (every multiset of two changes), ... up to ``max_changes``; the first distance with a state
    that reverses the verdict is the fragility. A state whose outcomes no longer vary (the slopes are not estimable)
    counts as "flip not shown".

    Each state's p-values are those :func:`simple_slopes` computes on the changed frame (the same code, without the
    intervals), with one shortcut: ``dist * cap`` fits one logistic line per depth, so the likelihood, Firth's penalty
    (up to a constant) and the 1L slope's estimate and p depend on the 1L members alone, given the method; the method
    (Firth when the data are separated, which they are when either depth's are) is the one link between the depths.
    A p-value is therefore fitted once per (depth, that depth's changes, method) and reused for every state that shares
    them -- equal to refitting up to the fits' convergence tolerance. The 1L slope is looked at first: when its
    one-sided p >= alpha, the flip is not shown whatever the 2L slope's.

    Returns a :class:`FlipFragility`; ``fragility`` None means more than ``max_changes`` changes are needed; ``p_after``
    is refitted on the reversing state found (no reuse). Raises ValueError when :func:`simple_slopes` does on ``df``. Cost,
    four cells of 32 members, six changes: at most 1,288 states and a few hundred p-only fits (about a second); six
    cells (three ratios), about 9,000 states (a few seconds).
    """
    base = simple_slopes(df)
    shown = bool(base["p_flip"] < alpha)
    designs = {layers: _design(df, reference=layers)[0] for layers, _ in FLIP_SIGNS}
    y0 = _design(df)[1]
    rows, cell_of = np.unique(designs[1][:, 1:3], axis=0, return_inverse=True)  # (dist, cap) per cell
    cell_of = np.asarray(cell_of).ravel()
    members = [np.flatnonzero(cell_of == c) for c in range(len(rows))]
    n = [len(m) for m in members]
    k = [int(y0[m].sum()) for m in members]
    ratios = df["ratio"].to_numpy(float)
    labels = [(2 if cap else 1, tuple(sorted(set(ratios[m].tolist())))) for (_, cap), m in zip(rows, members)]
    # per depth: its cells, its members and its own design [1, dist] (the joint design's first two columns there)
    cells = {layers: [c for c in range(len(rows)) if labels[c][0] == layers] for layers, _ in FLIP_SIGNS}
    own = {layers: np.concatenate([members[c] for c in cs]) for layers, cs in cells.items()}
    part_design = {layers: designs[1][idx][:, :2] for layers, idx in own.items()}
    sep_cache: dict[tuple, bool] = {}
    p_cache: dict[tuple, float] = {}
    fits = 0

    def outcomes(v) -> np.ndarray:
        y = np.zeros(len(y0))
        for m, kg, dv in zip(members, k, v):
            y[m[: kg + dv]] = 1.0
        return y

    def part(v, layers: int) -> tuple:
        return tuple(v[c] for c in cells[layers])

    def method(v, y: np.ndarray) -> str:
        seps = []
        for layers, _ in FLIP_SIGNS:
            key = (layers, part(v, layers))
            if key not in sep_cache:
                sep_cache[key] = separated(part_design[layers], y[own[layers]])
            seps.append(sep_cache[key])
        return "firth-profile-lr" if any(seps) else "mle-wald"

    def fit_p(y: np.ndarray, layers: int, sign: int) -> dict:
        nonlocal fits
        fits += 1
        return _slope(designs[layers], y, sign, interval=False)

    def p_of(v, y: np.ndarray, m: str, layers: int, sign: int, fresh: bool = False) -> tuple[float, bool]:
        """The slope's one-sided p for state v, reused when fitted before under method m (unless ``fresh``), and
        whether the method is m (a fit may choose Firth's regression although neither depth is separated: the MLE did
        not converge)."""
        key = (layers, part(v, layers), m)
        if fresh or key not in p_cache:
            res = fit_p(y, layers, sign)
            p_cache[(layers, part(v, layers), res["method"])] = res["p_one_sided"]
            return res["p_one_sided"], res["method"] == m
        return p_cache[key], True

    def reverses(v, y: np.ndarray) -> bool:
        if y.min() == y.max():
            return shown  # nothing to contrast: the flip is not shown
        m = method(v, y)
        p1, as_expected = p_of(v, y, m, *FLIP_SIGNS[0])
        if p1 >= alpha:  # p_flip >= the 1L p: not shown whatever the 2L slope
            return shown
        return (p_of(v, y, m, *FLIP_SIGNS[1], fresh=not as_expected)[0] < alpha) != shown

    lo, hi = [-kg for kg in k], [ng - kg for ng, kg in zip(n, k)]
    for d in range(1, max_changes + 1):
        for v in l1_changes(d, lo, hi):
            y = outcomes(v)
            if reverses(v, y):
                p_after = None if y.min() == y.max() else float(max(fit_p(y, *ls)["p_one_sided"] for ls in FLIP_SIGNS))
                changes = tuple((*labels[c], dv) for c, dv in enumerate(v) if dv)
                return FlipFragility(shown, base["p_flip"], d, max_changes, changes, p_after, fits)
    return FlipFragility(shown, base["p_flip"], None, max_changes, fits=fits)


def depths_left_out(summary: pd.DataFrame) -> list[int]:
    """The depths other than 1 and 2 layers in the summary (the logistic fits leave them out), sorted."""
    return sorted(set(summary["layers"].unique().tolist()) - {1, 2})


def interaction_fits(summary: pd.DataFrame) -> list[dict]:
    """:func:`interaction_logit`, :func:`simple_slopes` and :func:`flip_fragility` of the 1- and 2-layer members of every
    task, weight decay and head count, in that order: dicts with ``task, weight_decay, heads`` and either ``fit``,
    ``slopes`` and ``fragility`` or ``error`` (why they are not estimable)."""
    fits = []
    pairs = summary[summary["layers"].isin([1, 2])]
    for (task, wd, heads), sub in pairs.groupby([*GROUP, "heads"], sort=True):
        where = {"task": task, "weight_decay": wd, "heads": heads}
        try:
            fits.append(where | {"fit": interaction_logit(sub), "slopes": simple_slopes(sub),
                                 "fragility": flip_fragility(sub)})
        except ValueError as e:
            fits.append(where | {"error": str(e)})
    return fits


# ---------------------------------------------------------------- the rate under other criteria

CUTOFFS = [0.90, 0.95, 0.98, 0.99, 1.0]  # peak adversarial accuracies the rate is shown at
SPLIT_SIZE_MIN = 16  # the smallest adversarial split the rate is shown at


def cutoff_criteria(summary: pd.DataFrame) -> dict[float, pd.Series]:
    """Per cut-off t of :data:`CUTOFFS`, whether each member would count as generalized had "generalized" meant a
    peak adversarial accuracy >= t."""
    return {t: summary["peak_adv_acc"] >= t - 1e-12 for t in CUTOFFS}


def split_sizes(n_adv: int) -> list[int]:
    """The adversarial split sizes the rate is shown at: powers of two from ``SPLIT_SIZE_MIN`` below n_adv, then n_adv."""
    sizes, m = [], SPLIT_SIZE_MIN
    while m < n_adv:
        sizes.append(m)
        m *= 2
    return [*sizes, n_adv]


def split_size_criteria(summary: pd.DataFrame, n_adv: int) -> dict[int, pd.Series]:
    """Per split size m of :func:`split_sizes`, whether each member would have generalized on an adversarial split of
    its first m rows: its longest all-correct prefix of the split (``adv_prefix_max``) reached m."""
    return {m: summary["adv_prefix_max"] >= m for m in split_sizes(n_adv)}


def criterion_rates(summary: pd.DataFrame, criteria: dict) -> list[tuple[tuple, list[tuple[float, float, float]]]]:
    """Per cell (in :func:`cell_order`), the share of its members that meet each criterion (a boolean per member) with
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
    """Per cell (in :func:`cell_order`): ``*CELL, members, generalized`` (at some evaluation), ``retained`` (of those,
    still at 100% adversarial accuracy at the end) and ``lost`` (the rest: transient generalization)."""
    rows = []
    for key, d in by_cell(summary):
        k, kept = kept_to_end(d)
        rows.append((*key, len(d), k, kept, k - kept))
    return pd.DataFrame(rows, columns=[*CELL, "members", "generalized", "retained", "lost"])


PHASES = ["shortcut_epoch", "phase2_epoch", "gen_epoch"]  # the columns of :mod:`seedlab.shortcut.phases`


def phase_medians(summary: pd.DataFrame) -> pd.DataFrame:
    """Per capacity and ratio (tasks and weight decays pooled; 2L first): ``layers, heads, ratio, seeds`` and the
    median over seeds of each of :data:`PHASES` (NaN where no seed reached that phase)."""
    rows = []
    for key, d in sorted(summary.groupby([*CAPACITY, "ratio"]), key=lambda kv: paper_order(kv[0])):
        medians = [float(d[c].dropna().median()) if d[c].notna().any() else np.nan for c in PHASES]
        rows.append((*key, len(d), *medians))
    return pd.DataFrame(rows, columns=[*CAPACITY, "ratio", "seeds", *PHASES])


# ---------------------------------------------------------------- gradient conflict and amplification

#: the conflict measures within the shortcut head's parameters, per measure over all parameters
HEAD_CONFLICT = {"cosine": "head_cosine", "pair_cosine": "head_pair_cosine"}
#: the columns of :func:`conflict_medians`: both measures over all parameters, then within the shortcut head
CONFLICT = [*HEAD_CONFLICT, *HEAD_CONFLICT.values()]


@dataclass(frozen=True)
class Shape:
    """A median conflict series over epochs, as the paper describes it: ``lowest`` (its most negative value),
    ``last`` (its last value) and ``resolves`` (:func:`resolves_toward_zero`)."""

    lowest: float
    last: float
    resolves: bool


#: the least rise from a conflict series' most negative value to its last that counts as resolving toward 0 (a
#: shallow wobble does not); fixed on 2026-12-01, before the rule was applied to new runs (docs/assumptions.md)
MIN_RISE = 0.1


def resolves_toward_zero(series: pd.Series, min_rise: float = MIN_RISE) -> bool:
    """The paper's description of one median series over epochs: it goes negative (the conflict appears once
    the shortcut is learned; at epoch 0 the weights are random, so not at the first measurement) and at the last
    measurement it has risen by at least ``min_rise`` from its most negative value and is within half that value's
    size of 0 (an overshoot to +0.9 is not "toward 0")."""
    s = series.dropna()
    if len(s) < 2 or s.min() >= 0 or s.idxmin() == s.index[-1]:
        return False
    low, last = s.min(), s.iloc[-1]
    return bool(last - low >= min_rise - 1e-12 and abs(last) <= abs(low) / 2)


def conflict_shape(series: pd.Series) -> Shape | None:
    """The :class:`Shape` of a median series over epochs (missing values dropped); None when nothing is left."""
    s = series.dropna()
    if s.empty:
        return None
    return Shape(float(s.min()), float(s.iloc[-1]), resolves_toward_zero(s))


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
    """Per task, capacity and ratio (weight decays pooled; :func:`paper_order` within a task): ``members`` (measured),
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


# ---------------------------------------------------------------- the shortcut head, and the conflict within it

# the circuits.parquet fingerprint that marks a shortcut head, per shortcut feature (the paper's QK fingerprints)
SHORTCUT_FINGERPRINT = {"max": "qk_rho_value", "first": "attn_pos0"}


def shortcut_heads(summary: pd.DataFrame, circuits: pd.DataFrame | None) -> pd.DataFrame:
    """Each member's shortcut head: ``member, layer, head``, one row per member that circuits.parquet covers.

    The rule: the attention head with the highest shortcut fingerprint, averaged over the member's
    checkpoints: the activation-based QK rho with token value (``qk_rho_value``: attends to the max) for
    ``*-max`` tasks, the readout's attention on position 0 (``attn_pos0``) for ``*-first`` tasks.
    """
    if circuits is None or circuits.empty:
        return pd.DataFrame({"member": [], "layer": [], "head": []}, dtype="int64")
    c = circuits[circuits["head"] >= 0].merge(summary[["member", "task"]], on="member")
    first = c["task"].map(lambda t: get_task(t).shortcut == "first")
    c = c.assign(score=np.where(first, c[SHORTCUT_FINGERPRINT["first"]], c[SHORTCUT_FINGERPRINT["max"]]))
    mean = c.groupby(["member", "layer", "head"], as_index=False)["score"].mean().dropna(subset=["score"])
    return mean.loc[mean.groupby("member")["score"].idxmax(), ["member", "layer", "head"]].reset_index(drop=True)


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
    """Per cell (:func:`cell_order`), outcome (``generalized``), measured epoch and role of :func:`head_roles`: the
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

    chosen: pd.DataFrame  # each member's shortcut head (:func:`shortcut_heads`)
    missing: int  # members of the per-head gradients without one (:func:`without_shortcut_head`)
    task: str
    weight_decay: float
    medians: pd.DataFrame  # :func:`conflict_medians` in the group
    shown: pd.DataFrame  # its rows at :data:`SHOWN_EPOCHS` evenly spaced epochs per cell, in :func:`cell_order`


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


# ---------------------------------------------------------------- circuits at the last checkpoint


def last_checkpoint(summary: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The rows of circuits.parquet or patching.parquet (``table``) at each member's last checkpoint, with the
    member's cell (:data:`CELL`) and the row's component (``L0H1``, ``L1MLP``)."""
    t = table[table["epoch"] == table.groupby("member")["epoch"].transform("max")].merge(summary[["member", *CELL]], on="member")
    layer = "L" + t["layer"].astype(str)
    return t.assign(component=np.where(t["head"] >= 0, layer + "H" + t["head"].astype(str), layer + "MLP"))


def per_component(summary: pd.DataFrame, table: pd.DataFrame, values: Callable[[pd.DataFrame], dict]) -> pd.DataFrame:
    """One row per cell and component at the last checkpoint (in :func:`cell_order`): ``*CELL, component, seeds``
    and the dict ``values(rows)`` returns for the group's rows."""
    rows = [{**dict(zip([*CELL, "component"], key)), "seeds": d["member"].nunique(), **values(d)}
            for key, d in by_cell(last_checkpoint(summary, table), "component")]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=[*CELL, "component", "seeds"])


def _quartile_medians(d: pd.DataFrame, prefix: str) -> dict[str, float]:
    """The median over seeds of each seed's median and quartiles of a per-pair distribution (``{prefix}_q50`` ...)."""
    return {f"{prefix}_q{p}": float(d[f"{prefix}_q{p}"].median()) for p in ("50", "25", "75")}


def patching_medians(summary: pd.DataFrame, patching: pd.DataFrame) -> pd.DataFrame:
    """Activation patching on matched pairs per cell and component at the last checkpoint: ``pairs`` (median per
    seed), ``flagged`` (the mean share of pairs with a gap too small for a fraction), ``gap`` (the median of the
    seeds' median gaps), the fractions' median and quartiles per direction (``forward_q50, forward_q25,
    forward_q75``: clean→corrupt; ``backward_*``: corrupt→clean; the median over seeds of each) and ``dld_forward``,
    ``dld_backward`` (the median over seeds of the median unnormalized change, logits)."""

    def values(d: pd.DataFrame) -> dict[str, float]:
        fwd, back = d[d["direction"] == "clean_to_corrupt"], d[d["direction"] == "corrupt_to_clean"]
        return {
            "pairs": float(fwd["n_pairs"].median()),
            "flagged": float((fwd["n_small_gap"] / fwd["n_pairs"]).mean()),
            "gap": float(fwd["gap_q50"].median()),
            **{k.replace("frac", "forward"): v for k, v in _quartile_medians(fwd, "frac").items()},
            **{k.replace("frac", "backward"): v for k, v in _quartile_medians(back, "frac").items()},
            "dld_forward": float(fwd["dld_q50"].median()),
            "dld_backward": float(back["dld_q50"].median()),
        }

    return per_component(summary, patching, values)


PATH_ABLATIONS = ["qk_uniform", "qk_mean", "ov_mean"]  # the path ablations of circuits.parquet, per head


def ablation_means(summary: pd.DataFrame, circuits: pd.DataFrame) -> pd.DataFrame:
    """Per cell and head at the last checkpoint, the mean over seeds of each path ablation's accuracy change on each
    split (``{kind}_ablation_{split}`` of circuits.parquet, kinds :data:`PATH_ABLATIONS`, splits val and adv)."""
    columns = [f"{k}_ablation_{s}" for k in PATH_ABLATIONS for s in ("val", "adv")]
    return per_component(summary, circuits[circuits["head"] >= 0], lambda d: {c: d[c].mean() for c in columns})


def fingerprint_medians(summary: pd.DataFrame, circuits: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per cell and component at the last checkpoint, the median over seeds of each fingerprint in ``columns``
    (NaN where no seed has one)."""
    return per_component(summary, circuits, lambda d: {c: float(d[c].median()) if d[c].notna().any() else np.nan
                                                       for c in columns})


def _select(patching: pd.DataFrame, **values: str) -> pd.DataFrame:
    """The rows of patching.parquet with the given values."""
    return patching[np.logical_and.reduce([patching[c] == v for c, v in values.items()])]


def pair_patching(summary: pd.DataFrame, patching: pd.DataFrame, kinds: list[str]) -> pd.DataFrame:
    """:func:`patching_medians` of whole components (``path == total``) for each pair kind in ``kinds``, side by
    side: one row per cell and component, each kind's columns suffixed ``_{kind}``."""
    keys = [*CELL, "component", "seeds"]
    return pd.concat([patching_medians(summary, _select(patching, pairs=k, path="total")).set_index(keys).add_suffix(f"_{k}")
                      for k in kinds], axis=1).reset_index()


def rule_heads(patching: pd.DataFrame) -> pd.DataFrame:
    """Each member's rule head at its last checkpoint: ``member, layer, head``.

    The attention head whose clean activation, patched (whole) into the corrupt run of
    label-changing pairs, raises ld (clean label − corrupt label) the most: the highest median
    Δld clean→corrupt. Chosen by intervention, not by the direct-path OV fingerprint, which
    misses a head whose parity only an MLP reads."""
    t = _select(patching, pairs="label_changing", path="total", direction="clean_to_corrupt")
    t = t[(t["head"] >= 0) & (t["epoch"] == t.groupby("member")["epoch"].transform("max"))]
    return t.loc[t.groupby("member")["dld_q50"].idxmax(), ["member", "layer", "head"]].reset_index(drop=True)


def path_patching(summary: pd.DataFrame, patching: pd.DataFrame, paths: list[str]) -> pd.DataFrame | None:
    """Each member's rule head (:func:`rule_heads`) on label-changing pairs, clean→corrupt, along each of ``paths``,
    per cell and rule head (``rule_head``) at the last checkpoint: ``flagged`` (the mean share of pairs with too
    small a gap), and per path ``dld_{path}`` and ``frac_{path}`` (the median over seeds of each seed's per-pair
    median). None without label-changing pairs."""
    t = _select(patching, pairs="label_changing", direction="clean_to_corrupt").merge(rule_heads(patching), on=["member", "layer", "head"])
    if t.empty:
        return None

    def values(d: pd.DataFrame) -> dict[str, float]:
        out = {"flagged": float((d["n_small_gap"] / d["n_pairs"]).mean())}
        for path in paths:
            p = d[d["path"] == path]
            out |= {f"dld_{path}": float(p["dld_q50"].median()), f"frac_{path}": float(p["frac_q50"].median())}
        return out

    return per_component(summary, t, values).rename(columns={"component": "rule_head"})


#: the per-head measures :func:`aligned_roles` follows (``shortcut_fp``: the task's shortcut fingerprint)
ROLES = ["shortcut_fp", "qk_rho_value", "attn_pos0", "qk_w_rho_value", "qk_w_pos0", "ov_rho_residue", "probe_sum",
         "probe_shortcut", *(f"{k}_ablation_{s}" for k in ("zero", "mean", *PATH_ABLATIONS) for s in ("val", "adv"))]


def aligned_roles(circuits: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Every head of every member at every checkpoint, aligned at the member's generalization epoch.

    Columns: ``*CELL, member, generalized, layer, head, component, epoch, gen_epoch, epochs_from_gen``
    (``epoch - gen_epoch``; nan, like ``gen_epoch``, for members without a generalization epoch,
    which are not aligned), then :data:`ROLES`: ``shortcut_fp`` (``qk_rho_value`` for max tasks,
    ``attn_pos0`` for first tasks, as :data:`SHORTCUT_FINGERPRINT`) and the per-head measures of
    circuits.parquet present. Sorted by member, layer, head, epoch.
    """
    s = summary[["member", *CELL, "generalized", "gen_epoch"]]
    t = circuits[circuits["head"] >= 0].merge(s, on="member")
    gen = t["gen_epoch"].astype("float64").where(t["generalized"].astype(bool))
    fp = t["task"].map(lambda task: SHORTCUT_FINGERPRINT[get_task(task).shortcut])
    shortcut_fp = np.where(fp == "attn_pos0", t.get("attn_pos0", np.nan), t.get("qk_rho_value", np.nan))
    t = t.assign(gen_epoch=gen, epochs_from_gen=t["epoch"] - gen, shortcut_fp=shortcut_fp,
                 component="L" + t["layer"].astype(str) + "H" + t["head"].astype(str))
    keys = [*CELL, "member", "generalized", "layer", "head", "component", "epoch", "gen_epoch", "epochs_from_gen"]
    return t[keys + [c for c in ROLES if c in t]].sort_values(["member", "layer", "head", "epoch"], ignore_index=True)


def _moments(d: pd.DataFrame) -> list[float | None]:
    """One member's checkpoints to show: aligned, the last before gen_epoch, the first at or after it, and the last;
    otherwise the first and the last (None where there is none)."""
    epochs = np.sort(d["epoch"].unique())
    gen = d["gen_epoch"].iloc[0]
    if np.isnan(gen):
        return [epochs[0], epochs[-1]]
    before, after = epochs[epochs < gen], epochs[epochs >= gen]
    return [before[-1] if len(before) else None, after[0] if len(after) else None, epochs[-1]]


def role_moments(roles: pd.DataFrame, columns: list[str], cap: int) -> list[dict]:
    """Per member (at most ``cap`` per cell, the lowest ids) and head of :func:`aligned_roles`, its values at the
    moments around the generalization epoch: the cell, ``member``, ``gen_epoch`` (nan: not aligned), ``component``,
    ``when`` (each moment's epochs from gen_epoch when aligned, else its epoch; None: no such checkpoint) and per
    column of ``columns`` its values at the moments (None where there is no checkpoint)."""
    rows = []
    for _, cell in by_cell(roles):
        for member in sorted(cell["member"].unique())[:cap]:
            d = cell[cell["member"] == member]
            moments, gen = _moments(d), d["gen_epoch"].iloc[0]
            when = [None if e is None else e if np.isnan(gen) else e - gen for e in moments]
            for comp, h in d.groupby("component", sort=True):
                at = h.set_index("epoch")
                rows.append({**h.iloc[0][CELL].to_dict(), "member": member, "gen_epoch": gen, "component": comp,
                             "when": when, **{c: [None if e is None else at.at[e, c] for e in moments] for c in columns}})
    return rows


# ---------------------------------------------------------------- cadence


def at_evaluations(summary: pd.DataFrame, curves: pd.DataFrame) -> pd.Series:
    """Per member (``summary``'s order): generalized counting only the evaluations (every ``eval_every`` epochs and
    the last, the rows of ``curves``), not the ``adv_every`` checks between them: adversarial accuracy exactly 1.0 at
    one of them. Training does not depend on the checks (they are read-only), so this is the member's outcome had the
    run checked at the evaluation cadence alone."""
    keys = [k for k in ("job", "member") if k in summary and k in curves]
    adv = curves[curves["split"] == "adv"]
    hit = adv.assign(hit=adv["acc"] == 1.0).groupby(keys)["hit"].any()
    return pd.Series(hit.reindex(pd.MultiIndex.from_frame(summary[keys]) if len(keys) > 1 else summary[keys[0]])
                     .fillna(False).to_numpy(dtype=bool), index=summary.index)


def cadence_rates(summary: pd.DataFrame, curves: pd.DataFrame) -> tuple[pd.DataFrame, dict | None, dict | None]:
    """What a denser adversarial check adds: per cell ``*CELL, members, generalized`` (every check) ``,
    at_evaluations`` (:func:`at_evaluations`) ``, added, rate, rate_at_evaluations`` (the two counts' shares of the
    members); and the flip test (:func:`simple_slopes`) of the answer's
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
    """Per task (sorted), per capacity and ratio (:func:`paper_order`): :class:`GenEpochs`."""
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
    """Per capacity of the generalizing members (:func:`paper_order`): ``((layers, heads), generalized members,
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


def fingerprint_series(heads: pd.DataFrame, column: str) -> list[tuple[tuple, pd.Series]]:
    """Per (layer, head, ratio) of circuits.parquet's head rows (of one capacity): the median over seeds of
    ``column`` at each checkpoint."""
    return [(key, g.groupby("epoch")[column].median()) for key, g in heads.groupby(["layer", "head", "ratio"])]


def ablation_grid(summary: pd.DataFrame, circuits: pd.DataFrame) -> tuple[list[tuple], list[str], dict[str, np.ndarray]]:
    """The mean zero-ablation effect (points) of every component at each member's last checkpoint, per capacity and
    ratio (tasks and weight decays pooled): the cells ``(layers, heads, ratio)`` (:func:`paper_order`), the
    components, and per split (val, adv) a cells × components grid (NaN where a cell lacks the component)."""
    last = last_checkpoint(summary, circuits)
    cells = sorted({(int(a), int(b), float(r)) for a, b, r in last[["layers", "heads", "ratio"]].itertuples(index=False)},
                   key=paper_order)
    comps = sorted(last["component"].unique())
    grids = {}
    for split in ("val", "adv"):
        grid = np.full((len(cells), len(comps)), np.nan)
        for i, (L, H, r) in enumerate(cells):
            d = last[(last["layers"] == L) & (last["heads"] == H) & np.isclose(last["ratio"], r)]
            for j, comp in enumerate(comps):
                v = d.loc[d["component"] == comp, f"zero_ablation_{split}"]
                grid[i, j] = 100 * v.mean() if len(v) else np.nan
        grids[split] = grid
    return cells, comps, grids
