"""Circuit analyses of every checkpoint of a tiny real run -> circuits.parquet and patching.parquet."""

import numpy as np
import pandas as pd
import pytest

from seedlab.errors import SeedlabError
from seedlab.shortcut import analyze
from seedlab.shortcut.config import EnsembleConfig
from seedlab.shortcut.interventions import DIRECTIONS, PATHS
from seedlab.shortcut.pairs import KINDS

pytestmark = pytest.mark.usefixtures("one_thread")


def test_analyze_run_on_a_tiny_training_run(tiny_run):
    run = tiny_run([0, 4])
    df, pt = analyze.analyze_run(run)
    assert list(df.columns) == analyze.COLUMNS
    assert len(df) == 2 * 2 * 2 * 3  # epochs x members x layers x (heads + MLP)
    assert sorted(df.epoch.unique()) == [0, 4]
    assert sorted(df.member.unique()) == [0, 1]
    assert sorted(df["head"].unique()) == [-1, 0, 1]
    mlp, heads = df[df["head"] == -1], df[df["head"] >= 0]
    per_head = ["qk_rho_value", "attn_pos0", "qk_w_rho_value", "qk_w_pos0", "ov_rho_residue"]
    per_head += [f"{k}_ablation_{s}" for k in ("qk_uniform", "qk_mean", "ov_mean") for s in ("val", "adv")]
    assert mlp[per_head].isna().all().all()
    assert heads[[c for c in per_head if c not in ("qk_rho_value", "ov_rho_residue")]].notna().all().all()
    assert heads["attn_pos0"].between(0, 1).all() and heads["qk_w_pos0"].between(0, 1).all()
    assert heads["qk_rho_value"].abs().le(1 + 1e-9).all()
    for c in [c for c in analyze.COLUMNS if "ablation" in c]:
        assert df[c].dropna().between(-1, 1).all(), c
    for c in ("probe_sum", "probe_shortcut"):  # heads and MLPs alike
        assert df[c].notna().all() and df[c].between(0, 1).all()
        assert df[f"{c}_chance"].between(0.5, 1).all()  # the other residue alone reads it on the val half at least
    assert (df["probe_rows"] == 64).all()  # all 32 val and 32 adv rows (fewer than PROBE_ROWS)
    # patching: one row per (member, epoch, component, kind, path, direction), 32 pairs each (rows = min(n, n_val, n_adv))
    assert list(pt.columns) == analyze.PATCHING_COLUMNS
    assert len(pt) == len(KINDS) * len(PATHS) * len(DIRECTIONS) * len(df)
    assert set(pt["direction"]) == set(DIRECTIONS) and set(pt["pairs"]) == set(KINDS) and set(pt["path"]) == set(PATHS)
    assert not pt.duplicated(analyze.KEYS + ["pairs", "path", "direction"]).any()
    # the last MLP reads into no MLP: its via-MLP path moves nothing, its direct path is all of it
    last = pt[(pt["layer"] == 1) & (pt["head"] == -1)].set_index(["member", "epoch", "pairs", "direction", "path"])["dld_q50"]
    assert (last.xs("via_mlp", level="path") == 0).all()
    np.testing.assert_allclose(last.xs("direct", level="path"), last.xs("total", level="path"), atol=1e-5)
    assert (pt["n_pairs"] == 32).all() and pt["n_small_gap"].between(0, 32).all()
    q = pt[[c for c in pt.columns if c.startswith("frac_q")]]
    ok = q.notna().all(axis=1)
    assert (np.diff(q[ok].to_numpy(), axis=1) >= -1e-12).all()  # quantiles ascend
    assert ((pt["n_small_gap"] == 32) == q.isna().all(axis=1)).all()  # no fraction only where every pair is flagged
    paths = analyze.write_analyses(run)
    assert paths == {"circuits": run / "circuits.parquet", "patching": run / "patching.parquet"}
    pd.testing.assert_frame_equal(pd.read_parquet(paths["circuits"]), df)
    pd.testing.assert_frame_equal(pd.read_parquet(paths["patching"]), pt)
    assert analyze.write_circuits(run) == paths["circuits"]  # the old entry point writes both too


def test_analyze_run_without_checkpoints(tiny_run):
    run = tiny_run([])
    with pytest.raises(SeedlabError, match="no checkpoints"):
        analyze.analyze_run(run)


def test_no_counterfactual_pairs_is_a_one_line_error_and_nothing_is_written(tmp_path, seedlab_main):
    from seedlab.shortcut.train import train_ensemble

    cfg = EnsembleConfig.model_validate(
        {
            "model": {"layers": 1, "heads": 1, "d_model": 8, "d_ff": 8},
            "data": {"n_train": 8, "n_val": 4, "n_adv": 4, "vocab": 2, "length": 5},  # 0..1: no max can change parity
            "train": {"epochs": 1, "eval_every": 1, "checkpoint_epochs": [1]},
            "members": {"task": ["sum2-max"], "ratio": [0.5], "seed": [0]},
        }
    )
    train_ensemble(cfg, tmp_path, progress=False)
    with pytest.raises(SeedlabError, match="^vocab: counterfactual pairs for sum2-max") as e:
        analyze.write_analyses(tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "circuits.parquet").exists() and not (tmp_path / "patching.parquet").exists()
    rc, _, err = seedlab_main("shortcut", "analyze", str(tmp_path))
    assert rc == 2 and err.startswith("error: vocab: counterfactual pairs") and err.count("\n") == 1
    assert not (tmp_path / "circuits.parquet").exists() and not (tmp_path / "patching.parquet").exists()
