"""The claims ledger (seedlab/claims): bad input refused in one line, the rules, the render, the committed ledger.

Most tests build a small repository in tmp_path: the pages with their markers, a pre-registration, evidence
files of every kind (json, yaml, csv, parquet, md) and a twins ledger of one confirmed, one exploratory and one
withdrawn claim; each test breaks one thing and expects exactly its message.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from seedlab.claims import checks, evidence, render
from seedlab.claims.schema import STUDIES, load
from seedlab.errors import SeedlabError

ROOT = Path(__file__).resolve().parents[2]

PAGE = "# {title}\n\nIntro line one.\nIntro line two.\n\n<!-- claims:begin {name} -->\n<!-- claims:end {name} -->\n\n{body}\n"
TWINS_PAGE = """## Exploratory: the scale axis

```bash
# a comment, not a heading
```
distance 23.5 % of the seed distance; own drop 0.043 nats.

### a subsection
barrier 4.3 %.

## Confirmatory: specificity
drop −0.023 nats.
"""

CONFIRMED = {
    "id": "twins.own-text-drop", "study": "twins",
    "wording": "At CPU scale the passage's own text CE drops 0.043 nats/token 50 updates after one sighting.",
    "status": "confirmed",
    "scope": {"model": "GPT mini (2 layers, d 64)", "rows_per_batch": 16, "lr": "1e-2 peak", "steps_after_s": 50,
              "seeds": "1000-1007 (fresh)"},
    "evidence": {"command": "seedlab twins report runs/twins-specificity", "files": ["docs/results/twins.md"],
                 "numbers": [{"quote": "0.043", "file": "docs/results/twins.md",
                              "key": {"section": "Exploratory: the scale", "pattern": r"own drop (\S+) nats"}}]},
    "decision": {"preregistration": "docs/preregistration/twins-specificity.md", "id": "H1",
                 "rule": "paired t, one-sided, alpha 0.05 (Holm over H1-H3)", "verdict": "passed",
                 "record": {"file": "docs/results/twins-scale/verdict.json", "key": "confirmed", "expect": True}},
}
EXPLORATORY = {
    "id": "twins.distance-steps", "study": "twins",
    "wording": "After 1,000 updates the passage's distance is 23.5% of the seed distance, at seed 3 0.25x.",
    "status": "exploratory",
    "scope": {"model": "GPT mini", "rows_per_batch": 16, "steps_after_s": 1000, "seeds": "0-3"},
    "evidence": {"command": "seedlab twins report runs/scale", "files": [
        "docs/results/twins-scale/table.csv", "docs/results/twins-scale/cell.json", "docs/results/twins-scale/seeds.parquet"],
        "numbers": [
            {"quote": "1,000", "file": "docs/results/twins-scale/cell.json", "key": "cells.1.after"},
            {"quote": "23.5%", "file": "docs/results/twins-scale/table.csv",
             "key": {"where": {"cell": "long", "measure": "distance"}, "column": "value"}, "scale": 100},
            {"quote": "0.25x", "file": "docs/results/twins-scale/seeds.parquet",
             "key": {"where": {"seed": 3}, "column": "ratio"}}]},
}
WITHDRAWN = {
    "id": "twins.any-row", "study": "twins",
    "wording": "What one row does to the weights is any row's.",
    "status": "withdrawn", "why": "No difference shown is not equivalence.",
    "scope": {"model": "GPT mini", "seeds": "0-7"},
    "evidence": {"command": "seedlab twins report runs/twins-nulls", "files": ["docs/results/twins.md"]},
}


def _write_ledger(root: Path, study: str, claims: list[dict]) -> None:
    (root / "docs/claims").mkdir(parents=True, exist_ok=True)
    (root / f"docs/claims/{study}.yaml").write_text(yaml.safe_dump({"claims": claims}, sort_keys=False))


@pytest.fixture
def repo(tmp_path) -> Path:
    """A small repository: every page with its markers, a pre-registration, evidence, a twins ledger."""
    r = tmp_path
    (r / "docs/results/twins-scale").mkdir(parents=True)
    (r / "docs/preregistration").mkdir(parents=True)
    (r / "README.md").write_text(PAGE.format(title="seedlab", name="readme", body="## Links"))
    (r / "docs/results.md").write_text(PAGE.format(title="Results", name="index", body="| file | what |"))
    for study in STUDIES:
        body = TWINS_PAGE if study == "twins" else "## Exploratory: nothing"
        (r / f"docs/results/{study}.md").write_text(PAGE.format(title=study, name=study, body=body))
    (r / "docs/preregistration/twins-specificity.md").write_text("# Pre-registration\n\nH1: the drop is larger.\nH10: x\n")
    (r / "docs/results/twins-scale/verdict.json").write_text(json.dumps({"confirmed": True}))
    (r / "docs/results/twins-scale/cell.json").write_text(json.dumps({"cells": [{"after": 200}, {"after": 1000}]}))
    (r / "docs/results/twins-scale/table.csv").write_text(
        "cell,measure,value\nshort,distance,0.054\nlong,distance,0.2351\nlong,barrier,0.043\n")
    pd.DataFrame({"seed": [2, 3], "ratio": [0.5, 0.249]}).to_parquet(r / "docs/results/twins-scale/seeds.parquet")
    _write_ledger(r, "twins", [CONFIRMED, EXPLORATORY, WITHDRAWN])
    return r


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _entries(root: Path, study: str = "twins") -> list[dict]:
    return yaml.safe_load((root / f"docs/claims/{study}.yaml").read_text())["claims"]


# --------------------------------------------------------------------------- evidence


@pytest.mark.parametrize(("text", "value", "rounding"), [
    ("0.043", 0.043, 0.0005), ("23.5%", 23.5, 0.05), ("1,000", 1000, 0.5), ("2.4x", 2.4, 0.05), ("4.7×", 4.7, 0.05),
    ("−0.023", -0.023, 0.0005), ("+7", 7, 0.5), ("1e-6", 1e-6, 0.5e-6), ("2.5e5", 2.5e5, 0.5e4), ("7,030 %", 7030, 0.5)])
def test_a_quote_is_read_with_its_rounding(text, value, rounding):
    q = evidence.parse_quote(text)
    assert q.value == pytest.approx(value) and q.rounding == pytest.approx(rounding)


@pytest.mark.parametrize("text", ["~0.6", "0.04-0.05", "1,00", "abc", "", "0.5 nats"])
def test_a_quote_that_is_not_a_number_is_refused(text):
    with pytest.raises(ValueError, match="is not a number"):
        evidence.parse_quote(text)


def test_a_quote_agrees_within_its_rounding_or_the_tolerance_and_scale():
    q = evidence.parse_quote("23.5%")
    assert evidence.agrees(0.2351, q, scale=100) and evidence.agrees(0.2345, q, scale=100)
    assert not evidence.agrees(0.2356, q, scale=100) and not evidence.agrees(0.2351, q)
    assert evidence.agrees(0.236, q, scale=100, tolerance=0.2) and not evidence.agrees(0.2351, q, scale=100, tolerance=0)
    assert not evidence.agrees(float("nan"), q)


def test_a_quote_is_found_only_as_a_number_of_its_own():
    assert evidence.quoted_in("5.4", "from 5.4 to 23.5 %") and evidence.quoted_in("0.048", "0.043-0.048 nats")
    assert not evidence.quoted_in("5.4", "15.4 %") and not evidence.quoted_in("5.4", "5.41")
    assert not evidence.quoted_in("1", "1,000 updates") and not evidence.quoted_in("000", "1,000")


def test_a_section_is_its_heading_to_the_next_of_its_level_outside_fences_and_blocks():
    text = ("# T\n<!-- claims:begin x -->\nown drop 9.9 nats\n<!-- claims:end x -->\n## A one\n```\n# not a heading\n```\n"
            "a 1\n### A sub\na 2\n## B\nb 3\n")
    assert evidence.section(text, "A on") == "```\n# not a heading\n```\na 1\n### A sub\na 2"
    assert evidence.section(text, "B") == "b 3" and evidence.section(text, "C") is None
    assert "9.9" not in evidence.section(text, "T")


def test_every_file_type_reads_its_number(repo):
    assert evidence.read_number(repo, "docs/results/twins-scale/cell.json", "cells.1.after") == 1000
    assert evidence.read_number(repo, "docs/results/twins-scale/table.csv",
                                {"where": {"cell": "long", "measure": "barrier"}, "column": "value"}) == 0.043
    assert evidence.read_number(repo, "docs/results/twins-scale/seeds.parquet",
                                {"where": {"seed": 2}, "column": "ratio"}) == 0.5
    md = {"section": "Confirmatory", "pattern": r"drop (\S+) nats"}
    assert evidence.read_number(repo, "docs/results/twins.md", md) == -0.023
    (repo / "x.yaml").write_text("a: {b: [1, 2.5]}\n")
    assert evidence.read_number(repo, "x.yaml", "a.b.1") == 2.5


# --------------------------------------------------------------------------- bad input: one line, exit 2, nothing written


def _break(repo: Path, index: int, edit) -> None:
    claims = _entries(repo)
    edit(claims[index])
    _write_ledger(repo, "twins", claims)


def _set(path: str, value):
    """An edit that sets the dotted ``path`` (integers index lists) of an entry; value None deletes it."""
    def edit(entry):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = entry
        for p in parents:
            node = node[p]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return edit


def _moved(file: str):
    """An edit that points the exploratory entry's table (its first file, its second number) at ``file``."""
    def edit(entry):
        entry["evidence"]["files"][0] = entry["evidence"]["numbers"][1]["file"] = file
    return edit


BAD = [  # (which entry, edit, the start of the one line: "file: entry: field: ...", a fragment of the rest)
    (1, _set("status", "tentative"), "docs/claims/twins.yaml: twins.distance-steps: status: ", "tentative"),
    (1, _moved("docs/results/twins-scale/nope.csv"),
     "docs/claims/twins.yaml: twins.distance-steps: evidence.files[0]: ", "no such file docs/results/twins-scale/nope.csv"),
    (0, _set("decision.preregistration", "docs/preregistration/nope.md"),
     "docs/claims/twins.yaml: twins.own-text-drop: decision.preregistration: ", "no such file"),
    (1, _set("evidence.numbers.0.key", "cells.2.after"),
     "docs/claims/twins.yaml: twins.distance-steps: evidence.numbers[0].key: ", "no cells.2 in"),
    (1, _set("evidence.numbers.1.key.where.cell", "huge"),
     "docs/claims/twins.yaml: twins.distance-steps: evidence.numbers[1].key: ",
     "no row where cell=huge, measure=distance in docs/results/twins-scale/table.csv"),
    (1, _set("evidence.numbers.1.key.where", {"measure": "distance"}),
     "docs/claims/twins.yaml: twins.distance-steps: evidence.numbers[1].key: ", "2 rows where measure=distance"),
    (1, _set("evidence.numbers.2.key.column", "ratios"),
     "docs/claims/twins.yaml: twins.distance-steps: evidence.numbers[2].key: ", "no column ratios in"),
    (0, _set("evidence.numbers.0.key.section", "Nowhere"),
     "docs/claims/twins.yaml: twins.own-text-drop: evidence.numbers[0].key: ", "no heading starting 'Nowhere'"),
    (0, _set("evidence.numbers.0.key.pattern", r"ceiling (\S+) %"),
     "docs/claims/twins.yaml: twins.own-text-drop: evidence.numbers[0].key: ", "no match of"),
    (0, _set("evidence.numbers.0.key", "drop"),
     "docs/claims/twins.yaml: twins.own-text-drop: evidence.numbers[0].key: ", "a .md file takes"),
    (0, _set("evidence.numbers.0.quote", "0.044"),
     "docs/claims/twins.yaml: twins.own-text-drop: evidence.numbers[0].quote: ", "'0.044' is not written in the wording"),
    (0, _set("evidence.numbers.0.quote", 0.043),
     "docs/claims/twins.yaml: twins.own-text-drop: evidence.numbers[0].quote: ", "string"),
    (0, _set("evidence.numbers.0.file", "docs/results/twins-scale/cell.json"),
     "docs/claims/twins.yaml: twins.own-text-drop: evidence.numbers[0].file: ", "one of evidence.files"),
    (1, _set("id", "twins.own-text-drop"), "docs/claims/twins.yaml: twins.own-text-drop: id: ", "also an entry of"),
    (2, _set("status", "superseded"), "docs/claims/twins.yaml: twins.any-row: superseded_by: ", "required when"),
    (2, lambda e: e.update(status="superseded", superseded_by="twins.nope"),
     "docs/claims/twins.yaml: twins.any-row: superseded_by: ", "names no other entry"),
    (2, _set("superseded_by", "twins.own-text-drop"), "docs/claims/twins.yaml: twins.any-row: superseded_by: ",
     "only a superseded claim"),
    (2, _set("why", None), "docs/claims/twins.yaml: twins.any-row: why: ", "required when status is withdrawn"),
    (1, _set("decision", CONFIRMED["decision"]), "docs/claims/twins.yaml: twins.distance-steps: decision: ",
     "only a confirmed claim has one (status is exploratory)"),
    (0, _set("decision", None), "docs/claims/twins.yaml: twins.own-text-drop: decision: ", "required when status is confirmed"),
    (0, _set("study", "shortcut"), "docs/claims/twins.yaml: twins.own-text-drop: study: ", "holds the twins study's"),
    (0, _set("id", "own-text-drop"), "docs/claims/twins.yaml: own-text-drop: id: ", "'twins.<slug>'"),
    (0, _set("scope.seeds", None), "docs/claims/twins.yaml: twins.own-text-drop: scope.seeds: ", "required"),
    (0, _set("scope.batch", 16), "docs/claims/twins.yaml: twins.own-text-drop: scope.batch: ", "unknown field"),
    (0, _set("decision.verdict", "maybe"), "docs/claims/twins.yaml: twins.own-text-drop: decision.verdict: ", "passed"),
    (0, _set("decision.record.key", "verdict"), "docs/claims/twins.yaml: twins.own-text-drop: decision.record.key: ",
     "no verdict in"),
    (0, _set("decision.record.file", "docs/none.json"),
     "docs/claims/twins.yaml: twins.own-text-drop: decision.record.file: ", "no such file"),
    (1, _moved("../outside.csv"), "docs/claims/twins.yaml: twins.distance-steps: evidence.files[0]: ",
     "no such file ../outside.csv in the repository"),
]


@pytest.mark.parametrize(("index", "edit", "start", "fragment"), BAD, ids=[b[2].split(": ", 2)[2] + b[3] for b in BAD])
def test_bad_input_is_one_line_naming_entry_and_field_exit_2_nothing_written(repo, seedlab_main, index, edit, start,
                                                                             fragment):
    if "outside" in fragment:
        (repo.parent / "outside.csv").write_text("cell,measure,value\nlong,distance,0.2351\n")
    _break(repo, index, edit)
    before = _snapshot(repo)
    for command in (["render"], ["render", "--check"], ["check"]):
        rc, out, err = seedlab_main("claims", *command, "--root", str(repo))
        assert rc == 2, (command, out, err)
        line = err.strip().removeprefix("error: ")
        assert len(err.strip().splitlines()) == 1 and line.startswith(start) and fragment in line, err
    assert _snapshot(repo) == before


def test_the_fixture_ledger_is_valid_and_a_render_writes_every_page(repo, seedlab_main):
    """The bad-input test's 'nothing written' can fail: the same command on the unbroken ledger writes."""
    before = _snapshot(repo)
    rc, out, err = seedlab_main("claims", "render", "--root", str(repo))
    assert rc == 0, err
    changed = {k for k, v in _snapshot(repo).items() if before.get(k) != v}
    assert changed == {"README.md", "docs/results.md", *(f"docs/results/{s}.md" for s in STUDIES)}, changed
    assert "README.md" in out and "3 claims" in out


def test_a_page_without_its_markers_writes_nothing(repo, seedlab_main):
    (repo / "docs/results/attribution.md").write_text("# attribution\n")  # the last page rendered
    before = _snapshot(repo)
    rc, _, err = seedlab_main("claims", "render", "--root", str(repo))
    assert rc == 2 and err.startswith("error: docs/results/attribution.md: needs one <!-- claims:begin attribution -->")
    assert _snapshot(repo) == before


@pytest.mark.parametrize(("text", "what"), [("claims: [\n", "not valid YAML (line 2)"), ("[1, 2]\n", "must hold one field"),
                                            ("claims: []\nmore: 1\n", "must hold one field")])
def test_a_malformed_ledger_file_is_one_line(repo, text, what):
    (repo / "docs/claims/shortcut.yaml").write_text(text)
    with pytest.raises(SeedlabError, match=f"^docs/claims/shortcut.yaml: {re.escape(what)}"):
        load(repo)


def test_several_problems_are_one_line_with_a_count(repo):
    _break(repo, 1, _set("status", "tentative"))
    _break(repo, 2, _set("why", None))
    with pytest.raises(SeedlabError, match=r"twins.distance-steps: status: .* \(and 1 more\)$"):
        load(repo)


# --------------------------------------------------------------------------- the rules


def _violations(repo: Path) -> list[str]:
    return [str(v) for v in checks.check(load(repo), repo)]


@pytest.fixture
def rendered(repo) -> Path:
    render.write(load(repo), repo)
    return repo


def test_a_rendered_valid_ledger_breaks_no_rule(rendered, seedlab_main):
    assert _violations(rendered) == []
    rc, out, _ = seedlab_main("claims", "check", "--root", str(rendered))
    assert rc == 0 and out.strip() == "claims: 3 claims, every rule holds"
    rc, out, _ = seedlab_main("claims", "render", "--check", "--root", str(rendered))
    assert rc == 0 and "every page matches" in out


def test_a_page_that_differs_from_the_rendering_is_a_violation(rendered, seedlab_main):
    page = rendered / "docs/results/twins.md"
    page.write_text(page.read_text().replace("twins.own-text-drop", "twins.own-text-drops", 1))
    assert _violations(rendered) == ["docs/results/twins.md: its claims blocks differ from the ledger's rendering "
                                     "(run: make claims)"]
    before = _snapshot(rendered)
    rc, out, _ = seedlab_main("claims", "render", "--check", "--root", str(rendered))
    assert rc == 1 and out.strip() == ("claims: 1 page(s) differ from the ledger's rendering: docs/results/twins.md "
                                       "(+1 -1 lines) (run: make claims)")
    assert _snapshot(rendered) == before
    rc, out, _ = seedlab_main("claims", "check", "--root", str(rendered))
    assert rc == 1 and out.strip().startswith("docs/results/twins.md: its claims blocks differ")


def test_a_prose_edit_outside_the_blocks_is_kept_by_a_render(rendered):
    page = rendered / "docs/results/twins.md"
    page.write_text(page.read_text() + "\nA new paragraph.\n")
    assert render.write(load(rendered), rendered) == [] and page.read_text().endswith("\nA new paragraph.\n")


@pytest.mark.parametrize(("edit", "violation"), [
    (_set("decision.verdict", "failed"), "decision.verdict: a confirmed claim needs a decision that passed, got 'failed'"),
    (_set("decision.id", "H2"), "decision.id: 'H2' is not written in docs/preregistration/twins-specificity.md"),
    (_set("decision.id", "H"), "decision.id: 'H' is not written in"),  # H1 and H10 are there, not H
    (_set("decision.record.expect", False), "decision.record: docs/results/twins-scale/verdict.json holds True"),
])
def test_a_confirmed_claim_needs_its_passed_decision(repo, edit, violation):
    _break(repo, 0, edit)
    render.write(load(repo), repo)
    found = _violations(repo)
    assert len(found) == 1 and found[0].startswith(f"docs/claims/twins.yaml: twins.own-text-drop: {violation}"), found


@pytest.mark.parametrize(("index", "edit", "violation"), [
    (1, _set("evidence.numbers.1.scale", 1), "evidence.numbers[1]: docs/results/twins-scale/table.csv holds 0.2351, "
                                             "the wording writes 23.5% (tolerance 0.05)"),
    (1, _set("evidence.numbers.1.tolerance", 0.0001), "evidence.numbers[1]: docs/results/twins-scale/table.csv holds "
                                                      "0.2351 x 100 = 23.51, the wording writes 23.5% (tolerance 0.0001)"),
    (1, _set("evidence.numbers.2.key.where.seed", 2), "evidence.numbers[2]: docs/results/twins-scale/seeds.parquet holds "
                                                      "0.5, the wording writes 0.25x (tolerance 0.005)"),
    (1, _set("evidence.numbers.0.key", "cells.0.after"), "evidence.numbers[0]: docs/results/twins-scale/cell.json holds "
                                                         "200, the wording writes 1,000 (tolerance 0.5)"),
    (0, _set("evidence.numbers.0.key", {"section": "Confirmatory", "pattern": r"drop (\S+) nats"}),
     "evidence.numbers[0]: docs/results/twins.md holds -0.023, the wording writes 0.043 (tolerance 0.0005)"),
])
def test_a_quoted_number_is_what_its_file_holds(repo, index, edit, violation):
    _break(repo, index, edit)
    render.write(load(repo), repo)
    found = _violations(repo)
    claim = ("twins.own-text-drop", "twins.distance-steps")[index]
    assert found == [f"docs/claims/twins.yaml: {claim}: {violation}"], found


def test_a_number_within_a_stated_tolerance_agrees(repo):
    _break(repo, 1, _set("evidence.numbers.0.key", "cells.0.after"))
    _break(repo, 1, _set("evidence.numbers.0.tolerance", 800))
    render.write(load(repo), repo)
    assert _violations(repo) == []


def test_a_factor_is_read_off_its_log10_with_exp10(repo):
    """A file holding log10 of the quoted factor (a log10 residual quoted as 0.25x): read as 10 ** value with
    ``exp10``; without it the log10 value itself is compared, and disagrees."""
    pd.DataFrame({"seed": [2, 3], "ratio": [0.5, 0.249], "log_ratio": [math.log10(0.5), math.log10(0.249)]}).to_parquet(
        repo / "docs/results/twins-scale/seeds.parquet")
    _break(repo, 1, _set("evidence.numbers.2.key.column", "log_ratio"))
    render.write(load(repo), repo)
    assert _violations(repo) == ["docs/claims/twins.yaml: twins.distance-steps: evidence.numbers[2]: "
                                 "docs/results/twins-scale/seeds.parquet holds -0.603801, the wording writes 0.25x "
                                 "(tolerance 0.005)"]
    _break(repo, 1, _set("evidence.numbers.2.exp10", True))
    assert _violations(repo) == []


@pytest.mark.parametrize("where", ["README.md", "docs/twins.md", "docs/results/twins.md"])
def test_a_withdrawn_wording_may_stand_only_in_the_rendered_blocks(rendered, where):
    page = rendered / where
    prose = "Note: what one row does to the **weights**\nis ANY row's.\n"  # wrapped, bold, another case
    page.write_text((page.read_text() if page.exists() else "# Twins\n") + prose)
    assert _violations(rendered) == [f"{where}: states twins.any-row's wording, which is withdrawn "
                                     "(see docs/claims/twins.yaml)"]
    page.write_text(page.read_text().replace(prose, ""))
    assert _violations(rendered) == []  # its own rendering (struck through, beside its status) is allowed


def test_a_superseded_wording_counts_as_withdrawn_and_the_preregistrations_are_frozen(repo):
    _break(repo, 2, lambda e: e.update(status="superseded", superseded_by="twins.distance-steps"))
    render.write(load(repo), repo)
    (repo / "docs/preregistration/twins-specificity.md").write_text("H1: what one row does to the weights is any row's.\n")
    assert _violations(repo) == []
    (repo / "docs/results.md").write_text((repo / "docs/results.md").read_text() + "What one row does to the weights is any row's.\n")
    assert _violations(repo) == ["docs/results.md: states twins.any-row's wording, which is superseded "
                                 "(see docs/claims/twins.yaml)"]


@pytest.mark.parametrize(("index", "wording", "phrase"), [
    (1, "After 1,000 updates it is confirmed: 23.5% of the seed distance, at seed 3 0.25x.", "confirm"),
    (1, "After 1,000 updates (confirmatory) 23.5% of the seed distance, at seed 3 0.25x.", "confirm"),
    (1, "After 1,000 updates an ordinary row is the same: 23.5% of the seed distance, at seed 3 0.25x.", "the same"),
    (1, "After 1,000 updates any row's distance is 23.5% of the seed distance, at seed 3 0.25x.", "any row's"),
    (1, "After 1,000 updates the distance is equal to 23.5% of the seed distance, at seed 3 0.25x.", "equal to"),
    (1, "After 1,000 updates a row is no different: 23.5% of the seed distance, at seed 3 0.25x.", "no different"),
    (1, "After 1,000 updates rows are Identical\n at 23.5% of the seed distance, at seed 3 0.25x.", "Identical"),
    (0, "At CPU scale any row's own text CE drops 0.043 nats/token.", "any row's"),  # confirmed, but not equivalence
])
def test_a_standing_wording_follows_its_status(repo, index, wording, phrase):
    _break(repo, index, _set("wording", wording))
    render.write(load(repo), repo)
    needs = ("status confirmed (a pre-registered decision that passed)" if phrase == "confirm"
             else "decision.equivalence: true (a passed equivalence test)")
    claim = _entries(repo)[index]["id"]
    assert _violations(repo) == [f"docs/claims/twins.yaml: {claim}: wording: says {phrase!r}, which needs {needs}"]


@pytest.mark.parametrize("wording", [
    "On the same seeds, 1,000 updates give 23.5% of the seed distance, at seed 3 0.25x.",
    "The stack is bitwise identical to the serial runs; 1,000 updates give 23.5%, at seed 3 0.25x.",
])
def test_the_phrase_rules_leave_the_design_and_exact_identities_alone(repo, wording):
    _break(repo, 1, _set("wording", wording))
    render.write(load(repo), repo)
    assert _violations(repo) == []


def test_equivalence_licenses_alike_and_a_withdrawn_wording_is_exempt(repo):
    _break(repo, 0, _set("wording", CONFIRMED["wording"] + " Its drop is the same as any row's."))
    _break(repo, 0, _set("decision.equivalence", True))
    render.write(load(repo), repo)
    assert _violations(repo) == []  # the withdrawn "any row's" (entry 2) is exempt too
    _break(repo, 0, _set("decision.equivalence", False))
    render.write(load(repo), repo)
    assert [v.split(": ", 3)[2] for v in _violations(repo)] == ["wording", "wording"]


# --------------------------------------------------------------------------- the render


def test_the_readme_block_states_the_front_page_claims_with_status_and_scope(repo, seedlab_main):
    """README shows the claims marked ``front`` (status, scope), then how many more stand and how many were
    withdrawn or superseded: all of them on the results page."""
    claims = _entries(repo)
    claims[0]["front"] = True
    _write_ledger(repo, "twins", claims)
    assert seedlab_main("claims", "render")[0] == 0
    text = (repo / "README.md").read_text()
    block = text.split("<!-- claims:begin readme -->\n\n")[1].split("\n\n<!-- claims:end readme -->")[0]
    assert block.startswith("Each study's headline findings, from the ledger `docs/claims/` (`make claims`)")
    twins = block.split("**twins**")[1].split("**attribution**")[0]
    assert twins.startswith(" ([docs/results/twins.md](docs/results/twins.md))\n")
    assert (f"- {CONFIRMED['wording']} (**confirmed**, [pre-registered as H1](docs/preregistration/twins-specificity.md); "
            "GPT mini (2 layers, d 64), B 16, lr 1e-2 peak, s + 50, seeds 1000-1007 (fresh))") in twins
    assert EXPLORATORY["wording"] not in twins  # standing, but not on the front page
    assert "- *Also on the results page:* 1 more standing (1 exploratory); 1 withdrawn." in twins
    assert "any row's" not in block
    assert "**shortcut** ([docs/results/shortcut.md](docs/results/shortcut.md))\n- *No front-page finding" in block
    assert text.startswith("# seedlab\n\nIntro line one.") and text.endswith("<!-- claims:end readme -->\n\n## Links\n")


@pytest.mark.parametrize(("fronts", "problem"), [
    ([2], "twins.any-row: front: only a standing finding (confirmed or exploratory) is on the front page"),
    ([0, 1, 3, 4, 5], "twins.copy-5: front: at most 4 of a study's findings are on README's front page, got 5")])
def test_the_front_page_holds_a_few_standing_claims(repo, seedlab_main, fronts, problem):
    claims = _entries(repo) + [dict(EXPLORATORY, id=f"twins.copy-{k}") for k in (3, 4, 5)]
    for i in fronts:
        claims[i]["front"] = True
    _write_ledger(repo, "twins", claims)
    before = _snapshot(repo)
    code, _, err = seedlab_main("claims", "render")
    assert code == 2 and problem in err and len(err.strip().splitlines()) == 1
    assert _snapshot(repo) == before


def test_the_index_counts_and_lists_every_claim(rendered):
    text = (rendered / "docs/results.md").read_text()
    assert "**twins** ([results/twins.md](results/twins.md)): 1 confirmed, 1 exploratory, 1 withdrawn" in text
    assert "- [`twins.any-row`](results/twins.md) (*withdrawn*): ~~What one row does to the weights is any row's.~~" in text
    assert "**shortcut** ([results/shortcut.md](results/shortcut.md)): no claims entered yet" in text


def test_a_results_page_opens_with_its_claims_table(rendered):
    text = (rendered / "docs/results/twins.md").read_text()
    assert text.startswith("# twins\n\nIntro line one.\nIntro line two.\n\n<!-- claims:begin twins -->\n\n**Claims** "
                           "(1 confirmed, 1 exploratory, 1 withdrawn), rendered from "
                           "[docs/claims/twins.yaml](../claims/twins.yaml) by `seedlab claims render`")
    rows = [r for r in text.splitlines() if r.startswith("| `twins.")]
    assert len(rows) == 3 and all(r.count(" | ") == 4 for r in rows)
    assert rows[0].startswith("| `twins.own-text-drop` | **confirmed**, [pre-registered as H1]"
                              "(../preregistration/twins-specificity.md): paired t, one-sided, alpha 0.05 "
                              "(Holm over H1-H3), passed |")
    assert "| `seedlab twins report runs/scale`; [table.csv](twins-scale/table.csv), [cell.json](twins-scale/cell.json)" in rows[1]
    assert rows[2].startswith("| `twins.any-row` | *withdrawn* — No difference shown is not equivalence. | "
                              "~~What one row does")
    empty = (rendered / "docs/results/shortcut.md").read_text()
    assert "**Claims** (no claims entered yet), rendered from `docs/claims/shortcut.yaml`" in empty


def test_a_superseded_claim_names_what_replaced_it_and_a_pipe_stays_in_its_cell(repo):
    _break(repo, 2, lambda e: e.update(status="superseded", superseded_by="twins.distance-steps",
                                       wording="A | B is any row's."))
    table = render.study_table(load(repo), "twins")
    assert "| *superseded* by `twins.distance-steps` — No difference shown is not equivalence. | ~~A \\| B is any row's.~~ |" in table


@pytest.mark.parametrize(("text", "shown"), [
    ("seedlab twins report runs/x", "`seedlab twins report runs/x`"),
    ("seedlab twins report runs/x (its report.md, transcribed)", "`seedlab twins report runs/x` (its report.md, transcribed)"),
    ("seedlab twins report runs/x (its table, transcribed); the distances from the kept cell",
     "`seedlab twins report runs/x` (its table, transcribed); the distances from the kept cell"),
    ("python e.py --out runs/x; summarise() of it", "`python e.py --out runs/x; summarise() of it`")])
def test_an_evidence_command_is_code_and_its_trailing_note_text(text, shown):
    assert render.command(text) == shown


def test_the_render_is_idempotent(rendered):
    before = _snapshot(rendered)
    assert render.write(load(rendered), rendered) == [] and _snapshot(rendered) == before


def test_a_study_without_a_ledger_file_renders_and_a_ledger_can_be_empty(tmp_path):
    r = tmp_path
    (r / "docs/results").mkdir(parents=True)
    (r / "README.md").write_text(PAGE.format(title="s", name="readme", body=""))
    (r / "docs/results.md").write_text(PAGE.format(title="R", name="index", body=""))
    for study in STUDIES:
        (r / f"docs/results/{study}.md").write_text(PAGE.format(title=study, name=study, body=""))
    assert load(r).claims == ()
    assert len(render.write(load(r), r)) == 5 and checks.check(load(r), r) == []


# --------------------------------------------------------------------------- the committed ledger


def test_the_committed_ledger_holds_every_rule():
    """The real ledger (docs/claims/) and the pages rendered from it: every rule holds. Skipped only while
    the ledger files are still being written (docs/claims/ absent)."""
    if not (ROOT / "docs/claims").is_dir():
        pytest.skip("docs/claims/ does not exist yet")
    violations = checks.check(load(ROOT), ROOT)
    assert not violations, "\n".join(map(str, violations))
