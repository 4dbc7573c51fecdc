"""The report's circuit tables and the head-role figure from hand-made circuits/patching tables (no training)."""

import numpy as np
import pandas as pd

from seedlab.shortcut import analyze, circuit_data, circuits_report
from seedlab.shortcut.interventions import DIRECTIONS, PATHS
from seedlab.shortcut.pairs import KINDS

EPOCHS = (0, 10, 20, 30)


def _tables():
    """Members 0 and 1: 2L/1H at r = 0.9, generalized at epochs 15 and 30; member 2: 1L/1H at r = 0.5, never."""
    summary = pd.DataFrame({"member": [0, 1, 2], "task": "sum2-max", "weight_decay": 0.1, "layers": [2, 2, 1],
                            "heads": 1, "ratio": [0.9, 0.9, 0.5], "generalized": [True, True, False],
                            "gen_epoch": pd.array([15, 30, None], dtype="Int64")})
    keys = pd.DataFrame([{"member": m, "epoch": e, "layer": layer, "head": head}
                         for m, layers in ((0, 2), (1, 2), (2, 1)) for e in EPOCHS for layer in range(layers) for head in (0, -1)])
    circuits = keys.assign(**{c: np.where(keys["epoch"] == EPOCHS[-1], 0.5, -0.5) for c in analyze.COLUMNS[4:]})
    circuits["qk_rho_value"] = keys["epoch"] / 100 + keys["layer"] / 10  # 0.00, 0.10, 0.20, 0.30 (+0.1 in layer 1)
    circuits["probe_rows"] = 4096
    circuits.loc[circuits["head"] == -1, ["qk_rho_value", "qk_uniform_ablation_val"]] = np.nan
    rows = [keys.assign(pairs=k, path=p, direction=d) for k in KINDS for p in PATHS for d in DIRECTIONS]
    patching = pd.concat(rows, ignore_index=True)
    stats = {c: 0.25 for c in analyze.PATCHING_COLUMNS[9:]}
    patching = patching.assign(n_pairs=64, n_small_gap=np.where(patching["member"] == 2, 64, 16), **stats)
    lc = patching["pairs"] == "label_changing"
    patching.loc[lc, [c for c in patching.columns if c.startswith("frac_")]] = 0.75
    # the rule head: L1H0 for members 0 and 1 (its Δld is highest on label-changing pairs), L0H0 for member 2
    rule = lc & (patching["head"] == 0) & (patching["layer"] == np.where(patching["member"] == 2, 0, 1))
    for path, dld in (("total", 3.0), ("direct", 1.0), ("via_mlp", 2.0)):
        patching.loc[rule & (patching["path"] == path), "dld_q50"] = dld
    patching.loc[patching["member"] == 2, [c for c in patching.columns if c.startswith("frac_")]] = np.nan
    return summary, circuits[analyze.COLUMNS], patching[analyze.PATCHING_COLUMNS]


def _rows(text, start):
    return [line for line in text.split(start, 1)[1].split("\n\n")[1].splitlines()[2:]]


def test_circuits_section_tables_at_the_last_checkpoint():
    summary, circuits, patching = _tables()
    text = circuits_report.circuits_section(summary, circuits, patching)
    assert text.startswith("### Circuits at the last checkpoint")
    pair = _rows(text, "**Activation patching on matched counterfactual pairs**")
    # 2L before 1L; one row per (cell, component)
    assert [line.split(" | ")[2] for line in pair] == ["L0H0", "L0MLP", "L1H0", "L1MLP", "L0H0", "L0MLP"]
    header = text.split("**Activation patching on matched counterfactual pairs**", 1)[1].split("\n\n")[1].splitlines()[0]
    assert header.index("same-label: clean→corrupt fraction") < header.index("label-changing: clean→corrupt fraction")
    first = pair[0]  # the two kinds side by side: same-label 0.25, label-changing 0.75; 16 of 64 flagged
    assert first.index("0.25 [0.25, 0.25]") < first.index("0.75 [0.75, 0.75]") and first.count("25%") == 2
    assert "100%" in pair[-1] and "—" in pair[-1]  # every pair flagged: no fraction
    assert "+50" in text and "-50" not in text  # the last checkpoint's ablations, in points
    assert "### Head roles" not in text  # the per-member tables: roles_section, last in the report
    assert "task" not in text.split("\n\n")[2].splitlines()[0]  # one task, one wd: no such columns
    # the fingerprint table: probe chance levels and rows beside the probes, the OV residue named for what it measures
    fp = text.split("**Fingerprints**", 1)[1]
    assert "chance: sum" in fp and "probe rows" in fp and "OV ρ token residue (direct)" in fp and "| 4096 |" in fp


def test_path_patching_of_the_rule_head():
    summary, circuits, patching = _tables()
    np.testing.assert_array_equal(circuit_data.rule_heads(patching).to_numpy(), [[0, 1, 0], [1, 1, 0], [2, 0, 0]])
    rows = _rows(circuits_report.circuits_section(summary, circuits, patching), "**Path patching of the rule head**")
    # per cell and rule head: flagged, Δld total / direct / via MLP, fractions total / direct / via MLP
    assert rows[0] == "| 2L/1H | 0.9 | L1H0 | 2 | 25% | 3 | 1 | 2 | 0.75 | 0.75 | 0.75 |"
    assert rows[1] == "| 1L/1H | 0.5 | L0H0 | 1 | 100% | 3 | 1 | 2 | — | — | — |"


def test_head_roles_aligned_at_each_members_generalization_epoch(tmp_path):
    summary, circuits, patching = _tables()
    roles = circuit_data.aligned_roles(circuits, summary)
    assert len(roles) == 2 * 4 * 2 + 4  # members x checkpoints x heads (2L), + the 1L member
    m0 = roles[(roles["member"] == 0) & (roles["component"] == "L1H0")]
    np.testing.assert_array_equal(m0["epochs_from_gen"], [-15, -5, 5, 15])
    np.testing.assert_allclose(m0["shortcut_fp"], [0.1, 0.2, 0.3, 0.4])  # qk_rho_value for a max task
    never = roles[roles["member"] == 2]
    assert never["epochs_from_gen"].isna().all() and never["gen_epoch"].isna().all()
    text = circuits_report.roles_section(summary, circuits)
    assert text.startswith("### Head roles through training, aligned at the generalization epoch")
    aligned, unaligned = text.split("**Members that never generalized**")
    # member 0 (gen 15): the last checkpoint before (10), the first at or after (20), the last (30)
    assert "| 2L/1H | 0.9 | 0 | 15 | L1H0 | -5 / +5 / +15 | 0.20 → 0.30 → 0.40 |" in aligned
    # member 1 (gen 30): no checkpoint after gen_epoch but the last one itself
    assert "| 2L/1H | 0.9 | 1 | 30 | L0H0 | -10 / +0 / +0 | 0.20 → 0.30 → 0.30 |" in aligned
    assert "| 2" not in aligned.split("\n\n", 1)[1].replace("| 2L", "")  # member 2 is not aligned...
    assert "| 1L/1H | 0.5 | 2 | L0H0 | 0 / 30 | 0.00 → 0.30 |" in unaligned  # ...but shown apart, on its own epochs
    from seedlab.shortcut.rundir import RunDir

    fig = circuits_report.aligned_roles_figure(summary, circuits, RunDir(tmp_path))
    assert fig.path == tmp_path / "head_roles.png" and fig.path.stat().st_size > 0
    assert circuits_report.aligned_roles_figure(summary, None, RunDir(tmp_path)).path is None


def test_missing_tables_are_notes_and_old_patching_tables_still_read(tmp_path):
    from seedlab.shortcut.rundir import RunDir, read_table

    summary, circuits, patching = _tables()
    text = circuits_report.circuits_section(summary, circuits, None)
    assert "No patching.parquet" in text and "QK and OV ablations" in text
    assert "No circuits.parquet" in circuits_report.circuits_section(summary, None, None)
    assert read_table(RunDir(tmp_path), "patching") is None
    old = patching[(patching["pairs"] == "same_label") & (patching["path"] == "total")].drop(columns=["pairs", "path"])
    old.to_parquet(tmp_path / "patching.parquet", index=False)  # from before the pair kinds and paths
    text = circuits_report.circuits_section(summary, None, read_table(RunDir(tmp_path), "patching"))
    assert "0.25 [0.25, 0.25]" in text and "No label-changing pairs" in text
