"""Where a corpus's text comes from: local files, a Hugging Face dataset, or the ``embedded``
default (the standard library's own docstrings, no network).

``load_texts(source)`` returns the documents in a fixed order and a description of the source
(recorded in the corpus's meta.json). Files and parquet datasets (OpenWebText: the Hub's parquet
conversion) are streamed, never held in memory whole.
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
#: what ``"openwebtext"`` means: the Hub's maintained copy of OpenWebText, read from ...
OPENWEBTEXT = "Skylion007/openwebtext"
#: ... the Hub's parquet conversion of it (``datasets`` >= 4 no longer runs its loading script)
PARQUET_REVISION = "refs/convert/parquet"
_PARQUET_ROWS = 1024  # rows read from a parquet file at a time


class Texts(Protocol):
    """Documents in a fixed order: their number, and an iteration that may be repeated."""

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


class FileTexts:
    """The documents of a list of files, streamed: one file at a time, a parquet file a batch of
    rows at a time, so memory does not grow with the number of documents.

    A file is a local ``.txt``/``.jsonl``/``.parquet`` path or the URL of a parquet file (``hf://``
    and the other ``fsspec`` protocols). ``len`` counts the documents once: a parquet file from its
    footer, a text or JSONL file by reading it (which checks every row before anything is written).
    """

    def __init__(self, files: list[str] | list[Path], text_field: str = "text"):
        self.files = [f if _is_url(str(f)) else Path(f) for f in files]
        self.text_field = text_field
        self._n: int | None = None
        for f in self.files:
            if _suffix(f) not in FILE_SUFFIXES or (_is_url(str(f)) and _suffix(f) != ".parquet"):
                raise SeedlabError(f"source: {f} is not a .txt, .jsonl or .parquet file")

    def __len__(self) -> int:
        if self._n is None:
            self._n = sum(_count_file(f, self.text_field) for f in self.files)
        return self._n

    def __iter__(self) -> Iterator[str]:
        for f in self.files:
            yield from _iter_file(f, self.text_field)


def _is_url(s: str) -> bool:
    return "://" in s


def _suffix(f: str | Path) -> str:
    return Path(str(f).split("?")[0]).suffix


def _one_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _dataset_error(name: str, split: str, err: Exception) -> SeedlabError:
    msg = _one_line(err)
    if "scripts are no longer supported" in msg:
        fix = f"; read the Hub's parquet conversion instead: hf:{name}@{PARQUET_REVISION}"
    elif Path(name).exists():
        fix = ""
    else:
        fix = (
            "; a Hub dataset needs the network; without it, download its parquet files where the Hub can be reached"
            f" (hf download {name} --repo-type dataset --revision {PARQUET_REVISION} --local-dir DIR) and prepare"
            " the folder of the train split's .parquet files"
        )
    return SeedlabError(f"source: cannot load dataset {name!r} split {split!r} ({type(err).__name__}: {msg}){fix}")


def load_hf_texts(
    name_or_path: str,
    split: str = "train",
    text_field: str = "text",
    cache_dir: str | None = None,
    revision: str | None = None,
) -> Texts:
    """One split of a dataset, through Hugging Face ``datasets``.

    A local ``.jsonl``/``.json`` or ``.parquet`` file goes through the ``json`` / ``parquet``
    builders. Anything else is a Hub name (e.g. ``Skylion007/openwebtext`` at ``revision``
    ``refs/convert/parquet``) or a local dataset folder: ``datasets`` finds the split's data
    files; parquet files are then streamed (:class:`FileTexts`, nothing cached on disk), other
    formats loaded with ``datasets.load_dataset`` (which needs the network or a filled cache).
    """
    try:
        import datasets
    except ImportError:  # pragma: no cover - dependency
        raise SeedlabError(
            "source: Hugging Face datasets need the 'datasets' package (pip install 'seedlab[twins]')"
        ) from None
    p = Path(name_or_path)
    try:
        if p.is_file() and p.suffix in (".jsonl", ".json"):
            ds = datasets.load_dataset("json", data_files=str(p), split=split, cache_dir=cache_dir)
        elif p.is_file() and p.suffix == ".parquet":
            ds = datasets.load_dataset("parquet", data_files=str(p), split=split, cache_dir=cache_dir)
        else:
            builder = datasets.load_dataset_builder(name_or_path, revision=revision, cache_dir=cache_dir)
            data_files = builder.config.data_files or {}
            if split not in data_files:
                found = ", ".join(str(k) for k in data_files) or "none"
                raise SeedlabError(f"source: dataset {name_or_path!r} has no split {split!r} (splits: {found})")
            files = [str(f) for f in data_files[split]]
            if files and all(_suffix(f) == ".parquet" for f in files):
                texts = FileTexts(files, text_field)
                _open_parquet(texts.files[0], text_field).close()  # the text column is there
                return texts
            ds = datasets.load_dataset(
                name_or_path, split=split, revision=revision, cache_dir=cache_dir, streaming=False
            )
    except SeedlabError:
        raise
    except Exception as err:  # network, missing dataset, bad split: one line
        raise _dataset_error(name_or_path, split, err) from None
    if text_field not in ds.column_names:
        raise SeedlabError(
            f"source: dataset {name_or_path!r} has no {text_field!r} column (columns: {ds.column_names})"
        )
    return HFTexts(ds, text_field)


def read_txt(path: Path) -> list[str]:
    """Documents of a text file: paragraphs separated by blank lines."""
    text = path.read_text(encoding="utf-8")
    return [d.strip() for d in re.split(r"\n[ \t\r\f\v]*\n", text) if d.strip()]


def jsonl_objects(path: Path, text_field: str = "text") -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSONL file, each checked to be an object with
    a string ``text_field``; a line that is not is a one-line error naming it."""
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
            yield i, obj


def iter_jsonl(path: Path, text_field: str = "text") -> Iterator[str]:
    """The ``text_field`` of each row of a JSONL file, line by line."""
    return (obj[text_field] for _, obj in jsonl_objects(path, text_field))


def read_jsonl(path: Path, text_field: str = "text") -> list[str]:
    return list(iter_jsonl(path, text_field))


class _ParquetFile:
    """An open parquet file (local or a URL) and the file object under it."""

    def __init__(self, path: str | Path, text_field: str):
        import pyarrow.parquet as pq

        self.path = path
        self.fobj: Any = None
        try:
            if _is_url(str(path)):
                import fsspec

                self.fobj = fsspec.open(str(path), "rb").open()
                self.pf = pq.ParquetFile(self.fobj)
            else:
                self.pf = pq.ParquetFile(path)
        except Exception as err:
            self.close()
            raise SeedlabError(f"{path}: cannot read it as parquet ({type(err).__name__}: {_one_line(err)})") from None
        if text_field not in self.pf.schema_arrow.names:
            self.close()
            raise SeedlabError(f"{path}: cannot read a {text_field!r} column (columns: {self.pf.schema_arrow.names})")

    def close(self) -> None:
        if getattr(self, "pf", None) is not None:
            self.pf.close()
        if self.fobj is not None:
            self.fobj.close()


def _open_parquet(path: str | Path, text_field: str) -> _ParquetFile:
    return _ParquetFile(path, text_field)


def iter_parquet(path: str | Path, text_field: str = "text", rows: int | None = None) -> Iterator[str]:
    """The ``text_field`` column of a parquet file, ``rows`` rows at a time (default ``_PARQUET_ROWS``;
    a null is an empty document)."""
    f = _open_parquet(path, text_field)
    try:
        batches = f.pf.iter_batches(batch_size=rows or _PARQUET_ROWS, columns=[text_field])
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception as err:
                raise SeedlabError(f"{path}: reading failed ({type(err).__name__}: {_one_line(err)})") from None
            for t in batch.column(0).to_pylist():
                yield "" if t is None else str(t)
    finally:
        f.close()


def read_parquet(path: Path, text_field: str = "text") -> list[str]:
    return list(iter_parquet(path, text_field))


def _count_file(path: str | Path, text_field: str) -> int:
    if _suffix(path) == ".parquet":
        f = _open_parquet(path, text_field)
        try:
            return int(f.pf.metadata.num_rows)
        finally:
            f.close()
    return sum(1 for _ in _iter_file(path, text_field))


def _iter_file(path: str | Path, text_field: str) -> Iterator[str]:
    suffix = _suffix(path)
    if suffix == ".parquet":
        return iter_parquet(path, text_field)
    if suffix == ".jsonl":
        return iter_jsonl(Path(path), text_field)
    return iter(read_txt(Path(path)))


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


def load_texts(
    source: str | Path,
    *,
    text_field: str = "text",
    max_bytes: int | None = None,
    cache_dir: str | None = None,
    allow_partial: bool = False,
) -> tuple[Texts, dict[str, Any]]:
    """Documents of ``source`` in a fixed order, and a description of where they came from.

    ``source``: ``embedded``; a ``.txt``/``.jsonl``/``.parquet`` file or a folder of them (read in
    sorted path order, e.g. the ``.parquet`` shards of a Hub dataset's parquet conversion);
    ``openwebtext`` (= ``hf:Skylion007/openwebtext@refs/convert/parquet``); or ``hf:NAME[@REVISION]``,
    a Hugging Face dataset's ``train`` split. Files and parquet datasets are streamed, not loaded.

    A partial parquet conversion (:func:`partial_files`: the Hub converted only the first ~5 GB of
    the dataset, OpenWebText included) is refused, from the Hub or downloaded to a folder, unless
    ``allow_partial``; then the description says ``partial: true``.
    """
    s = str(source)
    info: dict[str, Any] = {"source": s}
    if s == "embedded":
        docs = embedded_texts(max_bytes)
        info.update(kind="embedded", stdlib=str(_stdlib_root()), max_bytes=max_bytes)
        return docs, info
    if s == "openwebtext" or s.startswith("hf:"):
        name, revision = (OPENWEBTEXT, PARQUET_REVISION) if s == "openwebtext" else _hf_name(s[3:])
        info.update(kind="huggingface", dataset=name, split="train", text_field=text_field)
        if revision is not None:
            info["revision"] = revision
        texts = load_hf_texts(name, "train", text_field, cache_dir=cache_dir, revision=revision)
        if isinstance(texts, FileTexts):
            info["files"] = [str(f) for f in texts.files]
            _check_partial(f"dataset {name!r}", texts.files, info, allow_partial)
        return texts, info
    p = Path(s)
    if p.is_file():
        info.update(kind="file")
        _check_partial(f"file {s!r}", [p], info, allow_partial)
        return FileTexts([p], text_field), info
    if p.is_dir():
        files = sorted(
            (f for f in p.rglob("*") if f.is_file() and f.suffix in FILE_SUFFIXES),
            key=lambda f: f.relative_to(p).as_posix(),
        )
        if not files:
            raise SeedlabError(f"source: folder {s!r} holds no .txt, .jsonl or .parquet files")
        info.update(kind="folder", files=[f.relative_to(p).as_posix() for f in files])
        _check_partial(f"folder {s!r}", files, info, allow_partial)
        return FileTexts(files, text_field), info
    raise SeedlabError(f"source: {s!r} is neither a file, a folder, 'embedded', 'openwebtext' nor 'hf:<dataset>'")


def partial_files(files: list[str] | list[Path] | list[str | Path]) -> list[str]:
    """The files of ``files`` that belong to a partial parquet conversion: ``.parquet`` files in a folder
    named ``partial-*`` (``plain_text/partial-train/0000.parquet``), the Hub's layout when it converted
    only the first ~5 GB of a dataset. A local path is judged by its absolute path, so the folder of
    the shards itself counts."""
    out = []
    for f in files:
        path = Path(str(f).split("?")[0]) if _is_url(str(f)) else Path(f).absolute()
        if path.suffix == ".parquet" and path.parent.name.startswith("partial-"):
            out.append(str(f))
    return out


def _check_partial(what: str, files: list[str] | list[Path] | list[str | Path], info: dict[str, Any], allow: bool) -> None:
    """Refuse a partial parquet conversion (one line, before anything is written) unless ``allow``;
    when allowed, ``info`` (the corpus's meta.json ``source``) records ``partial: true``."""
    partial = partial_files(files)
    if not partial:
        return
    if not allow:
        raise SeedlabError(
            f"source: {what} is a partial parquet conversion ({len(partial)} of {len(files)} files lie under "
            f"{Path(partial[0].split('?')[0]).parent.name}/: the Hub converted only the first ~5 GB of the dataset); "
            "prepare it anyway with --allow-partial (prepare(..., allow_partial=True)), recorded as partial in meta.json"
        )
    info["partial"] = True


def _hf_name(s: str) -> tuple[str, str | None]:
    """``NAME[@REVISION]`` -> (NAME, REVISION or None); an existing local path is taken whole."""
    if "@" in s and not Path(s).exists():
        name, _, revision = s.partition("@")
        if not name or not revision:
            raise SeedlabError(f"source: 'hf:{s}' is not 'hf:NAME' or 'hf:NAME@REVISION'")
        return name, revision
    return s, None
