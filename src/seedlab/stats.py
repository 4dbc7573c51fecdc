"""Generic statistics for studies over many seeds: proportions, 2x2 tables, logistic
coefficients, paired per-seed comparisons.

Proportions (a 0/1 outcome per trained model, e.g. "generalized"):

- ``wilson``      -- Wilson score interval for a proportion k/n (statsmodels ``proportion_confint``).
- ``rate_table``  -- the rate of a 0/1 column per group, with n, k and the Wilson 95% interval.
- ``fisher``      -- Fisher exact test of k1/n1 against k2/n2 (scipy ``fisher_exact``), two-sided or one-sided.
- ``fisher_fragility`` -- how many single outcomes would have to change to reverse a two-sided Fisher
  verdict at level alpha: the fragility index (Walsh et al. 2014) of a significant test, the reverse
  fragility index (Khan et al. 2020) of a non-significant one; an exhaustive search over both groups and
  both directions.
- ``logit_coefficient`` -- one coefficient of a logistic regression of y on X: maximum likelihood
  with Wald inference when the MLE exists; under (quasi-)separation -- common in small sweeps
  (0% / 77% / 0%) -- Firth's bias-reduced logistic regression with profile penalized-likelihood
  inference instead.

Per-seed values of one measure:

- ``mean_ci``    -- their mean with the two-sided t interval of the mean (NaNs left out).

For paired per-seed values (model A and model B trained from the same seeds):

- ``paired``     -- mean difference with the paired t-test and its t interval (as scipy ``ttest_rel``)
  and a two-sided sign-flip permutation test (as scipy ``permutation_test``, exact for small n).
- ``mde_paired`` -- minimum detectable effect of the two-sided paired t-test with n pairs
  (statsmodels ``TTestPower``), as Cohen's d or in raw units.
- ``tost_paired`` -- paired equivalence test (Schuirmann's two one-sided t-tests, as statsmodels
  ``ttost_paired``) against bounds ``(low, high)`` on the mean difference, with the (1 - 2·alpha)
  t interval it is equivalent to. What "no effect" claims need: a non-significant difference is
  not evidence of a small one; an equivalence test against a stated margin is.
- ``sign_flip_floor`` -- the smallest p-value the sign-flip permutation test can give with n pairs.

Correlations along an axis, resampling and reliability (many small vectors at once, e.g. one per
seed, query and bootstrap resample):

- ``spearman_along`` -- Spearman's correlation of x and y along the last axis (broadcast), pairwise
  complete, in many bootstrap resamples at once (given as multiplicities: one sort, not one per resample).
- ``slope_along`` -- the OLS slope of y on x along the last axis, pairwise complete.
- ``bootstrap_interval`` -- the percentile interval of bootstrap samples (axis 0), NaNs left out.
- ``jackknife_se`` -- the jackknife standard error from leave-one-out estimates.
- ``spearman_brown`` -- the reliability of a mean of k parallel measurements whose pairwise
  correlation is r: k·r / (1 + (k − 1)·r).
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import optimize, stats
from scipy.special import expit
from statsmodels.stats.power import TTestPower
from statsmodels.stats.proportion import proportion_confint
from statsmodels.tools.sm_exceptions import (
    ConvergenceWarning,
    HessianInversionWarning,
    PerfectSeparationError,
    PerfectSeparationWarning,
)


def wilson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval (1 - alpha) for the proportion k/n; ``(nan, nan)`` when n == 0."""
    k, n = int(k), int(n)
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return (math.nan, math.nan)
    lo, hi = proportion_confint(k, n, alpha=alpha, method="wilson")
    return (float(np.clip(lo, 0.0, 1.0)), float(np.clip(hi, 0.0, 1.0)))


def rate_table(df: pd.DataFrame, by: list[str], outcome: str = "generalized") -> pd.DataFrame:
    """The rate of the 0/1 column ``outcome`` per group: columns ``*by, n, k, rate, lo, hi``, sorted by ``by``.

    ``k`` counts the rows where ``outcome`` is true, ``rate = k / n`` and ``lo, hi`` is the Wilson
    95% interval. An empty ``by`` gives one row for the whole frame.
    """
    by = list(by)
    g = df[outcome].astype(bool).astype(int)
    if by:
        t = g.groupby([df[c] for c in by], sort=True).agg(n="size", k="sum").reset_index()
    else:
        t = pd.DataFrame({"n": [len(g)], "k": [int(g.sum())]})
    t["n"] = t["n"].astype(int)
    t["k"] = t["k"].astype(int)
    t["rate"] = t["k"] / t["n"]
    ci = [wilson(k, n) for k, n in zip(t["k"], t["n"])]
    t["lo"] = [c[0] for c in ci]
    t["hi"] = [c[1] for c in ci]
    return t[[*by, "n", "k", "rate", "lo", "hi"]].sort_values(by, ignore_index=True) if by else t


def fisher(k1: int, n1: int, k2: int, n2: int, alternative: str = "two-sided") -> tuple[float, float]:
    """Fisher exact test on ``[[k1, n1-k1], [k2, n2-k2]]``: ``(sample odds ratio, p)``.

    ``alternative``: "two-sided" (default), "greater" (the rate k1/n1 is higher than k2/n2: the odds
    ratio > 1) or "less" (lower); the one-sided p is a hypergeometric tail, as scipy ``fisher_exact``."""
    res = stats.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]], alternative=alternative)
    return float(res.statistic), float(res.pvalue)


@functools.lru_cache(maxsize=65536)
def _fisher_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """The two-sided p of :func:`fisher` (cached: a fragility search revisits tables)."""
    return fisher(k1, n1, k2, n2)[1]


def l1_changes(d: int, lo: list[int], hi: list[int]):
    """The integer vectors v of net changes per group with sum |v_g| = d and lo[g] <= v[g] <= hi[g], in a fixed
    order (larger changes in earlier groups first, increases before decreases): the states one fragility search
    reaches with d single-outcome changes."""
    G = len(lo)

    def parts(g: int, left: int):
        if g == G - 1:
            yield (left,)
            return
        for a in range(left, -1, -1):
            for rest in parts(g + 1, left - a):
                yield (a, *rest)

    for mags in parts(0, d):
        for signs in itertools.product(*[(1, -1) if m else (0,) for m in mags]):
            v = tuple(s * m for s, m in zip(signs, mags, strict=True))
            if all(lo[g] <= v[g] <= hi[g] for g in range(G)):
                yield v


def fisher_fragility(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> dict:
    """How many members' outcomes would have to change to reverse the two-sided Fisher verdict on
    k1/n1 against k2/n2 at level ``alpha`` (significant: p < alpha).

    One change turns one member's outcome from 0 to 1 or from 1 to 0, in either group, so reaching the
    table (k1', k2') takes |k1' − k1| + |k2' − k2| changes (no fewer; changing one member back and
    forth is never shorter). The fragility is the fewest changes over *all* tables with
    0 <= k1' <= n1, 0 <= k2' <= n2 and the other verdict -- searched exhaustively by distance, every
    combination of changes in group 1 and group 2 in both directions:

    - significant (p < alpha): the fragility index of Walsh et al. (2014, J Clin Epidemiol 67:622),
      the fewest changes after which p >= alpha. Walsh's original index only adds events to the group
      with fewer of them, one at a time; this minimum over every direction and both groups is never
      larger.
    - not significant: the reverse fragility index (Khan et al. 2020, JAMA Netw Open 3:e2016520),
      the fewest changes after which p < alpha (in either direction of the difference).

    Returns ``p`` (two-sided), ``significant``, ``fragility`` (an int >= 1, or None when no table of
    these sizes has the other verdict, e.g. 1/1 against 0/1 can never be significant), ``table``
    ((k1', k2'), one table at that distance -- the first in the order: larger change in group 1 first,
    increases before decreases) and ``p_after`` (its p), both None with ``fragility``.
    """
    k1, n1, k2, n2 = int(k1), int(n1), int(k2), int(n2)
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2) or n1 == 0 or n2 == 0:
        raise ValueError(f"fisher_fragility: need 0 <= k <= n and n > 0 in both groups, got {k1}/{n1} and {k2}/{n2}")
    p = _fisher_p(k1, n1, k2, n2)
    significant = p < alpha
    for d in range(1, n1 + n2 + 1):
        for d1, d2 in l1_changes(d, [-k1, -k2], [n1 - k1, n2 - k2]):
            a, b = k1 + d1, k2 + d2
            if (_fisher_p(a, n1, b, n2) < alpha) != significant:
                return {"p": p, "significant": significant, "fragility": d, "table": (a, b),
                        "p_after": _fisher_p(a, n1, b, n2)}
    return {"p": p, "significant": significant, "fragility": None, "table": None, "p_after": None}


# ---------------------------------------------------------------- logistic regression: MLE, or Firth under separation


def separated(X: np.ndarray, y: np.ndarray) -> bool:
    """True when the data are completely or quasi-completely separated (the MLE does not exist).

    Linear program (Konis 2007): look for a direction b != 0 with s_i x_i'b >= 0 for every row
    (s = +1 for y = 1, -1 for y = 0). With X of full rank such a b exists iff the MLE is infinite.
    """
    A = X * np.where(y > 0, 1.0, -1.0)[:, None]
    scale = np.abs(A).max()
    res = optimize.linprog(-A.sum(0) / scale, A_ub=-A / scale, b_ub=np.zeros(len(A)), bounds=[(-1, 1)] * X.shape[1])
    return bool(res.status == 0 and -res.fun > 1e-7 * len(A))


def _firth_parts(X, y, beta):
    """Penalized log-likelihood, modified score and Fisher information at ``beta``."""
    eta = X @ beta
    p = expit(eta)
    w = p * (1 - p)
    info = X.T @ (X * w[:, None])
    sign, logdet = np.linalg.slogdet(info)
    loglik = float(np.sum(y * eta - np.logaddexp(0, eta)))
    if sign <= 0:
        return -np.inf, np.full(len(beta), np.nan), info
    h = w * np.einsum("ij,jk,ik->i", X, np.linalg.inv(info), X)  # diag of the weighted hat matrix
    score = X.T @ (y - p + h * (0.5 - p))  # gradient of the penalized log-likelihood
    return loglik + 0.5 * logdet, score, info


def _firth_fit(X, y, fix: tuple[int, float] | None = None, tol=1e-9, max_iter=200, start=None):
    """Maximize l(b) + 1/2 log|I(b)| (Firth 1993), optionally with coefficient ``fix[0]`` held at ``fix[1]``.

    Newton steps on the modified score with step halving, from ``start`` (default 0; a profile
    starts from the unconstrained estimate, where the information is well conditioned).
    Returns ``(beta, penalized loglik)``.
    """
    k = X.shape[1]
    free = np.ones(k, bool)
    beta = np.zeros(k) if start is None else np.array(start, dtype=float)
    if fix is not None:
        free[fix[0]] = False
        beta[fix[0]] = fix[1]
    pll, score, info = _firth_parts(X, y, beta)
    for _ in range(max_iter):
        step = np.zeros(k)
        # least squares: far out on a profile (a fixed coefficient of +-20) the information is
        # numerically singular, and a pseudo-inverse step still climbs
        step[free] = np.linalg.lstsq(info[np.ix_(free, free)], score[free], rcond=None)[0]
        for _ in range(40):
            new = _firth_parts(X, y, beta + step)
            if new[0] >= pll - 1e-12:
                break
            step /= 2
        beta = beta + step
        pll, score, info = new
        if np.max(np.abs(score[free])) < 1e-8 or np.max(np.abs(step)) < tol:
            break
    return beta, pll


def _firth_inference(X, y, j, alpha=0.05, interval=True):
    """Firth estimate of coefficient ``j`` with penalized likelihood-ratio p-value and profile CI
    (``interval`` False: no CI, NaN bounds; the profile is most of the time)."""
    beta, pll = _firth_fit(X, y)
    est = float(beta[j])
    se = float(np.sqrt(np.linalg.inv(_firth_parts(X, y, beta)[2])[j, j]))

    def lr(b):  # penalized likelihood-ratio statistic for coefficient j == b
        return 2 * (pll - _firth_fit(X, y, fix=(j, b), start=beta)[1])

    p = float(stats.chi2.sf(max(lr(0.0), 0.0), 1))
    if not interval:
        return est, math.nan, math.nan, p
    crit = stats.chi2.ppf(1 - alpha, 1)

    def bound(direction):
        step, b = max(se, 1e-3), est
        for _ in range(60):  # walk out until the profile drops below the cut-off, then bracket
            nb = b + direction * step
            if lr(nb) > crit:  # bisect: inside (b) at or below the cut-off, outside (nb) above it
                inside, outside = b, nb
                for _ in range(60):
                    mid = (inside + outside) / 2
                    inside, outside = (inside, mid) if lr(mid) > crit else (mid, outside)
                    if abs(outside - inside) < 1e-6 * max(1.0, abs(mid)):
                        break
                return float((inside + outside) / 2)
            b, step = nb, step * 1.5
        return direction * math.inf

    return est, bound(-1), bound(+1), p


def logit_coefficient(X: np.ndarray, y: np.ndarray, j: int, interval: bool = True) -> dict:
    """Coefficient ``j`` of the logistic regression of the 0/1 outcome ``y`` on the design ``X``.

    Returns ``estimate, ci_low, ci_high`` (95%), ``p`` (two-sided), ``method`` and ``separated``.
    When the maximum-likelihood estimate exists it is used with Wald z inference
    (``method="mle-wald"``). When the data are (quasi-)separated -- detected by a linear program,
    or by statsmodels reporting perfect separation / non-convergence / non-finite standard
    errors -- ``separated`` is True and Firth's bias-reduced logistic regression is used instead,
    with a penalized likelihood-ratio p-value and a profile penalized-likelihood 95% interval
    (``method="firth-profile-lr"``, as in R's logistf). ``X`` must have full column rank and
    ``y`` must vary (the caller checks both, with its own words for what is missing). ``interval``
    False skips the 95% interval (``ci_low, ci_high`` NaN; the estimate and p are the same): for
    searches that need only p, e.g. how many outcomes must change to move it across a level.
    """
    sep = separated(X, y)
    if not sep:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PerfectSeparationWarning)
            warnings.simplefilter("ignore", (ConvergenceWarning, HessianInversionWarning, RuntimeWarning))
            try:
                fit = sm.Logit(y, X).fit(disp=0, maxiter=100)
                ok = bool(fit.mle_retvals.get("converged", True)) and np.all(np.isfinite(fit.bse))
            except (PerfectSeparationError, PerfectSeparationWarning, np.linalg.LinAlgError):
                ok = False
        sep = not ok
    if sep:
        est, lo, hi, p = _firth_inference(X, y, j, interval=interval)
        method = "firth-profile-lr"
    else:
        lo, hi = fit.conf_int(0.05)[j] if interval else (math.nan, math.nan)
        est, p, method = fit.params[j], fit.pvalues[j], "mle-wald"
    return {"estimate": float(est), "ci_low": float(lo), "ci_high": float(hi), "p": float(p), "method": method,
            "separated": bool(sep)}


# ---------------------------------------------------------------- per-seed values


def mean_ci(values, alpha: float = 0.05) -> tuple[float, float, float, int]:
    """``(mean, low, high, n)`` of the non-NaN ``values``: their mean and its two-sided (1 - alpha)
    t interval, ``mean ± t_{1-alpha/2, n-1} · sd / √n`` (sd with ddof=1). One value: no interval
    (low, high NaN); none: all NaN and n = 0."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    n = len(v)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    m = float(v.mean())
    if n == 1:
        return m, math.nan, math.nan, 1
    half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * float(v.std(ddof=1)) / math.sqrt(n)
    return m, m - half, m + half, n


# ---------------------------------------------------------------- paired per-seed comparisons


def sign_flip_null(d: np.ndarray, exact_limit: int, n_resamples: int, seed: int) -> tuple[np.ndarray, int, bool]:
    """The sign-flip null distribution of mean(d): the means of s·d over all 2ⁿ sign patterns when
    n <= ``exact_limit`` (exact), else over ``n_resamples`` seeded random ones. Returns (null means,
    ``extra`` = 1 when Monte Carlo (the observed pattern is added to numerator and denominator), exact)."""
    n = len(d)
    if n <= exact_limit:
        sums = np.zeros(1)
        for v in d:  # all 2^n signed sums, doubling once per observation
            sums = np.concatenate([sums + v, sums - v])
        return sums / n, 0, True
    signs = np.random.default_rng(seed).integers(0, 2, size=(n_resamples, n), dtype=np.int8) * 2 - 1
    return signs @ d / n, 1, False


def _sign_flip_p(d: np.ndarray, exact_limit: int, n_resamples: int, seed: int) -> tuple[float, bool]:
    """Two-sided sign-flip permutation p-value of mean(d), counted as scipy's ``permutation_test``.

    Null: the mean of ``s·d`` over sign patterns s ∈ {-1, +1}ⁿ. scipy takes
    ``p = min(2·min(P(null <= obs + γ), P(null >= obs - γ)), 1)`` with ``γ = 100·eps·|obs|``
    (null values within γ of obs count as ties, i.e. as extreme). Exact enumeration divides by 2ⁿ;
    Monte Carlo adds the observed pattern: ``(count + 1) / (n_resamples + 1)`` per side."""
    obs = float(np.mean(d))
    null, extra, exact = sign_flip_null(d, exact_limit, n_resamples, seed)
    gamma = abs(obs) * np.finfo(np.float64).eps * 100
    lo = (np.count_nonzero(null <= obs + gamma) + extra) / (len(null) + extra)
    hi = (np.count_nonzero(null >= obs - gamma) + extra) / (len(null) + extra)
    return float(min(2 * min(lo, hi), 1.0)), exact


def paired(a, b, *, alpha: float = 0.05, exact_limit: int = 20, n_resamples: int = 100_000, seed: int = 0) -> dict:
    """Paired comparison of per-seed values ``a[i]`` vs ``b[i]`` through their differences d = a - b.

    Pairs with a NaN on either side are dropped (``n_dropped``); n >= 2 pairs must remain. Returns
    ``n, n_dropped, mean_a, mean_b, diff`` (mean of d), ``sd_diff`` (sample sd, ddof=1), ``t, df, p_t``
    (two-sided paired t-test, as scipy ``ttest_rel``), ``ci_low, ci_high`` (t interval of the mean
    difference at level 1 - alpha), ``p_perm`` (two-sided sign-flip permutation test of mean(d):
    all 2ⁿ sign patterns when n <= exact_limit, else ``n_resamples`` seeded random ones) and
    ``perm_exact``. When all differences are equal the t-test is undefined: t and p_t are nan
    (scipy gives inf and 0 for a nonzero constant) and the interval collapses to the difference.
    """
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired: a and b need the same length, got {len(a)} and {len(b)}")
    keep = ~(np.isnan(a) | np.isnan(b))
    a, b = a[keep], b[keep]
    n = len(a)
    if n < 2:
        raise ValueError(f"paired: need at least 2 pairs without NaN, got {n}")
    d = a - b
    diff, sd, df = float(np.mean(d)), float(np.std(d, ddof=1)), n - 1
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf(1 - alpha / 2, df)) * se  # half-width of the t interval
    if np.all(d == d[0]):
        t = p_t = math.nan
    else:
        t = diff / se
        p_t = float(2 * stats.t.sf(abs(t), df))
    p_perm, exact = _sign_flip_p(d, exact_limit, n_resamples, seed)
    return {"n": n, "n_dropped": int((~keep).sum()), "mean_a": float(np.mean(a)), "mean_b": float(np.mean(b)),
            "diff": diff, "sd_diff": sd, "t": t, "df": df, "p_t": p_t, "ci_low": diff - half, "ci_high": diff + half,
            "p_perm": p_perm, "perm_exact": exact}


def mde_paired(n: int, sd_diff: float | None = None, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest mean difference a two-sided paired t-test with n pairs detects with the given power.

    Cohen's d (mean difference / sd of differences) from statsmodels ``TTestPower().solve_power``;
    times ``sd_diff`` when given, i.e. in the units of the compared values."""
    if n < 2:
        raise ValueError(f"mde_paired: need n >= 2 pairs, got {n}")
    d = float(np.squeeze(TTestPower().solve_power(nobs=n, alpha=alpha, power=power, alternative="two-sided")))
    return d * sd_diff if sd_diff is not None else d


def tost_paired(a, b, margin: float | tuple[float, float], *, alpha: float = 0.05) -> dict:
    """Paired equivalence test of d = a - b: two one-sided t-tests (TOST, Schuirmann 1987).

    ``margin``: a positive number m for the bounds (-m, +m), or the bounds ``(low, high)`` with
    low < high. Null: the mean difference lies outside, mu <= low or mu >= high; alternative:
    low < mu < high. Pairs with a NaN on either side are dropped (``n_dropped``); n >= 2 pairs must
    remain. Returns ``n, n_dropped, diff`` (mean of d), ``sd_diff, df, low, high``, ``t_low, p_low``
    (H0: mu <= low, one-sided), ``t_high, p_high`` (H0: mu >= high), ``p`` = max(p_low, p_high)
    (as statsmodels ``ttost_paired``), ``ci_low, ci_high`` (the t interval at level 1 - 2·alpha, 90%
    for alpha = 0.05) and ``equivalent``: ``p < alpha``, the same as the interval lying inside
    (low, high). When all differences are equal the t statistics are undefined: t and p are nan and
    ``equivalent`` says whether that one difference lies inside the bounds."""
    low, high = (-float(margin), float(margin)) if np.isscalar(margin) else map(float, margin)
    if not low < high:
        raise ValueError(f"tost_paired: need bounds low < high (a positive margin), got ({low}, {high})")
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"tost_paired: a and b need the same length, got {len(a)} and {len(b)}")
    keep = ~(np.isnan(a) | np.isnan(b))
    d = a[keep] - b[keep]
    n = len(d)
    if n < 2:
        raise ValueError(f"tost_paired: need at least 2 pairs without NaN, got {n}")
    diff, sd, df = float(np.mean(d)), float(np.std(d, ddof=1)), n - 1
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf(1 - alpha, df)) * se  # half-width of the (1 - 2 alpha) interval
    if np.all(d == d[0]):
        t_low = t_high = p_low = p_high = p = math.nan
        equivalent = bool(low < diff < high)
    else:
        t_low, t_high = (diff - low) / se, (diff - high) / se
        p_low, p_high = float(stats.t.sf(t_low, df)), float(stats.t.cdf(t_high, df))
        p = max(p_low, p_high)
        equivalent = bool(p < alpha)
    return {"n": n, "n_dropped": int((~keep).sum()), "diff": diff, "sd_diff": sd, "df": df, "low": low, "high": high,
            "t_low": t_low, "p_low": p_low, "t_high": t_high, "p_high": p_high, "p": p,
            "ci_low": diff - half, "ci_high": diff + half, "equivalent": equivalent}


def sign_flip_floor(n: int, *, exact_limit: int = 20, n_resamples: int = 100_000) -> float:
    """The smallest two-sided p-value ``paired``'s sign-flip test can return with n pairs:
    2 / 2ⁿ when exact (only the observed sign pattern and its mirror are as extreme; 0.0078 for
    n = 8), else 2 / (n_resamples + 1). A smaller reported p must come from another test."""
    return 2 / 2**n if n <= exact_limit else 2 / (n_resamples + 1)


# ---------------------------------------------------------------- correlations along an axis, resampling, reliability


def _complete(x, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y broadcast to one shape (float64), NaN wherever either is NaN; and the complete pairs counted (last axis)."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    bad = np.isnan(x) | np.isnan(y)
    return np.where(bad, np.nan, x), np.where(bad, np.nan, y), np.count_nonzero(~bad, axis=-1)


def _centered(v: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: their result is NaN anyway
        return v - np.nanmean(v, axis=-1, keepdims=True)


def _constant(v: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(v, axis=-1) == np.nanmin(v, axis=-1)


def _gather(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``a[k, ..., idx[..., i]]`` for every k: ``a`` [b, ..., C] broadcast against ``idx`` [..., C]
    in the middle axes (one flat fancy index: np.take_along_axis is several times slower here)."""
    b, c = a.shape[0], idx.shape[-1]
    if all(d == 1 for d in a.shape[1:-1]):
        return a.reshape(b, c)[:, idx]
    flat = idx.reshape(-1, c) + c * np.arange(idx.size // c)[:, None]
    return np.broadcast_to(a, (b, *idx.shape)).reshape(b, -1)[:, flat].reshape(b, *idx.shape)


def _weighted_ranks(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Average ranks (1-based, ties averaged) of the positions of ``v`` [..., C] in the sample that
    holds position i ``w[k, ..., i]`` times, for every k (``w`` [b, ..., C], broadcast against v; a
    position of weight 0 is not in the sample and its rank means nothing). One sort of v serves every k."""
    order = np.argsort(v, axis=-1)  # NaN last (weight 0)
    sv = np.take_along_axis(v, order, axis=-1)
    ws = _gather(w, order)
    cum = np.cumsum(ws, axis=-1)
    first = np.ones(v.shape, dtype=bool)
    first[..., 1:] = sv[..., 1:] != sv[..., :-1]
    if first.all():  # no ties in v: the rank of position p is the weight below it plus its own mid-point
        rank = cum - (ws - 1) / 2
    else:  # the weight below a tie group (cumulative, so the running max over group starts) and up to its end
        last = np.ones(v.shape, dtype=bool)
        last[..., :-1] = first[..., 1:]
        below = np.maximum.accumulate(np.where(first, cum - ws, -np.inf), axis=-1)
        upto = np.flip(np.minimum.accumulate(np.flip(np.where(last, cum, np.inf), -1), axis=-1), -1)
        rank = below + (upto - below + 1) / 2
    inverse = np.empty_like(order)
    np.put_along_axis(inverse, order, np.arange(v.shape[-1]), axis=-1)
    return _gather(rank, inverse)


def spearman_along(x, y, counts=None, min_n: int = 3) -> np.ndarray:
    """Spearman's correlation of ``x`` and ``y`` along the last axis (the two broadcast against each
    other; C positions), over the pairs where both are present, in every bootstrap resample at once.

    ``counts`` [b, C]: resample k holds position i ``counts[k, i]`` times (the multiplicities of its
    draws); the result [b, *shape without the last axis] is exactly ``scipy.stats.spearmanr`` of each
    expanded resample (ties averaged), but x and y are sorted once, not once per resample. ``counts``
    None: the sample as it is (no leading axis). NaN where fewer than ``min_n`` pairs (duplicates
    counted) remain or either side is constant on them."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    single = counts is None
    counts = np.ones((1, x.shape[-1])) if single else np.asarray(counts, dtype=np.float64)
    ok = ~(np.isnan(x) | np.isnan(y))
    if ok.all():  # nothing to leave out: each side ranked at its own shape
        rx, ry = (_weighted_ranks(v, counts.reshape(len(counts), *(1,) * (v.ndim - 1), -1)) for v in (x, y))
        w = counts.reshape(len(counts), *(1,) * (ok.ndim - 1), -1)
    else:  # pairwise complete: a left-out pair weighs 0 on both sides
        w = counts.reshape(len(counts), *(1,) * (ok.ndim - 1), -1) * ok
        rx, ry = (_weighted_ranks(np.broadcast_to(v, ok.shape), w) for v in (x, y))
    n = w.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx = rx - (w * rx).sum(axis=-1, keepdims=True) / n[..., None]
        dy = ry - (w * ry).sum(axis=-1, keepdims=True) / n[..., None]
        sxx, syy = (w * dx * dx).sum(axis=-1), (w * dy * dy).sum(axis=-1)
        r = (w * dx * dy).sum(axis=-1) / np.sqrt(sxx * syy)
    flat = (sxx <= 1e-9 * n) | (syy <= 1e-9 * n)  # one tie group: every rank the mean (round-off aside)
    r = np.where((n >= min_n) & ~flat, np.clip(r, -1.0, 1.0), np.nan)
    return r[0] if single else r


def slope_along(x, y, min_n: int = 3) -> np.ndarray:
    """The ordinary-least-squares slope of ``y`` on ``x`` (with an intercept) along the last axis,
    over the complete pairs: cov(x, y) / var(x). NaN where fewer than ``min_n`` pairs remain or x is constant."""
    x, y, n = _complete(x, y)
    xc, yc = _centered(x), _centered(y)
    with np.errstate(invalid="ignore", divide="ignore"):
        b = np.nansum(xc * yc, axis=-1) / np.nansum(xc * xc, axis=-1)
    return np.where((n >= min_n) & ~_constant(x), b, np.nan)


def bootstrap_interval(samples, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """The two-sided (1 - alpha) percentile interval of bootstrap ``samples`` along axis 0 (one
    resample a row), NaN samples left out: ``(low, high)``, NaN where every sample is NaN."""
    v = np.asarray(samples, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(v, [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
    return lo, hi


def jackknife_se(loo) -> float:
    """The jackknife standard error from the n leave-one-out estimates θ₍ᵢ₎ (NaNs left out):
    √((n − 1)/n · Σ (θ₍ᵢ₎ − θ̄)²); NaN with fewer than 2. For a mean it is the usual sd/√n."""
    v = np.asarray(loo, dtype=np.float64)
    v = v[~np.isnan(v)]
    n = len(v)
    return float(math.sqrt((n - 1) / n * np.sum((v - v.mean()) ** 2))) if n >= 2 else math.nan


def spearman_brown(r, k):
    """Spearman–Brown: the reliability of the mean of ``k`` parallel measurements whose mean
    pairwise correlation is ``r``, k·r / (1 + (k − 1)·r) (r itself for k = 1). NaN where the
    denominator is not positive (r <= −1/(k − 1): no parallel measurements correlate so)."""
    r, k = np.asarray(r, dtype=np.float64), np.asarray(k, dtype=np.float64)
    den = 1 + (k - 1) * r
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, k * r / den, np.nan)
    return float(out) if out.ndim == 0 else out
