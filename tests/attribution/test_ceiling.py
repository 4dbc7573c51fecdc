"""The removals' ceiling and TRAK's LDS: the retest arms (every leave-one-out row and the first group subsets removed
again from the nudged twin) and TRAK's retained subsets (retrained, the retrainings past the first nudged at s) — drawn
as the config says, trained in a tiny bank beside the same bank without them (whose every output stays bit for bit),
measured into retest.parquet and trak.parquet; both LDS kinds and every ceiling on synthetic data (a planted estimator
equal to the truth scores 1, a random one ~0; a retest equal to the measurement scores 1); bad input one line, exit 2,
nothing written."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from seedlab.attribution.analyses import lds, loo
from seedlab.attribution.bank import removals
from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.kinds import kind_of
from seedlab.attribution.bank.measure import RETEST_COLUMNS, TRAK_COLUMNS, TRAK_ROW_COLUMNS
from seedlab.attribution.bank.rundir import BankDir, open_bank, read_nudge_losses
from seedlab.attribution.bank.run import run_bank
from seedlab.config import load_config

pytestmark = pytest.mark.usefixtures("one_thread")

S, END, B = 4, 14, 4  # TINY_BANK: s = 4, 14 updates, 4 rows a batch: R = 40 rows after s
SMALL = {"seeds": [0], "candidates": {"file": "candidates.txt", "heldout": 0, "own_row": True}}  # 6 runs and 7 removals
REMOVALS = {"loo": {"steps": ["early", "s", "end-1"], "rows": 1}, "groups": {"alphas": [0.1], "subsets": 4}}
ON = {**REMOVALS, "ceiling": {"subsets": 3}, "trak": {"keep": [0.5], "subsets": 3, "retrains": 2}}
NUDGE = "blocks.0.mlp.c_fc.weight"  # chaos.nudges' first (the default)


@pytest.fixture(scope="module")
def banks(tmp_path_factory, twins_inputs, bank_design, one_thread):
    """TINY_BANK on one seed with no held-out candidate, leave-one-out rows at steps 2, 4, 13 and 4 groups of 4 rows,
    trained twice: with the ceiling (3 subsets repeated) and 3 TRAK subsets of 20 kept rows, 2 retrainings each
    (``on``), and without them (``off``). Read them, never change them."""
    base = tmp_path_factory.mktemp("ceiling")
    out = {}
    for name, over in (("on", SMALL | ON), ("off", SMALL | REMOVALS)):
        cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(base / name, twins_inputs[0], **over))
        run_bank(cfg, base / name / "bank", base=folder, progress=False)
        out[name] = base / name / "bank"
    return out


def test_the_new_arm_names_read_back_as_their_kinds():
    assert kind_of(removals.retest_name(removals.loo_name(4, 1))).name == "retest"
    assert kind_of(removals.retest_name(removals.group_name(0.05, 3))).name == "retest"
    name = removals.trak_name(0.5, 7, 1)
    assert name == "trak.0.5.7.1" and kind_of(name).name == "trak" and removals.parse_trak(name) == ("0.5", 7, 1)
    assert all(removals.is_removal(n) for n in ("retest.loo.4.1", "trak.0.5.7.1", "loo.4.1", "group.0.05.3"))
    rd = BankDir(Path("/b"))
    assert rd.run(0, "retest.loo.4.1").path.as_posix() == "/b/seed-0/retest/loo/4-1"
    assert rd.run(0, "retest.group.0.05.3").path.as_posix() == "/b/seed-0/retest/groups/0.05-3"
    assert rd.run(0, name).path.as_posix() == "/b/seed-0/trak/0.5-7-1"


def test_the_retests_and_trak_subsets_are_drawn_as_the_config_says(design):
    cfg, _ = design(**ON)
    plain, _ = design(**REMOVALS)
    for seed in (0, 1):
        arms = removals.arms(cfg, seed)
        base = removals.arms(plain, seed)
        assert arms[:len(base)] == base  # the removals come first, unchanged
        new = {a.name: a for a in arms[len(base):]}
        retests = [n for n in new if n.startswith("retest.")]
        assert retests == ["retest.loo.2.0", "retest.loo.4.0", "retest.loo.13.0", "retest.group.0.1.0",
                           "retest.group.0.1.1", "retest.group.0.1.2"]  # every leave-one-out row, the first 3 subsets
        for n in retests:
            twin_arm = next(a for a in base if a.name == n.removeprefix("retest."))
            a = new[n]
            assert a.removals == twin_arm.removals and a.start == twin_arm.start
            assert a.perturbation.step == S and a.perturbation.what == f"one ulp of {NUDGE}[0]"
        kept = removals.trak_kept(cfg, seed)
        gone = removals.trak_removed(cfg, seed)
        every = {(t, i) for t in range(S, END) for i in range(B)}
        assert len(kept) == 3 and len({tuple(v) for v in kept.values()}) == 3  # distinct subsets
        for key, rows in kept.items():
            assert len(rows) == 20 and set(rows) | set(gone[key]) == every and not set(rows) & set(gone[key])
            for r in (0, 1):
                a = new[removals.trak_name(0.5, key[1], r)]
                assert a.removals == frozenset(gone[key]) and a.start is None
                assert (a.perturbation is None) if r == 0 else a.perturbation.what == f"one ulp of {NUDGE}[0]"
        assert kept == removals.trak_kept(cfg, seed)  # reproducible
    assert removals.trak_kept(cfg, 0) != removals.trak_kept(cfg, 1)
    third, _ = design(**{**ON, "trak": {"keep": [0.5], "subsets": 1, "retrains": 3}, "chaos": {"index": 5}})
    t = [a for a in removals.arms(third, 0) if a.name.startswith("trak.")]
    assert [a.perturbation and a.perturbation.what for a in t] == [None, f"one ulp of {NUDGE}[5]", f"one ulp of {NUDGE}[6]"]
    assert removals.updates_per_seed(cfg) == {"loo": 12 + 10 + 1, "groups": 4 * 10, "retest": 23 + 3 * 10,
                                              "trak": 3 * 2 * 10}
    assert removals.rows_of(design(trak={"subsets": 2})[0]) == sorted(every)  # TRAK alone: every row after s scored


def test_the_bank_without_them_is_bit_for_bit_the_bank_with_them(banks):
    """Every run and table the plain design has is the same bits when the ceiling and TRAK's subsets train beside it."""
    on, off = BankDir(banks["on"]), BankDir(banks["off"])
    for table in ("measured", "loo", "groups", "group_rows"):
        a, b = (pd.read_parquet(getattr(rd, table)) for rd in (on, off))
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    cfg = open_bank(banks["off"]).cfg
    from seedlab.attribution.bank.arms import arms

    for seed in cfg.seeds:
        for arm in arms(open_bank(banks["off"]).inputs, seed):
            a, b = on.run(seed, arm.name), off.run(seed, arm.name)
            assert a.read_manifest() == b.read_manifest(), arm.name
            pd.testing.assert_frame_equal(pd.read_parquet(a.queries), pd.read_parquet(b.queries), check_exact=True)
    d_on, d_off = pd.read_parquet(on.distances), pd.read_parquet(off.distances)
    assert {"retest", "trak"} <= set(d_on.kind) and not {"retest", "trak"} & set(d_off.kind)
    pd.testing.assert_frame_equal(d_on[d_on.arm.isin(set(d_off.arm))].reset_index(drop=True), d_off, check_exact=True)
    assert not off.retest.exists() and not off.trak.exists()


def test_the_retest_and_trak_tables(banks):
    b = open_bank(banks["on"])
    rd, q = b.dir, len(b.inputs.queries)
    hs = sorted(b.cfg.horizon_steps())  # 5, 7, 9, 14
    R = pd.read_parquet(rd.retest)
    assert list(R.columns) == RETEST_COLUMNS and (R.nudge == NUDGE).all()
    L, G = pd.read_parquet(rd.loo), pd.read_parquet(rd.groups)
    loo_rows = R[R.removal == "loo"].merge(L, on=["seed", "step", "row", "query", "horizon"], suffixes=("", "_loo"))
    assert len(loo_rows) == len(L) == (R.removal == "loo").sum()  # every leave-one-out row, at the horizons after it
    assert (loo_rows.measured == loo_rows.measured_loo).all()  # the same subtraction of the same floats
    g = R[R.removal == "group"].merge(G, on=["seed", "alpha", "subset", "query", "horizon"], suffixes=("", "_g"))
    assert len(g) == 3 * q * len(hs) and (g.measured == g.measured_g).all() and set(g.subset) == {0, 1, 2}
    nudges = read_nudge_losses(rd, rd.read_config())
    for seed in (0,):  # the retest against the nudged twin, by hand
        own = pd.read_parquet(rd.run(seed, "retest.loo.4.0").queries).set_index(["step", "text"]).loss
        ref = nudges[(nudges.seed == seed) & (nudges.nudge == NUDGE)].set_index(["step", "text"]).loss
        got = R[(R.seed == seed) & (R.arm == "loo.4.0")]
        assert len(got) == q * len(hs)
        for r in got.itertuples():
            assert r.retest == own[r.horizon, r.query] - ref[r.horizon, r.query]
        # the retest of the last step's row is the nudged twin, bit for bit, until that step
        m = rd.run(seed, "retest.loo.13.0").read_manifest()
        n = rd.run(seed, "nudge." + NUDGE).read_manifest()
        assert all(m[t] == n[t] for t in m if int(t) <= 13) and m[str(END)] != n[str(END)]
    assert (R.retest != R.measured).any()  # the nudge moved them
    T, M = pd.read_parquet(rd.trak), pd.read_parquet(rd.trak_rows)
    assert list(T.columns) == TRAK_COLUMNS and list(M.columns) == TRAK_ROW_COLUMNS
    assert len(T) == 3 * 2 * q * len(hs) and len(M) == 3 * 20 and (T.rows == 20).all()
    for seed in (0,):
        gone = removals.trak_removed(b.cfg, seed)
        for (_, k), rows in gone.items():
            m = M[(M.seed == seed) & (M.subset == k)]
            assert list(zip(m.step, m.row)) == rows
    assert rd.run(0, "trak.0.5.0.1").perturbation.is_file() and not rd.run(0, "trak.0.5.0.0").perturbation.exists()
    a, c = (T[(T.seed == 0) & (T.subset == 0) & (T.retrain == r)].measured.to_numpy() for r in (0, 1))
    assert not np.array_equal(a, c)  # two retrainings of one subset differ by the nudge's growth only


def test_both_lds_kinds_and_the_ceilings_on_the_tiny_bank(banks):
    """lds.both on the bank's own tables with a random row estimator: each row named for its kind, the ceilings beside
    (the single-model LDS's from the retest, TRAK's from the retrainings), finite; loo.ceiling beside by_age."""
    b = open_bank(banks["on"])
    rd = b.dir
    G, M, T, TR, R = (pd.read_parquet(p) for p in (rd.groups, rd.group_rows, rd.trak, rd.trak_rows, rd.retest))
    g = np.random.default_rng(0)
    hs = sorted(b.cfg.horizon_steps())
    scores = pd.DataFrame([{"estimator": "random", "unit": "score", "seed": s, "query": q, "horizon": h, "step": t,
                            "row": i, "value": g.normal()}
                           for s in b.cfg.seeds for q in b.inputs.queries for h in hs
                           for t, i in removals.rows_of(b.cfg)])
    t = lds.both(G, M, T, TR, scores, R, resamples=50)
    assert list(t.columns) == lds.BOTH and set(t.lds_kind) == {lds.SINGLE, lds.TRAK}
    assert lds.SINGLE == "single-model LDS (MAGIC)" and lds.TRAK == "TRAK LDS (retrained subsets, seed-averaged)"
    single, trak = t[t.lds_kind == lds.SINGLE], t[t.lds_kind == lds.TRAK]
    assert set(single.alpha) == {0.1} and (single.retrains == 1).all() and (single.retest_subsets == 3).all()
    assert set(trak.alpha) == {0.5} and (trak.keep == 0.5).all() and (trak.retrains == 2).all()
    assert (trak.retest_subsets == 3).all() and (trak.subsets == 3).all()
    assert np.isfinite(t.lds).all() and np.isfinite(t.retest).all()
    assert np.allclose(t.bound, np.sqrt(np.clip(t.reliability, 0, None)))
    ages, pooled = loo.ceiling(R, resamples=50)
    assert list(ages.columns) == loo.CEILING and sorted(ages.step.unique()) == [2, 4, 13]
    j = loo.joined(pd.read_parquet(rd.loo), scores)
    table = loo.by_age(j, resamples=50)
    beside = loo.beside_ceiling(table, ages)
    want = ages.set_index(["query_kind", "step", "horizon"]).retest
    assert len(beside) == len(table) and np.array_equal(beside.rho, table.rho, equal_nan=True)
    assert np.array_equal(beside.retest, want.loc[list(zip(table.query_kind, table.step, table.horizon))], equal_nan=True)
    assert beside[beside.query_kind == "all"].retest.notna().all()  # 1 row a step: only the pooled kinds have 3 points
    assert loo.beside_ceiling(loo.pooled(j, resamples=50), pooled).query_kind.eq("all").any()


def _attributed(root):
    """The report's view of a bank (rundir.py ``Attributed``) without attribution.parquet (the section reads none)."""
    from seedlab.attribution.bank.rundir import Attributed

    rd = BankDir(root)
    get = lambda p: pd.read_parquet(p) if p.is_file() else None
    config = rd.read_config()
    return Attributed(rd, pd.DataFrame(), config, {}, {}, None, loo=get(rd.loo), groups=get(rd.groups),
                      group_rows=get(rd.group_rows), nudges=read_nudge_losses(rd, config), retest=get(rd.retest),
                      trak=get(rd.trak), trak_rows=get(rd.trak_rows))


def test_the_report_sets_the_ceiling_beside_every_loo_and_lds_number_and_names_both_lds_kinds(banks, tmp_path):
    import shutil

    from seedlab.attribution.estimators.rowscores import COLUMNS
    from seedlab.attribution.report.bank import removal_section
    from seedlab.attribution.report.lds import CEILING_HELP, RETEST_NAME, TRAK_TITLE

    off = removal_section(_attributed(banks["off"]))
    assert RETEST_NAME not in off and TRAK_TITLE not in off and CEILING_HELP not in off
    unscored = removal_section(_attributed(banks["on"]))  # no row scores yet: the ceilings alone
    assert CEILING_HELP in unscored and "| retest ρ pooled |" in unscored and TRAK_TITLE in unscored
    assert "| ceiling: the retrainings |" in unscored
    shutil.copytree(banks["on"], tmp_path / "bank")
    b = open_bank(tmp_path / "bank")
    g = np.random.default_rng(0)
    rows = [{"seed": 0, "estimator": "random", "query": q, "horizon": h, "step": t, "row": i, "value": g.normal(),
             "unit": "score"} for q in b.inputs.queries for h in sorted(b.cfg.horizon_steps())
            for t, i in removals.rows_of(b.cfg)]
    pd.DataFrame(rows, columns=COLUMNS).to_parquet(b.dir.rowscores)
    text = removal_section(_attributed(tmp_path / "bank"))
    loo_part = text[text.index("### Leave-one-out by age"):text.index("### Groups")]
    assert f"| {RETEST_NAME} |" in loo_part  # a column of the leave-one-out tables, pooled and within queries
    assert f"| random | {RETEST_NAME} |" in loo_part  # (the within-query table needs 3 rows a step: not here)
    lds_part = text[text.index("### Groups"):text.index(TRAK_TITLE)]
    assert f"| {RETEST_NAME} |  | " in lds_part and "bound" in lds_part and "(3 subsets)" in lds_part
    trak_part = text[text.index(TRAK_TITLE):]
    assert "| estimator | TRAK LDS α_keep = 0.5 |" in trak_part and "| random | " in trak_part
    assert "| ceiling: the retrainings | retest " in trak_part and "reliability of the mean of 2" in trak_part


# --------------------------------------------------------------------------- the statistics on synthetic data


def _trak(seeds=3, queries=4, subsets=60, rows=40, keep=0.5, retrains=2, noise=0.0, seed=0):
    """A synthetic TRAK design: per seed and query a true effect per row; a subset's measured effect per retraining is
    the sum over its removed rows plus the retraining's own noise. Returns (trak, trak_rows, scores)."""
    g = np.random.default_rng(seed)
    n = int(round(keep * rows))
    true = g.normal(size=(seeds, queries, rows))
    effects, members, scores = [], [], []
    for s in range(seeds):
        for k in range(subsets):
            removed = np.sort(g.choice(rows, size=rows - n, replace=False))
            members += [{"seed": s, "keep": keep, "subset": k, "step": 10 + int(j) // 4, "row": int(j) % 4}
                        for j in removed]
            for r in range(retrains):
                for q in range(queries):
                    effects.append({"seed": s, "keep": keep, "subset": k, "retrain": r, "query": f"q{q}",
                                    "query_kind": "heldout", "horizon": 30, "label": "end",
                                    "measured": true[s, q, removed].sum() + noise * g.normal()})
    for s in range(seeds):
        for q in range(queries):
            for j in range(rows):
                for name, value in (("planted", true[s, q, j]), ("random", g.normal())):
                    scores.append({"estimator": name, "unit": "nats/token", "seed": s, "query": f"q{q}",
                                   "horizon": 30, "step": 10 + j // 4, "row": j % 4, "value": value})
    return pd.DataFrame(effects), pd.DataFrame(members), pd.DataFrame(scores)


def test_trak_lds_of_a_planted_estimator_is_one_and_of_a_random_one_about_zero():
    trak, rows, scores = _trak()
    t, paired = lds.trak_analyse(trak, rows, scores, reference="planted", resamples=300)
    t = t.set_index("estimator")
    assert t.loc["planted"].lds == pytest.approx(1.0) and t.loc["planted"].low == pytest.approx(1.0)
    assert abs(t.loc["random"].lds) < 0.1 and t.loc["random"].low < 0 < t.loc["random"].high
    assert (t.keep == 0.5).all() and (t.alpha == 0.5).all() and (t.subsets == 60).all()
    assert set(paired.estimator) == {"random"} and paired.difference.iloc[0] < 0
    # the retrainings are averaged: noise in each retraining, the truth in their mean, still ranked near 1
    noisy, rows, scores = _trak(noise=0.5, retrains=4)
    t = lds.trak_analyse(noisy, rows, scores, resamples=100)[0].set_index("estimator")
    assert 0.9 < t.loc["planted"].lds < 1.0
    avg = lds.trak_groups(noisy)
    assert (avg.retrains == 4).all() and len(avg) == len(noisy) // 4
    one = noisy[noisy.retrain == 0].merge(avg, on=["seed", "subset", "query"], suffixes=("", "_mean"))
    want = noisy.groupby(["seed", "subset", "query"]).measured.mean()
    assert np.allclose(one.measured_mean, want.loc[list(zip(one.seed, one.subset, one["query"]))].to_numpy())


def test_the_trak_ceiling_is_the_retrainings_test_retest_stepped_up():
    same, *_ = _trak()  # two retrainings with no noise: they agree exactly
    c = lds.trak_ceiling(same, resamples=100).iloc[0]
    assert c.retest == pytest.approx(1.0) and c.reliability == pytest.approx(1.0) and c.bound == pytest.approx(1.0)
    assert c.retrains == 2 and c.seeds == 3 and c.queries == 4 and c.retest_subsets == 60
    noise = _trak(retrains=3, noise=1e6)[0]  # the noise swamps the truth: retrainings agree ~0
    c = lds.trak_ceiling(noise, resamples=200).iloc[0]
    assert abs(c.retest) < 0.1 and c.retest_low < 0 < c.retest_high
    some = _trak(retrains=3, noise=3.0)[0]
    c = lds.trak_ceiling(some, resamples=200).iloc[0]
    assert 0.1 < c.retest < 0.9 and c.reliability == pytest.approx(3 * c.retest / (1 + 2 * c.retest))
    assert c.bound == pytest.approx(math.sqrt(c.reliability)) and c.retest_low < c.retest < c.retest_high
    assert c.bound_low == pytest.approx(math.sqrt(max(0.0, 3 * c.retest_low / (1 + 2 * c.retest_low))))
    assert np.isnan(lds.trak_ceiling(same[same.retrain == 0], resamples=20).iloc[0].retest)  # one retraining: none


def _retest(noise: float, seeds=3, rows=12, queries=5, subsets=30):
    """retest.parquet-like rows: every removal's measured effect and a retest of it with ``noise`` added."""
    g = np.random.default_rng(3)
    out = []
    for s in range(seeds):
        for q in range(queries):
            for t in (2, 8):
                for i in range(rows):
                    m = g.normal()
                    out.append({"seed": s, "removal": "loo", "arm": f"loo.{t}.{i}", "nudge": NUDGE, "step": t, "row": i,
                                "alpha": np.nan, "subset": -1, "query": f"q{q}", "query_kind": "heldout",
                                "horizon": 10, "label": "end", "measured": m, "retest": m + noise * g.normal()})
            for k in range(subsets):
                m = g.normal()
                out.append({"seed": s, "removal": "group", "arm": f"group.0.05.{k}", "nudge": NUDGE, "step": -1,
                            "row": -1, "alpha": 0.05, "subset": k, "query": f"q{q}", "query_kind": "heldout",
                            "horizon": 10, "label": "end", "measured": m, "retest": m + noise * g.normal()})
    return pd.DataFrame(out, columns=RETEST_COLUMNS)


def test_the_removals_ceiling_scores_the_retest_as_an_estimator():
    exact = _retest(0.0)
    ages, pooled = loo.ceiling(exact, resamples=100)
    assert (ages.retest == 1).all() and (ages.retest_within == 1).all() and (ages.bound == 1).all()
    assert sorted(ages.step) == [2, 8] and (pooled.step == -1).all() and (pooled.retest_rows == 24).all()
    single = lds.single_ceiling(exact, resamples=100).iloc[0]
    assert single.retest == pytest.approx(1.0) and single.retest_subsets == 30 and single.bound == pytest.approx(1.0)
    lost = _retest(1e6)  # the nudge's growth swamps the removal: no test-retest
    ages = loo.ceiling(lost, resamples=200)[0]
    assert (ages.retest.abs() < 0.2).all() and (ages.retest_low < 0).all()
    assert ((ages.bound_low == 0) & (ages.bound == ages.retest.clip(lower=0) ** 0.5)).all()
    single = lds.single_ceiling(lost, resamples=200).iloc[0]
    assert abs(single.retest) < 0.2 and single.retest_low < 0 < single.retest_high and single.bound_low == 0
    # beside every estimator's cell: the same (kind, step, horizon)
    rows = _retest(0.5)
    j = loo.retest_pairs(rows).assign(estimator="e")
    t = loo.beside_ceiling(loo.by_age(j, resamples=50), loo.ceiling(rows, resamples=50)[0])
    assert (t.rho == t.retest).all()  # the estimator here *is* the retest
    assert loo.beside_ceiling(loo.by_age(j, resamples=50), pd.DataFrame(columns=loo.CEILING)).retest.isna().all()
    assert loo.ceiling(None)[0].empty and lds.single_ceiling(None).empty and lds.trak_ceiling(None).empty


def test_both_names_each_kind_and_leaves_a_missing_ceiling_empty():
    trak, rows, scores = _trak(seeds=2, subsets=20)
    t = lds.both(None, None, trak, rows, scores, None, resamples=50)
    assert set(t.lds_kind) == {lds.TRAK} and t.retest.notna().all()
    groups = trak[trak.retrain == 0].assign(alpha=0.5).drop(columns=["keep", "retrain"])
    members = rows.assign(alpha=0.5).drop(columns="keep")
    t = lds.both(groups, members, None, None, scores, None, resamples=50)
    assert set(t.lds_kind) == {lds.SINGLE} and t.retest.isna().all() and (t.keep == 0.5).all()
    assert t.set_index("estimator").loc["planted"].lds == pytest.approx(1.0)
    assert lds.both(None, None, None, None, scores).empty


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("settings", "message"), [
    (["loo.rows=1", "ceiling.subsets=0", "chaos.nudges=[]"], "ceiling: needs a nudged twin, and chaos.nudges names none"),
    (["ceiling.subsets=0"], "ceiling: nothing to repeat on the nudged twin: the design removes no rows"),
    (["loo.rows=1", "ceiling.nudge=wte.weight"], "ceiling.nudge: must be one of chaos.nudges"),
    (["groups.subsets=3", "groups.alphas=[0.1]", "ceiling.subsets=4"], "ceiling.subsets: at most the groups.subsets = 3 subsets each α has, got 4"),
    (["loo.rows=1", "ceiling.subsets=2"], "ceiling.subsets: 2 group subsets to repeat, but the design has no groups"),
    (["trak.keep=[0.99]"], "trak.keep: α_keep = 0.99 keeps all R = 40 rows of steps 4 .. 13"),
    (["trak.keep=[0.01]"], "trak.keep: α_keep = 0.01 keeps no row"),
    (["trak.subsets=50", "steps=5", "horizons=[1]", "batch_size=2", "trak.keep=[0.5]"],
     "trak.subsets: 50 distinct subsets of 1 of the R = 2 rows do not exist (at most 2)"),
    (["trak.retrains=2", "chaos.nudges=[]"], "trak.retrains: 2 retrainings, each past the first nudged at s, but neither"),
])
def test_a_ceiling_or_trak_request_the_design_cannot_serve_is_one_line_exit_2_nothing_written(
        seedlab_main, tmp_path, twins_inputs, bank_design, settings, message):
    path = bank_design.write(tmp_path, twins_inputs[0])
    args = [a for s in settings for a in ("--set", s)]
    rc, _, err = seedlab_main("attribution", "bank", str(path), "--out", str(tmp_path / "bank"), *args, "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert message in err, err
    assert not (tmp_path / "bank").exists()


def test_bad_trak_input_through_the_console_entry_point(seedlab_cli, tmp_path, twins_inputs, bank_design):
    path = bank_design.write(tmp_path, twins_inputs[0])
    rc, _, err = seedlab_cli("attribution", "bank", str(path), "--out", str(tmp_path / "bank"), "--set",
                             "trak.keep=[0.999]", "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0 and "removes none" in err, err
    assert not (tmp_path / "bank").exists()
