"""The decisions of docs/preregistration/attribution-regime.md on the banks of one design (presets attribution/loo-b32
and loo-b128) at B = 8 and B = 128, trained on fresh seeds, attributed and scored (confirmatory).

Four tests, one family, Holm at 0.05 (each p one-sided, from the bootstrap resamples: (1 + #{d* <= margin}) /
(1 + the finite resamples)); every statistic at the end (the last horizon), the single-model LDS at alpha = 5 %:

| id | d (the statistic) | margin | resamples |
|---|---|---|---|
| R1 | metagrad's LDS at B 128 - at B 8 (all query kinds) | 0 | each bank's own (lds.py), B 8 seed 0, B 128 seed 1 |
| R2 | metagrad-trunc's LDS - metagrad's at B 8 (all query kinds) | 0 | paired: the same resamples (lds.py) |
| R3 | unroll's within-seed rho - the largest of the estimators at theta_s (sgd, adam, tracin, cosine, adam-cosine), B 128, held-out queries, the max taken in each resample | 0.3 | stats.py within_joint, seed 0 |
| R4 | the single-model LDS's retest at B 128 - at B 8 (all query kinds; lds.py single_ceiling's) | 0 | as R1 |

    python experiments/attribution_regime_prereg.py --b8 runs/regime-b8 --b128 runs/regime-b128 [--out FILE.md]

:func:`decide` computes from the frames (tested in tests/attribution/test_regime_prereg.py); :func:`main` reads the
banks and prints the table.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

FAMILY = 0.05  # Holm's family-wise error rate
RESAMPLES = 2000
LDS_ALPHA = 0.05  # the single-model LDS's fraction of the rows after s removed
KIND = "all"  # every query kind pooled (8 held-out rows and 8 probes)
THETA_S = ("sgd", "adam", "tracin", "cosine", "adam-cosine")  # the estimators at θ_s of the grid's finding
MARGIN = 0.3  # R3: "stays below unroll" by more than this
TRUNCATED = "metagrad-trunc"
COLUMNS = ["id", "statistic", "value", "p", "holm_p", "margin", "confirmed"]


@dataclass
class Bank:
    """What the decisions read of one bank: groups.parquet, group_rows.parquet, the row scores (rowscores.py
    ``read_scores``), retest.parquet and attribution.parquet (None where absent)."""

    groups: pd.DataFrame | None
    group_rows: pd.DataFrame | None
    scores: pd.DataFrame | None
    retest: pd.DataFrame | None
    attribution: pd.DataFrame | None


def p_value(draws: np.ndarray, margin: float = 0.0) -> float:
    """One-sided bootstrap p of d > margin: (1 + #{d* <= margin}) / (1 + n), n the finite resamples; NaN if none."""
    d = np.asarray(draws, dtype=np.float64)
    d = d[np.isfinite(d)]
    return math.nan if not len(d) else float((1 + (d <= margin).sum()) / (1 + len(d)))


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted in the family's size: an undecided test
    takes no share of α from the others — the pre-registration says so)."""
    p = np.asarray(p, dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(p))
    out = np.full(len(p), np.nan)
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        out[i] = running
    return out.tolist()


def _end_cell(cells: list[tuple[dict, np.ndarray, np.ndarray]]) -> tuple[float, np.ndarray] | None:
    """The (point, draws) of the cell at α = 5 %, every kind pooled, the last horizon (None: not there)."""
    at = [c for c in cells if math.isclose(c[0]["alpha"], LDS_ALPHA) and c[0]["query_kind"] == KIND]
    if not at:
        return None
    end = max(c[0]["horizon"] for c in at)
    keys, per_seed, draws = next(c for c in at if c[0]["horizon"] == end)
    return float(np.nanmean(per_seed)), draws


def lds_draws(b: Bank, estimator: str, seed: int) -> tuple[float, np.ndarray] | None:
    """``estimator``'s single-model LDS at the end (point, its joint resamples with generator ``seed``)."""
    from seedlab.attribution.analyses import lds

    if b.groups is None or b.group_rows is None or b.scores is None or estimator not in set(b.scores.estimator):
        return None
    predicted = lds.predictions(b.group_rows, b.scores[b.scores.estimator == estimator])
    return _end_cell(lds.resampled(b.groups, predicted, resamples=RESAMPLES, seed=seed))


def retest_draws(b: Bank, seed: int) -> tuple[float, np.ndarray] | None:
    """The single-model LDS's retest (lds.py ``single_ceiling``'s statistic) at the end, with its resamples."""
    from seedlab.attribution.analyses import lds
    from seedlab.attribution.analyses.loo import RETEST

    g = None if b.retest is None else b.retest[b.retest.removal == "group"]
    if g is None or not len(g):
        return None
    measured = g[["seed", "alpha", "subset", "query", "query_kind", "horizon", "label", "measured"]]
    predicted = pd.DataFrame({"estimator": RETEST, "unit": "nats/token", "seed": g.seed, "alpha": g.alpha,
                              "subset": g.subset, "query": g["query"], "horizon": g.horizon, "predicted": g.retest,
                              "coverage": 1.0})
    return _end_cell(lds.resampled(measured, predicted, resamples=RESAMPLES, seed=seed))


def theta_s_gap(b: Bank, seed: int = 0) -> tuple[float, np.ndarray] | None:
    """R3's d: unroll's within-seed ρ minus the largest of :data:`THETA_S`' at the end, held-out queries (point, and
    per resample of stats.py ``within_joint`` with the max taken inside each)."""
    from seedlab.attribution.analyses import stats

    if b.attribution is None:
        return None
    names = ["unroll", *THETA_S]
    if not set(names) <= set(b.attribution.estimator):
        return None
    a = stats.Arrays.of(b.attribution[b.attribution.estimator.isin(names)]).only(names)
    if "heldout" not in set(a.kinds):
        return None
    h = len(a.horizons) - 1  # the end
    point = stats.within_rho(a)["heldout"][h]  # [E]
    draws = stats.within_joint(a, RESAMPLES, seed)["heldout"][:, h]  # [resamples, E]
    return float(point[0] - np.nanmax(point[1:])), draws[:, 0] - np.nanmax(draws[:, 1:], axis=1)


def decide(b8: Bank, b128: Bank) -> pd.DataFrame:
    """:data:`COLUMNS`, one row per test (module doc); ``confirmed`` None where its statistic cannot be computed."""
    rows = []

    def diff(one, two):  # independent banks: the k-th resample of each
        if one is None or two is None:
            return None
        n = min(len(one[1]), len(two[1]))
        return one[0] - two[0], one[1][:n] - two[1][:n]

    r1 = diff(lds_draws(b128, "metagrad", 1), lds_draws(b8, "metagrad", 0))
    rows.append(("R1", "metagrad's LDS (α 5 %, end, all kinds): B 128 − B 8", r1, 0.0))
    t, f = lds_draws(b8, TRUNCATED, 0), lds_draws(b8, "metagrad", 0)
    r2 = None if t is None or f is None else (t[0] - f[0], t[1] - f[1])
    rows.append(("R2", f"{TRUNCATED}'s LDS − metagrad's at B 8 (α 5 %, end, all kinds; paired)", r2, 0.0))
    rows.append(("R3", "unroll's ρ − the best of the estimators at θ_s at B 128 (held-out rows, end)",
                 theta_s_gap(b128), MARGIN))
    r4 = diff(retest_draws(b128, 1), retest_draws(b8, 0))
    rows.append(("R4", "the single-model LDS's retest on the nudged twin (α 5 %, end, all kinds): B 128 − B 8", r4, 0.0))
    p = [math.nan if r is None else p_value(r[1], m) for _, _, r, m in rows]
    adjusted = holm(p)
    out = []
    for (i, what, r, m), pv, hp in zip(rows, p, adjusted):
        out.append([i, what, math.nan if r is None else r[0], pv, hp, m,
                    None if math.isnan(hp) else bool(hp < FAMILY)])
    return pd.DataFrame(out, columns=COLUMNS)


def render(d: pd.DataFrame) -> str:
    from seedlab.reporting import fmt_num, md_table

    rows = [[r.id, r.statistic, fmt_num(r.value), f"> {r.margin:g}", fmt_num(r.p), fmt_num(r.holm_p),
             {True: "**confirmed**", False: "**not confirmed**", None: "undecided"}[r.confirmed]]
            for r in d.itertuples()]
    return md_table(["id", "d", "value", "confirmed when d", "p (one-sided)", "Holm p", "verdict"], rows)


def read(root: Path) -> Bank:
    from seedlab.attribution.bank.rundir import BankDir
    from seedlab.attribution.estimators.rowscores import read_scores

    d = BankDir(root)
    get = lambda p: pd.read_parquet(p) if Path(p).is_file() else None
    return Bank(get(d.groups), get(d.group_rows), read_scores(root), get(d.retest), get(d.attribution))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--b8", type=Path, required=True)
    p.add_argument("--b128", type=Path, required=True)
    p.add_argument("--out", type=Path, help="also write the table (markdown)")
    a = p.parse_args(argv)
    from seedlab.errors import SeedlabError

    missing = [str(x) for x in (a.b8, a.b128) if not (x / "config.json").is_file()]
    if missing:
        print(f"not a bank folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        out = render(decide(read(a.b8), read(a.b128)))
    except SeedlabError as err:
        print(err, file=sys.stderr)
        return 2
    print(out)
    if a.out:
        a.out.write_text(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
