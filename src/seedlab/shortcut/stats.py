"""The shortcut study's statistics: its tests, their intervals and the decisions they make.

Most functions take the per-member ``summary`` frame: one row per trained model (task, ratio,
layers, heads, weight_decay, lr, seed, generalized, ...). A *cell* is the members that share
:data:`CELL`: everything but the seed. What the report renders from these (its tables, counts,
medians and the data its figures draw) is computed in :mod:`seedlab.shortcut.report_data` and
:mod:`seedlab.shortcut.circuit_data`.

- cells            -- :data:`CELL`, the report's order of cells (2L before 1L, as the paper's
  table), the generalization rate per cell with its 95% Wilson interval.
- the question     -- :func:`flip_answer`: how each depth's rate moves from a balanced to an
  imbalanced ratio (Fisher's test two-sided, and one-sided toward the paper's direction), and whether
  the flip (1L falls, 2L rises) is shown.
- tests            -- ``chance``, ``ratio_contrasts`` (Fisher's test between every pair of ratios
  within each task, weight decay and capacity), ``interaction_logit`` (logistic regression ``generalized ~ dist * cap``,
  dist = |ratio - chance|, cap = 1 for 2 layers: the dist:cap coefficient tests whether distance
  from chance helps a 2-layer model more than a 1-layer one; :func:`seedlab.stats.logit_coefficient`:
  MLE, or Firth's regression when the data are separated), ``simple_slopes`` (the paper's claim
  is a *flip*: distance from chance lowers a 1-layer model's odds (slope < 0) and raises a 2-layer
  model's (slope > 0); both slopes with 95% intervals and one-sided p-values, and the
  intersection-union test of the flip: ``p_flip`` = the larger one-sided p, so the flip is shown at
  level α only when both slopes are, each at α).
- robustness       -- how many members' outcomes would have to change to reverse a verdict: the
  fragility of a Fisher verdict (:func:`seedlab.stats.fisher_fragility`; ``ratio_contrasts(...,
  fragility=True)``, each :class:`Move`) and of the flip verdict (:func:`flip_fragility`).
- criteria         -- whether a member counts as generalized had "generalized" meant a lower accuracy
  cut-off, a smaller adversarial split, or the evaluations alone (not the ``adv_every`` checks between them).
- the conflict's shape -- :func:`resolves_toward_zero`: the paper's "starts negative, resolves toward 0"
  as a fixed test of one median series.

The logistic fits code capacity from ``layers`` and compare only 1- and 2-layer models: they refuse a
frame holding any other depth (a 3-layer model is not a 1-layer one).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from seedlab.stats import fisher, fisher_fragility, l1_changes, logit_coefficient, rate_table, separated

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


# ---------------------------------------------------------------- the question: does imbalance help 2L and hurt 1L?

#: the group of the paper's headline: the answer speaks about it when the summary holds it
PAPER_TASK, PAPER_WD = "sum2-max", 0.1


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
    verdict: str = ""  # :func:`flip_verdict`: "shown" or "not shown"; "" when not determinable
    kept: tuple[int, int] = (0, 0)  # :func:`kept_to_end` of the group
    flip_fragility: FlipFragility | None = None  # of the slopes' flip verdict; None when the slopes are not estimable
    untestable: str = ""  # why the slopes are not estimable, in words ("" when they are)

    @property
    def determinable(self) -> bool:
        """Whether the group has 1L and 2L members at both ratios (else ``ratios`` or ``empty`` says what is missing)."""
        return self.moves is not None

    @property
    def transient(self) -> bool:
        """Whether most of the group's generalizing members lost the rule again by the end."""
        k, kept = self.kept
        return k > 0 and kept * 2 < k


def flip_verdict(slopes: dict | None) -> str:
    """The decision of the flip's pre-set test, and nothing else: "shown" where the intersection-union test of the
    simple slopes rejects (``p_flip`` < 0.05), "not shown" otherwise, and where the slopes are not estimable (no test
    ran). The raw direction of the rates is no verdict: it is in each :class:`Move`."""
    return "shown" if slopes is not None and slopes["flip"] else "not shown"


def why_untestable(df: pd.DataFrame) -> str:
    """Why :func:`simple_slopes` is not estimable on ``df``, in words; "" where it is."""
    try:
        simple_slopes(df)
    except ValueError:
        y = df["generalized"].astype(bool)
        if len(y) and y.nunique() == 1:
            return f"{'every one' if y.iloc[0] else 'none'} of its {len(y)} 1- and 2-layer members generalized"
        return "the logistic slopes are not identified: it needs 1L and 2L members, each at two or more ratios"
    return ""


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
    why = "" if slopes is not None else why_untestable(pairs)
    return Answer(task, wd, pair, None, moves, slopes, flip_verdict(slopes), kept_to_end(sub), fragile, why)


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


# ---------------------------------------------------------------- the conflict's shape: the paper's description as a test

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
