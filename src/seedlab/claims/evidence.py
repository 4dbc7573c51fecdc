"""Evidence: a number read by its key from a committed file, and a quoted number compared with it.

A claim's wording quotes numbers literally ("0.043", "23.5%", "1,000", "2.4x"); each quote names the file
it comes from and a key that reads it there:

- ``.json`` / ``.yaml``: a dotted path, integers index lists (``"verdict.value"``, ``"cells.0.distance"``);
- ``.csv`` / ``.parquet``: ``{where: {column: value, ...}, column: name}``, exactly one row matching (values
  compared as strings after ``str()``);
- ``.md``: ``{section: "heading prefix", pattern: "regex with one group"}``, float of group 1 of the first
  match under the first heading (outside code fences) that starts with the prefix, up to the next heading
  of the same or a higher level; the rendered claims blocks are not part of the text (a claim cannot be
  its own evidence).

Every failure to read is an :class:`EvidenceError` whose message says what is missing where.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

#: a numeric quote: sign, digits (thousands separated by commas or not), decimals, exponent, a unit
_NUMBER = re.compile(r"([+\-−]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?:[eE]([+\-−]?\d+))?\s*(%|x|×)?")
#: the file types a key can read, by suffix
PATH_FILES, TABLE_FILES, TEXT_FILES = (".json", ".yaml", ".yml"), (".csv", ".parquet"), (".md",)
#: a rendered claims block (render.py writes them); removed from a page before it is read as evidence
BLOCK = re.compile(r"<!-- claims:begin (\S+) -->.*?<!-- claims:end \1 -->", re.S)


class EvidenceError(ValueError):
    """A key that does not read a number from its file (the message says what is missing where)."""


@dataclass(frozen=True)
class Quote:
    """A number as a claim's wording writes it: its value, and how far a value may lie from it and
    still be written this way (half a unit in the last digit written)."""

    text: str
    value: float
    rounding: float


def parse_quote(text: str) -> Quote:
    """``text`` as a :class:`Quote`: an optional sign (``-``, ``−``, ``+``), thousands separators, an
    exponent, a trailing ``%`` or ``x``/``×`` (dropped: the unit is the wording's, ``scale`` maps the
    file's value to it). Anything else is a ValueError."""
    m = _NUMBER.fullmatch(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a number (digits, optional sign, thousands commas, % or x)")
    sign, whole, decimals, exponent, _unit = m.groups()
    exp = int(exponent.replace("−", "-")) if exponent else 0
    mantissa = float(whole.replace(",", "") + (f".{decimals}" if decimals else ""))
    value = (-1 if sign in ("-", "−") else 1) * mantissa * 10.0**exp
    return Quote(text, value, 0.5 * 10.0 ** (exp - len(decimals or "")))


def quoted_in(quote: str, wording: str) -> bool:
    """Whether ``quote`` is written in ``wording`` as a number of its own (not inside a longer one:
    "5.4" is not in "15.4" or "5.41")."""
    return re.search(rf"(?<![\d.,]){re.escape(quote)}(?![\d])(?!,\d)", wording) is not None


def agrees(value: float, quote: Quote, scale: float = 1.0, tolerance: float | None = None) -> bool:
    """Whether the file's ``value`` times ``scale`` is what ``quote`` writes: within ``tolerance``, by
    default within the quote's rounding (a relative 1e-9 more absorbs the float's own representation)."""
    allowed = quote.rounding if tolerance is None else tolerance
    shown = value * scale
    return math.isfinite(shown) and abs(shown - quote.value) <= allowed + 1e-9 * max(1.0, abs(quote.value))


# --------------------------------------------------------------------------- keys


@dataclass(frozen=True)
class TableKey:
    """A cell of a table: the one row whose columns hold ``where``'s values, its column ``column``."""

    where: dict[str, Any]
    column: str

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.where.items())


@dataclass(frozen=True)
class TextKey:
    """A number in a results page: group 1 of ``pattern``'s first match in the section ``section``."""

    section: str
    pattern: re.Pattern


def parse_key(file: str, raw: Any) -> str | TableKey | TextKey:
    """The key ``raw`` for a file of ``file``'s type, or a ValueError saying what that type's key is."""
    suffix = Path(file).suffix.lower()
    if suffix in PATH_FILES:
        if not isinstance(raw, str) or not raw:
            raise ValueError(f'a {suffix} file takes a dotted path ("verdict.value", "cells.0.distance"), got {raw!r}')
        return raw
    if suffix in TABLE_FILES:
        if not (isinstance(raw, dict) and set(raw) == {"where", "column"} and isinstance(raw["where"], dict)
                and raw["where"] and isinstance(raw["column"], str)):
            raise ValueError(f"a {suffix} file takes {{where: {{column: value, ...}}, column: name}}, got {raw!r}")
        return TableKey(dict(raw["where"]), raw["column"])
    if suffix in TEXT_FILES:
        if not (isinstance(raw, dict) and set(raw) == {"section", "pattern"}
                and all(isinstance(v, str) and v for v in raw.values())):
            raise ValueError(f'a .md file takes {{section: "heading prefix", pattern: "regex with one group"}}, got {raw!r}')
        try:
            pattern = re.compile(raw["pattern"])
        except re.error as err:
            raise ValueError(f"pattern {raw['pattern']!r} is not a regular expression ({err})") from None
        if pattern.groups != 1:
            raise ValueError(f"pattern {raw['pattern']!r} has {pattern.groups} groups, not one")
        return TextKey(raw["section"], pattern)
    raise ValueError(f"no key reads a {suffix or 'suffix-less'} file (json, yaml, csv, parquet or md)")


# --------------------------------------------------------------------------- reading


def read_value(root: Path, file: str, raw_key: Any) -> Any:
    """What ``raw_key`` reads from ``root / file``, as the file holds it (a JSON value, a table cell, the
    matched text of a page); an :class:`EvidenceError` when the file or the key's target is missing."""
    path = root / file
    if not path.is_file():
        raise EvidenceError(f"no such file {file}")
    key = parse_key(file, raw_key)
    try:
        if isinstance(key, TableKey):
            return _cell(_load_table(*_stamp(path)), key, file)
        if isinstance(key, TextKey):
            return _in_section(path.read_text(), key, file)
        return _at_path(_load_tree(*_stamp(path)), key, file)
    except EvidenceError:
        raise
    except (ValueError, yaml.YAMLError, csv.Error, OSError) as err:  # ValueError: JSON's, Arrow's
        raise EvidenceError(f"{file} cannot be read ({str(err).splitlines()[0]})") from None


def read_number(root: Path, file: str, raw_key: Any) -> float:
    """The number ``raw_key`` reads from ``root / file`` (a number, or text written as one)."""
    value = read_value(root, file, raw_key)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise EvidenceError(f"{raw_key!r} in {file} holds {value!r}, not a number")
    if isinstance(value, str):
        try:
            return float(value) if value.strip().lower() in ("nan", "inf", "-inf") else parse_quote(value).value
        except ValueError:
            raise EvidenceError(f"{raw_key!r} in {file} holds {value!r}, not a number") from None
    return float(value)


def _at_path(tree: Any, key: str, file: str) -> Any:
    node = tree
    for i, part in enumerate(key.split(".")):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            raise EvidenceError(f"no {'.'.join(key.split('.')[: i + 1])} in {file}")
    return node


def _cell(rows: list[dict[str, Any]], key: TableKey, file: str) -> Any:
    columns = list(rows[0]) if rows else []
    for name in (*key.where, key.column):
        if name not in columns:
            raise EvidenceError(f"no column {name} in {file} (columns: {', '.join(columns) or 'none'})")
    found = [r for r in rows if all(str(r[k]) == str(v) for k, v in key.where.items())]
    if len(found) != 1:
        raise EvidenceError(f"{'no' if not found else len(found)} row{'s' if len(found) > 1 else ''} where {key} in {file}"
                            + (" (the key must pick exactly one)" if found else ""))
    return found[0][key.column]


def _in_section(text: str, key: TextKey, file: str) -> str:
    body = section(text, key.section)
    if body is None:
        raise EvidenceError(f"no heading starting {key.section!r} in {file}")
    m = key.pattern.search(body)
    if m is None:
        raise EvidenceError(f"no match of {key.pattern.pattern!r} under {key.section!r} in {file}")
    return m.group(1)


def section(text: str, prefix: str) -> str | None:
    """The text under the first heading (any level, outside code fences) whose title starts with
    ``prefix``, up to the next heading of the same or a higher level; without the rendered claims blocks.
    None when no heading starts so."""
    lines, fenced, start, level = BLOCK.sub("", text).splitlines(), False, None, 0
    for i, line in enumerate(lines):
        if re.match(r"\s*(```|~~~)", line):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m and start is None and m.group(2).startswith(prefix):
            start, level = i + 1, len(m.group(1))
        elif m and start is not None and len(m.group(1)) <= level:
            return "\n".join(lines[start:i])
    return None if start is None else "\n".join(lines[start:])


# parsed files, once per content (a check reads one results page for many numbers)
def _stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


@lru_cache(maxsize=64)
def _load_tree(path: str, _mtime: int, _size: int) -> Any:
    text = Path(path).read_text()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


@lru_cache(maxsize=64)
def _load_table(path: str, _mtime: int, _size: int) -> list[dict[str, Any]]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
