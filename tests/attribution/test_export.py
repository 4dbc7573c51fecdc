"""A bank as a benchmark (attribution/benchmark.py, issue 33 §4): ``seedlab attribution export`` writes a folder
that needs nothing outside itself, ``seedlab attribution score`` scores a plug-in on it and gets the numbers
scoring the bank gets, a folder changed after export is refused naming the file; and the dattri adapter
(attribution/dattri_adapter.py): the bank as a dattri AttributionTask, whose TracIn is the bank's tracin."""

from __future__ import annotations

import json
import re
import shutil
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from seedlab.attribution.benchmark import SparseTokens, export, open_export, score, spans, verify
from seedlab.attribution.bank.rundir import BankDir, ExportDir
from seedlab.errors import SeedlabError
from seedlab.lm.batches import get_batch

pytestmark = pytest.mark.usefixtures("one_thread")

PLUGINS = '''
import torch
from seedlab.attribution.estimators.plugins import declare


def dot(model, case, grads):
    """At θ_s: −⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩ (a score)."""
    return torch.stack([torch.stack([-(grads.query(q) @ grads.swap(c)) for q in case.queries])
                        for c in case.candidates])


@declare(unit="score")
def weights_at_h(ctx):
    """Horizon-aware: dot scaled by the squared norm of the twin's weights at h (reads the twin's checkpoints)."""
    w = float(sum(t.double().pow(2).sum() for t in ctx.weights().values()))
    return torch.stack([torch.stack([-(ctx.grads.query(q) @ ctx.grads.swap(c)) * w for q in ctx.case.queries])
                        for c in ctx.case.candidates]) / (ctx.lr or 1.0)
'''
MODULE = "export_plugins"
DOT, AT_H = f"{MODULE}:dot", f"{MODULE}:weights_at_h"
BANK_ESTIMATORS = ["sgd", "tracin", "tracin-cp", "unroll", "random", "loss", "gradnorm", "length", DOT, AT_H]
KEYS = ["estimator", "seed", "candidate", "query", "horizon"]


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    where = tmp_path_factory.mktemp("plugins")
    (where / f"{MODULE}.py").write_text(PLUGINS)
    sys.path.insert(0, str(where))
    sys.modules.pop(MODULE, None)
    yield where
    sys.path.remove(str(where))
    sys.modules.pop(MODULE, None)


@pytest.fixture(scope="module")
def bank(tmp_path_factory, twins_inputs, bank_design, plugin_dir):
    """TINY_BANK trained and attributed with cheap estimators and the two plug-ins, plus an extra effect table
    (a stand-in for the tables later stages add: the export must carry every top-level table)."""
    from seedlab.attribution.estimators.attribute import attribute
    from seedlab.attribution.bank.run import run_bank
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.config import load_config

    before = torch.get_num_threads()
    base = tmp_path_factory.mktemp("export-bank")
    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(base, twins_inputs[0]))
    run_bank(cfg, base / "bank", base=folder, progress=False)
    attribute(base / "bank", estimators=BANK_ESTIMATORS, progress=False)
    pd.DataFrame({"seed": [0], "effect": [1.5]}).to_parquet(base / "bank" / "loo.parquet")
    torch.set_num_threads(before)
    return base / "bank"


@pytest.fixture(scope="module")
def exported(bank, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports") / "bench"
    r = export(bank, out)
    assert r.path == out and r.rows == "trained"
    return out


def _rows(path, names=None) -> pd.DataFrame:
    df = pd.read_parquet(path)
    if names is not None:
        df = df[df.estimator.isin(names)]
    return df.sort_values(KEYS).reset_index(drop=True)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- export


def test_the_export_holds_the_banks_tables_checkpoints_and_a_manifest_of_every_file(bank, exported):
    rd, ex = BankDir(bank), ExportDir(exported)
    m = verify(exported)
    assert m["format"] == "seedlab-attribution-benchmark/2" and m["rows"] == "trained" and m["seeds"] == [0, 1]
    assert set(m["files"]) == {ex.relative(p) for p in ex.files()}  # every file but the manifest itself
    for src in [*rd.tables(), *rd.records()]:  # every table (loo.parquet too) and record, byte for byte
        assert (exported / src.name).read_bytes() == src.read_bytes(), src.name
    assert "loo.parquet" in m["files"] and "measured.parquet" in m["files"] and "attribution.parquet" in m["files"]
    for seed in (0, 1):
        assert ex.prefix(seed).read_bytes() == rd.prefix(seed).read_bytes()
        steps = sorted(int(t) for t in rd.twin(seed).read_manifest())
        assert steps == sorted(int(t) for t in ex.twin(seed).read_manifest())
        for t in steps:
            assert ex.twin(seed).checkpoint(t).read_bytes() == rd.twin(seed).checkpoint(t).read_bytes()
        assert not (ex.seed(seed) / "candidates").exists() and not (ex.seed(seed) / "replica").exists()
    assert not any(p.suffix == ".bin" for p in exported.rglob("*"))  # no token file of the corpus
    size = sum(p.stat().st_size for p in exported.rglob("*") if p.is_file())
    assert size < sum(p.stat().st_size for p in bank.rglob("*") if p.is_file())
    again = export(bank, exported.parent / "again")  # deterministic: the same bytes, the same digest
    assert verify(again.path)["files"] == m["files"] and again.digest == m["digest"]


def test_the_corpus_slice_is_every_batch_the_twins_read_and_nothing_else(bank, exported, twins_inputs):
    from seedlab.corpus import load

    cfg, train = open_export(exported).cfg, load(twins_inputs[0]).train
    slice_ = open_export(exported).inputs.corpus.train
    assert isinstance(slice_, SparseTokens) and len(slice_) == len(train)
    T = cfg.block_size
    for seed in (0, 1):
        for t in range(cfg.end + 1):  # steps 0 .. end: the same rows as from the whole corpus
            for a, b in zip(get_batch(slice_, seed, t, cfg.batch_size, T), get_batch(train, seed, t, cfg.batch_size, T)):
                assert torch.equal(a, b)
    kept = int(slice_.lengths.sum())
    assert kept <= 2 * (cfg.end + 1) * cfg.batch_size * (T + 1) < len(train)
    outside = next(o for o in range(0, len(train) - T) if bisect_out(slice_, o, T + 1))
    with pytest.raises(SeedlabError, match=r"^corpus slice: tokens \d+\.\.\d+ of the training split are not in"):
        slice_[outside : outside + T + 1]
    starts, lengths = spans(np.array([10, 0, 40, 5]), 8)
    assert starts.tolist() == [0, 40] and lengths.tolist() == [18, 8]  # overlaps and touching ranges merged


def bisect_out(s: SparseTokens, a: int, n: int) -> bool:
    return not any(st <= a and a + n <= st + ln for st, ln in zip(s.starts, s.lengths))


# --------------------------------------------------------------------------- score


def test_scoring_an_export_gives_the_numbers_scoring_its_bank_gives(bank, exported, tmp_path):
    """The plug-ins (both forms) scored on the export equal their rows in the bank's own attribution.parquet
    (attribute on the bank) and the rows of score on the bank itself, bitwise; so do the report's tables."""
    on_export = score(exported, [DOT, AT_H], progress=False, report=False)
    on_bank = score(bank, [DOT, AT_H], out=tmp_path / "on-bank", progress=False, report=False)
    assert on_export.path == ExportDir(exported).scores(f"{MODULE}.dot-{MODULE}.weights_at_h")
    assert on_export.source["kind"] == "export" and on_export.source["digest"] == verify(exported)["digest"]
    assert on_bank.estimators == on_export.estimators == [DOT, AT_H, "random", "loss", "gradnorm", "length"]
    assert on_export.from_bank == ["sgd", "tracin", "tracin-cp", "unroll"]  # the bank's others, beside them
    a, b = _rows(on_export.path / "attribution.parquet"), _rows(on_bank.path / "attribution.parquet")
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(a, _rows(BankDir(bank).attribution))  # = the bank attributed with them
    assert set(a.estimator) == set(BANK_ESTIMATORS)
    ca = pd.read_parquet(on_export.path / "correlations.parquet")
    pd.testing.assert_frame_equal(ca, pd.read_parquet(on_bank.path / "correlations.parquet"))
    from seedlab.attribution.analyses.stats import analyse

    want = analyse(pd.read_parquet(BankDir(bank).attribution)).correlations
    pick = lambda c: c[c.estimator.isin([DOT, AT_H])].sort_values(list(c.columns[:4])).reset_index(drop=True)
    pd.testing.assert_frame_equal(pick(ca), pick(want))  # the headline tables' numbers, as the bank's report has them
    meta = json.loads((on_export.path / "attribution.json").read_text())
    assert meta["source"]["digest"] == verify(exported)["digest"] and meta["scored"][:2] == [DOT, AT_H]
    verify(exported)  # a score folder (scores/) is not part of what the manifest covers


def test_an_export_rescores_the_replayed_estimators_without_the_corpus(bank, exported, tmp_path):
    """unroll (the twin replayed from the prefix over the exported rows, checked against its hashes) and
    tracin-cp (the twin's checkpoints) from the export: the bank's numbers."""
    r = score(exported, ["unroll", "tracin-cp"], out=tmp_path / "s", baselines=False, progress=False, report=False)
    names = ["unroll", "tracin-cp"]
    pd.testing.assert_frame_equal(_rows(r.path / "attribution.parquet", names), _rows(BankDir(bank).attribution, names))


def test_an_export_of_the_batch_of_s_alone_scores_plugins_and_refuses_a_replay(bank, exported, tmp_path):
    small = export(bank, tmp_path / "small", rows="injection")
    assert small.bytes < sum(p.stat().st_size for p in exported.rglob("*") if p.is_file())
    r = score(small.path, [DOT], baselines=False, progress=False, report=False)
    pd.testing.assert_frame_equal(_rows(r.path / "attribution.parquet", [DOT]), _rows(BankDir(bank).attribution, [DOT]))
    with pytest.raises(SeedlabError, match=r"^corpus slice: .*--rows injection\): this estimator reads more of the "
                                           r"corpus; export the bank with --rows trained$"):
        score(small.path, ["unroll"], out=tmp_path / "u", baselines=False, progress=False, report=False)
    assert not (tmp_path / "u").exists()


@pytest.mark.parametrize("edit, named", [
    ("change", "measured.parquet"), ("change", "seed-1/twin/step-5.safetensors"), ("remove", "seed-0/prefix.safetensors"),
    ("add", "seed-0/extra.parquet"), ("add", "notes.txt"), ("digest", "manifest.json"),
])
def test_an_export_edited_after_export_is_refused_naming_the_file(exported, tmp_path, edit, named):
    ex = _copy(exported, tmp_path / "ex")
    shutil.rmtree(ex / "scores", ignore_errors=True)
    target = ex / named
    if edit == "change":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 1
        target.write_bytes(bytes(data))
    elif edit == "remove":
        target.unlink()
    elif edit == "add":
        target.write_text("x")
    else:
        m = json.loads(target.read_text())
        m["digest"] = "0" * 64
        target.write_text(json.dumps(m))
    what = {"change": "does not match its SHA-256 in manifest.json", "remove": r"is missing \(manifest.json lists it\)",
            "add": r"is not in manifest.json \(added after export\)", "digest": "its digest does not match"}[edit]
    with pytest.raises(SeedlabError, match=rf"{named.replace('.', '[.]')}.*{what}") as err:
        score(ex, [DOT], progress=False, report=False)
    assert "\n" not in str(err.value)
    assert not (ex / "scores").exists()  # nothing written


def test_a_bank_without_its_checkpoints_is_refused_before_any_work(bank, tmp_path):
    copy = _copy(bank, tmp_path / "bank")
    (copy / "seed-1" / "twin" / "step-7.safetensors").unlink()
    with pytest.raises(SeedlabError, match=r"^seed 1: .*step-7\.safetensors is missing \(a bank without its "
                                           r"checkpoints"):
        export(copy, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    with pytest.raises(SeedlabError, match="a bank without its checkpoints"):
        score(copy, [DOT], progress=False, report=False)
    assert not (copy / "scores").exists()


def test_the_commands_end_to_end_and_their_bad_input(bank, seedlab_cli, seedlab_main, tmp_path):
    """export and score from the command line (score in a process of its own: the plug-in found in the current
    folder; the other commands run in this one, seedlab_main), the report rendered; bad input is one line on
    stderr, exit 2, nothing written or overwritten."""
    (tmp_path / f"{MODULE}.py").write_text(PLUGINS)
    rc, out, err = seedlab_main("attribution", "export", str(bank), "--out", "bench")
    assert rc == 0, err
    assert " -> bench; digest " in out and "rows: trained" in out
    rc, out, err = seedlab_cli("attribution", "score", "bench", "--estimator", DOT, "--no-baselines", "--no-progress")
    assert rc == 0, err
    report = tmp_path / "bench" / "scores" / f"{MODULE}.dot" / "report.md"
    assert report.is_file() and f"| {DOT} " in report.read_text() and str(report.relative_to(tmp_path)) in out
    pd.testing.assert_frame_equal(_rows(report.parent / "attribution.parquet", [DOT]),
                                  _rows(BankDir(bank).attribution, [DOT]))

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    bad = [
        (("export", str(bank), "--out", "full"), r"^error: --out: full is not empty"),
        (("score", "bench", "--estimator", DOT, "--no-baselines"), r"^error: --out: .* already holds scores"),
        (("score", "full", "--estimator", DOT), r"^error: full: not an exported benchmark"),
    ]
    for args, match in bad:
        rc, out, err = seedlab_main("attribution", *args)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and re.match(match, err), (args, err)
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine" and sorted(p.name for p in (tmp_path / "full").iterdir()) == ["keep.txt"]
    for call, match in ((lambda: export(bank, tmp_path / "x", rows="some"), r"^--rows: trained or injection, got 'some'$"),
                        (lambda: export(tmp_path / "full", tmp_path / "y"), r"full: not an attribution bank folder"),
                        (lambda: export(tmp_path / "bench", tmp_path / "y"), r"bench: is an exported benchmark already"),
                        (lambda: score(tmp_path / "bench", ["nope"], out=tmp_path / "z"), r"nope"),
                        (lambda: score(tmp_path / "bench", []), r"^--estimator: name one at least")):
        with pytest.raises(SeedlabError, match=match):
            call()
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
    assert sorted(p.name for p in (tmp_path / "bench" / "scores").iterdir()) == [f"{MODULE}.dot"]
    (tmp_path / "bench" / "measured.parquet").write_bytes(b"edited")
    rc, _, err = seedlab_main("attribution", "score", "bench", "--estimator", DOT, "--force")
    assert rc == 2 and err.startswith("error: bench: measured.parquet does not match its SHA-256") and err.count("\n") == 1


# --------------------------------------------------------------------------- the dattri adapter


def _dattri():
    return pytest.importorskip("dattri", reason="dattri is not installed (pip install 'seedlab[dattri]')")


def _matrix(frame: pd.DataFrame, bt, seed: int, estimator: str, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """The bank's rows of (seed, estimator, horizon) beside the adapter's [C, Q] matrix entries they match."""
    f = frame[(frame.seed == seed) & (frame.estimator == estimator) & (frame.horizon == horizon)]
    col = {q: j for j, q in enumerate(bt.queries)}
    row = {c: i for i, c in enumerate(bt.candidates)}
    idx = [(row[r.candidate], col[r.candidate if r.query == "self" else r.query]) for r in f.itertuples()]
    return np.array(idx), f.estimate.to_numpy()


def test_dattri_tracin_on_the_task_is_the_banks_tracin(bank, exported):
    """dattri's TracInAttributor (weights lr_t / N, no projection) on the adapter's task: at θ_s the bank's tracin,
    over the twin's checkpoints its tracin-cp at the last horizon (float32 against float64)."""
    _dattri()
    from seedlab.attribution import dattri_adapter as da
    from seedlab.attribution.estimators.attribute import tracin_steps

    frame = pd.read_parquet(BankDir(bank).attribution)
    cfg = open_export(exported).cfg
    for seed in (0, 1):
        bt = da.task(exported, seed)
        assert bt.steps == [cfg.injection_step] and len(bt.train) == len(bt.candidates) + 1
        assert bt.queries[: len(bt.candidates)] == bt.candidates  # own texts first, then the queries
        got = bt.estimate(da.tracin_scores(bt, bt.tracin_weights()))
        idx, want = _matrix(frame, bt, seed, "tracin", cfg.injection_step + 1)
        assert np.abs(got[idx[:, 0], idx[:, 1]] - want).max() <= 1e-4 * np.abs(want).max()
        assert np.all(got[bt.candidates.index("own-row")] == 0)  # the replaced row against itself: exactly 0
    bt = da.task(bank, 1, steps="checkpoints")  # a bank folder works the same
    assert bt.steps == tracin_steps(cfg) and len(bt.steps) > 1
    got = bt.estimate(da.tracin_scores(bt, bt.tracin_weights()))
    idx, want = _matrix(frame, bt, 1, "tracin-cp", cfg.end)
    assert np.abs(got[idx[:, 0], idx[:, 1]] - want).max() <= 1e-4 * np.abs(want).max()


def test_the_dattri_plugins_score_like_the_built_in(exported, bank, tmp_path):
    _dattri()
    names = ["seedlab.attribution.dattri_adapter:tracin", "seedlab.attribution.dattri_adapter:grad_dot"]
    r = score(exported, names, out=tmp_path / "d", baselines=False, progress=False, report=False)
    from seedlab.lm.schedule import lr_of

    cfg = open_export(exported).cfg
    want = _rows(BankDir(bank).attribution, ["tracin"])
    lr = lr_of(cfg, cfg.injection_step)
    for name, scale, unit in ((names[0], 1.0, "nats/token"), (names[1], 1.0 / lr, "score")):
        got = _rows(r.path / "attribution.parquet", [name])
        assert (got.unit == unit).all() and len(got) == len(want)
        pd.testing.assert_frame_equal(got[KEYS[1:]], want[KEYS[1:]])
        tol = 1e-4 * np.abs(want.estimate).max() * scale
        assert np.abs(got.estimate.to_numpy() - scale * want.estimate.to_numpy()).max() <= tol


def test_the_dattri_adapter_refuses_a_bank_without_its_checkpoints(bank, exported, tmp_path):
    _dattri()
    from seedlab.attribution import dattri_adapter as da

    copy = _copy(bank, tmp_path / "bank")
    (copy / "seed-0" / "twin" / "step-4.safetensors").unlink()
    with pytest.raises(SeedlabError, match=r"^seed 0: .*step-4\.safetensors is missing \(a bank without its "
                                           r"checkpoints: .* it has 5, 7, 9, 14\)$"):
        da.task(copy, 0)
    with pytest.raises(SeedlabError, match=r"^seed 1: .*step-6\.safetensors has no checkpoint at step 6 \(a bank "
                                           r"without its checkpoints; the twin saved 4, 5, 7, 9, 14\)$"):
        da.task(exported, 1, steps=[4, 6])
    with pytest.raises(SeedlabError, match=r"^seed: 3 is not one of the bank's measured seeds \(0, 1\)$"):
        da.task(exported, 3)
    ex = _copy(exported, tmp_path / "ex")
    (ex / "seed-0" / "twin" / "step-4.safetensors").write_bytes(b"")
    with pytest.raises(SeedlabError, match=r"seed-0/twin/step-4\.safetensors does not match its SHA-256"):
        da.task(ex, 0)
