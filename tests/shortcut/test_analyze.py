"""Circuit analyses of every checkpoint of a tiny real run -> circuits.parquet."""

import pandas as pd
import pytest

from seedlab.errors import SeedlabError
from seedlab.shortcut import analyze


def test_analyze_run_on_a_tiny_training_run(tiny_run):
    run = tiny_run([0, 4])
    df = analyze.analyze_run(run)
    assert list(df.columns) == analyze.COLUMNS
    assert len(df) == 2 * 2 * 2 * 3  # epochs x members x layers x (heads + MLP)
    assert sorted(df.epoch.unique()) == [0, 4]
    assert sorted(df.member.unique()) == [0, 1]
    assert sorted(df["head"].unique()) == [-1, 0, 1]
    mlp = df[df["head"] == -1]
    assert mlp[["qk_rho_value", "attn_pos0", "ov_rho_residue"]].isna().all().all()
    heads = df[df["head"] >= 0]
    assert heads["attn_pos0"].between(0, 1).all()
    assert heads["qk_rho_value"].abs().le(1 + 1e-9).all()
    for c in ("zero_ablation_val", "zero_ablation_adv", "mean_ablation_val", "mean_ablation_adv"):
        assert df[c].between(-1, 1).all()
    path = analyze.write_circuits(run)
    assert path == run / "circuits.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)


def test_analyze_run_without_checkpoints(tiny_run):
    run = tiny_run([])
    with pytest.raises(SeedlabError, match="no checkpoints"):
        analyze.analyze_run(run)
