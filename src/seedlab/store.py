"""Every byte on disk that must be trusted: atomic writes, content and tensor hashes,
manifests, verified reads, ``done`` markers and the folder lock.

Studies never open a file of a run folder for writing except through here, and every
checkpoint they read back comes through :func:`read_verified`. Where a file *lives* is
each study's ``rundir.py`` (and, for a fork design, seedlab/forks/folders.py); *how* it is
written and checked is this module.

- **Atomic writes** (:func:`atomic_write` and the typed helpers): a temporary file beside
  the target, then ``os.replace``. A killed process leaves the old file or the new one,
  never a torn one.
- **Hashes**: :func:`content_hash` (a config or any JSON value: a run folder's name),
  :func:`file_sha256` (a whole file), :func:`tensor_hashes` (SHA-256 of each tensor's
  bytes: what manifests hold).
- **Verified reads**: :func:`read_verified` returns a safetensors file's tensors only if
  every tensor matches its expected SHA-256 (a manifest entry, or the hashes the file
  carries in its own metadata, written by :func:`write_safetensors` with ``hashed=True``).
- **Markers and locks**: :func:`mark_done` / :func:`is_done` (written last: the unit of work
  is complete), :func:`folder_lock` (one writer per folder; the OS releases it on kill -9).

A fork design's folders (config, inputs, prefixes, runs) are seedlab/forks/folders.py's; they
write and read through here.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from seedlab.errors import SeedlabError

#: name of the marker a finished unit of work (a job, a run) writes last
DONE = "done.json"
#: name of a folder's lock file
LOCK = ".lock"


# --------------------------------------------------------------------------- atomic writes
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


def write_json_if_changed(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` unless the file already holds exactly it (a resumed run leaves it untouched)."""
    path = Path(path)
    if not path.is_file() or json.loads(path.read_text()) != obj:
        write_json(path, obj)
    return path


def write_yaml(path: str | Path, obj: Any) -> Path:
    return write_text(path, yaml.safe_dump(obj, sort_keys=False))


def write_parquet(path: str | Path, df: Any) -> Path:
    return atomic_write(path, lambda p: df.to_parquet(p, index=False))


def write_safetensors(
    path: str | Path, tensors: Mapping[str, Any], metadata: dict[str, str] | None = None, *, hashed: bool = False
) -> Path:
    """Tensors (on the CPU, contiguous) to a safetensors file; ``hashed`` also stores every
    tensor's SHA-256 in its metadata (key ``sha256``), so :func:`read_verified` can check it alone."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = dict(metadata or {})
    if hashed:
        meta["sha256"] = json.dumps(tensor_hashes(tensors))
    return atomic_write(path, lambda p: save_file(tensors, str(p), metadata=meta))


# --------------------------------------------------------------------------- hashes
def content_hash(obj: Any, n: int = 12) -> str:
    """A stable short hash of a config (or any JSON-able value): the run-folder name."""
    from pydantic import BaseModel

    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:n]


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def tensor_hashes(state: Mapping[str, Any]) -> dict[str, str]:
    """SHA-256 of every tensor's bytes (on the CPU, contiguous): ``{name: hex digest}``."""
    return {k: hashlib.sha256(v.detach().cpu().contiguous().numpy().tobytes()).hexdigest() for k, v in state.items()}


def digest(hashes: Mapping[str, str]) -> str:
    """One SHA-256 over a ``{name: hash}`` mapping (names sorted): a whole model's fingerprint."""
    return hashlib.sha256("".join(f"{k}={v};" for k, v in sorted(hashes.items())).encode()).hexdigest()


# --------------------------------------------------------------------------- verified reads
def read_verified(path: str | Path, expected: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors and metadata of a safetensors file, each tensor's SHA-256 checked against
    ``expected`` (a manifest entry) or, when None, the hashes stored in the file's own metadata.

    Anything unreadable, missing or different is a one-line :class:`SeedlabError` naming the
    file and the tensor."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise SeedlabError(f"{path}: not a readable checkpoint ({str(e).splitlines()[0]})") from None
    if expected is None:
        if "sha256" not in meta:
            raise SeedlabError(f"{path}: no recorded hashes to check it against")
        expected = json.loads(meta["sha256"])
    got = tensor_hashes(tensors)
    for name, h in expected.items():
        if got.get(name) != h:
            why = "is missing" if name not in got else "does not match its recorded SHA-256"
            raise SeedlabError(f"{path}: tensor {name!r} {why} (corrupted checkpoint)")
    return tensors, meta


def read_manifest(path: str | Path) -> dict[str, dict[str, str]]:
    """A manifest (``{key: {tensor: SHA-256}}``); an absent or unreadable one is empty."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


# --------------------------------------------------------------------------- markers and locks
def refuse_overwrite(paths: list[str | Path], force: bool) -> None:
    """An existing result needs ``--force``: the first of ``paths`` that exists is a one-line error."""
    existing = [Path(p) for p in paths if Path(p).exists()]
    if existing and not force:
        raise SeedlabError(f"--out: {existing[0]} already exists (use --force to overwrite)")


def mark_done(folder: str | Path, info: Mapping[str, Any]) -> Path:
    """Write the folder's ``done.json`` (last, atomically): its work is complete."""
    return write_json(Path(folder) / DONE, dict(info))


def is_done(folder: str | Path) -> bool:
    return (Path(folder) / DONE).is_file()


@contextmanager
def folder_lock(folder: str | Path, busy: str = "{folder} is in use by another process (pid {pid})") -> Iterator[None]:
    """An exclusive lock on ``folder`` (created if absent). A second holder gets a one-line error,
    ``busy`` filled in with the folder and the first holder's pid. The kernel releases the lock
    when the process dies, even on kill -9."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise SeedlabError(busy.format(folder=folder, pid=holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock; the kernel does the same on kill -9
