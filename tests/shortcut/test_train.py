"""Training: a member's result does not depend on its ensemble; outcomes; checkpoints; early stop."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors import safe_open

from seedlab.shortcut import train as train_mod
from seedlab.shortcut.config import EnsembleConfig
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.phases import member_phases
from seedlab.shortcut.train import Evaluation, Outcome, evaluate, leading_correct, train_ensemble


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
        oc.update(epoch, {"adv_acc": adv, "val_acc": 1.0, "train_acc": 1.0}, round(100 * adv))
    assert oc.generalized and oc.gen_epoch == 20 and oc.retained and oc.peak_adv_acc == 1.0
    oc.update(50, {"adv_acc": 0.5, "val_acc": 1.0, "train_acc": 1.0}, 50)
    assert oc.generalized and oc.gen_epoch == 20 and not oc.retained  # transient generalization


def test_the_inverted_shortcut_is_not_generalization():
    # r < 0.5 rewards the inverted shortcut: 100% on the adversarial split (all anti-shortcut) and 0% on
    # the validation split (all consistent) -- not the rule, which solves both
    oc = Outcome()
    oc.update(10, {"adv_acc": 1.0, "val_acc": 0.0, "train_acc": 0.85}, 100)
    oc.see_adv(11, 1.0, 100, 0.98)  # below the 99% at which validation counts as solved
    assert not oc.generalized and oc.gen_epoch is None and oc.peak_adv_acc == 1.0
    oc.see_adv(12, 1.0, 100, 0.99)
    assert oc.generalized and oc.gen_epoch == 12
    curve = pd.DataFrame([(e, s, a) for e, v, d in [(0, 0.5, 0.5), (10, 0.48, 1.0), (20, 0.99, 1.0)]
                          for s, a in (("val", v), ("adv", d))], columns=["epoch", "split", "acc"])
    assert member_phases(curve)["gen_epoch"] == 20


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
        acc, loss, prefix = real(model, x, y, chunk)
        calls["n"] += 1
        if calls["n"] > 3 * 2:  # adv acc = 1 from the 3rd evaluation on
            return np.ones_like(acc), loss, np.full_like(prefix, x.shape[1])
        return acc, loss, prefix

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
    # the report's sensitivity column: the sparse run counted at its evaluations alone is the coarse run
    from seedlab.shortcut.stats import at_evaluations

    assert at_evaluations(sparse.summary, sparse.curves).tolist() == coarse.summary.generalized.tolist()


def test_adv_prefix_is_the_first_wrong_row():
    """The adv prefix of hand-built correctness vectors: the index of the first wrong row, n when none is."""
    correct = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    assert leading_correct(correct).tolist() == [2, 5, 0, 4]


class _Marked(torch.nn.Module):
    """A stand-in model whose row j is correct unless its first token is 9: correctness vectors by hand."""

    def row_losses(self, x, y):
        return torch.zeros(x.shape[:2]), x[..., 0] != 9


def test_evaluation_folds_the_largest_adv_prefix_into_each_outcome():
    n = 7
    x = torch.zeros(2, n, 3, dtype=torch.long)
    x[0, 4, 0] = 9  # member 0: rows 0-3 correct, row 4 wrong
    y = torch.zeros(2, n, dtype=torch.long)
    acc, _, prefix = evaluate(_Marked(), x, y, chunk=3)  # pieces 0-2, 3-5, 6: the prefix crosses pieces
    assert prefix.tolist() == [4, 7] and acc.tolist() == pytest.approx([6 / 7, 1.0])
    data = {s: (x.clone(), y, torch.ones_like(y, dtype=torch.bool)) for s in ("train", "val", "adv")}
    ev = Evaluation(_Marked(), data, [None, None], every=10, chunk=3)
    ev(0)
    assert [oc.adv_prefix_max for oc in ev.outcomes] == [4, 7]
    assert [oc.generalized for oc in ev.outcomes] == [False, True]
    data["adv"][0][0, 1, 0] = 9  # a later check with a shorter prefix keeps the maximum
    ev.check_adv(5)
    assert ev.outcomes[0].adv_prefix_max == 4
    data["adv"][0][0, :, 0] = 0  # all of member 0's adversarial rows right, one validation row of 7 still wrong (< 99%)
    ev.check_adv(6)
    assert ev.outcomes[0].adv_prefix_max == 7 and not ev.outcomes[0].generalized
    data["val"][0][0, :, 0] = 0  # both splits right at an adv_every check: generalized there
    ev.check_adv(7)
    assert ev.outcomes[0].gen_epoch == 7


def test_evaluate_prefix_of_a_real_model_matches_a_loop():
    cfg = _cfg()
    m = EnsembleTransformer(cfg.model, 3, 10, 5, 2)
    m.init_members([0, 1, 2])
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 10, (3, 50, 5), generator=g), torch.randint(0, 2, (3, 50), generator=g)
    _, _, prefix = evaluate(m, x, y, chunk=16)
    right = (m(x).argmax(-1) == y).tolist()
    assert prefix.tolist() == [row.index(False) if False in row else len(row) for row in right]


def test_adv_prefix_max_in_a_real_run(tmp_path):
    """A tiny real ensemble (some members generalize, some do not): adv_prefix_max is n_adv exactly for the
    generalized members and below it for the others, and is the last summary column."""
    cfg = EnsembleConfig.model_validate({
        "model": {"layers": 2, "heads": 2, "d_model": 16, "d_ff": 32},
        "data": {"length": 3, "n_train": 128, "n_val": 32, "n_adv": 32, "vocab": 8},
        "optim": {"lr": 1e-2},
        "train": {"epochs": 40, "batch_size": 32, "eval_every": 10, "adv_every": 2},
        "members": {"task": ["sum2-max"], "ratio": [0.5, 0.9], "seed": [0, 1, 2, 3]},
    })
    train_ensemble(cfg, tmp_path, progress=False)
    s = pd.read_parquet(tmp_path / "summary.parquet")
    assert s.columns[-1] == "adv_prefix_max" and list(s.columns[-3:-1]) == ["shortcut_epoch", "phase2_epoch"]
    assert 0 < s.generalized.sum() < len(s)  # both kinds of member
    assert (s.adv_prefix_max[s.generalized] == 32).all() and (s.adv_prefix_max[~s.generalized] < 32).all()
    assert (s.generalized == (s.adv_prefix_max == 32)).all()
    assert (s.adv_prefix_max <= np.round(s.peak_adv_acc * 32)).all()  # a prefix never exceeds the rows right


def _weights(cfg, members):
    """The trained ensemble's weights (train_ensemble keeps no model: rebuild it from a checkpoint-free run)."""
    seen = {}
    real = train_mod.init_ensemble

    def spy(*a, **k):
        model, opt = real(*a, **k)
        seen["model"] = model
        return model, opt

    train_mod.init_ensemble = spy
    try:
        train_ensemble(cfg, members=members, progress=False)
    finally:
        train_mod.init_ensemble = real
    return {k: v.clone() for k, v in seen["model"].state_dict().items()}


def test_bf16_is_bitwise_reproducible_keeps_fp32_weights_and_differs_from_fp32():
    cfg = _cfg(train={"epochs": 6, "precision": "bf16"})
    members = cfg.expand()[:4]
    a, b = _weights(cfg, members), _weights(cfg, members)
    assert all(torch.equal(a[k], b[k]) for k in a)  # one machine, one thread count: the same bits
    assert all(v.dtype == torch.float32 for v in a.values())  # master weights stay fp32
    fp32 = _weights(_cfg(train={"epochs": 6}), members)
    assert any(not torch.equal(a[k], fp32[k]) for k in a)  # the forward really ran in bf16
    # ... and near it: the two runs are far closer to each other than to where they started
    init = train_mod.init_ensemble(cfg, members, torch.device("cpu"))[0].state_dict()
    dist = lambda p, q: sum(((p[k] - q[k]) ** 2).sum().item() for k in p) ** 0.5
    assert dist(a, fp32) < 0.5 * dist(fp32, init)  # measured: 0.25 (AdamW amplifies bf16 rounding in tiny gradients)


def test_bf16_forward_runs_the_matmuls_in_bf16_and_the_loss_in_fp32():
    cfg = _cfg(train={"precision": "bf16"})
    model = EnsembleTransformer(cfg.model, 2, cfg.data.vocab, cfg.data.length, 2)
    x, y = torch.randint(0, cfg.data.vocab, (2, 8, cfg.data.length)), torch.randint(0, 2, (2, 8))
    with train_mod.autocast(torch.device("cpu"), "bf16"):
        assert model(x).dtype == torch.bfloat16
        ce, _ = model.row_losses(x, y)
    assert ce.dtype == torch.float32
    with train_mod.autocast(torch.device("cpu"), "fp32"):
        assert model(x).dtype == torch.float32


def test_the_run_folder_records_the_precision_and_the_environment(tmp_path):
    from seedlab.machine import cpu, environment

    cfg = _cfg(train={"epochs": 2, "precision": "bf16", "threads": 1}, members={"seed": [0]})
    train_ensemble(cfg, tmp_path / "run", progress=False)
    env = json.loads((tmp_path / "run" / "meta.json").read_text())["environment"]
    assert env["cpu"] == cpu()["model"] and env["threads"] == 1 and env["torch"] == torch.__version__
    assert env == environment(torch.device("cpu"), "bf16")  # the record every study keeps
    assert EnsembleConfig.model_validate(__import__("yaml").safe_load((tmp_path / "run" / "config.yaml").read_text())).train.precision == "bf16"
