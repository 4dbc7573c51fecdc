"""A bank with row weights (candidates.weights) and nudge arms: weighted.parquet and distances.parquet; the
own-row control bitwise the twin at every weight; unroll's three outputs from one replay — the exact readout
equal to the measured effect at s+1 (where the propagated step is exact), and measured(w)/w converging to the
w → 0 tangent as w shrinks (the test of the propagation that s+1 alone cannot give)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from seedlab.attribution.bank.run import run_bank
from seedlab.attribution.bank.rundir import BankDir, open_bank

pytestmark = pytest.mark.usefixtures("one_thread")
WEIGHTS = [1.0, 0.25, 0.0625, 0.015625]


@pytest.fixture(scope="module")
def weighted_bank(tmp_path_factory, twins_inputs, bank_design):
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.config import load_config

    base = tmp_path_factory.mktemp("weighted")
    over = {"seeds": [0], "horizons": [1, 3, "end"], "candidates": {**bank_design.config["candidates"], "weights": WEIGHTS}}
    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(base, twins_inputs[0], **over))
    run_bank(cfg, base / "bank", base=folder, progress=False)
    return base / "bank"


def test_weighted_effects_and_the_own_row_control_at_every_weight(weighted_bank):
    rd = BankDir(weighted_bank)
    w = pd.read_parquet(rd.weighted_measured)
    assert sorted(w.weight.unique()) == sorted(WEIGHTS)
    assert (w[w.candidate == "own-row"].measured == 0).all()
    one = w[w.weight == 1].drop(columns="weight").reset_index(drop=True)
    m = pd.read_parquet(rd.measured)
    pd.testing.assert_series_equal(one.measured, m.measured, check_names=False)  # w = 1 is measured.parquet
    shown = json.loads(rd.integrity.read_text())["seeds"]["0"]["own_row_weighted"]
    assert sorted(shown) == sorted(f"{x:g}" for x in WEIGHTS if x != 1) and all(v["bitwise_equal_to_twin"] for v in shown.values())
    # smaller weights, smaller effects (the effect of the passage-0 row on its own text at s+1 shrinks ~ w)
    own = w[(w.candidate == "passage-0") & (w["query"] == "self") & (w.label == "s+1")].set_index("weight").measured
    assert len(own) == 4 and (np.diff(np.abs(own.sort_index().to_numpy())) > 0).all()


def test_distances_of_rows_and_nudges(weighted_bank):
    d = pd.read_parquet(BankDir(weighted_bank).distances)
    assert set(d.kind) == {"candidate", "weighted", "nudge"}
    s1 = d[d.after == 1]
    assert (d[d.after == 0].distance == 0).all()  # every arm is the twin at s (a nudge moves it after its record)
    nudges = s1[s1.kind == "nudge"]
    assert len(nudges) == 2 and (nudges.distance > 0).all() and (nudges.distance < 1e-4).all()
    row = s1[(s1.candidate == "passage-0") & s1.kind.isin(["candidate", "weighted"])].set_index("weight").distance
    assert len(row) == 4 and (np.diff(row.sort_index().to_numpy()) > 0).all()  # the kick grows with the weight
    assert (s1[s1.candidate == "own-row"].distance == 0).all()


def test_unroll_outputs_from_one_replay(weighted_bank):
    from seedlab.attribution.estimators.builtin import Case, Gradients
    from seedlab.attribution.estimators.unroll import READOUT, TANGENT, UNROLL, responses, unroll
    from seedlab.forks.prefix import read_prefix
    from seedlab.lm.trainer import Trainer

    bank = open_bank(weighted_bank)
    cfg, inputs = bank.cfg, bank.inputs
    t = Trainer(cfg.model_copy(update={"device": "cpu"}), inputs.gcfg, 0, inputs.corpus.train)
    read_prefix(t, bank.dir.prefix(0), cfg.injection_step)
    cands = {n: x.tokens for n, x in inputs.candidates_of(0).items() if n != "own-row"}
    case = Case.of(*inputs.ordinary_batch(0), cfg.injection_row, cands, dict(cands), inputs.pad_id)
    grads = Gradients(t.model, case)
    hs = list(cfg.horizon_steps())
    out = responses(grads, t, hs, outputs=(UNROLL, READOUT, TANGENT))
    plain = unroll(grads, t, hs)
    assert all(np.array_equal(out[UNROLL][h], plain[h]) for h in hs)  # pushed beside the tangents: the same numbers
    w = pd.read_parquet(bank.dir.weighted_measured)
    w = w[(w["query"] == "self") & (w.candidate != "own-row")]
    names = list(cands)
    s1 = hs[0]
    measured1 = w[(w.weight == 1) & (w.horizon == s1)].set_index("candidate").measured.reindex(names).to_numpy()
    readout = np.diag(out[READOUT][s1])  # each candidate on its own text
    assert np.abs(readout - measured1).max() < 1e-4 * np.abs(measured1).max()  # exact to float32 at s+1
    for h in hs:  # measured(w)/w -> the tangent as w -> 0
        tangent = np.diag(out[TANGENT][h])
        err = []
        for x in sorted(WEIGHTS, reverse=True):
            m = w[(w.weight == x) & (w.horizon == h)].set_index("candidate").measured.reindex(names).to_numpy()
            err.append(np.linalg.norm(m / x - tangent) / np.linalg.norm(tangent))
        assert err[-1] < err[0] and err[-1] < 0.1, (h, err)


def test_attribute_runs_the_three_from_one_replay_and_unroll_alone_is_unchanged(weighted_bank, tmp_path):
    import shutil

    from seedlab.attribution.estimators.attribute import attribute

    both = tmp_path / "bank"
    shutil.copytree(weighted_bank, both)
    df = attribute(both, estimators=["unroll", "unroll-tangent", "unroll-readout"], progress=False)
    alone = attribute(weighted_bank, estimators=["unroll"], progress=False)
    assert set(df.estimator) == {"unroll", "unroll-tangent", "unroll-readout"}
    u = df[df.estimator == "unroll"].reset_index(drop=True)
    pd.testing.assert_frame_equal(u, alone.reset_index(drop=True))
    assert set(df[df.estimator != "unroll"].estimator_label) == {"reference"}


@pytest.mark.parametrize("sets, match", [
    (["candidates.weights=[1, 0]"], "greater than 0"),
    (["candidates.weights=[1, 1.5]"], "less than or equal to 1"),
    (["candidates.weights=[0.5, 0.25]"], "weights: must include 1"),
    (["candidates.weights=[1, 0.5, 0.5]"], "weights: each weight once"),
    (["candidates.weights=[1, 1e-6]"], r"weights: at least 0.0001, got 1e-06 \(a float32 run cannot hold a smaller one"),
    (["chaos.nudges=[blocks.7.mlp.c_fc.weight]"], "nudge"),
])
def test_bad_weights_and_nudges_one_line_exit_2_nothing_written(seedlab_main, tmp_path, twins_inputs, bank_design,
                                                                 sets, match):
    path = bank_design.write(tmp_path, twins_inputs[0])
    args = [a for s in sets for a in ("--set", s)]
    rc, _, err = seedlab_main("attribution", "bank", str(path), "--out", str(tmp_path / "bank"), *args, "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert __import__("re").search(match, err), err
    assert not (tmp_path / "bank").exists() or not any((tmp_path / "bank").glob("seed-*/*/done.json"))


def test_weights_on_a_design_without_them_one_line_exit_2(seedlab_main, tmp_path, twins_inputs):
    """The twins' design has no candidates: a weight there is refused, not ignored."""
    rc, _, err = seedlab_main("twins", "run", "mini", "--out", str(tmp_path / "t"), "--set",
                             "candidates.weights=[1, 0.5]", "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert "candidates" in err


def test_the_report_renders_the_size_axis_and_chaos(weighted_bank, tmp_path):
    import shutil

    from seedlab.attribution.estimators.attribute import attribute
    from seedlab.attribution.report.bank import write_report

    bank = tmp_path / "bank"
    shutil.copytree(weighted_bank, bank)
    attribute(bank, estimators=["unroll", "unroll-tangent", "unroll-readout", "adam", "random", "loss"], progress=False)
    text = write_report(bank).read_text()
    assert "## The size axis" in text and "## Chaos" in text
    assert (bank / "size_axis.png").is_file()
