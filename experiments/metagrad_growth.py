"""How a row's metagradient grows with the row's age, per bank: D3's statistic of
docs/preregistration/attribution-rows.md (per seed, the median |metagrad| of rows aged (20, 50] over rows aged (5, 10]
at a horizon) and the median |metagrad| by age bin, computed by experiments/attribution_rows_prereg.py's tested
``growth`` and ``magnitudes`` — reported, not decided (the decision D3 was the rows bank's, at s+1).

    python experiments/metagrad_growth.py runs/regime-b8 runs/regime-b32 [--horizon end] [--out FILE.md]

A bank without metagrad.parquet, or without the horizon, is one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path

_spec = importlib.util.spec_from_file_location("attribution_rows_prereg",
                                               Path(__file__).with_name("attribution_rows_prereg.py"))
rows_prereg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rows_prereg)


def table(banks: dict[str, object]) -> str:
    """One markdown table: a line per bank (``banks``: name -> metagrad.parquet's frame and the horizon read), D3's
    statistic per seed, then the median |metagrad| per age bin."""
    from seedlab.reporting import md_table

    rows, mags = [], []
    for name, (m, h) in banks.items():
        mags.append(rows_prereg.magnitudes(m, h))
        rows.append([name, str(h), ", ".join(f"{v:.3g}" for v in rows_prereg.growth(m, h).values)])
    bins = sorted({b for mag in mags for b in mag.index}, key=lambda b: b.left)  # every bank's, in age order
    lines = [r + [f"{mag[b]:.3g}" if b in mag.index else "—" for b in bins] for r, mag in zip(rows, mags)]
    (o0, o1), (y0, y1) = rows_prereg.OLD, rows_prereg.YOUNG
    return md_table(["bank", "horizon", f"ages ({o0}, {o1}] / ({y0}, {y1}], per seed",
                     *(f"median, ages {b}" for b in bins)], lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("banks", type=Path, nargs="+")
    p.add_argument("--horizon", default="end", help="updates completed, or end (each bank's)")
    p.add_argument("--out", type=Path, help="also write the table (markdown)")
    a = p.parse_args(argv)
    import pandas as pd

    from seedlab.attribution.bank.rundir import BankDir

    banks = {}
    for b in a.banks:
        d = BankDir(b)
        if not d.metagrad.is_file():
            print(f"{b}: no metagrad.parquet (seedlab attribution metagrad first)", file=sys.stderr)
            return 2
        m = pd.read_parquet(d.metagrad)
        end = int(json.loads(d.config.read_text())["steps"])
        h = end if a.horizon == "end" else int(a.horizon)
        if h not in set(m.horizon):
            print(f"{b}: metagrad.parquet holds no horizon {h} (it has {sorted(set(m.horizon))})", file=sys.stderr)
            return 2
        banks[b.name] = (m, h)
    out = table(banks)
    print(out)
    if a.out:
        a.out.write_text(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
