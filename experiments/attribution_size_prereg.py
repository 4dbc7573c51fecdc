"""The verdicts of docs/preregistration/attribution-size.md on a finished, attributed bank (issue 31 §1, §3, §4).

Seven decisions, each a bracket or an order fixed by the pre-registration before the bank was trained:

| id | decided on | confirmed when |
|---|---|---|
| S1 | seeds 4-7, held-out | size.py's ``bent`` horizon (first horizon with ē > 0.10) at w = 1/256 is s+5 or s+10 |
| S2 | seeds 4-7, self; probe | the same, each kind its own decision |
| S3 | seeds 4-7, held-out; probe | ē(1/256) < ē(1/64) at s+1 (point estimates) |
| S4 | seeds 4-7, held-out | h*(1/256) (size.py ``h_star``, its default rule) is s+50, end, or not reached |
| A1 | seeds 0-7, held-out | the Additivity slope of the pair's effect on the sum of its singles at s+1 lies in [0.8, 1.2] |

Reported beside them (no decision): the law's prediction re-derived from seeds 0-3 of the same bank (λ from the
nudges, ε(1/256) at s+1, ε_nl per query kind) next to the pre-registered 3.9-6.9 updates.

    python experiments/attribution_size_prereg.py runs/attribution-size8 [--out runs/attribution-size8/prereg.md]

Compute-only functions (:func:`decide`, :func:`rederived`) are tested in tests/attribution/test_size_prereg.py;
:func:`render` formats their frames.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from seedlab.attribution.analyses import additivity, chaos, size
from seedlab.attribution.bank.rundir import read_attributed

WEIGHT = 0.00390625  # 1/256, the row weight never run before the pre-registration
NEIGHBOUR = 0.015625  # 1/64, the smallest weight of the exploratory bank
TEST_SEEDS = [4, 5, 6, 7]
LAW_SEEDS = [0, 1, 2, 3]
BENT_OK = {5, 10}  # S1, S2: the bend in (2, 5] or (5, 10]
PREDICTED = (3.9, 6.9)  # the pre-registered h - s from λ = 0.66, ε = 0.00073, ε_nl = 0.005 .. 0.035
SLOPE = (0.8, 1.2)  # A1
DECISIONS = ["id", "query_kind", "seeds", "statistic", "value", "confirmed_when", "confirmed"]


def seeds_of(frame: pd.DataFrame | None, seeds: list[int]) -> pd.DataFrame | None:
    return None if frame is None else frame[frame.seed.isin(seeds)].reset_index(drop=True)


def _bent(sz: size.SizeAxis, kind: str, w: float) -> tuple[str, float]:
    r = sz.h_star[(sz.h_star.query_kind == kind) & (sz.h_star.weight == w)]
    if not len(r):
        return "absent", math.nan
    r = r.iloc[0]
    return (r.bent_label or "none"), r.bent_after


def _error(sz: size.SizeAxis, kind: str, after: int, w: float) -> float:
    s = sz.summary
    r = s[(s.query_kind == kind) & (s.after == after) & (s.weight == w)]
    return float(r.error.iloc[0]) if len(r) else math.nan


def decide(test: size.SizeAxis, pairs: pd.DataFrame | None, *, seeds: str = "4-7",
           pair_seeds: str = "0-7") -> pd.DataFrame:
    """The seven decisions (module doc) from the size axis on the test seeds and additivity.summarise's
    numbers on every seed (None: A1 undecided). Columns :data:`DECISIONS`; ``confirmed`` None where the
    statistic is missing."""
    rows = []
    for hid, kind in (("S1", "heldout"), ("S2", "self"), ("S2", "probe")):
        label, after = _bent(test, kind, WEIGHT)
        ok = None if label == "absent" else (not math.isnan(after) and int(after) in BENT_OK)
        rows.append([hid, kind, seeds, "bent horizon at w = 1/256", label, "s+5 or s+10", ok])
    for kind in ("heldout", "probe"):
        fine, coarse = _error(test, kind, 1, WEIGHT), _error(test, kind, 1, NEIGHBOUR)
        ok = None if math.isnan(fine) or math.isnan(coarse) else bool(fine < coarse)
        rows.append(["S3", kind, seeds, "ē(1/256) vs ē(1/64) at s+1", f"{fine:.4g} vs {coarse:.4g}",
                     "ē(1/256) < ē(1/64)", ok])
    r = test.h_star[(test.h_star.query_kind == "heldout") & (test.h_star.weight == WEIGHT)]
    if len(r):
        r = r.iloc[0]
        label = r.label if r.status == "reached" else r.status
        ok = bool(r.status == "not reached" or (r.status == "reached" and (r.label == "end" or r.after >= 50)))
    else:
        label, ok = "absent", None
    rows.append(["S4", "heldout", seeds, "h*(1/256)", label, "s+50, end or not reached", ok])
    if pairs is None or not len(pairs):
        rows.append(["A1", "heldout", pair_seeds, "additivity slope at s+1", "no pairs", "in [0.8, 1.2]", None])
    else:
        n = pairs[(pairs.query_kind == "heldout") & (pairs.comparison == additivity.PAIR) & (pairs.after == 1)]
        if len(n):
            v = n.iloc[0]
            rows.append(["A1", "heldout", pair_seeds, "additivity slope at s+1",
                         f"{v.slope:.3f} [{v.slope_low:.3f}, {v.slope_high:.3f}] ({int(v.pairs)} pairs)",
                         "in [0.8, 1.2]", bool(SLOPE[0] <= v.slope <= SLOPE[1])])
        else:
            rows.append(["A1", "heldout", pair_seeds, "additivity slope at s+1", "absent", "in [0.8, 1.2]", None])
    return pd.DataFrame(rows, columns=DECISIONS)


def rederived(law: size.SizeAxis, lam: chaos.Chaos, w: float = WEIGHT) -> pd.DataFrame:
    """The law's h − s for weight ``w`` from the law seeds' own λ, ε(w) and ε_nl per query kind (chaos.predict
    and predict_interval), beside the pre-registered bracket. Columns: query_kind, rate, epsilon, eps_nl,
    predicted, low, high."""
    rate, rlo, rhi = lam.cell_rate
    e = law.epsilon[law.epsilon.weight == w]
    rows = []
    for n in law.scales.itertuples():
        if not len(e):
            continue
        eps = e.iloc[0]
        p = float(chaos.predict(rate, eps.epsilon, n.eps_nl, eps.after))
        lo, hi = chaos.predict_interval((rlo, rhi), (eps.low, eps.high), (n.low, n.high), float(eps.after))
        rows.append([n.query_kind, rate, float(eps.epsilon), float(n.eps_nl), p, lo, hi])
    return pd.DataFrame(rows, columns=["query_kind", "rate", "epsilon", "eps_nl", "predicted", "low", "high"])


def render(decisions: pd.DataFrame, law: pd.DataFrame, root: str) -> str:
    out = [f"# Pre-registered verdicts: {root}", "", "docs/preregistration/attribution-size.md; "
           f"{int(decisions.confirmed.notna().sum())} of {len(decisions)} decisions defined, "
           f"{int((decisions.confirmed == True).sum())} confirmed.", "",  # noqa: E712
           "| id | queries | seeds | statistic | value | confirmed when | verdict |", "|---|---|---|---|---|---|---|"]
    for r in decisions.itertuples():
        verdict = "undecided" if r.confirmed is None else "confirmed" if r.confirmed else "not confirmed"
        out.append(f"| {r.id} | {r.query_kind} | {r.seeds} | {r.statistic} | {r.value} | {r.confirmed_when} | {verdict} |")
    out += ["", f"The law re-derived from seeds {LAW_SEEDS[0]}-{LAW_SEEDS[-1]} of this bank (pre-registered: h − s = "
            f"{PREDICTED[0]} .. {PREDICTED[1]}):", "", "| queries | λ /update | ε(1/256) | ε_nl | h − s predicted |",
            "|---|---|---|---|---|"]
    for r in law.itertuples():
        out.append(f"| {r.query_kind} | {r.rate:.3f} | {r.epsilon:.3g} | {r.eps_nl:.3g} | {r.predicted:.1f} "
                   f"[{r.low:.1f}, {r.high:.1f}] |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bank")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    a = read_attributed(args.bank)
    if a.weighted is None or a.distances is None:
        print(f"{args.bank}: no weighted.parquet or distances.parquet (a bank with row weights and nudges)",
              file=sys.stderr)
        return 2
    test = size.analyse(seeds_of(a.weighted, TEST_SEEDS), seeds_of(a.df, TEST_SEEDS), seeds_of(a.distances, TEST_SEEDS))
    pairs = additivity.summarise(a.pairs).numbers if a.pairs is not None else None
    law_size = size.analyse(seeds_of(a.weighted, LAW_SEEDS), seeds_of(a.df, LAW_SEEDS),
                            seeds_of(a.distances, LAW_SEEDS))
    law = rederived(law_size, chaos.analyse(seeds_of(a.distances, LAW_SEEDS)))
    text = render(decide(test, pairs), law, args.bank)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
