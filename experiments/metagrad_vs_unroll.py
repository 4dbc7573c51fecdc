"""metagrad against unroll on a finished bank (issue 33 §1): two modes of one linearisation, so every candidate's
first-order effect on every query at every horizon must agree to float round-off; and what each costs.

For each chosen seed, attribute.py's :func:`~seedlab.attribution.estimators.attribute.seed_estimates` runs ``unroll`` (forward
mode: one JVP pass per chunk of candidates through the replayed twin) and ``metagrad`` (reverse mode: one VJP pass
per step for every query's adjoint at once), each replay hash-checked against the twin. Printed per seed and
horizon: the largest |metagrad − unroll| relative to the largest |unroll| of that horizon (the scale of the effects),
the median relative difference per entry, and each estimator's wall time (one thread).

    python experiments/metagrad_vs_unroll.py runs/attribution-mini-rows --seeds 0,1 [--out FILE.csv]

Compute only: :func:`compare` (tested in tests/attribution/test_metagrad.py) returns the frame; :func:`main` prints it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

COLUMNS = ["seed", "horizon", "entries", "max_abs_diff", "max_abs_unroll", "max_rel", "median_rel",
           "unroll_s", "metagrad_s"]


def compare(root: str | Path, seeds: Sequence[int], device: str = "cpu") -> pd.DataFrame:
    """:data:`COLUMNS` per seed × horizon (module doc)."""
    from seedlab.attribution.estimators.attribute import seed_estimates
    from seedlab.attribution.bank.rundir import open_bank
    from seedlab.lm.determinism import settle
    from seedlab.lm.distributed import World

    bank = open_bank(root)
    dev = World().device(device)
    settle(dev, bank.cfg.threads)
    rows = []
    for seed in seeds:
        frame, seconds = seed_estimates(bank, seed, ["unroll", "metagrad"], dev, None)
        keys = ["candidate", "query", "horizon"]
        u = frame[frame.estimator == "unroll"].set_index(keys).estimate
        m = frame[frame.estimator == "metagrad"].set_index(keys).estimate.reindex(u.index)
        for h in sorted(u.index.get_level_values("horizon").unique()):
            uh, mh = u.xs(h, level="horizon").to_numpy(), m.xs(h, level="horizon").to_numpy()
            diff = np.abs(mh - uh)
            scale = float(np.max(np.abs(uh)))
            nz = np.abs(uh) > 0
            rows.append([seed, int(h), len(uh), float(diff.max()), scale, float(diff.max() / scale),
                         float(np.median(diff[nz] / np.abs(uh[nz]))) if nz.any() else float("nan"),
                         seconds["unroll"], seconds["metagrad"]])
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bank", type=Path)
    p.add_argument("--seeds", default="0", help="comma-separated training seeds of the bank")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, help="also write the frame as CSV")
    a = p.parse_args(argv)
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        print(f"--seeds: comma-separated integers, got {a.seeds!r}", file=sys.stderr)
        return 2
    from seedlab.errors import SeedlabError

    try:
        df = compare(a.bank, seeds, a.device)
    except SeedlabError as err:
        print(err, file=sys.stderr)
        return 2
    pd.set_option("display.width", 200)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if a.out:
        df.to_csv(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
