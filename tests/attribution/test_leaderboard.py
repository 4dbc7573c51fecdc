"""The leaderboard across banks and exports (attribution/analyses/leaderboard.py, report/leaderboard.py, ``seedlab
attribution leaderboard``): its cells are the analyses modules' numbers for the same bank (single-row ρ and the row
invariance, leave-one-out by age, the single-model LDS, each estimator's recorded seconds over the bank's training
clock); banks that differ in B render side by side, an export beside a bank; the figure passes figcheck; banks of
another design (queries, corpus) and a folder that is neither bank nor export are refused in one line, exit 2,
nothing written. The banks here are synthetic tables in a bank's layout (no training): what the leaderboard reads."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest

import figcheck
from seedlab.attribution.analyses import lds, leaderboard, loo, stats
from seedlab.attribution.bank.measure import RETEST_COLUMNS, TRAK_COLUMNS, TRAK_ROW_COLUMNS
from seedlab.attribution.bank.rundir import BankDir, ExportDir, LeaderboardDir
from seedlab.attribution.benchmark import FORMAT, verify
from seedlab.attribution.report import leaderboard as report
from seedlab.errors import SeedlabError
from seedlab.store import digest, file_sha256

S, END = 4, 14
HORIZONS = {5: "s+1", 7: "s+3", 9: "mid", 14: "end"}
SEEDS = (0, 1)
CANDIDATES = [("passage-0", "passage"), ("passage-1", "passage"), ("passage-2", "passage"), ("heldout-0", "heldout"),
              ("heldout-1", "heldout"), ("heldout-2", "heldout")]
QUERIES = [("query-0", "heldout"), ("query-1", "heldout"), ("probe-gizmo", "probe")]
SWAPS = {"adam": ("estimator", 0.3), "sgd": ("estimator", 1.5), "unroll": ("reference", 0.1),
         "random": ("baseline", None), "gradnorm": ("baseline", 3.0)}
ROWS = {"metagrad": 0.3, "tracin": 1.0, "grad-dot": 3.0}
LOO_STEPS = (2, 4, 13)  # ages at the end: 12, 10, 1
R = 200  # bootstrap resamples (the command's 2,000: the same code)


def write_bank(folder, *, B=4, lr=1e-2, rng=0, queries=QUERIES, replicate=True, removals=True, training=2.0,
               retests=False):
    """A bank's top as the leaderboard reads it: config, inputs, attribution.parquet and .json, loo, groups and
    their rows, the row scores with their seconds, training.json; with ``retests`` retest.parquet (every
    leave-one-out row and the first 3 subsets again, noisier) and trak.parquet with its rows (TRAK subsets keeping
    half the rows after s, 2 retrainings). Effects and estimates are seeded noise around a shared truth, so the
    estimators differ in how well they rank."""
    g = np.random.default_rng(rng)
    folder.mkdir(parents=True)
    cfg = {"model": "mini", "block_size": 32, "batch_size": B, "peak_lr": lr, "min_lr": lr / 10, "steps": END,
           "injection_step": S, "injection_row": 0, "seeds": list(SEEDS), "corpus": "/corpus",
           "candidates": {"file": "candidates.txt", "heldout": 3, "seed": 0, "own_row": replicate},
           "queries": {"own": True, "heldout": 2, "probes": "probes.jsonl"}}
    (folder / "config.json").write_text(json.dumps(cfg))
    text = lambda name, kind, i: {"name": name, "kind": kind, "text": name, "tokens": [i, i + 1, i + 2]}
    (folder / "inputs.json").write_text(json.dumps({
        "corpus": "/corpus", "corpus_sha256": {"train": "a1", "heldout": "b2"}, "eot_id": 0,
        "candidates": [text(n, k, i) for i, (n, k) in enumerate(CANDIDATES)],
        "queries": [text(n, k, 10 + i) for i, (n, k) in enumerate(queries)]}))
    rows = []
    for seed in SEEDS:
        for (c, ck) in [*CANDIDATES, ("own-row", "control")]:
            for (q, qk) in [("self", "self"), *queries]:
                for h, label in HORIZONS.items():
                    m = 0.0 if ck == "control" else g.normal() * (1 + 0.1 * (h - S))
                    rep = np.nan if not replicate else m + g.normal() * 0.3
                    for e, (lab, noise) in SWAPS.items():
                        est = 0.0 if ck == "control" else (g.normal() if noise is None else m + noise * g.normal())
                        rows.append({"seed": seed, "candidate": c, "query": q, "horizon": h, "measured": m,
                                     "measured_replicate": rep, "estimator": e, "estimator_label": lab, "estimate": est,
                                     "candidate_kind": ck, "query_kind": qk, "after": h - S, "label": label,
                                     "unit": "nats/token"})
    pd.DataFrame(rows).to_parquet(folder / "attribution.parquet")
    (folder / "attribution.json").write_text(json.dumps({
        "estimators": list(SWAPS), "seconds": {e: {str(s): 0.5 + i + s for s in SEEDS} for i, e in enumerate(SWAPS)}}))
    if training is not None:
        (folder / "training.json").write_text(json.dumps({"seconds_per_run": training, "run_updates": 100}))
    if not removals:
        return folder
    truth, scores = {}, []
    for seed in SEEDS:
        for t in range(0, END):
            for i in range(B):
                for q, _ in queries:
                    for h in HORIZONS:
                        if h > t:
                            truth[seed, t, i, q, h] = g.normal()
    for (seed, t, i, q, h), v in truth.items():
        for e, noise in ROWS.items():
            scores.append({"seed": seed, "estimator": e, "query": q, "horizon": h, "step": t, "row": i,
                           "value": v + noise * g.normal(), "unit": "nats/token"})
    pd.DataFrame(scores).to_parquet(folder / "rowscores.parquet")
    (folder / "rowscores.json").write_text(json.dumps({"estimators": ["tracin", "grad-dot"], "seconds": {
        str(s): {"tracin": 4.0 + s, "grad-dot": 1.0, "grad-cosine": 1e-6} for s in SEEDS}}))  # cosine: in dot's pass
    (folder / "metagrad.json").write_text(json.dumps({"seeds": {str(s): {"seconds": 10.0 * (s + 1)} for s in SEEDS}}))
    kinds = dict(queries)
    L = [{"seed": seed, "step": t, "row": i, "query": q, "query_kind": kinds[q], "horizon": h, "label": HORIZONS[h],
          "age": h - t, "measured": truth[seed, t, i, q, h] + 0.5 * g.normal(), "loss": 1.0, "twin_loss": 1.0}
         for seed in SEEDS for t in LOO_STEPS for i in range(4) for q, _ in queries for h in HORIZONS if h > t]
    pd.DataFrame(L).to_parquet(folder / "loo.parquet")
    members, groups = [], []
    rows_after = [(t, i) for t in range(S, END) for i in range(B)]
    for seed in SEEDS:
        for a in (0.05, 0.1):
            for k in range(8):
                pick = [rows_after[j] for j in g.choice(len(rows_after), size=max(2, round(a * len(rows_after))),
                                                        replace=False)]
                members += [{"seed": seed, "alpha": a, "subset": k, "step": t, "row": i} for t, i in pick]
                for q, qk in queries:
                    for h in (9, 14):
                        effect = sum(truth[seed, t, i, q, h] for t, i in pick if t < h) + 0.5 * g.normal()
                        groups.append({"seed": seed, "alpha": a, "subset": k, "rows": len(pick), "query": q,
                                       "query_kind": qk, "horizon": h, "label": HORIZONS[h], "removed_before": 0,
                                       "measured": effect, "loss": 1.0, "twin_loss": 1.0})
    pd.DataFrame(groups).to_parquet(folder / "groups.parquet")
    pd.DataFrame(members).to_parquet(folder / "group_rows.parquet")
    if not retests:
        return folder
    again = [{"seed": r["seed"], "removal": "loo", "arm": f"loo.{r['step']}.{r['row']}", "nudge": "w", "step": r["step"],
              "row": r["row"], "alpha": np.nan, "subset": -1, "query": r["query"], "query_kind": r["query_kind"],
              "horizon": r["horizon"], "label": r["label"], "measured": r["measured"],
              "retest": r["measured"] + 0.7 * g.normal()} for r in L]
    again += [{"seed": r["seed"], "removal": "group", "arm": f"group.{r['alpha']}.{r['subset']}", "nudge": "w",
               "step": -1, "row": -1, "alpha": r["alpha"], "subset": r["subset"], "query": r["query"],
               "query_kind": r["query_kind"], "horizon": r["horizon"], "label": r["label"], "measured": r["measured"],
               "retest": r["measured"] + 0.7 * g.normal()} for r in groups if r["subset"] < 3]
    pd.DataFrame(again, columns=RETEST_COLUMNS).to_parquet(folder / "retest.parquet")
    kept, trak = [], []
    for seed in SEEDS:
        for k in range(8):
            gone = [rows_after[j] for j in g.choice(len(rows_after), size=len(rows_after) // 2, replace=False)]
            kept += [{"seed": seed, "keep": 0.5, "subset": k, "step": t, "row": i} for t, i in gone]
            for retrain in range(2):
                for q, qk in queries:
                    for h in (9, 14):
                        trak.append({"seed": seed, "keep": 0.5, "subset": k, "retrain": retrain, "rows": len(gone),
                                     "query": q, "query_kind": qk, "horizon": h, "label": HORIZONS[h],
                                     "removed_before": 0, "loss": 1.0, "twin_loss": 1.0, "measured": sum(
                                         truth[seed, t, i, q, h] for t, i in gone if t < h) + g.normal()})
    pd.DataFrame(trak, columns=TRAK_COLUMNS).to_parquet(folder / "trak.parquet")
    pd.DataFrame(kept, columns=TRAK_ROW_COLUMNS).to_parquet(folder / "trak_rows.parquet")
    return folder


def as_export(bank, dst):
    """``bank`` copied and sealed as an export: a manifest of every file's SHA-256 (benchmark.py's format)."""
    shutil.copytree(bank, dst)
    ex = ExportDir(dst)
    files = {ex.relative(p): file_sha256(p) for p in ex.files()}
    ex.manifest.write_text(json.dumps({"format": FORMAT, "bank": str(bank), "rows": "trained", "seeds": list(SEEDS),
                                       "files": files, "digest": digest(files)}))
    verify(dst)
    return dst


@pytest.fixture(scope="module")
def banks(tmp_path_factory):
    base = tmp_path_factory.mktemp("leaderboard")
    return {"b4": write_bank(base / "b4", retests=True), "b16": write_bank(base / "b16", B=16, lr=1e-3, rng=1),
            "bare": write_bank(base / "bare", B=8, rng=2, replicate=False, removals=False, training=None)}


@pytest.fixture(scope="module")
def board(banks):
    return leaderboard.board([banks["b4"], banks["b16"], banks["bare"]], resamples=R)


def _cells(b, column, metric, **where):
    t = b.table[(b.table.column == column) & (b.table.metric == metric)]
    for k, v in where.items():
        t = t[t[k] == v]
    return t


def test_the_single_row_cells_are_the_banks_correlations_and_its_row_invariance(banks, board):
    column = board.columns[0]
    df = pd.read_parquet(banks["b4"] / "attribution.parquet")
    corr = stats.analyse(df, resamples=R).correlations
    corr = corr[corr.track == "within"]
    got = _cells(board, column, leaderboard.SINGLE)
    est = got[got.role != "ceiling"].set_index(["estimator", "query_kind", "setting"])
    want = corr[corr.estimator != stats.ROW_INVARIANCE].set_index(["estimator", "query_kind", "label"])
    assert len(est) == len(want) == 6 * 3 * 4  # adam, sgd, unroll, random, gradnorm and the kind baseline
    for key, r in want.iterrows():
        np.testing.assert_array_equal(est.loc[key, ["value", "low", "high"]].tolist(), [r.rho, r.low, r.high], key)
    assert est.loc[("unroll", "heldout", "s+1"), "role"] == "reference"
    assert est.loc[("random", "heldout", "s+1"), "role"] == est.loc[("kind", "heldout", "s+1"), "role"] == "baseline"
    ceil = got[got.role == "ceiling"].set_index(["query_kind", "setting"])
    for r in corr[corr.estimator == stats.ROW_INVARIANCE].itertuples():
        c = ceil.loc[(r.query_kind, r.label)]
        assert (c.retest, c.retest_low, c.retest_high, c.value) == (r.rho, r.low, r.high, r.bound)
        assert c.low == pytest.approx(np.sqrt(max(r.low, 0))) and c.high == pytest.approx(np.sqrt(max(r.high, 0)))
    bare = _cells(board, board.columns[2], leaderboard.SINGLE)  # no replicate rows: the ceiling not measured
    assert (bare[bare.role == "ceiling"].note == leaderboard.NOT_MEASURED).all() and len(bare[bare.role == "ceiling"])


def test_the_leave_one_out_and_lds_cells_are_loo_and_lds_at_the_end(banks, board):
    column = board.columns[0]
    L = pd.read_parquet(banks["b4"] / "loo.parquet")
    scores = pd.read_parquet(banks["b4"] / "rowscores.parquet")
    by_age = loo.by_age(loo.joined(L, scores), resamples=R)
    got = _cells(board, column, leaderboard.LOO).query("role != 'ceiling'").set_index(["estimator", "query_kind", "setting"])
    assert sorted(set(got.index.get_level_values("setting"))) == ["age 1", "age 11–50", "age 2–10"]  # 1, 10, 12
    for step, band in ((13, "age 1"), (4, "age 2–10"), (2, "age 11–50")):  # one step a band: its by_age cell
        want = by_age[(by_age.step == step) & (by_age.horizon == END)]
        assert len(want) == 3 * 3  # metagrad, tracin, grad-dot × heldout, probe, all
        for r in want.itertuples():
            cell = got.loc[(r.estimator, r.query_kind, band)]
            np.testing.assert_array_equal([cell.value, cell.low, cell.high],
                                          [r.rho_within, r.rho_within_low, r.rho_within_high])
            assert cell.role == "estimator"  # metagrad is MAGIC's attributor here, not a reference
    two = leaderboard.loo_rows(board.sources[0], column, bands=(1, 50), resamples=R, seed=0, alpha=0.05)
    pooled = loo.pooled(loo.joined(L[L.step.isin([2, 4])], scores), resamples=R)
    pooled = pooled[pooled.horizon == END].set_index(["estimator", "query_kind"])
    for r in (r for r in two if r["setting"] == "age 2–50" and r["role"] != "ceiling"):  # two steps: loo.pooled over them
        assert r["value"] == pooled.loc[(r["estimator"], r["query_kind"]), "rho_within"]

    G, M = pd.read_parquet(banks["b4"] / "groups.parquet"), pd.read_parquet(banks["b4"] / "group_rows.parquet")
    table = lds.analyse(G, M, scores, resamples=R)
    table = table[table.horizon == END]
    got = _cells(board, column, leaderboard.LDS).query("role != 'ceiling'").set_index(["estimator", "query_kind", "setting"])
    assert len(got) == len(table) == 3 * 3 * 2
    for r in table.itertuples():
        np.testing.assert_array_equal(
            got.loc[(r.estimator, r.query_kind, f"α {100 * r.alpha:g} %"), ["value", "low", "high"]].tolist(),
            [r.lds, r.low, r.high])
    plain = pd.concat([_cells(board, board.columns[1], m).query("role == 'ceiling'")
                       for m in (leaderboard.LOO, leaderboard.LDS)])
    assert len(plain) and (plain.note == leaderboard.NOT_MEASURED).all()  # no retest of the removals there
    assert not len(_cells(board, board.columns[1], leaderboard.TRAK_LDS))  # nor TRAK subsets


def test_the_removals_ceilings_and_the_trak_lds_are_loo_and_lds_own(banks, board):
    column = board.columns[0]
    R_ = pd.read_parquet(banks["b4"] / "retest.parquet")
    ages = loo.ceiling(R_, resamples=R)[0]
    got = _cells(board, column, leaderboard.LOO).query("role == 'ceiling'").set_index(["query_kind", "setting"])
    for step, band in ((13, "age 1"), (4, "age 2–10"), (2, "age 11–50")):
        for r in ages[(ages.step == step) & (ages.horizon == END)].itertuples():
            c = got.loc[(r.query_kind, band)]
            np.testing.assert_array_equal([c.retest, c.retest_low, c.retest_high, c.value, c.low, c.high],
                                          [r.retest_within, r.retest_within_low, r.retest_within_high, r.bound_within,
                                           r.bound_within_low, r.bound_within_high])
    single = lds.single_ceiling(R_, resamples=R)
    got = _cells(board, column, leaderboard.LDS).query("role == 'ceiling'").set_index(["query_kind", "setting"])
    for r in single[single.horizon == END].itertuples():
        c = got.loc[(r.query_kind, f"α {100 * r.alpha:g} %")]
        np.testing.assert_array_equal([c.retest, c.value, c.low, c.high], [r.retest, r.bound, r.bound_low, r.bound_high])
    trak, rows = pd.read_parquet(banks["b4"] / "trak.parquet"), pd.read_parquet(banks["b4"] / "trak_rows.parquet")
    scores = pd.read_parquet(banks["b4"] / "rowscores.parquet")
    want = lds.trak_analyse(trak, rows, scores, resamples=R)[0]
    got = _cells(board, column, leaderboard.TRAK_LDS)
    est = got.query("role != 'ceiling'").set_index(["estimator", "query_kind"])
    assert set(got.setting) == {"keep 50 %"} and len(est) == len(want[want.horizon == END]) == 3 * 3
    for r in want[want.horizon == END].itertuples():
        np.testing.assert_array_equal(est.loc[(r.estimator, r.query_kind), ["value", "low", "high"]].tolist(),
                                      [r.lds, r.low, r.high])
    ceiling = lds.trak_ceiling(trak, resamples=R)
    got = got.query("role == 'ceiling'").set_index("query_kind")
    for r in ceiling[ceiling.horizon == END].itertuples():
        np.testing.assert_array_equal([got.loc[r.query_kind, "value"], got.loc[r.query_kind, "retest"]],
                                      [r.bound, r.reliability])


def test_the_cost_is_the_recorded_seconds_per_seed_over_the_banks_training_run(banks, board):
    t = board.table
    swaps = t[(t.column == board.columns[0]) & (t.metric == leaderboard.COST_SWAPS)].set_index("estimator")
    assert swaps.loc["sgd", "seconds"] == pytest.approx((1.5 + 2.5) / 2) and swaps.loc["sgd", "per_run"] == pytest.approx(1.0)
    rows = t[(t.column == board.columns[0]) & (t.metric == leaderboard.COST_ROWS)].set_index("estimator")
    assert rows.loc["metagrad", "seconds"] == pytest.approx(15.0) and rows.loc["metagrad", "per_run"] == pytest.approx(7.5)
    assert rows.loc["tracin", "seconds"] == pytest.approx(4.5)
    # grad-cosine came out of grad-dot's pass: it costs that pass, and says so
    assert rows.loc["grad-cosine", "seconds"] == pytest.approx(1.0) and "one pass with grad-dot" in rows.loc["grad-cosine", "detail"]
    # what the seconds bought, counted in the scores: the fixture's 14 steps × 4 rows, 3 queries, 4 horizons
    assert rows.loc["tracin", "detail"] == "56 rows × 3 queries × 4 horizons"
    assert rows.loc["metagrad", "detail"].endswith("every query in one reverse pass")
    repeated = leaderboard.row_cover(pd.DataFrame({"seed": 0, "estimator": "tracin", "query": "q", "step": [3, 3, 4, 4],
                                                   "row": 0, "horizon": [5, 9, 5, 9], "value": [1.0, 1.0, 2.0, 2.0]}))
    assert repeated == {"tracin": "2 rows × 1 query, one value repeated at its 2 horizons"}  # its one visit
    bare = t[(t.column == board.columns[2]) & (t.metric == leaderboard.COST_SWAPS)]
    assert bare.per_run.isna().all() and bare.seconds.notna().all()  # no training.json: seconds, no multiple


def test_banks_of_other_rows_per_batch_are_columns_labelled_by_their_design(board):
    assert board.columns == ["B 4, lr 0.01, 14 steps", "B 16, lr 0.001, 14 steps", "B 8, lr 0.01, 14 steps"]
    assert list(board.designs.kind) == ["bank", "bank", "bank"] and board.main == {"single": "heldout", "rows": "all"}
    s = board.standings
    row = s[(s.column == board.columns[0]) & (s.metric == leaderboard.SINGLE) & (s.query_kind == "heldout")
            & (s.setting == "s+1")].iloc[0]
    assert row.leader != "unroll"  # a reference never leads
    t = board.table
    cell = t[(t.column == row.column) & (t.metric == row.metric) & (t.query_kind == "heldout") & (t.setting == "s+1")
             & ~t.role.isin(["ceiling", "reference"])]
    others = cell[cell.estimator != row.leader]
    assert row.value == cell.value.max()
    assert row.separated == bool((others.high < row.low).all())
    assert set(row.tied) == set(others[others.high >= row.low].estimator)


def test_the_report_renders_the_table_csv_and_figure(board, tmp_path, monkeypatch):
    figs = figcheck.capture(monkeypatch, report)
    path = report.write_leaderboard(board, tmp_path / "lb")
    where = LeaderboardDir(tmp_path / "lb")
    assert path == where.report and where.table("table").is_file() and where.figure("grid").is_file()
    figcheck.check_all(figs)
    text = path.read_text()
    for column in board.columns:
        assert f"| {column} |" in text
    t = board.table
    adam = t[(t.column == board.columns[0]) & (t.estimator == "adam") & (t.metric == leaderboard.SINGLE)
             & (t.query_kind == "heldout") & (t.setting == "end")].iloc[0]
    assert f"{adam.value:.2f} [{adam.low:.2f}, {adam.high:.2f}]" in text
    assert leaderboard.NOT_MEASURED in text and "| *random* |" in text and "| **unroll** |" in text
    assert "(ρ_rep " in text and "LOO age 1" in text and "LDS α 5 %" in text and "TRAK LDS keep 50 %" in text
    assert "(reliability " in text and "(retest " in text and "## Single rows on the candidates' own text" in text
    assert f"- tracin — {board.columns[0]}: 56 rows × 3 queries × 4 horizons" in text  # what each cost covers
    assert not re.search(r"\b(best|wins?)\b", text, re.I)  # leaders are "first" only where intervals separate
    csv = pd.read_csv(where.table("table"))
    assert len(csv) == len(t) and {"B", "lr", "steps"} <= set(csv.columns)


def test_an_export_and_a_bank_render_together(banks, tmp_path, seedlab_main):
    """From the command line (the analyses' 2,000 resamples: the bank without removals keeps it seconds)."""
    ex = as_export(banks["bare"], tmp_path / "bench")
    rc, out, err = seedlab_main("attribution", "leaderboard", str(banks["bare"]), str(ex), "--out", "lb")
    assert rc == 0, err
    text = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "| B 8, lr 0.01, 14 steps · bare |" in text and "| B 8, lr 0.01, 14 steps · bench |" in text
    assert "| export |" in text and "leaderboard.md" in out and (tmp_path / "lb" / "leaderboard-grid.png").is_file()
    csv = pd.read_csv(tmp_path / "lb" / "leaderboard-table.csv")
    a, b = (csv[csv.column == f"B 8, lr 0.01, 14 steps · {n}"].drop(columns=["column", "source", "kind"])
            .reset_index(drop=True) for n in ("bare", "bench"))
    assert len(a) and a.metric.isin([leaderboard.SINGLE, leaderboard.COST_SWAPS]).all()
    pd.testing.assert_frame_equal(a, b)  # the export's numbers are its bank's


def test_a_score_folder_reads_the_records_it_does_not_copy_from_the_export_it_scored(banks, tmp_path):
    """A score folder (seedlab attribution score) holds config, integrity and the tables; inputs.json (the
    comparability check), training.json and the row estimators' seconds are its export's."""
    ex = as_export(banks["b4"], tmp_path / "bench")
    score = ex / "scores" / "mine"
    score.mkdir(parents=True)
    for name in ("config.json", "attribution.parquet", "loo.parquet", "groups.parquet", "group_rows.parquet",
                 "rowscores.parquet"):
        shutil.copyfile(ex / name, score / name)
    meta = json.loads((ex / "attribution.json").read_text())
    (score / "attribution.json").write_text(json.dumps({**meta, "source": {"kind": "export", "path": str(ex)}}))
    verify(ex)  # scores/ is not the manifest's
    src = leaderboard.read_source(score, verify)
    bank = leaderboard.read_source(banks["b4"])
    assert src.kind == "score" and src.inputs == bank.inputs and src.training == bank.training
    assert src.row_seconds == bank.row_seconds and "metagrad" in src.row_seconds["0"]
    leaderboard.check_comparable([bank, src])


def test_bad_input_is_one_line_exit_2_and_writes_nothing(banks, tmp_path, seedlab_main):
    other = write_bank(tmp_path / "other", B=32, queries=[("query-0", "heldout"), ("query-9", "heldout")])
    ex = as_export(banks["b4"], tmp_path / "sealed")
    (ex / "loo.parquet").write_bytes(b"edited")
    (tmp_path / "plain").mkdir()
    corpus = json.loads((banks["b16"] / "inputs.json").read_text())
    alien = tmp_path / "alien"
    shutil.copytree(banks["b16"], alien)
    (alien / "inputs.json").write_text(json.dumps({**corpus, "corpus_sha256": {"train": "zz", "heldout": "b2"}}))
    bad = [((str(banks["b4"]), str(other)), r"^error: leaderboard: .*b4 and .*other are not comparable: they differ in "
                                            r"queries .*B, lr and steps may differ"),
           ((str(banks["b4"]), str(alien)), r"they differ in corpus \("),
           ((str(banks["b4"]), str(tmp_path / "plain")), r"plain: neither a bank nor an export"),
           ((str(tmp_path / "nowhere"),), r"nowhere: no such folder"),
           ((str(ex),), r"sealed: loo.parquet does not match its SHA-256"),
           ((str(banks["b4"]), "--age-bands", "10,2"), r"age bands: increasing")]
    for args, match in bad:
        rc, _, err = seedlab_main("attribution", "leaderboard", *args, "--out", "lb")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and re.search(match, err), (args, err)
        assert not (tmp_path / "lb").exists()
    with pytest.raises(SeedlabError, match="nothing scored yet"):
        empty = tmp_path / "empty"
        empty.mkdir()
        (empty / "config.json").write_text((banks["b4"] / "config.json").read_text())
        leaderboard.read_source(empty)


def test_the_bank_records_its_training_clock(tmp_path, monkeypatch):
    """bank/run.py ``SeedClock``: a seed's seconds from its first run started to its last finished run and the
    updates trained, added to seed-<k>/training.json as each run finishes, so a later command (a resume) adds to
    them; ``write_training`` sums the seeds' clocks: one run's seconds at that rate. No clock, nothing written."""
    from types import SimpleNamespace

    from seedlab.attribution.bank import run as bank_run
    from seedlab.attribution.bank.run import SeedClock, write_training

    now = [10.0]
    monkeypatch.setattr(bank_run.time, "perf_counter", lambda: now[0])
    rd = BankDir(tmp_path)

    def train(seed: int, updates: int, seconds: float, finish: bool = True) -> None:
        clock = SeedClock(rd)
        clock.run(f"seed {seed} twin", updates)
        for _ in range(updates):
            clock.step(f"seed {seed} twin")
        now[0] += seconds
        if finish:
            clock.finished(seed, None, None, None)

    train(0, 40, 8.0)
    assert json.loads(rd.seed_training(0).read_text()) == {"seconds": 8.0, "run_updates": 40}
    train(0, 30, 5.0, finish=False)  # stopped in a run: neither its updates nor its seconds count
    train(0, 10, 2.0)  # the resume
    train(1, 50, 10.0)
    assert json.loads(rd.seed_training(0).read_text()) == {"seconds": 10.0, "run_updates": 50}
    write_training(rd, SimpleNamespace(end=20, seeds=[0, 1, 2]), {"device": "cpu", "threads": 1})
    record = json.loads(rd.training.read_text())
    assert (record["seconds"], record["run_updates"], record["clocks"], record["seconds_per_run"]) == (20.0, 100, 2, 4.0)
    write_training(BankDir(tmp_path / "none"), SimpleNamespace(end=20, seeds=[0]), {})
    assert not (tmp_path / "none").exists()


def test_a_trained_bank_records_its_clock_and_renders_beside_its_export(tiny_bank, tmp_path):
    """The tiny bank of conftest.py (trained once for the suite): its training.json from the bank's own clock, and
    the leaderboard of the bank beside its export (checked against the manifest) gives the same cells for both."""
    from seedlab.attribution.benchmark import export

    bank = tiny_bank / "bank"
    record = json.loads(BankDir(bank).training.read_text())
    assert record["run_updates"] > 2 * END and record["seconds"] > 0
    clocks = [json.loads(p.read_text()) for p in map(BankDir(bank).seed_training, (0, 1)) if p.is_file()]
    assert record["clocks"] == len(clocks) >= 1  # one stack of both seeds' runs counts on the first seed
    assert record["run_updates"] == sum(c["run_updates"] for c in clocks)
    assert record["seconds"] == pytest.approx(sum(c["seconds"] for c in clocks))
    assert record["seconds_per_run"] == pytest.approx(record["seconds"] / record["run_updates"] * END)
    ex = export(bank, tmp_path / "bench", rows="injection").path
    b = leaderboard.board([bank, ex], verify=verify, resamples=R)
    assert list(b.designs.kind) == ["bank", "export"] and b.columns[0].endswith("· bank")
    t = b.table
    cells = [t[t.column == c].drop(columns=["column", "source", "kind"]).reset_index(drop=True) for c in b.columns]
    pd.testing.assert_frame_equal(*cells)
    cost = t[(t.column == b.columns[1]) & (t.metric == leaderboard.COST_SWAPS)]
    assert len(cost) and cost.per_run.notna().all()  # the export carries training.json
    single = t[(t.column == b.columns[0]) & (t.metric == leaderboard.SINGLE) & (t.role != "ceiling")]
    corr = stats.analyse(pd.read_parquet(BankDir(bank).attribution), resamples=R).correlations
    assert len(single) == int((corr.track == "within").sum()) - int((corr.estimator == stats.ROW_INVARIANCE).sum())
