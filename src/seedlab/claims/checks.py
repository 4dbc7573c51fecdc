"""The ledger's rules: words follow decisions, numbers follow their files, the pages follow the ledger.

:func:`check` runs every rule on a loaded ledger (bad input was refused when it was loaded) and returns one
:class:`Violation` per breach:

- the rendered blocks equal what the pages hold (README.md, docs/results.md, each results page);
- a confirmed claim's decision passed, its pre-registration names the decision's id, and its record (when
  given) holds what it expects;
- every quoted number is what its evidence file holds (within the quote's rounding, or the tolerance);
- a withdrawn or superseded wording appears nowhere in README.md or docs/ outside the rendered blocks
  (where it is shown struck through beside its status);
- the wording of a standing claim follows its status (:data:`PHRASES`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from seedlab.claims.evidence import BLOCK, agrees, parse_quote, read_number, read_value
from seedlab.claims.render import pages
from seedlab.claims.schema import Claim, Ledger, ledger_file
from seedlab.errors import SeedlabError


@dataclass(frozen=True)
class Violation:
    """One breach of a rule: where (a page, or a ledger entry and its field) and what."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _equivalence(claim: Claim) -> bool:
    return claim.decision is not None and claim.decision.verdict == "passed" and claim.decision.equivalence


@dataclass(frozen=True)
class PhraseRule:
    """A phrase a standing claim's wording may use only where ``allowed(claim)``: ``pattern`` is matched,
    case-insensitive, on the wording with its whitespace collapsed; ``needs`` says what would allow it."""

    pattern: str
    allowed: Callable[[Claim], bool]
    needs: str


#: Words follow decisions. Each phrase below claims more than an exploratory reading or a failed test can
#: carry; a standing (confirmed or exploratory) claim uses it only beside the decision that licenses it.
#: Withdrawn and superseded wordings are exempt: they quote what was said, and are shown as withdrawn.
#: Add a rule here when a review finds another phrase that says more than its decision.
PHRASES: tuple[PhraseRule, ...] = (
    # "confirmed" (and "confirms", "confirmatory") only beside a pre-registered decision that passed
    PhraseRule(r"\bconfirm", lambda c: c.status == "confirmed", "status confirmed (a pre-registered decision that passed)"),
    # "no difference shown" is not "alike": these need a passed equivalence test (TOST, a margin fixed in
    # advance). "the same" naming the design ("the same seeds", "on the same machine") is not a result;
    # "bitwise identical / equal to" is exact and checked by a test, not an estimate.
    *(PhraseRule(p, _equivalence, "decision.equivalence: true (a passed equivalence test)") for p in (
        r"\bthe same\b(?!\s+(?:seeds?|machines?|designs?|runs?|steps?|presets?|schedules?|prefix|corpus|data)\b)",
        r"\bany row's\b",
        r"(?<!bitwise )\bequal to\b",
        r"\bno different\b",
        r"(?<!bitwise )\bidentical\b",
    )),
)


def normalised(text: str) -> str:
    """``text`` as the withdrawn-wording search compares it: emphasis and code marks dropped, every run of
    whitespace one space, lower case."""
    return " ".join(re.sub(r"[*`]", "", text).split()).lower()


def check(ledger: Ledger, root: Path) -> list[Violation]:
    """Every rule on ``ledger`` and the pages under ``root``: the violations, pages first, then entries
    in ledger order."""
    out = list(_stale_pages(ledger, root))
    out += _withdrawn_wordings(ledger, root)
    for claim in ledger.claims:
        where = f"{ledger_file(claim.study)}: {claim.id}"
        for field, what in (*_decision(claim, root), *_numbers(claim, root), *_phrases(claim)):
            out.append(Violation(f"{where}: {field}", what))
    return out


def _stale_pages(ledger: Ledger, root: Path) -> Iterator[Violation]:
    """A page whose blocks differ from the ledger's rendering (or that cannot hold them)."""
    try:
        rendered = pages(ledger, root)
    except SeedlabError as err:
        page, _, what = str(err).partition(": ")
        yield Violation(page, what)
        return
    for p in rendered:
        if p.stale:
            yield Violation(p.path, "its claims blocks differ from the ledger's rendering (run: make claims)")


def _decision(claim: Claim, root: Path) -> Iterator[tuple[str, str]]:
    """A confirmed claim's decision: passed, named in its pre-registration, and as recorded."""
    d = claim.decision
    if claim.status != "confirmed" or d is None:
        return
    if d.verdict != "passed":
        yield "decision.verdict", f"a confirmed claim needs a decision that passed, got {d.verdict!r}"
    if not re.search(rf"(?<!\w){re.escape(d.id)}(?!\w)", (root / d.preregistration).read_text()):
        yield "decision.id", f"{d.id!r} is not written in {d.preregistration}"
    if d.record is not None:
        got = read_value(root, d.record.file, d.record.key)
        if not (got == d.record.expect or str(got).lower() == str(d.record.expect).lower()):
            yield "decision.record", f"{d.record.file} holds {got!r} at {d.record.key!r}, not {d.record.expect!r}"


def _numbers(claim: Claim, root: Path) -> Iterator[tuple[str, str]]:
    """Each quoted number against the value its file holds."""
    for i, n in enumerate(claim.evidence.numbers):
        value, quote = read_number(root, n.file, n.key), parse_quote(n.quote)
        if n.exp10:
            value = 10.0 ** value
        if not agrees(value, quote, n.scale, n.tolerance):
            allowed = quote.rounding if n.tolerance is None else n.tolerance
            scaled = f" x {n.scale:g} = {value * n.scale:.6g}" if n.scale != 1 else ""
            yield f"evidence.numbers[{i}]", (f"{n.file} holds {value:.6g}{scaled}, the wording writes {n.quote} "
                                             f"(tolerance {allowed:g})")


def _phrases(claim: Claim) -> Iterator[tuple[str, str]]:
    """Each phrase of a standing claim's wording that its status or decision does not license."""
    if not claim.live:
        return
    text = " ".join(claim.wording.split())
    for rule in PHRASES:
        m = re.search(rule.pattern, text, re.I)
        if m and not rule.allowed(claim):
            yield "wording", f"says {m.group(0)!r}, which needs {rule.needs}"


#: pages the withdrawn-wording search leaves out: the pre-registrations are frozen before their runs (the
#: runs keep their SHA-256) and state hypotheses, not findings
FROZEN = ("docs/preregistration/",)


def _withdrawn_wordings(ledger: Ledger, root: Path) -> Iterator[Violation]:
    """Each page (README.md, docs/**/*.md) that states a withdrawn or superseded wording outside the
    rendered blocks."""
    gone = [c for c in ledger.claims if not c.live]
    if not gone:
        return
    docs = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for path in (p for p in docs if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(FROZEN):
            continue
        text = normalised(BLOCK.sub(" ", path.read_text()))
        for c in gone:
            if normalised(c.wording).rstrip(".;:") in text:
                yield Violation(rel, f"states {c.id}'s wording, which is {c.status} (see {ledger_file(c.study)})")
