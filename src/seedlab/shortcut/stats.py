"""The shortcut study's statistics on a per-member ``summary`` frame (one row per trained model:
task, ratio, layers, heads, weight_decay, lr, seed, generalized, ...).

- ``chance``            -- chance accuracy of a task: 1/2 for ``sum2-*``, 1/3 for ``sum3-*``.
- ``ratio_contrasts``   -- Fisher's test between every pair of ratios within each capacity cell.
- ``interaction_logit`` -- logistic regression ``generalized ~ dist * cap`` (dist = |ratio - chance|,
  cap = 1 for 2 layers): the dist:cap coefficient tests the paper's claim that distance from chance
  helps a 2-layer model and not a 1-layer one (:func:`seedlab.stats.logit_coefficient`: MLE, or
  Firth's regression when the data are separated).
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


def _design(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Design matrix ``[1, dist, cap, dist*cap]`` (:data:`TERMS`) and the 0/1 outcome."""
    dist = np.abs(df["ratio"].to_numpy(float) - np.array([chance(t) for t in df["task"]], float))
    cap = (df["layers"].to_numpy() == 2).astype(float)
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
