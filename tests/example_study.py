"""examples/repeats as ``pip install -e examples/repeats`` leaves it, without pip: its folder importable as
the package ``repeats`` and a ``.dist-info`` holding the entry points its pyproject declares, both on sys.path
(importlib.metadata finds a distribution's metadata in any sys.path folder, as seedlab.cli reads it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PACKAGE = EXAMPLES / "repeats"


def project() -> dict:
    """examples/repeats/pyproject.toml's [project] table."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]


def write_dist_info(root: Path, name: str, version: str, entry_points: Mapping[str, Mapping[str, str]]) -> Path:
    """An installed distribution's metadata in ``root``: METADATA and entry_points.txt (``{group: {name: value}}``)."""
    where = root / f"{name.replace('-', '_')}-{version}.dist-info"
    where.mkdir(parents=True)
    (where / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (where / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in entry_points.items()))
    return where


@contextlib.contextmanager
def installed(root: Path, more: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None) -> Iterator[None]:
    """examples/repeats installed (its pyproject's name, version and entry points) for the block, and
    ``more``: other distributions, ``{name: {group: {entry: value}}}`` (version 1.0)."""
    p = project()
    write_dist_info(root, p["name"], p["version"], p["entry-points"])
    for name, eps in (more or {}).items():
        write_dist_info(root, name, "1.0", eps)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        mp.syspath_prepend(str(EXAMPLES))
        yield
