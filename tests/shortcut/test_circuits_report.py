"""The report's circuit tables from hand-made circuits/patching tables (no training)."""

import numpy as np
import pandas as pd

from seedlab.shortcut import analyze, circuits_report


def _tables():
    summary = pd.DataFrame({"member": [0, 1, 2], "task": "sum2-max", "weight_decay": 0.1, "layers": [2, 2, 1],
                            "heads": 1, "ratio": [0.9, 0.9, 0.5]})
    rows = []
    for m, layers in ((0, 2), (1, 2), (2, 1)):
        for epoch in (0, 10):
            for layer in range(layers):
                for head in (0, -1):
                    rows.append({"member": m, "epoch": epoch, "layer": layer, "head": head})
    keys = pd.DataFrame(rows)
    circuits = keys.assign(**{c: np.where(keys["epoch"] == 10, 0.5, -0.5) for c in analyze.COLUMNS[4:]})
    circuits.loc[circuits["head"] == -1, ["qk_rho_value", "qk_uniform_ablation_val"]] = np.nan
    patching = pd.concat([keys.assign(direction=d) for d in ("clean_to_corrupt", "corrupt_to_clean")], ignore_index=True)
    stats = {c: 0.25 for c in analyze.PATCHING_COLUMNS[7:]}
    patching = patching.assign(n_pairs=64, n_small_gap=np.where(patching["member"] == 2, 64, 16), **stats)
    patching.loc[patching["member"] == 2, [c for c in patching.columns if c.startswith("frac_")]] = np.nan
    return summary, circuits[analyze.COLUMNS], patching[analyze.PATCHING_COLUMNS]


def test_circuits_section_tables_at_the_last_checkpoint():
    summary, circuits, patching = _tables()
    text = circuits_report.circuits_section(summary, circuits, patching)
    assert text.startswith("### Circuits at the last checkpoint")
    lines = [line for line in text.splitlines() if line.startswith(("| 2L/1H", "| 1L/1H"))]
    # 2L before 1L; one row per (cell, component) in each of the three tables (the ablation table: heads only)
    assert [line.split(" | ")[2] for line in lines[:3]] == ["L0H0", "L0MLP", "L1H0"]
    assert sum("L1MLP" in line for line in lines) == 2
    pair = [line for line in lines if "flagged" not in line][:3]
    assert "25%" in pair[0] and "0.25 [0.25, 0.25]" in pair[0]  # 16 of 64 flagged; median [quartiles]
    one_layer = next(line for line in lines if line.startswith("| 1L/1H"))
    assert "100%" in one_layer and "—" in one_layer  # every pair flagged: no fraction
    assert "+50" in text and "-50" not in text  # the last checkpoint's ablations, in points
    assert "task" not in text.split("\n\n")[2].splitlines()[0]  # one task, one wd: no such columns


def test_missing_tables_are_notes():
    summary, circuits, _ = _tables()
    text = circuits_report.circuits_section(summary, circuits, None)
    assert "No patching.parquet" in text and "QK and OV ablations" in text
    assert "No circuits.parquet" in circuits_report.circuits_section(summary, None, None)
