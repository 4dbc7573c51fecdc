"""Training: a member's result does not depend on its ensemble; outcomes; checkpoints; early stop."""

import json

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open

from seedlab.shortcut import train as train_mod
from seedlab.shortcut.config import EnsembleConfig
from seedlab.shortcut.train import Outcome, train_ensemble


def _cfg(**over):
    base = {
        "model": {"layers": 2, "heads": 2},
        "data": {"n_train": 256, "n_val": 64, "n_adv": 64, "vocab": 10},
        "optim": {"lr": 3e-3},
        "train": {"epochs": 12, "batch_size": 64, "chunk": None, "eval_every": 3},
        "members": {"task": ["sum2-max", "sum2-first"], "ratio": [0.5, 0.9], "seed": [0, 1], "weight_decay": [0.1, 0.4]},
    }
    for k, v in over.items():
        base[k] = base.get(k, {}) | v
    return EnsembleConfig.model_validate(base)


def test_member_in_ensemble_of_8_matches_solo_run():
    cfg = _cfg(optim={"lr": 3e-3})
    members = cfg.expand()
    assert len(members) == 16
    members = members[::2]  # 8 members differing in task, ratio, weight decay
    cfg8 = cfg.model_copy(deep=True)
    ens = train_ensemble(cfg8, members=members, progress=False)
    for i in (0, 5):
        solo = train_ensemble(cfg, members=[members[i]], progress=False)
        a = ens.curves[ens.curves.member == i].reset_index(drop=True)
        b = solo.curves.reset_index(drop=True)
        np.testing.assert_array_equal(a.epoch, b.epoch)
        np.testing.assert_allclose(a.loss, b.loss, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(a.acc, b.acc, atol=1.5 / 64)  # at most one borderline sample may flip


def test_full_batch_chunking_is_the_same_math():
    cfg = _cfg(train={"batch_size": None, "chunk": 512, "epochs": 6})
    members = cfg.expand()[:2]
    whole = train_ensemble(cfg, members=members, progress=False)
    cfg.train.chunk = 74  # uneven pieces: 37 rows per member
    pieces = train_ensemble(cfg, members=members, progress=False)
    np.testing.assert_allclose(whole.curves.loss, pieces.curves.loss, rtol=1e-4, atol=1e-6)


def test_outcome_rules():
    oc = Outcome()
    for epoch, adv in [(0, 0.3), (10, 0.99), (20, 1.0), (30, 0.98), (40, 1.0)]:
        oc.update(epoch, {"adv_acc": adv, "val_acc": 1.0, "train_acc": 1.0})
    assert oc.generalized and oc.gen_epoch == 20 and oc.retained and oc.peak_adv_acc == 1.0
    oc.update(50, {"adv_acc": 0.5, "val_acc": 1.0, "train_acc": 1.0})
    assert oc.generalized and oc.gen_epoch == 20 and not oc.retained  # transient generalization


def test_outputs_and_checkpoints(tmp_path):
    cfg = _cfg(train={"checkpoint_epochs": [0, 6]})
    members = cfg.expand()[:3]
    r = train_ensemble(cfg, tmp_path, members=members, progress=False)
    s = pd.read_parquet(tmp_path / "summary.parquet")
    for col in ["task", "ratio", "layers", "heads", "weight_decay", "seed", "generalized", "gen_epoch", "final_val_acc", "final_adv_acc", "retained"]:
        assert col in s.columns
    assert len(s) == 3
    c = pd.read_parquet(tmp_path / "curves.parquet")
    assert list(c.columns) == ["member", "epoch", "split", "acc", "loss"]
    assert sorted(c.epoch.unique()) == [0, 3, 6, 9, 12]
    assert len(c) == 5 * 3 * 3
    with safe_open(tmp_path / "checkpoints" / "epoch-000000.safetensors", "pt") as f:
        meta = f.metadata()
        w = f.get_tensor("blocks.0.attn.W_Q")
    assert w.shape[0] == 3 and json.loads(meta["members"])[1]["seed"] == members[1].seed
    # epoch-0 weights are each member's seed-determined init
    from seedlab.shortcut.model import EnsembleTransformer

    m = EnsembleTransformer(cfg.model, 1, cfg.data.vocab, cfg.data.length, 2)
    m.init_members([members[1].seed])
    assert torch.equal(w[1], m.blocks[0].attn.W_Q[0].detach())
    assert (tmp_path / "checkpoints" / "epoch-000006.safetensors").exists()
    assert r.epochs_run == 12


def test_stop_when_decided(monkeypatch):
    """Once every member has generalized the run stops at that evaluation."""
    calls = {"n": 0}
    real = train_mod.evaluate

    def fake(model, x, y, chunk):
        acc, loss = real(model, x, y, chunk)
        calls["n"] += 1
        return np.ones_like(acc) if calls["n"] > 3 * 2 else acc, loss  # adv acc = 1 from the 3rd evaluation on

    monkeypatch.setattr(train_mod, "evaluate", fake)
    cfg = _cfg(train={"stop_when_decided": True, "epochs": 30})
    r = train_ensemble(cfg, members=cfg.expand()[:2], progress=False)
    assert r.epochs_run == 6
    assert list(r.summary.gen_epoch) == [6, 6]


def test_adv_every_sees_what_evaluating_every_epoch_sees():
    """train.adv_every checks adversarial accuracy between the evaluations: the outcome ("100% at any
    point", the peak) is that of evaluating every epoch, while the curves keep the coarser cadence."""
    every = train_ensemble(_cfg(train={"eval_every": 1, "epochs": 12}), progress=False)
    sparse = train_ensemble(_cfg(train={"eval_every": 6, "adv_every": 1, "epochs": 12}), progress=False)
    coarse = train_ensemble(_cfg(train={"eval_every": 6, "epochs": 12}), progress=False)
    cols = ["generalized", "gen_epoch", "peak_adv_acc"]
    pd.testing.assert_frame_equal(sparse.summary[cols], every.summary[cols])
    assert sorted(sparse.curves.epoch.unique()) == [0, 6, 12]
    assert (coarse.summary.peak_adv_acc <= every.summary.peak_adv_acc).all()
    assert (coarse.summary.peak_adv_acc < every.summary.peak_adv_acc).any()  # the cadence mattered here
