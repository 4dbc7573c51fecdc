"""The shortcut study's statistics on a per-member ``summary`` frame (one row per trained model:
task, ratio, layers, heads, weight_decay, lr, seed, generalized, ...).

- ``chance``            -- chance accuracy of a task: 1/2 for ``sum2-*``, 1/3 for ``sum3-*``.
- ``ratio_contrasts``   -- Fisher's test between every pair of ratios within each capacity cell.
- ``interaction_logit`` -- logistic regression ``generalized ~ dist * cap`` (dist = |ratio - chance|,
  cap = 1 for 2 layers): the dist:cap coefficient tests the paper's claim that distance from chance
  helps a 2-layer model and not a 1-layer one (:func:`seedlab.stats.logit_coefficient`: MLE, or
  Firth's regression when the data are separated).
- ``simple_slopes``     -- the paper's claim is a *flip*: distance from chance lowers a 1-layer model's
  odds (slope < 0) and raises a 2-layer model's (slope > 0). Both simple slopes of the same model
  with 95% intervals and one-sided p-values, and the intersection-union test of the flip
  (``p_flip`` = the larger of the two one-sided p-values: the flip is shown at level α only when
  both slopes are, each at α).

Capacity is coded from ``layers`` and only 1- and 2-layer models are compared: a frame holding any
other depth is refused (a 3-layer model is not a 1-layer one).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from seedlab.stats import fisher, logit_coefficient, rate_table

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


def ratio_contrasts(df: pd.DataFrame) -> pd.DataFrame:
    """Fisher's test between every pair of ratios within each (task, layers, heads, weight_decay) cell.

    Columns: task, layers, heads, weight_decay, ratio_a, ratio_b (ratio_a < ratio_b), rate_a, rate_b,
    odds_ratio (odds of generalizing at ratio_a over ratio_b), p (two-sided, not adjusted for the
    number of pairs).
    """
    cell = ["task", "layers", "heads", "weight_decay"]
    counts = rate_table(df, [*cell, "ratio"])
    rows = []
    for key, grp in counts.groupby(cell, sort=True):
        grp = grp.sort_values("ratio")
        for a, b in itertools.combinations(grp.itertuples(index=False), 2):
            odds, p = fisher(a.k, a.n, b.k, b.n)
            rows.append((*key, a.ratio, b.ratio, a.rate, b.rate, odds, p))
    cols = [*cell, "ratio_a", "ratio_b", "rate_a", "rate_b", "odds_ratio", "p"]
    return pd.DataFrame(rows, columns=cols)


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
    for layers, sign in ((1, -1), (2, 1)):
        X, y = _design(df, reference=layers)
        if len(y) == 0 or np.linalg.matrix_rank(X) < X.shape[1]:
            raise ValueError("simple_slopes: not identified (needs 1L and 2L models, each at two or more distances)")
        if y.min() == y.max():
            raise ValueError(f"simple_slopes: generalized is {bool(y[0])} for all {len(y)} members; nothing to contrast")
        res = logit_coefficient(X, y, TERMS.index("dist"))
        toward = np.sign(res["estimate"]) == sign
        res["p_one_sided"] = res["p"] / 2 if toward else 1 - res["p"] / 2
        out[f"{layers}L"] = res
    p_flip = max(out["1L"]["p_one_sided"], out["2L"]["p_one_sided"])
    return out | {"p_flip": float(p_flip), "flip": bool(p_flip < 0.05)}
