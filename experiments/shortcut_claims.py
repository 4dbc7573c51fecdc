"""The paper's other claims at CPU scale (exploratory): one small sweep per claim, each the preset
``shortcut/quick`` with a few ``--set`` overrides, gradients and checkpoints off, one torch thread.

| id | the paper's claim (docs/results.md quotes it beside our row) | overrides of quick |
|---|---|---|
| C1 | imbalance *against* the shortcut (r = 0.15) also promotes generalization | ratios 0.15, 0.5, 0.9 |
| C2 | the effect holds for ternary labels (sum mod 3) | task sum3-max, ratios 1/3 (chance) and 0.9 |
| C3 | ... and for the positional (first-element) shortcut | task sum2-first |
| C4 | phase 2 comes earlier with more heads in 2L | 2L only, heads 1 and 2, r = 0.9 |
| C5 | weight decay 0.4: generalizing basins found, often not kept (transient) | weight decay 0.4 |

Prints (and appends to ``OUT/claims.jsonl``) per claim and cell: members, generalized, retained to the end,
the median generalization and phase-2 epochs, and the wall time. Exploratory: the seeds (0..n-1) overlap the
search's; nothing here is pre-registered.

    python experiments/shortcut_claims.py --out runs/claims [--seeds 8] [--jobs 2] [IDS...]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
from sweeps import main, sweep

from seedlab.shortcut import stats

CLAIMS = {
    "C1": ("r = 0.15 beside 0.5 and 0.9", ["grid.ratio=[0.15,0.5,0.9]"]),
    "C2": ("ternary labels (sum3-max)", ["grid.task=[sum3-max]", "grid.ratio=[0.3333333333333333,0.9]"]),
    "C3": ("first-element shortcut (sum2-first)", ["grid.task=[sum2-first]"]),
    "C4": ("2L, 1 head vs 2 heads, r = 0.9", ["grid.layers=[2]", "grid.heads=[1,2]", "grid.ratio=[0.9]"]),
    "C5": ("weight decay 0.4", ["optim.weight_decay=0.4"]),
}


def run(cid: str, out: Path, seeds: int) -> list[dict]:
    folder = out / cid
    error, wall = sweep(folder, CLAIMS[cid][1], seeds)
    if error:
        return [{"id": cid, "error": error}]
    subprocess.run([sys.executable, "-m", "seedlab", "shortcut", "report", str(folder)], check=True,
                   stdout=subprocess.DEVNULL)
    df = pd.read_parquet(folder / "summary.parquet")
    rows = []
    for key, d in stats.by_cell(df):
        cell = dict(zip(stats.CELL, key, strict=True))
        med = lambda c, d=d: None if d[c].isna().all() else float(d[c].dropna().median())
        rows.append({"id": cid, "claim": CLAIMS[cid][0], **cell, "members": len(d), "generalized": int(d.generalized.sum()),
                     "retained": int((d.generalized & d.retained).sum()), "gen_epoch": med("gen_epoch"),
                     "phase2_epoch": med("phase2_epoch"), "wall_s": wall})
    return rows


if __name__ == "__main__":
    main(__doc__, list(CLAIMS), run, "runs/claims", "claims.jsonl")
