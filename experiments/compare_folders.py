"""Are two run folders the same results? Every table, manifest and record of one folder against
the other's, file by file: the check behind "results bitwise unchanged" after a refactor.

    python experiments/compare_folders.py BEFORE AFTER [--ignore environment.json ...]

- ``*.parquet``: the same columns, dtypes and values (NaN equal to NaN; ``pandas.testing``,
  exact: no tolerance);
- ``manifest.json`` and every other ``*.json``: equal as data, except the files named by
  ``--ignore`` (by name; default: environment.json, which records the machine, and timings.json,
  which records seconds) and the keys named by ``--ignore-keys`` at any depth (default: ``seconds``
  and ``corpus``, the corpus folder's path); the first differing key is named;
- ``*.safetensors``: the same tensors, bit for bit, and the same metadata (safetensors writes its
  metadata in a process-random order, so the file's bytes are no test);
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
IGNORE_KEYS = ("seconds", "corpus")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def table_rows(text: str) -> Counter:
    """The report's table rows, as a multiset (the order of sections may change, the rows may not)."""
    return Counter(line for line in text.splitlines() if line.startswith("|"))


def first_key_difference(a, b, ignore_keys: tuple[str, ...], path: str = "") -> str | None:
    """The first key path (``/a/b``) where two JSON records differ, keys in ``ignore_keys`` aside; None: equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in ignore_keys:
                continue
            if k not in a or k not in b:
                return f"{path}/{k}"
            if (found := first_key_difference(a[k], b[k], ignore_keys, f"{path}/{k}")) is not None:
                return found
        return None
    return None if a == b else path


def tensors_difference(a: Path, b: Path) -> str | None:
    """Why two safetensors files do not hold the same tensors and metadata (None: they do)."""
    import torch
    from safetensors import safe_open

    with safe_open(a, "pt") as fa, safe_open(b, "pt") as fb:
        if fa.metadata() != fb.metadata():
            return "the metadata differ"
        if sorted(fa.keys()) != sorted(fb.keys()):
            return "the tensor names differ"
        for k in fa.keys():
            x, y = fa.get_tensor(k), fb.get_tensor(k)
            bits = lambda t: t.contiguous().reshape(-1).view(torch.uint8)
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(bits(x), bits(y)):
                return f"tensor {k!r} differs"
    return None


def differs(a: Path, b: Path, ignore_keys: tuple[str, ...] = IGNORE_KEYS) -> str | None:
    """Why the two files are not the same result (None: they are)."""
    if a.suffix == ".parquet":
        try:
            pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b), check_exact=True)
        except AssertionError as err:
            return str(err).strip().splitlines()[0]
        return None
    if a.suffix == ".json":
        where = first_key_difference(json.loads(a.read_text()), json.loads(b.read_text()), ignore_keys)
        return None if where is None else f"the records differ at {where or 'the top'}"
    if a.suffix == ".safetensors":
        return tensors_difference(a, b)
    if a.name == "report.md":
        if table_rows(a.read_text()) != table_rows(b.read_text()):
            return "the table rows differ"
        return None
    if a.suffix in (".npz", ".txt"):
        return None if sha256(a) == sha256(b) else "the bytes differ"
    return None  # figures and other renderings: not results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--ignore", nargs="*", default=list(IGNORE), help="file names whose differences are not results")
    ap.add_argument("--ignore-keys", nargs="*", default=list(IGNORE_KEYS), help="JSON keys (any depth) that are not results")
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
        why = differs(args.before / rel, args.after / rel, tuple(args.ignore_keys))
        compared += 1
        if why is not None:
            print(f"differs: {rel}: {why}")
            bad += 1
        elif rel.name == "report.md" and (args.before / rel).read_bytes() != (args.after / rel).read_bytes():
            print(f"reordered: {rel} (the same table rows, other text or order)")
    print(f"{compared} files compared, {bad} differences ({', '.join(args.ignore)} and the keys "
          f"{', '.join(args.ignore_keys)} not compared)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
