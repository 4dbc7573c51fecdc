"""The run's own rows (issue 33 §2–3): leave-one-out arms by age and group arms in a tiny bank — their folders and
tables, each arm bitwise the twin until its first removed row; −metagrad predicts a young row's measured removal
effect (first order); the row estimators' sign convention; TRAK as a row estimator (influence.py's trak on the same
rows, its sign, ``rowscores --add``); the LOO and LDS statistics on synthetic data (a perfect predictor scores 1, a
shuffled one ~0); the removals beside the nudges' own query effects (the floor: each nudge against the twin at the same
horizon, the summary from that table); the report's section; bad input one line, exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from seedlab.attribution.analyses import lds, loo

from seedlab.attribution.bank import removals
from seedlab.attribution.bank.run import run_bank
from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.measure import GROUP_COLUMNS, GROUP_ROW_COLUMNS, LOO_COLUMNS
from seedlab.attribution.bank.rundir import BankDir, open_bank
from seedlab.config import load_config

pytestmark = pytest.mark.usefixtures("one_thread")

S, END = 4, 14  # TINY_BANK: s = 4, 14 updates, 4 rows a batch
LOO_STEPS = ["early", "s", "end-1"]  # 2, 4, 13: ages at the end 12, 10, 1
OVER = {"loo": {"steps": LOO_STEPS, "rows": 2}, "groups": {"alphas": [0.05, 0.1], "subsets": 4}}


@pytest.fixture(scope="module")
def bank(tmp_path_factory, twins_inputs, bank_design, one_thread):
    """TINY_BANK (2 seeds) with leave-one-out rows at steps 2, 4 and 13 and 2 × 4 groups, its metagradients from
    step 2 and its row scores (tracin, grad-dot, grad-cosine). Read it, never change it."""
    from seedlab.attribution.estimators.metagrad import bank_metagrad
    from seedlab.attribution.estimators.rowscores import bank_rowscores

    base = tmp_path_factory.mktemp("loo")
    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(base, twins_inputs[0], **OVER))
    run_bank(cfg, base / "bank", base=folder, progress=False)
    bank_metagrad(base / "bank", first=2, progress=False)
    bank_rowscores(base / "bank", estimators=["tracin", "grad-dot", "grad-cosine"], progress=False)
    return base / "bank"


def test_the_removal_rows_and_subsets_are_drawn_as_the_config_says(design):
    cfg, _ = design(**OVER)
    assert removals.loo_steps(cfg) == [2, 4, 13]
    assert removals.loo_rows(cfg) == [(2, 0), (2, 1), (4, 0), (4, 1), (13, 0), (13, 1)]
    R = (END - S) * 4
    for seed in (0, 1):
        subs = removals.subsets(cfg, seed)
        assert sorted({a for a, _ in subs}) == [0.05, 0.1] and len(subs) == 8
        for (alpha, _), rows in subs.items():
            assert len(rows) == round(alpha * R) and len(set(rows)) == len(rows)
            assert all(S <= t < END and 0 <= i < 4 for t, i in rows)
        assert subs == removals.subsets(cfg, seed)  # reproducible
    assert removals.subsets(cfg, 0) != removals.subsets(cfg, 1)
    arms = removals.arms(cfg, 0)
    early = next(a for a in arms if a.name == "loo.2.1")
    assert early.start == 2 and early.removals == {(2, 1)}
    assert next(a for a in arms if a.name == "loo.4.0").start is None
    assert removals.updates_per_seed(cfg) == {"loo": 2 * (12 + 10 + 1), "groups": 2 * 4 * (END - S)}


def test_the_tables_and_folders(bank):
    b = open_bank(bank)
    rd = b.dir
    q = len(b.inputs.queries)
    hs = sorted(b.cfg.horizon_steps())  # 5, 7, 9, 14
    L = pd.read_parquet(rd.loo)
    assert list(L.columns) == LOO_COLUMNS
    after = {t: sum(h > t for h in hs) for t in (2, 4, 13)}
    assert len(L) == 2 * 2 * q * sum(after.values())  # seeds × rows × queries × horizons after each step
    assert (L.horizon > L.step).all() and (L.age == L.horizon - L.step).all()
    assert set(L["query"]) == set(b.inputs.queries) and np.isfinite(L.measured).all()
    G, M = pd.read_parquet(rd.groups), pd.read_parquet(rd.group_rows)
    assert list(G.columns) == GROUP_COLUMNS and list(M.columns) == GROUP_ROW_COLUMNS
    assert len(G) == 2 * 8 * q * len(hs) and len(M) == 2 * 4 * (2 + 4)  # α·R = 2 and 4 rows
    assert (G[G.horizon == END].removed_before == G[G.horizon == END].rows).all()
    # a subset none of whose rows lie before a horizon is the twin there: measured exactly 0
    assert (G[G.removed_before == 0].measured == 0).all()
    assert rd.run(0, "loo.2.1").path == rd.root / "seed-0" / "loo" / "2-1"
    assert rd.run(1, "group.0.05.3").path == rd.root / "seed-1" / "groups" / "0.05-3"
    assert rd.prefix_at(0, 2).is_file() and rd.prefix_at(1, 2).is_file()
    integrity = json.loads(rd.integrity.read_text())["seeds"]["0"]
    assert integrity["early_starts"]["arms"] == {"loo.2.0": 2, "loo.2.1": 2}
    assert integrity["arms"]["loo.13.1"]["removals"] == [{"step": 13, "row": 1}]


def test_each_removal_arm_is_the_twin_exactly_until_its_first_removed_row(bank):
    rd = BankDir(bank)
    twin = rd.twin(0).read_manifest()
    for arm, first in (("loo.4.0", S), ("loo.13.1", 13)):
        m = rd.run(0, arm).read_manifest()
        assert all(m[t] == twin[t] for t in m if int(t) <= first)  # through its step (hashed at s and the horizons)
        assert all(m[t] != twin[t] for t in m if int(t) > first)
    early = rd.run(0, "loo.2.0").read_manifest()
    assert "2" in early and early[str(S)] != twin[str(S)]  # left the prefix at 2: not the twin at s
    cfg = open_bank(bank).cfg
    for (alpha, k), rows in removals.subsets(cfg, 0).items():
        m = rd.run(0, removals.group_name(alpha, k)).read_manifest()
        first = min(t for t, _ in rows)
        assert all(m[t] == twin[t] for t in m if int(t) <= first) and m[str(END)] != twin[str(END)]


def test_a_removal_is_metagrads_step_at_weight_zero(bank):
    """The arm's update with row r removed is the step metagrad differentiates (metagrad.py ``WeightedStep``: the loss
    (Σ_i w_i ℓ_i)/N) evaluated at w_r = 0, to float32 round-off: the same function, so −∂/∂w at w = 1 is its first
    order in Δw = −1."""
    import torch

    from seedlab.attribution.estimators.metagrad import WeightedStep
    from seedlab.forks.prefix import read_prefix
    from seedlab.lm.trainer import Trainer

    b = open_bank(bank)
    tr = Trainer(b.cfg.model_copy(update={"device": "cpu"}), b.inputs.gcfg, 0, b.inputs.corpus.train)
    read_prefix(tr, b.dir.prefix(0), S)
    removed = tr.fork()
    removed.advance(None, removed={1})
    step = WeightedStep(tr)
    w = torch.ones(4)
    w[1] = 0.0
    with torch.no_grad():
        theta = step.weighted(w, *step.state)[0]
    err = max(float((r.detach() - q).abs().max()) for r, q in zip(removed.params, theta))
    assert err < 5e-7  # a few float32 ulps of weights of order 1
    kept = tr.fork()
    kept.advance(None)
    effect = max(float((a.detach() - c.detach()).abs().max()) for a, c in zip(kept.params, removed.params))
    assert effect > 100 * err


def test_minus_metagrad_predicts_a_late_rows_removal(bank):
    """First order, small effect: the row of step end − 1 read at the end (age 1, at the schedule's small rate) moves
    the queries by ~2e-4 nats and −∂L_q/∂w predicts it: per seed Pearson > 0.9, the pooled slope of measured on
    predicted and the median ratio within 20 % of 1, and within 50 % pair by pair for the larger half of the effects.
    A sign error (Δw = +1) or a removal that rescaled the other rows (a mean over B − 1 rows) fails every one of
    these. The row of step s at s + 1 (peak rate, a quarter of the batch: Adam's normalisation is not linear in it,
    issue 31) keeps its ranks only; older rows need not (the study's question) but stay positively related."""
    from seedlab.attribution.estimators.rowscores import read_scores

    j = loo.joined(pd.read_parquet(BankDir(bank).loo), read_scores(bank))
    mg = j[j.estimator == "metagrad"]
    late = mg[(mg.step == 13) & (mg.horizon == END)]
    assert len(late) == 2 * 2 * 3
    for _, g in late.groupby("seed"):
        assert np.corrcoef(g.measured, g.predicted)[0, 1] > 0.9
    big = late[late.measured.abs() >= late.measured.abs().median()]
    assert ((big.measured - big.predicted).abs() < 0.5 * big.measured.abs()).all()
    table = loo.by_age(mg, resamples=200)
    r = table[(table.step == 13) & (table.query_kind == loo.ALL)].iloc[0]
    assert r.age == 1 and 0.8 < r.slope < 1.25 and 0.8 < r.ratio < 1.25 and r.rho > 0.8 and r.rho_low > 0
    at_s = table[(table.step == S) & (table.horizon == S + 1) & (table.query_kind == loo.ALL)].iloc[0]
    assert at_s.rho > 0.8
    assert (table[table.query_kind == loo.ALL].rho > 0).all()


def test_the_row_estimators_sign_convention(bank):
    """Every value is a predicted Δ L_q of removing the row: tracin's is +lr·⟨∇L_q, ∇ℓ_i⟩/N at the row's visit, so its
    sign agrees with grad-dot's at the first horizon after a row of step s; cosines lie in [−1, 1]; each estimator
    scores every removal row at every horizon after its step."""
    from seedlab.attribution.estimators.rowscores import read_scores

    sc = read_scores(bank)
    assert set(sc.estimator) == {"metagrad", "tracin", "grad-dot", "grad-cosine"}
    record = json.loads(BankDir(bank).rowscores_json.read_text())
    assert record["estimators"] == ["tracin", "grad-dot", "grad-cosine"] and set(record["seconds"]) == {"0", "1"}
    assert loo.unscored(pd.read_parquet(BankDir(bank).loo), sc, "metagrad") == []  # metagrad from t0 = 2
    assert loo.unscored(pd.read_parquet(BankDir(bank).loo), sc[sc.step >= S], "metagrad") == [2]
    cfg = open_bank(bank).cfg
    rows = removals.rows_of(cfg)
    assert len(rows) == 2 + (END - S) * 4  # the rows of step 2 and every row of s .. end − 1
    for e in ("tracin", "grad-dot", "grad-cosine"):
        g = sc[(sc.estimator == e) & (sc.seed == 0) & (sc.horizon == END)]
        assert set(zip(g.step, g.row)) == set(rows)
    cos = sc[sc.estimator == "grad-cosine"].value
    assert (cos.abs() <= 1 + 1e-12).all()
    at = lambda e: sc[(sc.estimator == e) & (sc.step == S) & (sc.horizon == S + 1)].set_index(
        ["seed", "row", "query"]).value.sort_index()
    assert (np.sign(at("tracin")) == np.sign(at("grad-dot"))).all()


# --------------------------------------------------------------------------- the statistics, on synthetic data


def _groups(seeds=3, queries=5, subsets=400, alphas=(0.1,), rng=0):
    """A synthetic groups.parquet and group_rows.parquet with the row scores of a perfect, a monotone, an
    anti-correlated and a shuffled predictor: the measured effect of a subset is the sum of its rows' true effects."""
    g = np.random.default_rng(rng)
    rows = [(t, i) for t in range(10) for i in range(4)]
    true = {(s, q, r): g.normal() for s in range(seeds) for q in range(queries) for r in rows}
    members, measured, scores = [], [], []
    for s in range(seeds):
        for a in alphas:
            for k in range(subsets):
                pick = [rows[j] for j in g.choice(len(rows), size=4, replace=False)]
                members += [{"seed": s, "alpha": a, "subset": k, "step": t, "row": i} for t, i in pick]
                for q in range(queries):
                    measured.append({"seed": s, "alpha": a, "subset": k, "query": f"q{q}", "query_kind": "heldout",
                                     "horizon": 10, "label": "end", "measured": sum(true[s, q, r] for r in pick)})
    for (s, q, (t, i)), v in true.items():
        for name, value in (("perfect", v), ("scaled", 3 * v), ("anti", -v), ("shuffled", g.normal())):
            scores.append({"seed": s, "estimator": name, "query": f"q{q}", "horizon": 10, "step": t, "row": i,
                           "value": value, "unit": "nats/token"})
    return pd.DataFrame(measured), pd.DataFrame(members), pd.DataFrame(scores)


def test_the_nudges_floor_pairs_each_nudge_with_the_twin_at_the_same_horizon(bank):
    """loo.beside_nudges: a nudge's Δ at horizon h is its own queries.parquet loss at h minus the twin's at h (by hand
    here, from the two files), on loo.parquet's queries, at the horizons loo.parquet holds; the removals' rows are
    loo.parquet's, unchanged."""
    from seedlab.attribution.bank.rundir import read_nudge_losses

    b = open_bank(bank)
    rd, cfg = b.dir, b.cfg
    L = pd.read_parquet(rd.loo)
    tensors = cfg.chaos.nudges
    assert len(tensors) == 2 and rd.nudge(0, tensors[0]).path == rd.run(0, "nudge." + tensors[0]).path
    t = loo.beside_nudges(L, read_nudge_losses(rd, rd.read_config()), S)
    assert list(t.columns) == loo.BESIDE
    n = t[t.kind == loo.NUDGE]
    hs = sorted(cfg.horizon_steps())  # 5, 7, 9, 14: every one after s
    assert sorted(n.horizon.unique()) == hs == sorted(L.horizon.unique())
    assert len(n) == 2 * len(tensors) * len(b.inputs.queries) * len(hs)  # seeds × nudges × queries × horizons
    assert (n.step == S).all() and (n.age == n.horizon - S).all() and (n.row == -1).all()
    assert set(n["query"]) == set(L["query"])
    for seed in (0, 1):
        twin = pd.read_parquet(rd.twin(seed).queries).set_index(["step", "text"]).loss
        for tensor in tensors:
            own = pd.read_parquet(rd.run(seed, "nudge." + tensor).queries).set_index(["step", "text"]).loss
            got = n[(n.seed == seed) & (n.arm == tensor)]
            for h in hs:
                for q in b.inputs.queries:
                    at = got[(got.horizon == h) & (got["query"] == q)]
                    assert len(at) == 1 and at.measured.iloc[0] == own[h, q] - twin[h, q]
                    assert at["abs"].iloc[0] == abs(own[h, q] - twin[h, q])
            assert (got.measured != 0).any()  # the nudge left the twin (one ulp is not lost)
    r = t[t.kind == loo.REMOVAL].sort_values(["seed", "step", "row", "query", "horizon"], ignore_index=True)
    want = L.sort_values(["seed", "step", "row", "query", "horizon"], ignore_index=True)
    assert len(r) == len(L) and (r.measured.to_numpy() == want.measured.to_numpy()).all()
    assert (r.arm == [f"loo.{a}.{b}" for a, b in zip(r.step, r.row)]).all()


def test_the_nudges_floor_summary_is_the_tables_medians(bank):
    """loo.nudge_floor: per horizon, every leave-one-out step before it pooled and each alone; the medians, the
    nudges' max, the ratio, the share of removals at or below that max and the worst seed, each recomputed from
    beside_nudges' table by hand; the ratio's interval is over seeds (one seed: no spread)."""
    from seedlab.attribution.bank.rundir import read_nudge_losses

    rd = BankDir(bank)
    t = loo.beside_nudges(pd.read_parquet(rd.loo), read_nudge_losses(rd, rd.read_config()), S)
    f = loo.nudge_floor(t, resamples=300)
    assert list(f.columns) == loo.FLOOR
    steps = {h: [t_ for t_ in (2, 4, 13) if t_ < h] for h in (5, 7, 9, 14)}
    assert [(r.horizon, r.step) for r in f.itertuples()] == [(h, x) for h, ts in steps.items()
                                                             for x in (loo.EVERY_STEP, *ts)]
    for r in f.itertuples():
        nudged = t[(t.kind == loo.NUDGE) & (t.horizon == r.horizon)]
        removed = t[(t.kind == loo.REMOVAL) & (t.horizon == r.horizon)]
        if r.step != loo.EVERY_STEP:
            removed = removed[removed.step == r.step]
            assert r.age == r.horizon - r.step
        assert r.nudge_age == r.horizon - S and r.seeds == 2
        assert r.nudge_n == len(nudged) and r.removal_n == len(removed)
        assert r.nudge_median == np.median(np.abs(nudged.measured)) and r.nudge_max == np.abs(nudged.measured).max()
        assert r.removal_median == np.median(np.abs(removed.measured))
        assert r.ratio == pytest.approx(r.removal_median / r.nudge_median, rel=1e-12)
        assert r.ratio_low <= r.ratio_high and np.isfinite([r.ratio_low, r.ratio_high]).all()
        assert r.below_max == pytest.approx(float((removed["abs"] <= r.nudge_max).mean()))
        per_seed = {k: np.median(removed[removed.seed == k]["abs"]) / np.median(nudged[nudged.seed == k]["abs"])
                    for k in (0, 1)}
        assert r.worst_seed == min(per_seed, key=per_seed.get)
        assert r.worst_seed_ratio == pytest.approx(min(per_seed.values()), rel=1e-12)
    one = loo.nudge_floor(t[t.seed == 0], resamples=50)
    assert (one.ratio_low == one.ratio).all() and (one.ratio_high == one.ratio).all()


def test_lds_of_a_perfect_predictor_is_one_and_of_a_shuffled_one_about_zero():
    measured, members, scores = _groups()
    t = lds.analyse(measured, members, scores, resamples=300).set_index("estimator")
    for e in ("perfect", "scaled"):
        assert t.loc[e].lds == pytest.approx(1.0) and t.loc[e].low == pytest.approx(1.0)
    assert t.loc["anti"].lds == pytest.approx(-1.0)
    assert abs(t.loc["shuffled"].lds) < 0.1 and t.loc["shuffled"].low < 0 < t.loc["shuffled"].high
    assert (t.coverage == 1).all() and (t.subsets == 400).all() and (t.seeds == 3).all()
    c = lds.contrast(lds.analyse(measured, members, scores, resamples=100), pd.DataFrame(columns=loo.COLUMNS))
    assert set(c[c.group_predicts].estimator) == {"perfect", "scaled"}


def test_lds_differences_are_paired_against_the_reference():
    measured, members, scores = _groups()
    predicted = lds.predictions(members, scores)
    table = lds.lds(measured, predicted, resamples=300).set_index("estimator")
    d = lds.differences(measured, predicted, "perfect", resamples=300).set_index("estimator")
    assert "perfect" not in d.index and set(d.index) == {"scaled", "anti", "shuffled"}
    # a rescaled copy of the reference ranks every subset alike: zero in every resample, not just on average
    # (up to the ranks of float sums that tie to ~1e-9)
    r = d.loc["scaled"]
    assert r.difference == pytest.approx(0, abs=1e-6) and r.low == pytest.approx(0, abs=1e-6) == r.high
    for e in ("anti", "shuffled"):
        assert d.loc[e].difference == pytest.approx(table.loc[e].lds - table.loc["perfect"].lds)
        assert d.loc[e].high < 0  # the perfect predictor is better, and the paired interval says so
    assert d.loc["anti"].difference == pytest.approx(-2.0)
    # pairing: the reference is 1 in every resample, so the difference's interval is the estimator's own shifted by 1
    # (the same resamples of seeds and subsets; an unpaired draw would move the bounds)
    assert d.loc["shuffled"].low == pytest.approx(table.loc["shuffled"].low - 1, abs=1e-6)
    assert d.loc["shuffled"].high == pytest.approx(table.loc["shuffled"].high - 1, abs=1e-6)
    t2, d2 = lds.analyse_paired(measured, members, scores, "perfect", resamples=300)
    pd.testing.assert_frame_equal(t2.set_index("estimator"), table)
    pd.testing.assert_frame_equal(d2.set_index("estimator"), d)
    assert lds.differences(measured, predicted, "absent").empty


def test_the_lds_section_renders_the_paired_differences_at_the_end():
    """report_lds.removals_section with lds.differences' frame: the paired table after the LDS table, a row per
    estimator (not the reference), a column per α, at the end horizon only; no table without a paired frame."""
    from seedlab.attribution.report.lds import removals_section
    from seedlab.reporting import fmt_ci, fmt_num

    measured, members, scores = _groups(queries=3, subsets=40, alphas=(0.1, 0.2))
    table, paired = lds.analyse_paired(measured, members, scores, "perfect", resamples=50)
    early = paired[paired.estimator == "anti"].assign(horizon=5, difference=0.777, low=0.776, high=0.778)
    contrast = lds.contrast(table, pd.DataFrame(columns=loo.COLUMNS))
    text = removals_section(None, None, contrast, table, None, pd.concat([paired, early], ignore_index=True))
    assert "Each estimator's LDS minus perfect's at the end, paired" in text
    assert "| estimator | LDS − perfect's, α = 0.1 | LDS − perfect's, α = 0.2 |" in text
    assert "| anti | -2.00 [-2.00, -2.00] ±0 | -2.00 [-2.00, -2.00] ±0 |" in text  # -1 against 1 in every resample
    sh = paired[paired.estimator == "shuffled"].set_index("alpha")
    assert "| shuffled | " + " | ".join(f"{fmt_ci(sh.loc[a].difference, sh.loc[a].low, sh.loc[a].high)} "
                                        f"±{fmt_num(sh.loc[a].se_seeds)}" for a in (0.1, 0.2)) + " |" in text
    diff = text[text.index("| estimator | LDS − "):text.index("For comparison")].strip().splitlines()[2:]
    assert [line.split(" | ")[0].removeprefix("| ") for line in diff] == ["anti", "scaled", "shuffled"]  # no reference
    assert "0.777" not in text  # an earlier horizon left out
    assert text.index("| LDS α = 0.1 |") < text.index("LDS − perfect's") < text.index("MAGIC 0.93")
    for none in (None, paired.iloc[:0]):
        assert "LDS − " not in removals_section(None, None, contrast, table, None, none)


def test_a_subsets_prediction_sums_its_rows_before_the_horizon():
    members = pd.DataFrame({"seed": 0, "alpha": 0.5, "subset": [0, 0, 1], "step": [1, 3, 3], "row": [0, 1, 1]})
    scores = pd.DataFrame({"seed": 0, "estimator": "e", "unit": "nats/token", "query": "q",
                           "horizon": [2, 2, 4, 4], "step": [1, 0, 1, 3], "row": [0, 0, 0, 1],
                           "value": [1.0, 5.0, 2.0, 10.0]})
    p = lds.predictions(members, scores).set_index(["subset", "horizon"]).sort_index()
    assert p.loc[(0, 2)].predicted == 1.0  # only (1, 0) is before 2
    assert p.loc[(0, 4)].predicted == 12.0
    assert p.loc[(1, 2)].predicted == 0.0  # nothing before 2: the empty sum, the twin
    assert p.loc[(1, 4)].predicted == 10.0 and (p.coverage == 1).all()


def test_loo_by_age_of_a_perfect_predictor():
    g = np.random.default_rng(1)
    rows = []
    for s in range(3):
        for t in (2, 8):
            for i in range(4):
                for q in range(3):
                    m = g.normal()
                    rows += [{"seed": s, "step": t, "row": i, "query": f"q{q}", "query_kind": "heldout", "horizon": 10,
                              "label": "end", "measured": m, "estimator": e, "unit": "nats/token", "predicted": p}
                             for e, p in (("perfect", m), ("half", m / 2), ("noise", g.normal()))]
    t = loo.by_age(pd.DataFrame(rows), resamples=200).set_index(["estimator", "age"])
    assert t.loc[("perfect", 8)].rho == pytest.approx(1.0) and t.loc[("perfect", 2)].slope == pytest.approx(1.0)
    assert t.loc[("half", 8)].ratio == pytest.approx(2.0) and t.loc[("half", 8)].slope == pytest.approx(2.0)
    assert t.loc[("noise", 8)].rho_low < 0 < t.loc[("noise", 8)].rho_high
    assert loo.oldest(t.reset_index(), "perfect") == {"predicts": [2, 8], "first_miss": None, "ages": [2, 8]}


def test_a_query_only_predictor_has_a_high_pooled_rho_and_no_within_query_rho():
    # each query's removals move it by its own offset (a sensitivity every row shares) plus a row-specific part; the
    # predictor knows the offset only: the pooled ρ rewards it, rho_within (the rows ranked per query) does not
    g = np.random.default_rng(2)
    rows = []
    for s in range(4):
        for q in range(8):
            offset = 3.0 * q
            for i in range(12):
                m = offset + g.normal()
                rows += [{"seed": s, "step": 5, "row": i, "query": f"q{q}", "query_kind": "heldout", "horizon": 10,
                          "label": "end", "measured": m, "estimator": e, "unit": "nats/token", "predicted": p}
                         for e, p in (("query-only", offset + 1e-6 * g.normal()), ("perfect", m))]
    t = loo.by_age(pd.DataFrame(rows), resamples=300).set_index("estimator")
    assert t.loc["query-only"].rho > 0.9 and t.loc["query-only"].rho_low > 0.8
    assert abs(t.loc["query-only"].rho_within) < 0.15
    assert t.loc["query-only"].rho_within_low < 0 < t.loc["query-only"].rho_within_high
    assert t.loc["perfect"].rho_within == pytest.approx(1.0) and t.loc["perfect"].rho_within_low == pytest.approx(1.0)
    t = t.reset_index()
    assert loo.oldest(t, "query-only")["first_miss"] is None  # pooled: "predicts"
    assert loo.oldest(t, "query-only", column="rho_within") == {"predicts": [], "first_miss": 5, "ages": [5]}
    from seedlab.attribution.report.lds import removals_section

    text = removals_section(t, loo.oldest(t, "query-only"), None, None,
                            within=loo.oldest(t, "query-only", column="rho_within"))
    assert "ranked **within each query**" in text and "does not predict which rows matter for each query" in text


# --------------------------------------------------------------------------- the report, bad input


def test_the_report_has_the_leave_one_out_and_lds_section(bank, tmp_path):
    import shutil

    from seedlab.attribution.estimators.attribute import attribute
    from seedlab.attribution.report.bank import write_report

    shutil.copytree(bank, tmp_path / "bank")
    attribute(tmp_path / "bank", estimators=["sgd"], progress=False)
    text = write_report(tmp_path / "bank").read_text()
    assert "## The run's own rows: leave-one-out by age, and groups (LDS)" in text
    assert "### Leave-one-out by age" in text and "### Groups: the linear datamodeling score" in text
    assert "| metagrad |" in text and "LDS α = 0.05" in text and "single-row ρ (end)" in text
    assert "MAGIC 0.93" in text  # quoted, with its setting, as not ours
    # the removals beside the nudges' own query effects (loo.nudge_floor), a floor and said to be one
    from seedlab.attribution.report.lds import FLOOR_TITLE

    assert FLOOR_TITLE in text and "not a size-matched null" in text and "| ratio removal / nudge |" in text
    assert text.index("### Leave-one-out by age") < text.index(FLOOR_TITLE) < text.index("### Groups")
    assert "| end (14) | every t < 14 |" in text and "| t = 13 (age 1) |" in text


def test_alpha_that_leaves_no_row_is_one_line_exit_2_nothing_written(seedlab_cli, tmp_path, twins_inputs, bank_design):
    path = bank_design.write(tmp_path, twins_inputs[0])
    for setting, message in (("groups.alphas=[0.01]", "groups.alphas: α = 0.01 leaves no row (α·R = 0.4 < 1 of the "
                                                      "R = 40 rows of steps 4 .. 13)"),
                             ("loo.steps=[14]", "loo.steps: a step must be an update of the run (0 .. 13), got 14"),
                             ("loo.steps=[s+x]", "a step is an int (updates completed) or s, s+n, s-n, end-n")):
        rc, _, err = seedlab_cli("attribution", "bank", str(path), "--out", str(tmp_path / "bank"), "--set", setting,
                                 "--no-progress")
        assert rc == 2 and err.strip().count("\n") == 0, err
        assert message in err, err
        assert not (tmp_path / "bank").exists()


def test_rowscores_bad_input_is_one_line_exit_2_nothing_written(seedlab_cli, bank, tmp_path):
    plain = tmp_path / "plain"  # the same design without removals: its config and inputs are all rowscores reads first
    plain.mkdir()
    config = json.loads((bank / "config.json").read_text()) | {"loo": None, "groups": None}
    (plain / "config.json").write_text(json.dumps(config))
    (plain / "inputs.json").write_text((bank / "inputs.json").read_text())
    rc, _, err = seedlab_cli("attribution", "rowscores", str(plain), "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert "removes no rows" in err and not (plain / "rowscores.parquet").exists()
    before = (bank / "rowscores.parquet").stat().st_mtime_ns
    rc, _, err = seedlab_cli("attribution", "rowscores", str(bank), "--estimator", "metagrad", "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert "must be among tracin, grad-dot, grad-cosine, ekfac, trak" in err
    assert (bank / "rowscores.parquet").stat().st_mtime_ns == before
    rc, _, err = seedlab_cli("attribution", "rowscores", str(bank), "--estimator", "trak,tracein", "--add",
                             "--no-progress")
    assert rc == 2 and err.strip().count("\n") == 0 and "'tracein'" in err, err
    assert (bank / "rowscores.parquet").stat().st_mtime_ns == before


# --------------------------------------------------------------------------- TRAK as a row estimator (rowscores.py)


@pytest.fixture(scope="module")
def traked(bank, tmp_path_factory):
    """A copy of the bank, ``seedlab attribution rowscores COPY --estimator trak --add`` run on it (the command line):
    (the copy, its rowscores.json)."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path_factory.mktemp("traked") / "bank"
    shutil.copytree(bank, copy)
    p = subprocess.run([sys.executable, "-m", "seedlab", "attribution", "rowscores", str(copy), "--estimator", "trak",
                        "--add", "--no-progress"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return copy, json.loads(BankDir(copy).rowscores_json.read_text())


def _rowscores(folder) -> pd.DataFrame:
    keys = ["seed", "estimator", "query", "horizon", "step", "row"]
    return pd.read_parquet(BankDir(folder).rowscores).sort_values(keys).reset_index(drop=True)


def test_trak_scores_every_row_at_the_end_and_add_keeps_the_others_bitwise(bank, traked):
    """``--estimator trak --add``: tracin, grad-dot and grad-cosine kept as they were (values bitwise, their seconds);
    trak added, one value per seed, removal row and query, at the end horizon only, unit "score"."""
    copy, record = traked
    old, new = _rowscores(bank), _rowscores(copy)
    kept = new[new.estimator != "trak"].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, old, check_exact=True)
    before = json.loads(BankDir(bank).rowscores_json.read_text())
    assert record["estimators"] == ["tracin", "grad-dot", "grad-cosine", "trak"]
    for seed in ("0", "1"):
        assert record["seconds"][seed] == before["seconds"][seed] | {"trak": record["seconds"][seed]["trak"]}
    b = open_bank(bank)
    rows, queries = removals.rows_of(b.cfg), set(b.inputs.queries)
    tr = new[new.estimator == "trak"]
    assert set(tr.horizon) == {END} and set(tr.unit) == {"score"} and np.isfinite(tr.value).all()
    assert len(tr) == 2 * len(rows) * len(queries)
    for seed in (0, 1):
        g = tr[tr.seed == seed]
        assert set(zip(g.step, g.row, g["query"])) == {(t, i, q) for t, i in rows for q in queries}


def test_trak_row_scores_are_influence_trak_on_the_same_training_set(traked):
    """The same rows and queries through influence.py's ``trak`` (the bank's estimator for a swap): the fit rows and
    every scored row but the last two as its fit set, the second-to-last as the replaced row and the last as the
    candidate — Φ's training set the same rows in the same order — give −(τ(q, c) − τ(q, r)), which is the row
    scores' v(r) − v(c) for every query (a removal is +τ)."""
    import torch

    from seedlab.attribution.estimators.attribute import fit_set
    from seedlab.attribution.estimators.builtin import Case
    from seedlab.attribution.estimators.influence import InfluenceOptions, trak
    from seedlab.lm.batches import get_batch
    from seedlab.lm.model import GPT

    copy, _ = traked
    b = open_bank(copy)
    rows = removals.rows_of(b.cfg)
    batch = lambda t: get_batch(b.inputs.corpus.train, 0, t, b.cfg.batch_size, b.inputs.gcfg.block_size)
    X = torch.stack([batch(t)[0][i] for t, i in rows])
    Y = torch.stack([batch(t)[1][i] for t, i in rows])
    fx, fy = fit_set(b, 0, END)
    model = GPT(b.inputs.gcfg)
    model.load_state_dict(b.dir.twin(0).weights(END))
    queries = {n: t.tokens for n, t in b.inputs.queries.items()}
    last = tuple(int(v) for v in torch.cat([X[-1], Y[-1, -1:]]))
    case = Case.of(X[-2:-1], Y[-2:-1], 0, {"last": last}, queries, b.inputs.pad_id)
    est = trak(model, case, options=InfluenceOptions(fit=(torch.cat([fx, X[:-2]]), torch.cat([fy, Y[:-2]]))))[0]
    sc = _rowscores(copy)
    v = sc[(sc.estimator == "trak") & (sc.seed == 0)].set_index(["step", "row", "query"]).value
    want = np.array([v[(*rows[-2], q)] - v[(*rows[-1], q)] for q in queries])
    assert np.abs(est).min() > 0
    np.testing.assert_allclose(est, want, rtol=1e-6, atol=0)


def test_trak_puts_a_querys_own_text_among_its_largest_removal_effects(traked):
    """The sign: a query whose text *is* a training row (three rows of the run taken as queries) — removing that row
    is predicted to raise the query's loss more than removing any other row, and positive (a flipped sign puts it
    at the bottom). The bank's own queries keep their values beside them (τ is per query)."""
    from dataclasses import replace

    from seedlab.attribution.estimators.rowscores import trak_scores
    from seedlab.attribution.bank.rundir import Bank
    from seedlab.attribution.bank.texts import Text
    from seedlab.lm.batches import get_batch

    copy, _ = traked
    b = open_bank(copy)
    rows = removals.rows_of(b.cfg)
    picked = [rows[0], rows[len(rows) // 2], rows[-1]]
    dup = {}
    for t, i in picked:
        x, y = get_batch(b.inputs.corpus.train, 0, t, b.cfg.batch_size, b.inputs.gcfg.block_size)
        dup[f"row-{t}-{i}"] = Text("heldout", tuple(int(v) for v in np.r_[x[i].numpy(), y[i, -1:].numpy()]), "")
    bank2 = Bank(b.dir, b.cfg, replace(b.inputs, queries=dict(b.inputs.queries) | dup))
    f = trak_scores(bank2, 0, rows)
    for (t, i), q in zip(picked, dup):
        g = f[f["query"] == q].set_index(["step", "row"]).value
        assert g[(t, i)] > 0 and g[(t, i)] > g.median() and g.idxmax() == (t, i)  # the largest of all (~10x the next)
    sc = _rowscores(copy)
    own = sc[(sc.estimator == "trak") & (sc.seed == 0)].set_index(["step", "row", "query"]).value
    again = f[~f["query"].isin(dup)].set_index(["step", "row", "query"]).value
    # float32 features: the query gradients taken in another batch differ by round-off, which (ΦᵀΦ)⁻¹ amplifies
    np.testing.assert_allclose(again.loc[own.index], own, rtol=0, atol=1e-3 * own.abs().max())


def test_add_replaces_the_estimators_asked_for_and_without_it_rowscores_overwrites(traked, tmp_path, monkeypatch):
    """``add``: an estimator asked for again replaces its rows (no duplicates), the others stay; without ``add`` the
    file holds the estimators asked for only. (trak stubbed: the merge is what is tested.) traker missing: a
    one-line error naming it when asked for, left out of the default."""
    import shutil
    import sys

    from seedlab.attribution.estimators import rowscores
    from seedlab.errors import SeedlabError

    copy = shutil.copytree(traked[0], tmp_path / "bank")
    before = _rowscores(copy)
    monkeypatch.setattr(rowscores, "trak_scores", lambda bank, seed, rows: rowscores._long(
        seed, "trak", list(bank.inputs.queries), END, rows, np.full((len(rows), len(bank.inputs.queries)), 7.0)))
    rowscores.bank_rowscores(copy, estimators=["trak"], add=True, progress=False)
    after = _rowscores(copy)
    assert len(after) == len(before) and (after[after.estimator == "trak"].value == 7.0).all()
    pd.testing.assert_frame_equal(after[after.estimator != "trak"], before[before.estimator != "trak"], check_exact=True)
    record = json.loads(BankDir(copy).rowscores_json.read_text())
    assert record["estimators"] == ["tracin", "grad-dot", "grad-cosine", "trak"]
    rowscores.bank_rowscores(copy, estimators=["trak"], progress=False)
    assert set(_rowscores(copy).estimator) == {"trak"}
    assert json.loads(BankDir(copy).rowscores_json.read_text())["estimators"] == ["trak"]
    monkeypatch.setitem(sys.modules, "trak", None)  # as if traker were not installed
    with pytest.raises(SeedlabError, match=r"^rowscores: trak needs traker, which is not installed: pip install traker"):
        rowscores.choose(["trak"])
    assert "trak" not in rowscores.choose(None) and "tracin" in rowscores.choose(None)


def test_ekfac_scores_every_row_at_the_end_from_the_rows_of_the_twins_batches(bank):
    # rowscores' shared row gathering (each step's batch drawn once) is the batches' own rows, in the order asked;
    # ekfac, built on it, scores every (row, query) once at the end, in nats/token
    import torch

    from seedlab.attribution.estimators import rowscores

    b = open_bank(bank)
    rows = removals.rows_of(b.cfg)
    X, Y = rowscores._row_tensors(b, 0, rows)
    for j in (0, len(rows) // 2, len(rows) - 1):
        t, i = rows[j]
        x, y = rowscores._batch(b, 0, t)
        assert torch.equal(X[j], x[i]) and torch.equal(Y[j], y[i])
    e = rowscores.ekfac_scores(b, 0, rows, torch.device("cpu"))
    assert len(e) == len(rows) * len(b.inputs.queries) and set(e.horizon) == {b.cfg.end}
    assert set(e.unit) == {"nats/token"} and np.isfinite(e.value).all() and (e.value != 0).any()
    assert not e.duplicated(["step", "row", "query"]).any()


def test_metagrad_trunc_scores_the_rows_as_metagrad_inside_its_window(bank, tmp_path):
    """``rowscores --estimator metagrad-trunc`` (only when named): on every removed row, −metagrad (this bank's
    metagrad.parquet, from step 2) bit for bit where the row is at most attribute.metagrad_window = 10 updates older
    than the horizon, 0 for an older one (here the rows of step 2 at the end, age 12); the LOO tables read it."""
    import shutil

    from seedlab.attribution.estimators import rowscores

    copy = shutil.copytree(bank, tmp_path / "bank")
    rowscores.bank_rowscores(copy, estimators=["metagrad-trunc"], add=True, progress=False)
    scores = rowscores.read_scores(copy)
    keys = ["seed", "query", "horizon", "step", "row"]
    t = scores[scores.estimator == "metagrad-trunc"].set_index(keys).value
    m = scores[scores.estimator == "metagrad"].set_index(keys).value
    assert open_bank(copy).cfg.attribute.metagrad_window == 10 and set(scores.unit[scores.estimator == "metagrad-trunc"]) == {"nats/token"}
    assert len(t) == len(scores[scores.estimator == "tracin"])  # every removed row at every horizon after it
    age = t.index.get_level_values("horizon") - t.index.get_level_values("step")
    inside = t[age <= 10]
    assert np.array_equal(inside.to_numpy(), m.reindex(inside.index).to_numpy()) and (inside != 0).any()
    assert (t[age > 10] == 0).all() and (age > 10).sum() == 2 * 2 * len(open_bank(copy).inputs.queries)
    assert "metagrad-trunc" not in rowscores.choose(None)
    j = loo.joined(pd.read_parquet(BankDir(copy).loo), scores)
    assert "metagrad-trunc" in set(j.estimator)


def test_seeds_in_processes_of_their_own_give_the_same_metagradients_and_row_scores(bank, tmp_path):
    """``metagrad --jobs 2`` and ``rowscores --jobs 2``: the two seeds at once in spawned workers, one thread each,
    their progress reported back; the tables the one-process runs of the fixture wrote, bit for bit."""
    import shutil

    from seedlab.attribution.estimators.metagrad import bank_metagrad
    from seedlab.attribution.estimators.rowscores import bank_rowscores

    copy = shutil.copytree(bank, tmp_path / "bank")
    rd, ref = BankDir(copy), BankDir(bank)
    bank_metagrad(copy, first=2, progress=False, jobs=2)
    bank_rowscores(copy, estimators=["tracin", "grad-dot", "grad-cosine"], progress=False, jobs=2)
    for table in ("metagrad", "rowscores"):
        pd.testing.assert_frame_equal(pd.read_parquet(getattr(rd, table)), pd.read_parquet(getattr(ref, table)),
                                      check_exact=True)
    record = json.loads(rd.metagrad_json.read_text())
    assert record["jobs"] == 2 and set(record["seeds"]) == {"0", "1"}
    assert set(json.loads(rd.rowscores_json.read_text())["seconds"]) == {"0", "1"}
