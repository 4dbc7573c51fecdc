"""The verdicts of docs/preregistration/attribution-rows.md on a finished bank with leave-one-out and group arms,
scored by metagrad and rowscores (issue 33 §2-§3, confirmatory on training seeds 8-11).

Five decisions, fixed before the bank was trained, each read on a 99% interval (Bonferroni: 0.05 / 5):

| id | statistic (all query kinds pooled, loo.py / lds.py as committed) | confirmed when |
|---|---|---|
| D1 | metagrad's rho_within, rows of step s read at s+1 (age 1) | the interval's lower end > 0.5 |
| D2 | metagrad's rho_within, rows of step s read at the end (age 100) | the interval lies inside (-0.5, 0.5) |
| D3 | per seed: median abs metagrad value at s+1 of rows aged (20, 50] / of rows aged (5, 10] | > 10 in every seed |
| D4 | ekfac's LDS at alpha = 5 % at the end | the interval's lower end > 0 |
| D5 | every row estimator's LDS at alpha = 5 % at the end | every interval's upper end < 0.3 |

    python experiments/attribution_rows_prereg.py runs/attribution-rows-confirm [--out FILE.md]

:func:`decide` computes (tested in tests/attribution/test_rows_prereg.py); :func:`main` prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

DECISIONS = 5
ALPHA = 0.05 / DECISIONS  # each decision on a 99% interval
RESAMPLES = 2000
ESTIMATORS = ("metagrad", "ekfac", "trak", "tracin", "grad-dot", "grad-cosine")
YOUNG = (5, 10)  # D3's ages (lo, hi]
OLD = (20, 50)
COLUMNS = ["id", "statistic", "value", "low", "high", "confirmed_when", "confirmed"]


def _row(age: pd.DataFrame, step: int, horizon: int) -> pd.Series | None:
    r = age[(age.estimator == "metagrad") & (age.query_kind == "all") & (age.step == step) & (age.horizon == horizon)]
    return r.iloc[0] if len(r) else None


def growth(metagrad: pd.DataFrame, horizon: int) -> pd.Series:
    """D3's statistic per seed: the median |value| at ``horizon`` of rows aged (20, 50] over that of rows aged
    (5, 10] (metagrad.parquet's frame)."""
    m = metagrad[metagrad.horizon == horizon]
    age = m.horizon - m.step
    old = m[(age > OLD[0]) & (age <= OLD[1])].groupby("seed").value.apply(lambda v: np.median(np.abs(v)))
    young = m[(age > YOUNG[0]) & (age <= YOUNG[1])].groupby("seed").value.apply(lambda v: np.median(np.abs(v)))
    return (old / young).dropna()


AGES = (0, 1, 5, 10, 20, 50, 100, 200)  # the bins of :func:`magnitudes`


def magnitudes(metagrad: pd.DataFrame, horizon: int) -> pd.Series:
    """Reported beside the decisions (no decision): the median |metagrad value| at ``horizon`` over every seed, row
    and query, per age bin (lo, hi] of :data:`AGES` — the growth D3 decides, at every age."""
    m = metagrad[metagrad.horizon == horizon]
    bins = pd.cut(m.horizon - m.step, list(AGES))
    return m.value.abs().groupby(bins, observed=True).median()


def decide(age: pd.DataFrame, table: pd.DataFrame, metagrad: pd.DataFrame, s: int, end: int) -> pd.DataFrame:
    """:data:`COLUMNS`, one row per decision. ``age``: loo.py ``by_age`` at :data:`ALPHA`; ``table``: lds.py ``lds``
    at :data:`ALPHA`; ``metagrad``: metagrad.parquet; ``s``, ``end``: the bank's injection step and last update.
    ``confirmed`` None where the statistic is missing."""
    out = []
    r = _row(age, s, s + 1)
    out.append(["D1", "metagrad rho_within, age 1 (t = s, h = s+1)", *(
        (r.rho_within, r.rho_within_low, r.rho_within_high) if r is not None else (math.nan,) * 3),
        "lower > 0.5", None if r is None else bool(r.rho_within_low > 0.5)])
    r = _row(age, s, end)
    out.append(["D2", f"metagrad rho_within, age {end - s} (t = s, h = end)", *(
        (r.rho_within, r.rho_within_low, r.rho_within_high) if r is not None else (math.nan,) * 3),
        "inside (-0.5, 0.5)", None if r is None else bool(-0.5 < r.rho_within_low and r.rho_within_high < 0.5)])
    g = growth(metagrad, s + 1)
    out.append(["D3", f"median |metagrad| at s+1, ages {OLD} / ages {YOUNG}, min over {len(g)} seeds",
                float(g.min()) if len(g) else math.nan, math.nan, math.nan, "> 10 in every seed",
                None if not len(g) else bool((g > 10).all())])
    e = table[(table.alpha == 0.05) & (table.query_kind == "all") & (table.horizon == end)].set_index("estimator")
    r = e.loc["ekfac"] if "ekfac" in e.index else None
    out.append(["D4", "ekfac LDS, alpha = 5 %, end", *((r.lds, r.low, r.high) if r is not None else (math.nan,) * 3),
                "lower > 0", None if r is None else bool(r.low > 0)])
    have = [n for n in ESTIMATORS if n in e.index]
    worst = e.loc[have].high.idxmax() if have else None
    out.append(["D5", f"the largest upper end of {len(have)} estimators' LDS, alpha = 5 %, end ({worst})",
                *((e.loc[worst].lds, e.loc[worst].low, e.loc[worst].high) if worst else (math.nan,) * 3),
                "every upper < 0.3", None if len(have) < len(ESTIMATORS) else bool((e.loc[have].high < 0.3).all())])
    return pd.DataFrame(out, columns=COLUMNS)


def render(d: pd.DataFrame) -> str:
    from seedlab.reporting import fmt_num, md_table

    rows = [[r.id, r.statistic, fmt_num(r.value) + ("" if math.isnan(r.low) else f" [{fmt_num(r.low)}, "
                                                     f"{fmt_num(r.high)}]"), r.confirmed_when,
             {True: "**confirmed**", False: "**not confirmed**", None: "undecided"}[r.confirmed]]
            for r in d.itertuples()]
    return md_table(["id", "statistic", "value [99% interval]", "confirmed when", "verdict"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bank", type=Path)
    p.add_argument("--out", type=Path, help="also write the table (markdown)")
    a = p.parse_args(argv)
    from seedlab.attribution.analyses import lds, loo
    from seedlab.attribution.estimators.rowscores import read_scores
    from seedlab.attribution.bank.rundir import BankDir
    from seedlab.errors import SeedlabError

    d = BankDir(a.bank)
    need = [d.loo, d.groups, d.group_rows, d.metagrad]
    missing = [str(f) for f in need if not Path(f).is_file()]
    if missing:
        print(f"{a.bank}: missing {', '.join(missing)} (bank, metagrad and rowscores first)", file=sys.stderr)
        return 2
    try:
        cfg = json.loads(Path(d.root / "config.json").read_text())
        s, end = int(cfg["injection_step"]), int(cfg["steps"])
        scores = read_scores(a.bank)
        age, _ = loo.analyse(pd.read_parquet(d.loo), scores, resamples=RESAMPLES, alpha=ALPHA)
        table = lds.analyse(pd.read_parquet(d.groups), pd.read_parquet(d.group_rows), scores, resamples=RESAMPLES,
                            alpha=ALPHA)
        metagrad = pd.read_parquet(d.metagrad)
        out = render(decide(age, table, metagrad, s, end))
        for h, label in ((s + 1, "s+1"), (end, "the end")):
            out += (f"\n\nBeside them (no decision): the median |metagrad| at {label} by the row's age: "
                    + ", ".join(f"{b} {v:.3g}" for b, v in magnitudes(metagrad, h).items()) + ".")
    except SeedlabError as err:
        print(err, file=sys.stderr)
        return 2
    print(out)
    if a.out:
        a.out.write_text(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
