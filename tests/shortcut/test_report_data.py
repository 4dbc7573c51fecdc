"""What the report prints and the figures draw, computed (shortcut/stats.py, report_data.py, circuit_data.py), and
the readers of a folder's files (shortcut/rundir.py): the report and the figures only word, tabulate and draw these."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from seedlab.errors import SeedlabError
from seedlab.shortcut import circuit_data, report_data, stats
from seedlab.shortcut.rundir import (
    OLD_DEFINITION,
    RunDir,
    SweepDir,
    generalized_definitions,
    read_preregistration,
    read_summary,
    read_table,
)
from seedlab.store import file_sha256


def _summary(cells: dict[tuple[int, float], list[int | None]], task: str = "sum2-max", wd: float = 0.1) -> pd.DataFrame:
    """``cells[(layers, ratio)]``: each member's gen_epoch (None: never generalized); 2 heads."""
    rows = [dict(member=m, task=task, weight_decay=wd, layers=layers, heads=2, ratio=r, seed=i, generalized=e is not None,
                 gen_epoch=e) for m, (layers, r, i, e) in enumerate((layers, r, i, e) for (layers, r), es in cells.items()
                                                                    for i, e in enumerate(es))]
    df = pd.DataFrame(rows)
    df["gen_epoch"] = df["gen_epoch"].astype("Int64")
    return df


def test_headline_grid_holds_every_capacity_and_ratio_with_the_papers_numbers():
    s = _summary({(1, 0.5): [None, 10], (2, 0.9): [20, 30, None, None]})
    h = report_data.headline("sum2-max", 0.1, stats.rate_cells(s))
    assert h.ratios == [0.5, 0.9] and h.capacities == [(2, 2), (1, 2)]  # 2L first, as the paper's table
    row, paper = h.cells[2, 2, 0.9]
    assert (row["k"], row["n"], row["rate"], paper) == (2, 4, 0.5, 77)
    assert h.cells[2, 2, 0.5] == (None, 0)  # no such cell in the sweep; the paper reports it
    assert report_data.headline("sum3-max", 0.1, stats.rate_cells(s.assign(task="sum3-max"))).cells[1, 2, 0.5][1] is None


def test_contrast_table_sorts_and_marks_the_reverse_fragilities():
    s = pd.concat([_summary({(2, 0.5): [None] * 10, (2, 0.9): [10] * 7 + [None] * 3}),
                   _summary({(1, 0.5): [10] * 3 + [None] * 7, (1, 0.9): [None] * 10})], ignore_index=True)
    c = report_data.contrast_table(s.assign(member=range(len(s))))
    assert list(c["layers"]) == [1, 2] and list(c["reverse"]) == [True, False] and list(c["fragility"]) == [2, 2]


def test_definition_counts_most_jobs_first():
    assert report_data.definition_counts(["a", "b", "b"]) == [("b", 2), ("a", 1)]
    assert report_data.definition_counts(["a"]) == [("a", 1)]


def test_cadence_rates_carry_both_shares():
    s = _summary({(2, 0.9): [10, None, None, 20]})
    curves = pd.DataFrame([(m, e, "adv", 1.0 if m == 0 and e == 10 else 0.5) for m in range(4) for e in (0, 10, 20)],
                          columns=["member", "epoch", "split", "acc"])
    table, _, _ = report_data.cadence_rates(s, curves)
    t = table.iloc[0]
    assert (t["generalized"], t["at_evaluations"], t["added"]) == (2, 1, 1)
    assert (t["rate"], t["rate_at_evaluations"]) == (0.5, 0.25)


def test_head_conflict_shows_evenly_spaced_epochs_per_cell():
    s = _summary({(2, 0.9): [10, None]})
    epochs = range(0, 100, 10)  # 10 measured epochs: 6 shown, the first and the last among them
    grads = pd.DataFrame([{"member": m, "epoch": e, "cosine": -0.1, "pair_cosine": 0.0} for m in (0, 1) for e in epochs])
    per_head = pd.DataFrame([{"member": m, "epoch": e, "layer": 1, "head": h, "cosine": 0.1 * h, "pair_cosine": 0.0}
                             for m in (0, 1) for e in epochs for h in (0, 1)])
    hc = report_data.head_conflict(s, grads, per_head, None)
    assert hc.chosen.empty and hc.missing == 2 and (hc.task, hc.weight_decay) == ("sum2-max", 0.1)
    assert list(hc.shown["epoch"]) == [0, 20, 40, 50, 70, 90] and len(hc.medians) == 10
    np.testing.assert_allclose(hc.shown["head_cosine"], 0.05)  # no shortcut head: every head, one observation each
    circuits = pd.DataFrame([{"member": m, "epoch": 0, "layer": 1, "head": h, "qk_rho_value": float(h == m), "attn_pos0": 0.0}
                             for m in (0, 1) for h in (0, 1)])
    hc = report_data.head_conflict(s, grads, per_head, circuits)
    assert hc.missing == 0 and list(hc.chosen["head"]) == [0, 1]
    shapes, shown = report_data.head_control(s, per_head, hc.chosen, hc.task, hc.weight_decay)
    assert [role for role, _ in shapes] == list(report_data.HEAD_ROLES)
    assert [(e.cell[-1], e.epoch, e.members) for e in shown][:2] == [(False, 0, 1), (False, 20, 1)]
    assert set(shown[0].at) == set(report_data.HEAD_ROLES) and shown[0].at["shortcut"]["cosine"] == pytest.approx(0.1)


def test_role_moments_are_epochs_from_gen_when_aligned():
    s = _summary({(1, 0.9): [15, None]})
    circuits = pd.DataFrame([{"member": m, "epoch": e, "layer": 0, "head": 0, "qk_rho_value": e / 100, "attn_pos0": 0.0}
                             for m in (0, 1) for e in (0, 10, 20, 30)])
    roles = circuit_data.aligned_roles(circuits, s)
    aligned, never = circuit_data.role_moments(roles, ["shortcut_fp"], cap=12)
    assert aligned["when"] == [-5, 5, 15] and aligned["shortcut_fp"] == [0.1, 0.2, 0.3]
    assert np.isnan(never["gen_epoch"]) and never["when"] == [0, 30] and never["shortcut_fp"] == [0.0, 0.3]
    assert len(circuit_data.role_moments(roles, ["shortcut_fp"], cap=0)) == 0


def test_path_patching_without_label_changing_pairs_is_none():
    s = _summary({(1, 0.9): [None]})
    patching = pd.DataFrame({"member": [0], "epoch": [0], "layer": [0], "head": [0], "pairs": ["same_label"],
                             "path": ["total"], "direction": ["clean_to_corrupt"], "dld_q50": [1.0]})
    assert circuit_data.path_patching(s, patching, ["total"]) is None


def test_what_the_figures_draw():
    s = _summary({(2, 0.9): [10, 30, None, None, None], (1, 0.5): [None, None]})
    picked = report_data.pick_members(s[s["layers"] == 2], 2)  # one of each kind when both exist
    assert list(picked["generalized"]) == [True, False]
    panels = report_data.curve_panels(s, "sum2-max", 0.1, 12)
    assert [(key, len(m), n) for key, m, n in panels] == [((1, 2, 0.5), 2, 2), ((2, 2, 0.9), 5, 5)]
    (task, cells), = report_data.gen_epochs(s).items()
    assert task == "sum2-max" and [(c.layers, c.members, len(c.epochs), c.median) for c in cells] == [(2, 5, 2, 20.0), (1, 2, 0, None)]
    curves = pd.DataFrame([(m, e, split, 0.5) for m in range(7) for e in (0, 20, 40) for split in ("val", "adv")],
                          columns=["member", "epoch", "split", "acc"])
    ((cap, n, lines),) = report_data.aligned_curves(s, curves, 12)
    assert cap == (2, 2) and n == 2 and list(lines[lines["member"] == 1]["epochs_from_gen"]) == [-30, -10, 10] * 2
    g = pd.DataFrame([{"member": m, "layers": layers, "ratio": 0.9, "epoch": e, "cosine": m + e}
                      for m, layers in ((0, 2), (1, 2), (2, 1)) for e in (0, 1)])
    top, depths = report_data.conflict_over_training(g, "cosine")
    assert top == 0.9 and [d[0] for d in depths] == [2, 1] and list(depths[0][2]) == [0.5, 1.5]
    circuits = pd.DataFrame([{"member": m, "epoch": e, "layer": 0, "head": h, "zero_ablation_val": -0.1 * m - e,
                              "zero_ablation_adv": 0.0} for m in (0, 1, 5) for e in (0, 1) for h in (0, -1)])
    cells, comps, grids = circuit_data.ablation_grid(s, circuits)  # the last checkpoint (epoch 1) of members 0, 1 and 5
    assert cells == [(2, 2, 0.9), (1, 2, 0.5)] and comps == ["L0H0", "L0MLP"]
    np.testing.assert_allclose(grids["val"], [[-105, -105], [-150, -150]])


def test_readers_of_a_folder(tmp_path):
    with pytest.raises(SeedlabError, match="no summary.parquet"):
        read_summary(RunDir(tmp_path))
    pd.DataFrame({"member": [], "generalized": []}).to_parquet(tmp_path / "summary.parquet")
    with pytest.raises(SeedlabError, match="no members"):
        read_summary(RunDir(tmp_path))
    _summary({(1, 0.5): [None]}).assign(generalized=0).to_parquet(tmp_path / "summary.parquet")
    assert read_summary(RunDir(tmp_path))["generalized"].dtype == bool
    assert read_table(RunDir(tmp_path), "circuits") is None
    # what generalized meant: a run folder without meta.json reads as the old definition
    assert generalized_definitions(RunDir(tmp_path), []) == [OLD_DEFINITION]
    (tmp_path / "meta.json").write_text(json.dumps({"generalized": "new"}))
    assert generalized_definitions(RunDir(tmp_path), []) == ["new"]
    # the pre-registration, and whether its text still has the recorded hash
    sweep = SweepDir(tmp_path)
    assert read_preregistration(sweep) is None
    sweep.preregistration_path.write_text("H1\n")
    sweep.preregistration_record.write_text(json.dumps({"sha256": file_sha256(sweep.preregistration_path), "source": "p.md",
                                                        "written_utc": "2026-01-01T00:00:00"}))
    rec = read_preregistration(sweep)
    assert rec.intact and rec.text == "H1\n" and rec.source == "p.md"
    sweep.preregistration_path.write_text("H2\n")
    assert not read_preregistration(sweep).intact
