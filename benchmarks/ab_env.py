"""One command timed under two environments, interleaved (A, B, A, B, ...), best of each, at one thread count.

Made for the allocator setting (seedlab.machine.tune_allocator, set by the CLI at start-up): by default A is
``SEEDLAB_MALLOC=0`` (glibc as it comes) and B ``SEEDLAB_MALLOC=1`` (the tuned thresholds, the CLI's default).
Each run is a subprocess (benchmarks/timing.py ``run_command``) with ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS``
at ``--threads``; give the command the same count itself (``--set threads=N`` for a seedlab design). Per side:
the best wall time, and from ``getrusage`` of the child (its best run, and the fewest over the runs) user and
system CPU seconds and minor/major page faults; the ratio A/B of the best wall times and of the best CPU times
with the per-round ratios; the load average before and after. ``{out}`` in the command becomes a fresh folder
for every run; the folders' results (every parquet's rows and every manifest: timing.py ``results_digest``)
are compared, so "same bits" is checked, not assumed. Usage:

    python benchmarks/ab_env.py --threads 1 [--repeats 3] [--warmup 0] [--a SEEDLAB_MALLOC=0] [--b SEEDLAB_MALLOC=1] \\
        -- .venv/bin/seedlab attribution bank mini --set threads=1 ... --out {out} --no-progress
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from itertools import count
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import interleaved, results_digest, run_command


def env_pairs(text: str) -> dict[str, str]:
    """'NAME=value[,NAME=value...]' -> {NAME: value} ('' -> {})."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"expected NAME=value, got {part!r}")
        out[name] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, required=True, help="OMP/MKL threads of both sides (give the command the same)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds (A then B), best of each kept")
    ap.add_argument("--warmup", type=int, default=0, help="untimed rounds first (page cache, imports)")
    ap.add_argument("--a", type=env_pairs, default=env_pairs("SEEDLAB_MALLOC=0"), help="side A's environment")
    ap.add_argument("--b", type=env_pairs, default=env_pairs("SEEDLAB_MALLOC=1"), help="side B's environment")
    ap.add_argument("--keep", type=Path, default=None, help="keep every run's {out} folder under this folder")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command ({out}: a fresh folder per run)")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    if args.threads < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--threads and --repeats: at least 1; --warmup: at least 0")
    uses_out = any("{out}" in a for a in command)
    digests: dict[str, list[str]] = {"A": [], "B": []}
    root = Path(tempfile.mkdtemp(prefix="ab-env-"))
    serial = count()

    def side(name: str, env: dict[str, str]):
        def fn() -> dict:
            out = root / f"{next(serial):02d}-{name}"
            stats = run_command([a.replace("{out}", str(out)) for a in command], threads=args.threads, env=env)
            if uses_out:
                digests[name].append(results_digest(out) if out.exists() else "(no folder)")
                if args.keep:
                    shutil.copytree(out, args.keep / out.name, dirs_exist_ok=True)
                shutil.rmtree(out, ignore_errors=True)
            return stats

        return fn

    label = {"A": args.a, "B": args.b}
    try:
        t = interleaved({"A": side("A", args.a), "B": side("B", args.b)}, args.repeats, threads=args.threads,
                        warmup=args.warmup)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    show = lambda env: ", ".join(f"{k}={v}" for k, v in env.items()) or "(inherited)"
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {platform.node()} {platform.processor() or platform.machine()}; "
          f"A: {show(args.a)}; B: {show(args.b)}; {t.conditions()}")
    print(f"command: {' '.join(command)}")
    print("| side | environment | wall s (best) | user s | sys s | minor faults | major faults | "
          "minor faults, fewest of the runs |")
    print("|---|---|---|---|---|---|---|---|")
    for k in ("A", "B"):
        s = t.best_stats(k)
        fewest = min(r["minflt"] for r in t.stats[k])
        print(f"| {k} | {show(label[k])} | {t.best[k]:.2f} | {s['user_s']:.2f} | {s['sys_s']:.2f} | {s['minflt']:,} | "
              f"{s['majflt']:,} | {fewest:,} |")
    cpu = {k: min(r["user_s"] + r["sys_s"] for r in t.stats[k]) for k in ("A", "B")}
    print(f"A/B wall {t.ratio('A', 'B'):.3f}x (best of each; round by round "
          f"{', '.join(f'{r:.3f}' for r in t.round_ratios('A', 'B'))}); A/B CPU time (user + sys, best of each) "
          f"{cpu['A'] / cpu['B']:.3f}x")
    if uses_out:
        every = digests["A"] + digests["B"]
        same = len(set(every)) == 1
        print(f"results: {'the same bits in all ' + str(len(every)) + ' runs' if same else 'DIFFER'} "
              f"(A {', '.join(digests['A'])}; B {', '.join(digests['B'])})")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
