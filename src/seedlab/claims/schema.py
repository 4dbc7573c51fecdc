"""The claims ledger: one entry per finding, in ``docs/claims/<study>.yaml`` (DESIGN.md, "Findings are data").

An entry holds the one sentence README and the results pages may use for a finding (its *wording*), its
status, the design it was measured on (*scope*), the files and keys of every number it quotes (*evidence*)
and, when confirmed, the pre-registered decision that passed. :func:`load` validates everything a render or
a check relies on and fails on bad input with one line naming the ledger file, the entry and the field (a
:class:`SeedlabError`, exit code 2):

- each entry's fields and their types (unknown fields refused);
- the rules between its fields (status and ``superseded_by``, ``why``, ``decision``; the id's study; every
  quote a number written in the wording, read from one of the evidence files);
- the rules between entries (unique ids; ``superseded_by`` names another entry; at most :data:`FRONT_MAX` front-page
  findings a study);
- the files (evidence, pre-registration and record files exist inside the repository; every key reads).

What the files then say (a decision passed, a number agrees with its quote) is checks.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from seedlab.claims.evidence import parse_key, parse_quote, quoted_in, read_number, read_value
from seedlab.config import parse
from seedlab.errors import SeedlabError

#: the studies, in the order README and the index list them; each has its ledger file and results page
STUDIES = ("shortcut", "twins", "attribution")
STATUSES = ("confirmed", "exploratory", "withdrawn", "superseded")
#: the statuses of a finding that stands (README states these; the others are shown only as withdrawn)
LIVE = ("confirmed", "exploratory")
#: README's front page holds at most this many findings per study (the rest: the results page and the index)
FRONT_MAX = 4


def ledger_file(study: str) -> str:
    """Where a study's entries live, from the repository root."""
    return f"docs/claims/{study}.yaml"


class _Entry(BaseModel):
    """A part of a ledger entry: unknown fields refused, numbers accepted where text is asked
    (``rows_per_batch: 16``), immutable once read."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)


class Scope(_Entry):
    """Where a claim was measured, as its readers need it to know where it holds."""

    model: str = Field(description="the model, e.g. 'GPT mini (2 layers, d 64)'")
    rows_per_batch: str | None = Field(None, description="rows per batch (B)")
    lr: str | None = Field(None, description="the learning rate and its schedule")
    steps_after_s: str | None = Field(None, description="updates after the injection step s")
    seeds: str = Field(description="the seeds, e.g. '1000-1007 (fresh)'")
    other: str | None = Field(None, description="anything else that bounds it (corpus, preset, ...)")


class Number(_Entry):
    """One number the wording quotes, and where it is read: ``file`` (one of the evidence files) at
    ``key``; the file's value times ``scale`` must lie within ``tolerance`` of the quote (by default the
    quote's own rounding: half a unit in its last digit). ``exp10``: the file holds the number's log10 (a factor
    quoted as x1.02 from a log10 residual), so 10 ** value is compared."""

    quote: str = Field(strict=True, description="exactly as the wording writes it, e.g. '0.043', '23.5%'")
    file: str
    key: Any
    scale: float = 1.0
    tolerance: float | None = Field(None, ge=0)
    exp10: bool = False


class Evidence(_Entry):
    """What shows the claim: the command that writes the files, the files, the numbers read from them."""

    command: str
    files: list[str] = Field(min_length=1)
    numbers: list[Number] = []


class Record(_Entry):
    """Where a decision's verdict is written in a file: ``key`` there holds ``expect``."""

    file: str
    key: Any
    expect: Any


class Decision(_Entry):
    """The pre-registered decision a confirmed claim rests on, quoted as it was fixed."""

    preregistration: str
    id: str
    rule: str
    verdict: Literal["passed", "failed"]
    record: Record | None = None
    equivalence: bool = Field(False, description="a passed equivalence test (TOST, margin fixed in advance)")


class Claim(_Entry):
    """One finding: its wording and everything that says how far the wording may be believed."""

    id: str
    study: Literal["shortcut", "twins", "attribution"]
    wording: str
    status: Literal["confirmed", "exploratory", "withdrawn", "superseded"]
    superseded_by: str | None = None
    why: str | None = None
    scope: Scope
    evidence: Evidence
    decision: Decision | None = None
    #: on README's front page: one of the study's few headline findings (at most :data:`FRONT_MAX`); every
    #: finding is on its results page and in docs/results.md's index either way
    front: bool = False

    @property
    def live(self) -> bool:
        """Whether the finding stands (confirmed or exploratory)."""
        return self.status in LIVE


@dataclass(frozen=True)
class Ledger:
    """Every entry of the three ledger files, in file order (studies in :data:`STUDIES` order)."""

    claims: tuple[Claim, ...]
    present: tuple[str, ...] = ()  # the studies whose ledger file exists

    def of(self, study: str) -> list[Claim]:
        """The study's entries, in its file's order."""
        return [c for c in self.claims if c.study == study]


def load(root: Path) -> Ledger:
    """The ledger under ``root`` (the repository), validated (see the module's docstring). A study without
    a ledger file has no entries yet. Bad input: one line, the first problem (and how many more)."""
    root, problems, found, present = Path(root), [], [], []
    for study in STUDIES:
        file = ledger_file(study)
        if (root / file).is_file():
            present.append(study)
        for i, raw in enumerate(_raw_entries(root, file, problems)):
            name = raw["id"] if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"claims[{i}]"
            try:
                claim = parse(Claim, raw)
            except SeedlabError as err:
                problems.append(f"{file}: {name}: {err}")
                continue
            where = f"{file}: {claim.id}"
            problems += [f"{where}: {field}: {what}" for field, what in _entry_problems(claim, study)]
            problems += [f"{where}: {field}: {what}" for field, what in _file_problems(claim, root)]
            found.append(claim)
    problems += list(_ledger_problems(found))
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise SeedlabError(problems[0] + more)
    return Ledger(tuple(found), tuple(present))


def _raw_entries(root: Path, file: str, problems: list[str]) -> list[Any]:
    """The entries a ledger file holds as YAML gives them ([] when the file does not exist)."""
    path = root / file
    if not path.is_file():
        return []
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problems.append(f"{file}: not valid YAML{f' (line {mark.line + 1})' if mark else ''}")
        return []
    if not (isinstance(data, dict) and set(data) == {"claims"} and isinstance(data["claims"], list)):
        problems.append(f"{file}: must hold one field, claims: a list of entries")
        return []
    return data["claims"]


def _entry_problems(claim: Claim, study: str) -> Iterator[tuple[str, str]]:
    """(field, what is wrong) for each rule between an entry's own fields."""
    if claim.study != study:
        yield "study", f"{ledger_file(study)} holds the {study} study's claims, got {claim.study!r}"
    if not re.fullmatch(rf"{re.escape(claim.study)}\.[a-z0-9][a-z0-9-]*", claim.id):
        yield "id", f"'{claim.study}.<slug>' (lowercase letters, digits, hyphens), got {claim.id!r}"
    if claim.status == "superseded" and not claim.superseded_by:
        yield "superseded_by", "required when status is superseded (the id of the claim that replaced it)"
    if claim.status != "superseded" and claim.superseded_by:
        yield "superseded_by", f"only a superseded claim has one (status is {claim.status})"
    if claim.status in ("withdrawn", "superseded") and not claim.why:
        yield "why", f"required when status is {claim.status} (what withdrew it)"
    if claim.status == "confirmed" and claim.decision is None:
        yield "decision", "required when status is confirmed (the pre-registered decision that passed)"
    if claim.status != "confirmed" and claim.decision is not None:
        yield "decision", f"only a confirmed claim has one (status is {claim.status})"
    if claim.front and not claim.live:
        yield "front", f"only a standing finding (confirmed or exploratory) is on the front page (status is {claim.status})"
    for i, n in enumerate(claim.evidence.numbers):
        field = f"evidence.numbers[{i}]"
        try:
            parse_quote(n.quote)
        except ValueError as err:
            yield f"{field}.quote", str(err)
        else:
            if not quoted_in(n.quote, claim.wording):
                yield f"{field}.quote", f"{n.quote!r} is not written in the wording"
        if n.file not in claim.evidence.files:
            yield f"{field}.file", f"one of evidence.files ({', '.join(claim.evidence.files)}), got {n.file!r}"
        try:
            parse_key(n.file, n.key)
        except ValueError as err:
            yield f"{field}.key", str(err)
    record = claim.decision.record if claim.decision else None
    if record is not None:
        try:
            parse_key(record.file, record.key)
        except ValueError as err:
            yield "decision.record.key", str(err)


def _file_problems(claim: Claim, root: Path) -> Iterator[tuple[str, str]]:
    """(field, what is wrong) for each file an entry names that is missing or does not hold its key."""
    for i, file in enumerate(claim.evidence.files):
        if not _inside(root, file):
            yield f"evidence.files[{i}]", f"no such file {file} in the repository"
    for i, n in enumerate(claim.evidence.numbers):
        if n.file in claim.evidence.files and _inside(root, n.file):
            try:
                read_number(root, n.file, n.key)
            except ValueError as err:  # EvidenceError: what the key reads is missing
                yield f"evidence.numbers[{i}].key", str(err)
    if claim.decision is not None:
        if not _inside(root, claim.decision.preregistration):
            yield "decision.preregistration", f"no such file {claim.decision.preregistration} in the repository"
        record = claim.decision.record
        if record is not None and not _inside(root, record.file):
            yield "decision.record.file", f"no such file {record.file} in the repository"
        elif record is not None:
            try:
                read_value(root, record.file, record.key)
            except ValueError as err:  # EvidenceError: what the key reads is missing
                yield "decision.record.key", str(err)


def _inside(root: Path, file: str) -> bool:
    """Whether ``file`` (relative to the repository root) is a file inside the repository."""
    path = (root / file).resolve()
    return not Path(file).is_absolute() and path.is_relative_to(root.resolve()) and path.is_file()


def _ledger_problems(claims: list[Claim]) -> Iterator[str]:
    """What is wrong between entries: an id twice, a ``superseded_by`` that names no other entry."""
    first: dict[str, Claim] = {}
    for c in claims:
        if c.id in first:
            yield f"{ledger_file(c.study)}: {c.id}: id: also an entry of {ledger_file(first[c.id].study)} (ids are unique)"
        first.setdefault(c.id, c)
    for c in claims:
        if c.superseded_by and (c.superseded_by not in first or c.superseded_by == c.id):
            yield f"{ledger_file(c.study)}: {c.id}: superseded_by: names no other entry of the ledger, got {c.superseded_by!r}"
    for study in STUDIES:
        front = [c for c in claims if c.study == study and c.front]
        if len(front) > FRONT_MAX:
            yield (f"{ledger_file(study)}: {front[FRONT_MAX].id}: front: at most {FRONT_MAX} of a study's findings are on "
                   f"README's front page, got {len(front)}")
