"""What measuring gradient dynamics costs: the same ensemble trained with and without it.

Default cadence (train.gradients.every = 50 epochs, 64 examples per group for per-example
norms). Usage: python benchmarks/gradients_cost.py [--epochs 200] [--n-train 2048] [--members 8]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from seedlab.shortcut.config import EnsembleConfig
from seedlab.shortcut.train import train_ensemble


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--n-train", type=int, default=2048)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    base = {
        "data": {"n_train": a.n_train, "n_val": 256, "n_adv": 256},
        "train": {"epochs": a.epochs, "eval_every": 10},
        "members": {"ratio": [0.9], "seed": list(range(a.members))},
    }
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(a.repeats):  # interleaved, best of repeats
        for on in (False, True):
            cfg = EnsembleConfig.model_validate(base | {"train": base["train"] | {"gradients": {"enabled": on}}})
            t = time.perf_counter()
            train_ensemble(cfg, progress=False)
            times[on].append(time.perf_counter() - t)
    off, on = min(times[False]), min(times[True])
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} torch {torch.__version__} threads {torch.get_num_threads()}")
    print(f"2L/2H, S={a.members}, n_train={a.n_train}, full batch, {a.epochs} epochs, eval every 10")
    print(f"without gradients: {off:.1f} s; with (every 50 epochs): {on:.1f} s; ratio {on / off:.3f}x")


if __name__ == "__main__":
    main()
