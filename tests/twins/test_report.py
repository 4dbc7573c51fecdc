"""twins report on a tiny real design: every section and figure, the pre-registration check, refused before measure."""

import json

from helpers import copy_run


def test_report_sections_figures_and_preregistration(design, tmp_path, seedlab_cli):
    run = copy_run(design, tmp_path)
    rc, _, err = seedlab_cli("twins", "report", str(run))
    assert rc == 0, err
    text = (run / "report.md").read_text()
    for section in ("## Pre-registration", "## Headline", "## Learned, then lost", "## Fabricated vs attested",
                    "## Normalized effects", "## Time course", "44.1%", "unchanged since"):
        assert section in text, section
    for png in ("interpolation", "loss_difference", "distance_vs_barrier", "cka", "passage_ce", "distance_course"):
        assert (run / f"{png}.png").stat().st_size > 5000, png
    prereg = json.loads((run / "preregistration.json").read_text())  # as if the labels were set differently before training
    prereg["outcomes"]["barrier"], prereg["hash"] = "secondary", "000000000000"
    (run / "preregistration.json").write_text(json.dumps(prereg))
    assert seedlab_cli("twins", "report", str(run))[0] == 0
    assert "**Changed after pre-registration** (outcome labels changed: barrier" in (run / "report.md").read_text()


def test_report_before_measure_is_exit_2(design, tmp_path, seedlab_cli):
    run = copy_run(design, tmp_path)
    (run / "measures.parquet").unlink()
    rc, _, err = seedlab_cli("twins", "report", str(run))
    assert rc == 2 and "twins measure" in err


