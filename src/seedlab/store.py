"""Run folders: atomic writes so a killed process never leaves a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place.

    ``os.replace`` is atomic on POSIX: readers see the old file or the new one, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text))


def write_json(path: str | Path, obj: Any) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_yaml(path: str | Path, obj: Any) -> Path:
    return write_text(path, yaml.safe_dump(obj, sort_keys=False))


def write_parquet(path: str | Path, df: Any) -> Path:
    return atomic_write(path, lambda p: df.to_parquet(p, index=False))


def write_safetensors(path: str | Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> Path:
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    return atomic_write(path, lambda p: save_file(tensors, str(p), metadata=metadata))
