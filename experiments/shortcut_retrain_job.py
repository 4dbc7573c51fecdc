"""Retrain one finished shortcut job and compare its curves with the job's own, bit for bit.

Trains the job's members from its ``config.yaml`` (``train.adv_every`` and the report-only and later-added
fields dropped, so a job of a newer seedlab also runs on an older one) with whatever ``seedlab`` is importable,
one torch thread, and compares accuracy and loss at every evaluation with the job's ``curves.parquet``.
Identical curves: the same training (code and machine); different: another draw of the members' chaotic
trajectories. To test an older commit's code on this machine:

    git worktree add /tmp/old COMMIT
    PYTHONPATH=/tmp/old/src python experiments/shortcut_retrain_job.py runs/r1-every-epoch/jobs/38bcebde0c7f
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
import yaml

import seedlab
from seedlab.shortcut.config import EnsembleConfig
from seedlab.shortcut.train import train_ensemble


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", type=Path, help="a finished job folder (SWEEP/jobs/<hash>)")
    job = ap.parse_args().job
    torch.set_num_threads(1)
    cfg = yaml.safe_load((job / "config.yaml").read_text())
    for key in ("adv_every", "precision"):
        cfg["train"].pop(key, None)
    cfg["train"].get("gradients", {}).pop("saturated_loss", None)
    result = train_ensemble(EnsembleConfig.model_validate(cfg), progress=False)
    m = result.curves.merge(pd.read_parquet(job / "curves.parquet"), on=["member", "epoch", "split"], suffixes=("", "_job"))
    same = bool((m.acc == m.acc_job).all() and (m.loss == m.loss_job).all())
    print(f"seedlab from {Path(seedlab.__file__).parent}; {len(m)} curve rows compared: "
          f"{'bitwise identical' if same else 'different'} (max |loss difference| {(m.loss - m.loss_job).abs().max():.3g})")
    print("generalized at the evaluations, per ratio:", result.summary.groupby("ratio").generalized.sum().to_dict())


if __name__ == "__main__":
    main()
