"""Are two run folders the same results? Every table, manifest and record of one folder against
the other's, file by file: the check behind "results bitwise unchanged" after a refactor.

    python experiments/compare_folders.py BEFORE AFTER [--ignore environment.json ...]

- ``*.parquet``: the same columns, dtypes and values (NaN equal to NaN; ``pandas.testing``,
  exact: no tolerance);
- ``manifest.json`` and every other ``*.json``: equal as data, except the files named by
  ``--ignore`` (by name; default: environment.json, which records the machine, and timings.json,
  which records seconds);
- ``*.safetensors``: the same bytes (SHA-256);
- ``report.md``: the same multiset of table rows (a report may reorder its sections and still
  print the same numbers), and, separately, whether the text is byte-identical;
- files only one folder holds are listed (``.lock``, the lock a command holds, is skipped).

Prints one line per difference and a summary; exit 1 when any result differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

SKIP = {".lock"}
IGNORE = ("environment.json", "timings.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def table_rows(text: str) -> Counter:
    """The report's table rows, as a multiset (the order of sections may change, the rows may not)."""
    return Counter(line for line in text.splitlines() if line.startswith("|"))


def differs(a: Path, b: Path) -> str | None:
    """Why the two files are not the same result (None: they are)."""
    if a.suffix == ".parquet":
        try:
            pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b), check_exact=True)
        except AssertionError as err:
            return str(err).strip().splitlines()[0]
        return None
    if a.suffix == ".json":
        return None if json.loads(a.read_text()) == json.loads(b.read_text()) else "the records differ"
    if a.name == "report.md":
        if table_rows(a.read_text()) != table_rows(b.read_text()):
            return "the table rows differ"
        return None
    if a.suffix in (".safetensors", ".npz", ".txt"):
        return None if sha256(a) == sha256(b) else "the bytes differ"
    return None  # figures and other renderings: not results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--ignore", nargs="*", default=list(IGNORE), help="file names whose differences are not results")
    args = ap.parse_args(argv)
    files = lambda root: {p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name not in SKIP}
    before, after = files(args.before), files(args.after)
    bad = 0
    for rel in sorted(before ^ after):
        print(f"only in {'before' if rel in before else 'after'}: {rel}")
        bad += 1
    compared = 0
    for rel in sorted(before & after):
        if rel.name in args.ignore:
            continue
        why = differs(args.before / rel, args.after / rel)
        compared += 1
        if why is not None:
            print(f"differs: {rel}: {why}")
            bad += 1
        elif rel.name == "report.md" and (args.before / rel).read_bytes() != (args.after / rel).read_bytes():
            print(f"reordered: {rel} (the same table rows, other text or order)")
    print(f"{compared} files compared, {bad} differences ({', '.join(args.ignore)} not compared)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
