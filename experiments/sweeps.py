"""What the experiment scripts share: one `seedlab shortcut sweep quick` per protocol (the preset with
``--set`` overrides, gradients and checkpoints off, one torch thread), several at once, a JSON line each."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FIXED = ["train.gradients.enabled=false", "train.checkpoint_epochs=[]", "train.threads=1"]


def sweep(folder: Path, sets: list[str], seeds: int) -> tuple[str | None, int]:
    """Run (or resume) the sweep into ``folder``: (the error's last line or None, wall seconds)."""
    cmd = [sys.executable, "-m", "seedlab", "shortcut", "sweep", "quick", "--out", str(folder), "--no-progress"]
    for s in [*FIXED, *sets, f"grid.seed={seeds}"]:
        cmd += ["--set", s]
    t0 = time.time()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    error = None if not done.returncode else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return error, round(time.time() - t0)


def main(doc: str, ids: list[str], run: Callable[[str, Path, int], list[dict]], out: str, log: str) -> None:
    """The scripts' command line: IDS (default all), --out, --seeds per cell, --jobs sweeps at once; every row
    ``run(id, out, seeds)`` returns is printed and appended to OUT/``log``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=ids)
    ap.add_argument("--out", type=Path, default=Path(out))
    ap.add_argument("--seeds", type=int, default=8, help="seeds per cell")
    ap.add_argument("--jobs", type=int, default=2, help="sweeps at once (each one torch thread)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool, (args.out / log).open("a") as f:
        for rows in pool.map(lambda i: run(i, args.out, args.seeds), args.ids):
            for row in rows:
                print(json.dumps(row), flush=True)
                f.write(json.dumps(row | {"seeds": args.seeds}) + "\n")
