"""Paired statistics over seeds: the same measure on two arms of each seed, the seeds as the pairs.

- ``paired_row``           one comparison as a row: :func:`seedlab.stats.paired` (means, the difference a − b,
                           its 95% t interval, the two-sided paired t-test ``p_t`` and the sign-flip
                           permutation test ``p_perm``), the sign-flip test's floor ``p_perm_min`` (2/2ⁿ exact:
                           a p below it can only be the t-test's), the minimum detectable effect ``mde`` (80%
                           power, two-sided paired t) for this many seeds (n/a where the differences have no
                           spread, as the t-test's p is) and ``diff_over_mde``.
- ``one_sided_sign_flip``  the one-sided (H1: mean < 0) sign-flip permutation p of per-seed differences.
"""

from __future__ import annotations

import numpy as np

from seedlab.stats import mde_paired, paired, sign_flip_floor, sign_flip_null


def paired_row(a, b, *, alpha: float = 0.05) -> dict:
    """The paired comparison of ``a`` and ``b`` (aligned per seed) as a table row (see the module docstring)."""
    res = paired(a, b, alpha=alpha)
    # no spread in the differences: the t-test is undefined (p n/a), and so is its power; 0 would read "detects all"
    mde = mde_paired(res["n"], res["sd_diff"], alpha=alpha) if res["n"] >= 2 and res["sd_diff"] > 0 else np.nan
    return {**res, "p_perm_min": sign_flip_floor(res["n"]),
            "mde": mde, "diff_over_mde": res["diff"] / mde if np.isfinite(mde) else np.nan}  # mde > 0 or NaN


def one_sided_sign_flip(d: np.ndarray, exact_limit: int = 20, n_resamples: int = 100_000, seed: int = 0) -> tuple[float, bool, float]:
    """One-sided (H1: mean < 0) sign-flip permutation p of mean(d), counted as scipy's ``permutation_test``
    (``alternative="less"``): the share of sign patterns s ∈ {-1, +1}ⁿ whose mean of s·d is <= the observed
    one, null values within γ = 100·eps·|obs| counting as ties. Exact (all 2ⁿ patterns) for n <= exact_limit,
    else ``n_resamples`` seeded patterns plus the observed one. Returns (p, exact, the smallest p possible:
    1/2ⁿ exact, else 1/(n_resamples + 1))."""
    obs = float(np.mean(d))
    null, extra, exact = sign_flip_null(d, exact_limit, n_resamples, seed)
    floor = 1 / 2 ** len(d) if exact else 1 / (n_resamples + 1)
    gamma = abs(obs) * np.finfo(np.float64).eps * 100
    return float((np.count_nonzero(null <= obs + gamma) + extra) / (len(null) + extra)), exact, floor
