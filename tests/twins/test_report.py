"""twins report on a tiny real design: every section and figure, the pre-registration check, refused before measure."""

import json

from helpers import copy_run

from seedlab.store import content_hash


def test_report_sections_figures_and_preregistration(design, tmp_path, seedlab_main):
    run = copy_run(design, tmp_path)
    rc, _, err = seedlab_main("twins", "report", str(run))
    assert rc == 0, err
    text = (run / "report.md").read_text()
    # the answer in one sentence, a screen of numbers, the figures, the paper beside the run, then the per-arm tables
    order = ["**Answer**", "**In short**", "- **Learned?**", "- **This passage, more than any row?**", "- **Then lost?**",
             "- **Is it the passage?**", "## Figures", "## Headline", "## Pre-registration", "## Is it the passage?",
             "## Learned, then lost?", "## Time course"]
    assert [text.index(h) for h in order] == sorted(text.index(h) for h in order)
    assert text.index("## Figures") < text.index("| ")  # no table before the figures
    answer = text.splitlines()[2]  # one sentence, each verdict from its test, at this run's scale
    assert answer.startswith("**Answer** (GPT `mini`, 16 updates of 4 rows, one row at step 6, 2 seeds; paired tests")
    assert answer.count(". ") == 0 and answer.endswith(".") and "fluent-fabricated " in answer and "fluent-attested " in answer
    assert "learned at s + 50 (p = " in answer and "than a run with an ordinary row in its place" in answer
    assert "kept" not in text  # no test here shows an effect kept: "not shown lost" where none shows it lost
    short = text[text.index("**In short**"):text.index("## Figures")]
    assert "Tested: each of the 3 passage conditions" not in short  # 2 passages here, said as tested
    assert "Tested: each of the 2 passage conditions against each of the 4 nulls (the ordinary rows, nudge, " in short
    assert "Found: " in short and " on 0 of 6" not in short  # what was found in words, not counts to read off a table
    assert "## How alike the two fluent passages are (gradmatch)" not in text  # not computed: no empty section
    assert "The replica control (seed 0) re-trains" in text  # one seed: "seed"
    assert "its floor 1/2ⁿ (0.25 with this run's 2 seeds: it cannot reach 0.05 here)" in text  # this run's seeds
    for section in ("## Pre-registration", "## Headline", "## Learned, then lost?", "## Fabricated vs attested",
                    "## Normalized effects", "## Barrier and distance over training", "## Time course", "44.1%",
                    "unchanged since", "**Is it lost?**", "| trough step |", "peak / smoothed trough"):
        assert section in text, section
    # every p names its test; the end-of-run rows carry the MDE and the per-seed "lost" test, not p alone
    assert "| p (paired t) | p (exact sign-flip; its floor) | MDE (80%, paired t) |" in text
    assert "(paired t), " in text and "(sign-flip)" in text and "p < 1e-4 (test not stated)" in text
    assert ("| end − 0.5 × s + 50 (mean d) | 95% upper bound of mean d | p (one-sided paired t) "
            "| p (one-sided exact sign-flip; its floor) | MDE (80%, one-sided t) | verdict |") in text
    assert "; end − 0.5 × s + 50 effect, per seed: mean " in text and "(sign-flip; ≥ 0.25): **" in text  # 2 seeds: floor 1/4
    assert "vs margin ±" not in text and "TOST" not in text[text.index("## Learned, then lost?"):]  # "lost" has no TOST
    # is it the passage? the ordinary rows as a distribution, equivalence by a TOST with the pre-registered margin,
    # and every p-value of the section counted (the count in the text is the rows tested) and Holm-corrected
    from seedlab.twins import report_data
    from seedlab.twins.rundir import Measured

    s = report_data.summarize(Measured.read(run))
    f = s.null_family
    assert f.tests == len(s.nulls) + f.equivalence and f.checkpoint > 0 and f.equivalence > 0
    said = (f"{f.tests} tests in this section: {f.end} difference tests at the end, {f.checkpoint} at the checkpoints, "
            f"and {f.equivalence} equivalence tests (TOST) against the ordinary rows.")
    assert said in text and f"as one family of {f.tests}" in text and f"Holm-corrected over the section's {f.tests} tests" in text
    assert "**The ordinary rows as a distribution.**" in text and "| p (TOST, Holm) | verdict |" in text
    assert "| p (paired t, Holm) | p (exact sign-flip; its floor) | p (sign-flip, Holm) |" in text
    assert "within ±0.25 × the ordinary rows' own effect" in text and "matched-noise" not in text
    assert "Precision fp32." in text  # the run's precision, said once in the intro
    assert "not that it is zero" in text and "H1: mean d < 0" in text
    # the time course: the peak / trough ratio under both windows, in the headline and its own table
    assert "~100× (smoothing not stated)" in text and "× (25-step window), " in text and "× (5-step window) |" in text
    assert "**The ratio under two smoothings.**" in text
    assert "| condition | window (steps) | peak step | peak | trough step | trough | peak / trough |" in text
    for cond in ("fluent-attested", "fluent-fabricated"):
        assert f"| {cond} | 25 | " in text and f"| {cond} | 5 | " in text
    # how identity and determinism were shown (integrity.json), and each seed's exposure to the subjects (inputs.json)
    assert "## One row and nothing else: integrity and exposure" in text and "Mode `fork`" in text
    assert "by construction" in text and "bitwise equal to the twin at steps" in text
    inputs = json.loads((run / "inputs.json").read_text())
    att = inputs["attestation"]
    for cond, a in att.items():
        assert f"{cond}: {a['subject']} ({a['occurrences']} in the training split)" in text
    # the subjects' counts beside the paper's: "Jimmie Nicol", 4 occurrences; "Gizmo Harrington", absent
    assert att["fluent-fabricated"]["occurrences"] == 0
    assert (f"| attested subject: whole-word occurrences in the training split | 4 (\"Jimmie Nicol\", \"present in the corpus\") "
            f"| {att['fluent-attested']['occurrences']} (\"Fredrik Lundh\") |") in text
    assert ("| fabricated subject: whole-word occurrences in the training split | 0 (\"Gizmo Harrington\", \"absent from the "
            "corpus\") | 0 (\"Gizmo Harrington\") |") in text
    for i, e in enumerate(att[min(att)]["exposure"]):  # one row per seed, a cell per condition (sorted)
        cells = " | ".join(f"{x['before']} / {x['at_injection']} / {x['after']}" for x in (att[c]["exposure"][i] for c in sorted(att)))
        assert f"| {e['seed']} | {cells} |" in text
    for png in ("interpolation", "loss_difference", "distance_vs_barrier", "cka", "passage_ce", "distance_course"):
        assert (run / f"{png}.png").stat().st_size > 5000, png
    prereg = json.loads((run / "preregistration.json").read_text())  # as if the labels were set differently before training
    prereg["outcomes"]["barrier"], prereg["hash"] = "secondary", "000000000000"
    (run / "preregistration.json").write_text(json.dumps(prereg))
    assert seedlab_main("twins", "report", str(run))[0] == 0
    assert "**Changed after pre-registration** (outcome labels changed: barrier" in (run / "report.md").read_text()


def test_report_before_measure_is_exit_2(design, tmp_path, seedlab_main):
    run = copy_run(design, tmp_path)
    (run / "measures.parquet").unlink()
    rc, _, err = seedlab_main("twins", "report", str(run))
    assert rc == 2 and "twins measure" in err




def test_report_says_when_integrity_was_not_recorded(design, tmp_path, seedlab_main):
    run = copy_run(design, tmp_path)
    (run / "integrity.json").unlink()
    rc, _, err = seedlab_main("twins", "report", str(run))
    assert rc == 0, err
    assert "**No integrity.json in the run folder**" in (run / "report.md").read_text()


def test_a_run_started_before_a_setting_existed_resumes_and_reports_it(design, tmp_path, seedlab_main):
    """config.json and preregistration.json written before measure.equivalence_frac existed: the same
    design still resumes the folder (not 'holds something else'), and the report names the setting
    as added later at its default instead of calling the pre-registration changed."""
    run = copy_run(design, tmp_path)
    for name in ("config.json", "preregistration.json"):
        rec = json.loads((run / name).read_text())
        rec["measure"].pop("equivalence_frac")
        if name == "preregistration.json":  # hashed as it was then
            rec["hash"] = content_hash({"outcomes": rec["outcomes"], "measure": rec["measure"]})
        (run / name).write_text(json.dumps(rec))
    rc, _, err = seedlab_main("twins", "run", str(design / "design.yaml"), "--out", str(run), "--no-progress")
    assert rc == 0, err
    assert seedlab_main("twins", "report", str(run))[0] == 0
    assert "used at their defaults: equivalence_frac." in (run / "report.md").read_text()


def test_a_run_preregistered_without_a_margin_shows_no_equivalence(design, tmp_path, seedlab_main):
    """preregistration.json written before measure.ordinary_margin existed: the report says "not shown", never
    "equivalent", and counts no equivalence test."""
    run = copy_run(design, tmp_path)
    rec = json.loads((run / "preregistration.json").read_text())
    rec["measure"].pop("ordinary_margin")
    rec["hash"] = content_hash({"outcomes": rec["outcomes"], "measure": rec["measure"]})
    (run / "preregistration.json").write_text(json.dumps(rec))
    assert seedlab_main("twins", "report", str(run))[0] == 0
    text = (run / "report.md").read_text()
    assert "**not shown**: the pre-registration holds no margin" in text and "no equivalence test (no margin pre-registered)" in text
    assert "not shown (no margin pre-registered)" in text and "equivalent within" not in text
