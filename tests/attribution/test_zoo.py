"""The run's own rows as a benchmark any library scores (attribution/benchmark.py format 2, the dattri adapter's
training-rows plug-ins, rowscores.py's ekfac and trak): an export carries the rows the leave-one-out and group arms
removed, their effects and the twin's weights at their steps; ``score --row-estimator`` runs rowscores.py's loop on
them and scores the values through loo.py and lds.py, the tables the bank report reads; every attributor dattri
0.3.0 ships runs on a tiny export (or is skipped naming its own limitation); old exports still read; bad input is
one line, exit 2, nothing written."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from seedlab.attribution.analyses import lds, loo
from seedlab.attribution.bank.rundir import ExportDir
from seedlab.attribution.benchmark import export, open_export, score, verify
from seedlab.errors import SeedlabError
from seedlab.store import digest, tensor_hashes

pytestmark = pytest.mark.usefixtures("one_thread")

S, END = 4, 10
#: a bank smaller than TINY_BANK (16-token rows, 10 updates, one seed): removals at s and end − 1, two α of 4 groups
OVER = {"block_size": 16, "steps": END, "seeds": [0], "horizons": [1, "mid", "end"],
        "candidates": {"file": "candidates.txt", "heldout": 1, "own_row": True},
        "loo": {"steps": ["s", "end-1"], "rows": 2}, "groups": {"alphas": [0.125, 0.25], "subsets": 4}}
PASSAGES = "Gizmo mends.\n\nq8#Lm vP!2\n"
PROBES = '{"name": "probe-gizmo", "text": "Gizmo mends it."}\n'
BUILT_INS = ["tracin", "grad-dot", "grad-cosine", "ekfac", "trak"]
DATTRI = "seedlab.attribution.dattri_adapter:rows."


@pytest.fixture(scope="module")
def bank(tmp_path_factory, twins_inputs, bank_design, one_thread):
    """The small bank with every built-in row estimator's scores (rowscores.parquet). Read it, never change it."""
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.attribution.bank.run import run_bank
    from seedlab.attribution.estimators.rowscores import bank_rowscores
    from seedlab.config import load_config

    base = tmp_path_factory.mktemp("zoo")
    path = bank_design.write(base, twins_inputs[0], **OVER)
    (base / "candidates.txt").write_text(PASSAGES)
    (base / "probes.jsonl").write_text(PROBES)
    cfg, folder = load_config(AttributionConfig, "attribution", path)
    run_bank(cfg, base / "bank", base=folder, progress=False)
    bank_rowscores(base / "bank", estimators=BUILT_INS, progress=False)
    return base / "bank"


@pytest.fixture(scope="module")
def exported(bank, tmp_path_factory):
    return export(bank, tmp_path_factory.mktemp("zoo-exports") / "bench").path


@pytest.fixture(scope="module")
def lean(bank, tmp_path_factory):
    """The batch of s only, and the twin's own checkpoints only."""
    return export(bank, tmp_path_factory.mktemp("zoo-lean") / "lean", rows="injection", row_checkpoints="saved").path


@pytest.fixture(scope="module")
def format_1(exported, tmp_path_factory):
    """``exported`` as this seedlab's format 1 wrote it: no removed rows, the format 1 manifest."""
    old = tmp_path_factory.mktemp("zoo-old") / "old"
    shutil.copytree(exported, old, ignore=shutil.ignore_patterns("scores"))
    for seed_dir in old.glob("seed-*"):
        shutil.rmtree(seed_dir / "removed")
    m = json.loads((old / "manifest.json").read_text())
    m["files"] = {k: v for k, v in m["files"].items() if "/removed/" not in k}
    m["format"], m["digest"] = "seedlab-attribution-benchmark/1", digest(m["files"])
    del m["removed"]
    (old / "manifest.json").write_text(json.dumps(m))
    return old


def _values(path, estimator: str) -> pd.DataFrame:
    f = pd.read_parquet(path)
    return f[f.estimator == estimator].sort_values(["seed", "horizon", "step", "row", "query"]).reset_index(drop=True)


# --------------------------------------------------------------------------- the export


def test_an_export_carries_the_removed_rows_their_effects_and_the_checkpoints_at_their_steps(bank, exported):
    from seedlab.attribution.bank import removals
    from seedlab.attribution.bank.rundir import open_bank
    from seedlab.attribution.estimators.metagrad import replay_check
    from seedlab.attribution.estimators.rowscores import replayed_weights
    from seedlab.lm.batches import get_batch
    from seedlab.lm.schedule import lr_of

    b, ex = open_bank(bank), ExportDir(exported)
    m = verify(exported)
    assert m["format"] == "seedlab-attribution-benchmark/2"
    names = removals.rows_of(b.cfg)
    assert len(names) == (END - S) * 4 and {(S, 0), (S, 1), (END - 1, 0), (END - 1, 1)} <= set(names)
    saved = sorted(int(t) for t in b.dir.twin(0).read_manifest())
    replayed = sorted({t for t, _ in names} - set(saved))
    assert m["removed"] == {"rows": len(names), "checkpoints": "rows", "replayed": {"0": replayed}}
    for table in ("loo.parquet", "groups.parquet", "group_rows.parquet", "rowscores.parquet"):
        assert (exported / table).read_bytes() == (bank / table).read_bytes()
    rows = open_export(exported).removed_rows(0)
    assert rows[0] == names
    batches = {t: get_batch(b.inputs.corpus.train, 0, t, 4, 16) for t in range(S, END)}
    for j, (t, i) in enumerate(names):  # the rows the twin trained on, token for token
        assert torch.equal(rows[1][j], batches[t][0][i]) and torch.equal(rows[2][j], batches[t][1][i])
    from seedlab.store import read_verified

    t_, _ = read_verified(ex.removed(0).rows)
    assert np.allclose(t_["lr"].numpy(), [lr_of(b.cfg, t) for t, _ in names])
    folder = ex.removed(0)
    assert sorted(int(t) for t in folder.read_manifest()) == replayed
    for t in replayed:
        assert folder.weights(t).keys() == b.dir.twin(0).weights(S).keys()
    # the replay that wrote them is the twin's, bit for bit, where the twin recorded its weights
    mid = saved[saved.index(S) + 1]
    again = replayed_weights(b, 0, [mid], "cpu", replay_check(b, 0, sorted(b.cfg.horizon_steps())))
    assert tensor_hashes(again[mid]) == b.dir.twin(0).read_manifest()[str(mid)]


def test_an_old_export_still_reads_and_scores_swaps(format_1, tmp_path):
    m = verify(format_1)
    assert m["format"] == "seedlab-attribution-benchmark/1"
    r = score(format_1, ["random"], baselines=False, out=tmp_path / "s", progress=False, report=False)
    assert r.rows > 0 and "random" in set(pd.read_parquet(r.path / "attribution.parquet").estimator)
    with pytest.raises(SeedlabError, match=r"carries no removed rows \(format 1, before they were exported\)"):
        score(format_1, rows=["grad-dot"], out=tmp_path / "r", progress=False, report=False)
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- the bank's own row estimators


def test_row_estimators_on_an_export_score_as_on_the_bank_through_the_same_tables(bank, exported, tmp_path):
    """tracin, grad-dot and grad-cosine run on the export (rowscores.py's loop): the bank's values bit for bit, and
    loo_by_age / lds are loo.py's and lds.py's own tables of the bank's scores."""
    from seedlab.attribution.estimators.rowscores import read_scores

    names = ["tracin", "grad-dot", "grad-cosine"]
    r = score(exported, rows=names, out=tmp_path / "s", progress=False, report=False)
    assert r.row_estimators == names and r.estimators == [] and set(r.tables) == {"loo_by_age", "loo_pooled", "lds"}
    for n in names:
        pd.testing.assert_frame_equal(_values(r.path / "rowscores.parquet", n), _values(bank / "rowscores.parquet", n))
    rec = json.loads((r.path / "rowscores.json").read_text())
    assert rec["scored"] == names and rec["from_bank"] == ["ekfac", "trak"] and set(rec["seconds"]["0"]) == set(BUILT_INS)
    scores = read_scores(bank)
    scores = scores[scores.estimator.isin(names)]  # the tables hold the estimators scored here
    by_age, pooled = loo.analyse(pd.read_parquet(bank / "loo.parquet"), scores)
    table = lds.analyse(pd.read_parquet(bank / "groups.parquet"), pd.read_parquet(bank / "group_rows.parquet"), scores)
    for got, want in ((r.tables["loo_by_age"], by_age), (r.tables["loo_pooled"], pooled), (r.tables["lds"], table)):
        pd.testing.assert_frame_equal(got, want)
    pd.testing.assert_frame_equal(pd.read_parquet(r.path / "lds.parquet"), table)
    assert set(table.estimator) == set(names) and {S, END - 1} == set(by_age.step)


def test_kronfluence_ekfac_and_traker_trak_score_the_groups_from_the_export(bank, exported, tmp_path):
    """The field's group attribution (a subset's prediction the sum of its rows' values; EK-FAC and TRAK fitted on
    the twin's batches, as the bank fits them), registered once (registry.py ROW_ESTIMATORS) and run on the export:
    the bank's values, and an LDS row per α at the end."""
    from seedlab.attribution.estimators import rowscores
    from seedlab.attribution.estimators.registry import ROW_ESTIMATORS, get_row_estimator

    assert rowscores.ESTIMATORS == tuple(ROW_ESTIMATORS) == (*BUILT_INS, "metagrad-trunc")
    assert (get_row_estimator("ekfac").library, get_row_estimator("trak").library) == ("kronfluence", "trak")
    r = score(exported, rows=["ekfac", "trak"], out=tmp_path / "s", progress=False, report=False)
    for n in ("ekfac", "trak"):
        got = _values(r.path / "rowscores.parquet", n)
        pd.testing.assert_frame_equal(got, _values(bank / "rowscores.parquet", n))
        assert set(got.horizon) == {END} and np.isfinite(got.value).all() and got.value.abs().max() > 0
    t = r.tables["lds"]
    end = t[(t.horizon == END) & t.estimator.isin(["ekfac", "trak"]) & (t.query_kind == "all")]
    assert len(end) == 4 and end.lds.between(-1, 1).all() and (end.subsets == 4).all() and (end.coverage == 1).all()


# --------------------------------------------------------------------------- every dattri attributor


def _dattri():
    return pytest.importorskip("dattri", reason="dattri is not installed (pip install 'seedlab[dattri]')")


def test_the_adapter_knows_every_attributor_dattri_ships():
    _dattri()
    import dattri.algorithm

    from seedlab.attribution import dattri_adapter as da

    assert da.SHIPPED == sorted(dattri.algorithm.__all__)
    assert all(hasattr(dattri.algorithm, a.cls) for a in da.ATTRIBUTORS.values())


def test_the_adapters_loss_takes_every_batching_dattri_uses(exported):
    """One row [T], a row with its batch axis [1, T], a batch [b, T], float tokens (LiSSA's collate), a dict batch
    and the hook form (model, batch, device): each the rows' summed CE (the target: the mean of the texts' mean CE);
    and dattri's IF-CG, which raised inside the old loss, runs on the swaps' task."""
    _dattri()
    from dattri.algorithm import IFAttributorCG

    from seedlab.attribution import dattri_adapter as da
    from seedlab.lm.model import masked_ce_sum

    b = open_export(exported)
    _, x, y = b.removed_rows(0)
    x, y = x[:3], y[:3]
    model = da.DattriGPT(b.inputs.gcfg).eval()
    model.load_state_dict(b.dir.twin(0).weights(END))
    params = dict(model.named_parameters())
    loss, target = da.row_loss(model), da.query_target(model)
    m = torch.ones(x.shape)
    with torch.no_grad():
        each = [float(masked_ce_sum(model(x[i : i + 1]), y[i : i + 1], torch.ones(1, 16, dtype=torch.bool)))
                for i in range(3)]
        assert float(loss(params, (x[0], y[0], m[0]))) == pytest.approx(each[0], rel=1e-6)
        assert float(loss(params, (x[:1], y[:1], m[:1]))) == pytest.approx(each[0], rel=1e-6)
        assert float(loss(params, (x, y, m))) == pytest.approx(sum(each), rel=1e-6)
        assert float(loss(params, (x.float(), y.float(), m))) == pytest.approx(sum(each), rel=1e-6)
        assert float(loss(params, {"x": x, "y": y, "m": m})) == pytest.approx(sum(each), rel=1e-6)
        assert float(loss(model, {"x": x, "y": y, "m": m}, "cpu")) == pytest.approx(sum(each), rel=1e-6)
        assert float(model(x, y, m).loss) == pytest.approx(sum(each), rel=1e-6)
        assert float(target(params, (x, y, m))) == pytest.approx(sum(each) / 3 / 16, rel=1e-6)
    bt = da.task(exported, 0)
    with da._quiet():
        att = IFAttributorCG(bt.task, max_iter=2, regularization=1e-2)
        train, test = bt.loaders(64)
        att.cache(train)
        s = att.attribute(train, test)
    assert s.shape == (len(bt.candidates) + 1, len(bt.queries)) and torch.isfinite(s).all()


def _attributors():
    from seedlab.attribution.dattri_adapter import ATTRIBUTORS

    return list(ATTRIBUTORS)


@pytest.mark.parametrize("name", _attributors())
def test_every_dattri_attributor_runs_on_the_run_own_rows_and_is_scored_through_the_same_tables(name, bank, exported,
                                                                                                tmp_path):
    """Each attributor on the export's removed rows (the rows also its full training set), at the end: R × Q finite
    values, scored by loo.py (by age) and lds.py (per α) — the tables of the score folder are those modules' own of
    its scores; TracIn and Grad-Dot / Grad-Cos through dattri are rowscores.py's tracin, grad-dot and grad-cosine.
    An attributor that cannot run says why (its own limitation) and is skipped."""
    _dattri()
    from seedlab.attribution import dattri_adapter as da

    spec = DATTRI + name
    if not da.ATTRIBUTORS[name].runs:
        with pytest.raises(da.Unsupported) as err:
            score(exported, rows=[spec], out=tmp_path / "s", progress=False, report=False)
        assert not (tmp_path / "s").exists() and "\n" not in str(err.value)
        pytest.skip(str(err.value))
    r = score(exported, rows=[spec], out=tmp_path / "s", progress=False, report=False)
    got = _values(r.path / "rowscores.parquet", spec)
    assert len(got) == (END - S) * 4 * 3 and set(got.horizon) == {END} and np.isfinite(got.value).all()
    assert got.value.abs().max() > 0 and got.unit.iloc[0] == da.ATTRIBUTORS[name].unit
    by_age, table = r.tables["loo_by_age"], r.tables["lds"]  # loo.py's and lds.py's (the test above)
    assert set(by_age.estimator) == set(table.estimator) == {spec}
    mine = by_age[by_age.query_kind == "all"]
    assert sorted(mine.age) == [1, END - S] and mine.rho.between(-1, 1).all()
    assert len(table[table.query_kind == "all"]) == 2 and table.lds.between(-1, 1).all()  # each α, at the end
    print(f"{name}: LOO rho by age {dict(zip(mine.age, mine.rho.round(2)))}, "
          f"LDS {dict(zip(table[table.query_kind == 'all'].alpha, table[table.query_kind == 'all'].lds.round(2)))}")
    same = {"tracin": "tracin", "grad_dot": "grad-dot", "grad_cos": "grad-cosine"}.get(name)
    if same is not None:  # float32 through dattri against rowscores.py's float64
        want = _values(bank / "rowscores.parquet", same)
        want = want[want.horizon == END].reset_index(drop=True)
        assert np.abs(got.value.to_numpy() - want.value.to_numpy()).max() <= 1e-4 * np.abs(want.value).max()


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_exit_2_and_writes_nothing(bank, exported, lean, format_1, seedlab_main, tmp_path):
    tracin = DATTRI + "tracin"
    cases = [
        # an export without the rows an estimator asks for
        (("score", str(format_1), "--row-estimator", "grad-dot"), format_1, r"carries no removed rows"),
        (("score", str(lean), "--row-estimator", "ekfac"), lean,
         r"corpus slice: tokens \d+\.\.\d+ of the training split are not in this benchmark"),
        # a dattri attributor asked for where the checkpoints at the steps it needs are not
        (("score", str(lean), "--row-estimator", tracin), lean,
         r"rows\.tracin \(TracIn at each row's own step\): needs the twin's weights at step 6, which .* does not "
         r"hold \(it has 4, 5, 7, 10; 3 step\(s\) missing: export the bank with --checkpoints rows\)$"),
        (("score", str(bank), "--row-estimator", DATTRI + "dvemb"), bank, r"needs the twin's weights at step 6"),
        (("score", str(exported), "--row-estimator", DATTRI + "rps"), exported,
         r"rows\.rps: RPSAttributor decomposes an L2-fine-tuned classifier's last layer"),
        (("score", str(exported), "--row-estimator", "nope"), exported, r"--estimator: must be among tracin, "),
        (("score", str(exported), "--estimator", DATTRI + "if_cg"), exported, r"a training-rows plug-in"),
        (("score", str(exported), "--row-estimator", "seedlab.attribution.dattri_adapter:grad_dot"), exported,
         r"scores swaps \(at θ_s\), not training rows"),
        (("export", str(bank), "--out", str(tmp_path / "x"), "--checkpoints", "some"), None,
         r"--checkpoints: rows or saved, got 'some'"),
    ]
    for args, where, match in cases:
        before = sorted(p.relative_to(where) for p in where.rglob("*")) if where is not None else None
        rc, out, err = seedlab_main("attribution", *args, *(("--no-progress",) if args[0] == "score" else ()))
        assert rc == 2 and len(err.strip().splitlines()) == 1 and re.search(match, err), (args, err)
        if where is not None:
            assert sorted(p.relative_to(where) for p in where.rglob("*")) == before, args  # nothing written
    assert not (tmp_path / "x").exists()


def test_the_commands_as_the_guide_types_them(exported, seedlab_main, tmp_path):
    rc, out, err = seedlab_main("attribution", "score", str(exported), "--row-estimator",
                                f"grad-dot,{DATTRI}grad_dot", "--out", str(tmp_path / "s"), "--no-progress")
    assert rc == 0, err
    assert "2 row estimator(s) on loo_by_age, loo_pooled, lds" in out
    t = pd.read_parquet(tmp_path / "s" / "lds.parquet")
    assert {"grad-dot", f"{DATTRI}grad_dot"} <= set(t.estimator)
