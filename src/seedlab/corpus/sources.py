"""Where a corpus's text comes from: local files, a Hugging Face dataset, or the ``embedded``
default (the standard library's own docstrings, no network).

``load_texts(source)`` returns the documents in a fixed order and a description of the source
(recorded in the corpus's meta.json).
"""

from __future__ import annotations

import ast
import json
import os
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from seedlab.errors import SeedlabError

FILE_SUFFIXES = (".txt", ".jsonl", ".parquet")
#: what ``"openwebtext"`` means: the Hub's maintained copy of OpenWebText
OPENWEBTEXT = "Skylion007/openwebtext"


class Texts(Protocol):
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[str]: ...


class HFTexts:
    """One text column of a ``datasets.Dataset``, read lazily in order (no full copy in memory)."""

    def __init__(self, ds: Any, text_field: str):
        self.ds = ds.select_columns([text_field])
        self.text_field = text_field

    def __len__(self) -> int:
        return len(self.ds)

    def __iter__(self) -> Iterator[str]:
        for batch in self.ds.iter(batch_size=1000):
            for t in batch[self.text_field]:
                yield "" if t is None else str(t)


def load_hf_texts(
    name_or_path: str, split: str = "train", text_field: str = "text", cache_dir: str | None = None
) -> HFTexts:
    """Load one split of a dataset with ``datasets.load_dataset`` (streaming off).

    A local ``.jsonl``/``.json`` or ``.parquet`` file goes through the ``json`` /
    ``parquet`` builders; anything else is a Hub name (e.g. ``Skylion007/openwebtext``),
    which needs the network or a filled Hugging Face cache.
    """
    try:
        import datasets
    except ImportError:  # pragma: no cover - dependency
        raise SeedlabError("source: Hugging Face datasets need the 'datasets' package (pip install datasets)") from None
    p = Path(name_or_path)
    try:
        if p.is_file() and p.suffix in (".jsonl", ".json"):
            ds = datasets.load_dataset("json", data_files=str(p), split=split, cache_dir=cache_dir)
        elif p.is_file() and p.suffix == ".parquet":
            ds = datasets.load_dataset("parquet", data_files=str(p), split=split, cache_dir=cache_dir)
        else:
            ds = datasets.load_dataset(name_or_path, split=split, cache_dir=cache_dir, streaming=False)
    except Exception as err:  # network, missing dataset, bad split: one line
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SeedlabError(
            f"source: cannot load dataset {name_or_path!r} split {split!r} ({type(err).__name__}: {msg});"
            " a Hub dataset needs the network or a filled Hugging Face cache"
        ) from None
    if text_field not in ds.column_names:
        raise SeedlabError(
            f"source: dataset {name_or_path!r} has no {text_field!r} column (columns: {ds.column_names})"
        )
    return HFTexts(ds, text_field)


def read_txt(path: Path) -> list[str]:
    """Documents of a text file: paragraphs separated by blank lines."""
    text = path.read_text(encoding="utf-8")
    return [d.strip() for d in re.split(r"\n[ \t\r\f\v]*\n", text) if d.strip()]


def read_jsonl(path: Path, text_field: str = "text") -> list[str]:
    out = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise SeedlabError(f"{path}:{i}: not valid JSON") from None
            if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                raise SeedlabError(f"{path}:{i}: needs a string {text_field!r} field")
            out.append(obj[text_field])
    return out


def read_parquet(path: Path, text_field: str = "text") -> list[str]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=[text_field])
    except Exception as err:
        raise SeedlabError(f"{path}: cannot read a {text_field!r} column ({type(err).__name__})") from None
    return ["" if t is None else str(t) for t in table.column(text_field).to_pylist()]


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def embedded_texts(max_bytes: int | None = None) -> list[str]:
    """A corpus that needs no network: the docstrings of the standard library's own sources.

    One document per module (module, class and function docstrings in source order),
    modules in sorted path order, read with ``ast`` (nothing is imported), so it is
    identical on every run of the same Python installation. ``max_bytes`` stops at the
    last whole document that keeps the UTF-8 total within the limit.
    """
    root = _stdlib_root()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    docs: list[str] = []
    total = 0
    for f in files:
        try:
            tree = ast.parse(f.read_bytes(), filename=str(f))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        parts = []
        for node in _docstring_nodes(tree):
            doc = ast.get_docstring(node, clean=True)
            if doc and doc.strip():
                parts.append(doc.strip())
        if not parts:
            continue
        doc = "\n\n".join(parts)
        n = len(doc.encode("utf-8"))
        if max_bytes is not None and total + n > max_bytes:
            if docs:
                break
            continue  # the first module alone is too big: try a smaller one
        docs.append(doc)
        total += n
    if not docs:
        raise SeedlabError(f"source: no docstrings found under {root} (embedded corpus)")
    return docs


def _docstring_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Module, classes and functions in source (depth-first) order."""
    yield tree
    stack = list(reversed(getattr(tree, "body", [])))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
            stack.extend(reversed(node.body))


def _read_file(path: Path, text_field: str) -> list[str]:
    if path.suffix == ".txt":
        return read_txt(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path, text_field)
    if path.suffix == ".parquet":
        return read_parquet(path, text_field)
    raise SeedlabError(f"source: {path} is not a .txt, .jsonl or .parquet file")


def load_texts(
    source: str | Path, *, text_field: str = "text", max_bytes: int | None = None, cache_dir: str | None = None
) -> tuple[Texts, dict[str, Any]]:
    """Documents of ``source`` in a fixed order, and a description of where they came from."""
    s = str(source)
    info: dict[str, Any] = {"source": s}
    if s == "embedded":
        docs = embedded_texts(max_bytes)
        info.update(kind="embedded", stdlib=str(_stdlib_root()), max_bytes=max_bytes)
        return docs, info
    if s == "openwebtext" or s.startswith("hf:"):
        name = OPENWEBTEXT if s == "openwebtext" else s[3:]
        info.update(kind="huggingface", dataset=name, split="train", text_field=text_field)
        return load_hf_texts(name, "train", text_field, cache_dir=cache_dir), info
    p = Path(s)
    if p.is_file():
        info.update(kind="file")
        return _read_file(p, text_field), info
    if p.is_dir():
        files = sorted(
            (f for f in p.rglob("*") if f.is_file() and f.suffix in FILE_SUFFIXES),
            key=lambda f: f.relative_to(p).as_posix(),
        )
        if not files:
            raise SeedlabError(f"source: folder {s!r} holds no .txt, .jsonl or .parquet files")
        docs = [d for f in files for d in _read_file(f, text_field)]
        info.update(kind="folder", files=[f.relative_to(p).as_posix() for f in files])
        return docs, info
    raise SeedlabError(
        f"source: {s!r} is neither a file, a folder, 'embedded', 'openwebtext' nor 'hf:<dataset>'"
    )
