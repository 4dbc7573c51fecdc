"""The ledger rendered: README's "What we found", docs/results.md's index, each results page's claims table.

Pure functions from a :class:`Ledger` to markdown, and the one place that writes them: between the marker
lines ``<!-- claims:begin NAME -->`` and ``<!-- claims:end NAME -->`` of the page that holds block NAME
(:data:`PAGES`). Everything else on those pages is prose that people write; a render never touches it.
Links are written relative to the page that holds them.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from seedlab.claims.schema import STATUSES, STUDIES, Claim, Ledger, Scope, ledger_file
from seedlab.errors import SeedlabError
from seedlab.store import write_text

#: block name -> the page (from the repository root) whose markers hold it
PAGES = {"readme": "README.md", "index": "docs/results.md",
         **{study: f"docs/results/{study}.md" for study in STUDIES}}
COMMAND = "seedlab claims render"


def results_page(study: str) -> str:
    """The study's results page, from the repository root."""
    return PAGES[study]


def link(target: str, page: str) -> str:
    """``target`` (from the repository root) as a link from ``page``."""
    return Path(os.path.relpath(target, Path(page).parent)).as_posix()


def scope_short(scope: Scope) -> str:
    """The scope as README writes it: model, B, lr, steps after s, seeds (the fields the entry gives)."""
    steps = scope.steps_after_s
    parts = [scope.model, scope.rows_per_batch and f"B {scope.rows_per_batch}", scope.lr and f"lr {scope.lr}",
             steps and (f"s + {steps}" if re.fullmatch(r"[\d,]+", steps) else f"steps after s: {steps}"),
             f"seeds {scope.seeds}"]
    return ", ".join(p for p in parts if p)


def status_tag(claim: Claim, page: str) -> str:
    """The claim's status as a page shows it: **confirmed** with its pre-registered decision linked,
    *exploratory*, *withdrawn*, *superseded* by the id that replaced it."""
    if claim.status == "confirmed":
        d = claim.decision
        return f"**confirmed**, [pre-registered as {d.id}]({link(d.preregistration, page)})"
    if claim.status == "superseded":
        return f"*superseded* by `{claim.superseded_by}`"
    return f"*{claim.status}*"


def _counts(claims: list[Claim]) -> str:
    n = {s: sum(c.status == s for c in claims) for s in STATUSES}
    return ", ".join(f"{k} {s}" for s, k in n.items() if k) or "no claims entered yet"


def readme_block(ledger: Ledger, page: str = PAGES["readme"]) -> str:
    """README's "What we found": per study a bold name and its results page, then one bullet per front-page
    claim (``front: true``, confirmed or exploratory): the wording, (status; scope); then how many more
    findings stand and how many were withdrawn or superseded, all listed on the results page."""
    out = ["Each study's headline findings, from the ledger `docs/claims/` (`make claims`): what was found, then its "
           "status and where it was measured (model, rows per batch B, learning rate, updates after the injection "
           "step s, seeds). Every other finding, and every withdrawn or superseded one, is on the study's results "
           "page and in [docs/results.md](" + link(PAGES["index"], page) + ").", ""]
    for study in STUDIES:
        claims = ledger.of(study)
        out.append(f"**{study}** ([{results_page(study)}]({link(results_page(study), page)}))")
        front = [c for c in claims if c.front and c.live]
        out += [f"- {c.wording} ({status_tag(c, page)}; {scope_short(c.scope)})" for c in front]
        if not front:
            out.append(f"- *No front-page finding is entered yet* ({ledger_file(study)}).")
        rest = [c for c in claims if c.live and not c.front]
        gone = [c for c in claims if not c.live]
        more = [f"{len(rest)} more standing ({_counts(rest)})" if rest else "",
                f"{_counts(gone)}" if gone else ""]
        if any(more):
            out.append(f"- *Also on the results page:* {'; '.join(m for m in more if m)}.")
        out.append("")
    return "\n".join(out).rstrip()


def index_block(ledger: Ledger, page: str = PAGES["index"]) -> str:
    """docs/results.md's index: per study its counts by status and every claim, by id and status,
    withdrawn and superseded wordings struck through."""
    out = []
    for study in STUDIES:
        claims = ledger.of(study)
        out.append(f"**{study}** ([{link(results_page(study), page)}]({link(results_page(study), page)})): "
                   f"{_counts(claims)}")
        for c in claims:
            wording = c.wording if c.live else f"~~{c.wording}~~"
            out.append(f"- [`{c.id}`]({link(results_page(study), page)}) ({status_tag(c, page)}): {wording}")
        out.append("")
    return "\n".join(out).rstrip()


def command(text: str) -> str:
    """An evidence command as code; from its first `` (`` on, a note about it, shown as text
    (``seedlab twins report runs/x (its report.md, transcribed into docs/results/twins.md); the ...``)."""
    m = re.fullmatch(r"(.*?)\s+(\(.*)", text.strip(), re.S)
    return f"`{m.group(1)}` {m.group(2)}" if m else f"`{text.strip()}`"


def _cell(text: str) -> str:
    """Text as one markdown table cell (pipes escaped, lines joined)."""
    return " ".join(text.split()).replace("|", "\\|")


def study_table(ledger: Ledger, study: str) -> str:
    """A results page's claims table: every claim of the study, withdrawn and superseded ones
    included: id | status | claim | scope | evidence (command; files)."""
    page, claims = results_page(study), ledger.of(study)
    source = (f"[{ledger_file(study)}]({link(ledger_file(study), page)})" if study in ledger.present
              else f"`{ledger_file(study)}`")
    head = f"**Claims** ({_counts(claims)}), rendered from {source} by `{COMMAND}`; the record of runs follows."
    if not claims:
        return head
    rows = ["| id | status | claim | scope | evidence |", "|---|---|---|---|---|"]
    for c in claims:
        status = status_tag(c, page)
        if c.decision:
            status += f": {c.decision.rule}, {c.decision.verdict}"
        if c.why:
            status += f" — {c.why}"
        scope = scope_short(c.scope) + (f"; {c.scope.other}" if c.scope.other else "")
        files = ", ".join(f"[{Path(f).name}]({link(f, page)})" for f in c.evidence.files)
        wording = c.wording if c.live else f"~~{c.wording}~~"
        rows.append("| " + " | ".join(_cell(x) for x in (
            f"`{c.id}`", status, wording, scope, f"{command(c.evidence.command)}; {files}")) + " |")
    return head + "\n\n" + "\n".join(rows)


def blocks(ledger: Ledger) -> dict[str, str]:
    """Every block's rendered text, by block name."""
    return {"readme": readme_block(ledger), "index": index_block(ledger),
            **{study: study_table(ledger, study) for study in STUDIES}}


# --------------------------------------------------------------------------- writing between the markers


def markers(name: str) -> tuple[str, str]:
    """The begin and end marker lines of block ``name``."""
    return f"<!-- claims:begin {name} -->", f"<!-- claims:end {name} -->"


def put(text: str, name: str, body: str, page: str) -> str:
    """``text`` with block ``name``'s content replaced by ``body`` (a blank line either side); a
    SeedlabError when the page lacks the markers, has them twice or out of order."""
    begin, end = markers(name)
    starts = [m.start() for m in re.finditer(rf"^{re.escape(begin)}[ \t]*$", text, re.M)]
    ends = [m.start() for m in re.finditer(rf"^{re.escape(end)}[ \t]*$", text, re.M)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SeedlabError(f"{page}: needs one {begin} line and, below it, one {end} line "
                           f"(found {len(starts)} and {len(ends)})")
    return text[: starts[0]] + f"{begin}\n\n{body}\n\n" + text[ends[0]:]


@dataclass(frozen=True)
class Page:
    """A page that holds rendered blocks: its text as committed and as the ledger renders it."""

    path: str
    committed: str
    rendered: str

    @property
    def stale(self) -> bool:
        return self.committed != self.rendered

    def summary(self) -> str:
        """The page and how many of its lines a render would add and remove: ``README.md (+3 -1 lines)``."""
        diff = list(difflib.unified_diff(self.committed.splitlines(), self.rendered.splitlines(), lineterm="", n=0))
        added = sum(d.startswith("+") and not d.startswith("+++") for d in diff)
        removed = sum(d.startswith("-") and not d.startswith("---") for d in diff)
        return f"{self.path} (+{added} -{removed} lines)"


def pages(ledger: Ledger, root: Path) -> list[Page]:
    """Every page with its blocks rendered from ``ledger`` (nothing written); a SeedlabError for a page
    that is missing or lacks its markers."""
    texts: dict[str, str] = {}
    for name, body in blocks(ledger).items():
        page = PAGES[name]
        if page not in texts:
            if not (root / page).is_file():
                raise SeedlabError(f"{page}: no such file under {root} (run from the repository root)")
            texts[page] = (root / page).read_text()
        texts[page] = put(texts[page], name, body, page)
    return [Page(p, (root / p).read_text(), t) for p, t in texts.items()]


def write(ledger: Ledger, root: Path) -> list[str]:
    """Render every block into its page under ``root``: all pages are rendered before the first is
    written (a page without its markers writes nothing). The pages that changed."""
    changed = [p for p in pages(ledger, root) if p.stale]
    for p in changed:
        write_text(root / p.path, p.rendered)
    return [p.path for p in changed]
