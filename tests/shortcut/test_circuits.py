"""Circuit analyses on hand-built weights (known answers) and on a tiny real run."""

import numpy as np
import pandas as pd
import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.shortcut import circuits
from seedlab.shortcut.config import EnsembleConfig, ModelConfig
from seedlab.shortcut.model import EnsembleTransformer

VOCAB, LENGTH, S = 10, 5, 2
# residual dimensions of the hand-built model (d_model = 8, 2 heads of d_head = 4)
VAL, READ, POS0, PAR, OUT = 0, 1, 2, 3, 4


def _zero_model(n_classes: int = 2) -> EnsembleTransformer:
    cfg = ModelConfig(layers=1, heads=2, d_model=8, d_ff=4, layer_norm=False)
    model = EnsembleTransformer(cfg, S, VOCAB, LENGTH, n_classes)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def _hand_built(q_scale: float = 1.0) -> EnsembleTransformer:
    """Head 0 attends to large values and writes parity to the readout; head 1 attends to position 0.

    - W_E[v] = (v in VAL, v mod 2 in PAR); W_E[READ token] has 1 in READ; W_pos[0] has 1 in POS0.
    - head 0: key = VAL, query at the readout = q_scale * READ -> attends to the max value;
      value = PAR, output -> OUT; W_U reads OUT as (class 1 - class 0).
    - head 1: key = 10 * POS0, query = 10 * READ -> attends to position 0; W_O = 0.
    """
    m = _zero_model()
    a = m.blocks[0].attn
    with torch.no_grad():
        v = torch.arange(VOCAB, dtype=torch.float32)
        m.embed.W_E[:, :VOCAB, VAL] = v
        m.embed.W_E[:, :VOCAB, PAR] = v % 2
        m.embed.W_E[:, VOCAB, READ] = 1.0
        m.pos_embed.W_pos[:, 0, POS0] = 1.0
        a.W_K[:, 0, VAL, 0] = 1.0
        a.W_Q[:, 0, READ, 0] = q_scale
        a.W_V[:, 0, PAR, 0] = 1.0
        a.W_O[:, 0, 0, OUT] = 1.0
        a.W_K[:, 1, POS0, 0] = 10.0
        a.W_Q[:, 1, READ, 0] = 10.0
        m.unembed.W_U[:, OUT, 1] = 1.0
        m.unembed.W_U[:, OUT, 0] = -1.0
    return m


def _x(B: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (S, B, LENGTH), generator=g)


def test_spearman_basics():
    a = np.array([[1.0, 2, 3, 4], [1, 1, 1, 1]])
    np.testing.assert_allclose(circuits.spearman(a[0], [10, 20, 30, 40]), 1.0)
    np.testing.assert_allclose(circuits.spearman(a[0], [4, 3, 2, 1]), -1.0)
    assert np.isnan(circuits.spearman(a, [1, 2, 3, 4])[1])


@pytest.mark.parametrize("q_scale", [1.0, 20.0])  # soft and sharp attention to large values
def test_qk_max_head_has_high_value_rho_and_position_head_attends_to_pos0(q_scale):
    m = _hand_built(q_scale)
    fp = circuits.qk_fingerprint(m, _x())
    assert fp["qk_rho_value"].shape == fp["attn_pos0"].shape == (S, 1, 2)
    assert (fp["qk_rho_value"][:, 0, 0] > 0.8).all(), fp["qk_rho_value"]
    assert (fp["attn_pos0"][:, 0, 1] > 0.9).all(), fp["attn_pos0"]
    # the max head does not focus on position 0; the position head ignores magnitude
    assert (fp["attn_pos0"][:, 0, 0] < 0.5).all()
    assert (np.abs(fp["qk_rho_value"][:, 0, 1]) < 0.5).all()


def test_qk_sharp_max_head_puts_its_mass_on_the_max():
    m = _hand_built(q_scale=20.0)
    x = _x()
    _, cache = m.run_with_cache(x, ["blocks.0.attn.hook_pattern"])
    p = cache["blocks.0.attn.hook_pattern"][:, :, 0, -1, :LENGTH]
    on_max = (p * (x == x.max(-1, keepdim=True).values)).sum(-1) / p.sum(-1)
    assert (on_max > 0.99).all()
    assert (circuits.qk_fingerprint(m, x)["qk_rho_value"][:, 0, 0] > 0.8).all()


def test_ov_parity_head_has_rho_one():
    m = _hand_built()
    rho = circuits.ov_fingerprint(m, _x(), 2)
    assert rho.shape == (S, 1, 2)
    assert (rho[:, 0, 0] > 0.8).all(), rho
    np.testing.assert_allclose(rho[:, 0, 0], 1.0)
    assert np.isnan(rho[:, 0, 1]).all()  # W_O = 0: a constant output has no rank correlation
    with pytest.raises(ValueError, match="modulus"):
        circuits.ov_fingerprint(m, _x(), 3)


def test_ov_ternary_residue_head():
    m = _zero_model(n_classes=3)
    a = m.blocks[0].attn
    with torch.no_grad():
        r = torch.arange(VOCAB) % 3
        for c in range(3):  # one-hot residue in dims 0..2, copied by head 0 to dims 4..6 = class c
            m.embed.W_E[:, :VOCAB, c] = (r == c).float()
            a.W_V[:, 0, c, c] = 1.0
            a.W_O[:, 0, c, 4 + c] = 1.0
            m.unembed.W_U[:, 4 + c, c] = 1.0
            a.W_V[:, 1, c, c] = 1.0  # head 1 writes the residue's NEXT class: anti-correlated
            a.W_O[:, 1, c, 4 + (c + 1) % 3] = 1.0
    rho = circuits.ov_fingerprint(m, _x())
    np.testing.assert_allclose(rho[:, 0, 0], 1.0)
    assert (rho[:, 0, 1] < 0).all()


def test_ablating_a_head_with_zero_W_O_changes_nothing():
    m = _hand_built()
    x = _x(128)
    y = x.sum(-1) % 2
    for kind in ("zero", "mean"):
        d = circuits.ablate(m, x, y, kind)
        assert d.shape == (S, 1, 3)
        assert (d[:, 0, 1] == 0).all()  # head 1 writes nothing
        assert (d[:, 0, 2] == 0).all()  # the MLP is all zeros
    # zero-ablating the only writing head leaves logits 0 -> argmax 0: accuracy = fraction of y == 0
    base = (m(x).argmax(-1) == y).double().mean(1).numpy()
    np.testing.assert_allclose(circuits.ablate(m, x, y, "zero")[:, 0, 0], (y == 0).double().mean(1).numpy() - base)
    with pytest.raises(ValueError, match="kind"):
        circuits.ablate(m, x, y, "resample")


def _uniform_two_writer_model() -> EnsembleTransformer:
    """Both heads attend uniformly (W_Q = W_K = 0) and copy VAL to OUT, head 0 with weight 3, head 1 with 1."""
    m = _zero_model()
    a = m.blocks[0].attn
    with torch.no_grad():
        m.embed.W_E[:, :VOCAB, VAL] = torch.arange(VOCAB, dtype=torch.float32)
        for h, w in ((0, 3.0), (1, 1.0)):
            a.W_V[:, h, VAL, 0] = 1.0
            a.W_O[:, h, 0, OUT] = w
        m.unembed.W_U[:, OUT, 1] = 1.0
        m.unembed.W_U[:, OUT, 0] = -1.0
    return m


def test_patching_into_itself_moves_nothing():
    m = _hand_built()
    x = _x(32)
    y = x.sum(-1) % 2
    moved, full = circuits.patch_delta(m, x, x, y)
    assert (moved == 0).all() and (full == 0).all()
    assert np.isnan(circuits.patch(m, x, x, y)).all()


def test_patching_moves_each_head_by_its_share():
    m = _uniform_two_writer_model()
    x_dst = _x(32, seed=1)
    x_src = _x(32, seed=2)
    y = x_dst.sum(-1) % 2
    frac = circuits.patch(m, x_src, x_dst, y)
    assert frac.shape == (S, 1, 3)
    # the logits are linear in the two heads' writes, which differ only by their weights 3 : 1
    np.testing.assert_allclose(frac[:, 0, 0], 0.75, atol=1e-5)
    np.testing.assert_allclose(frac[:, 0, 1], 0.25, atol=1e-5)
    np.testing.assert_allclose(frac[:, 0, 2], 0.0, atol=1e-12)  # the MLP carries nothing


def test_patch_rejects_unpaired_batches():
    m = _hand_built()
    with pytest.raises(ValueError, match="pair"):
        circuits.patch(m, _x(16), _x(32), _x(32).sum(-1) % 2)


def _tiny_run(tmp_path, checkpoints):
    from seedlab.shortcut.train import train_ensemble

    cfg = EnsembleConfig.model_validate(
        {
            "model": {"layers": 2, "heads": 2, "d_model": 16, "d_ff": 32},
            "data": {"n_train": 128, "n_val": 32, "n_adv": 32, "vocab": 10},
            "train": {"epochs": 4, "eval_every": 2, "checkpoint_epochs": checkpoints},
            "members": {"task": ["sum2-max"], "ratio": [0.9], "seed": [0, 1]},
        }
    )
    train_ensemble(cfg, tmp_path, progress=False)
    return tmp_path


def test_analyze_run_on_a_tiny_training_run(tmp_path):
    run = _tiny_run(tmp_path, [0, 4])
    df = circuits.analyze_run(run)
    assert list(df.columns) == circuits.COLUMNS
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
    path = circuits.write_circuits(run)
    assert path == run / "circuits.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(path), df)


def test_analyze_run_without_checkpoints(tmp_path):
    run = _tiny_run(tmp_path, [])
    with pytest.raises(SeedlabError, match="no checkpoints"):
        circuits.analyze_run(run)
