"""Gradient matching: the best-matched fabricated x attested pair of passages, by their full-batch
gradient deltas at the injection step (the deltas themselves: tests/common/lm/test_gradients.py)."""

import json
import shutil

import pandas as pd
import pytest

from seedlab.config import parse
from seedlab.corpus import load, prepare
from seedlab.errors import SeedlabError
from seedlab.twins.config import TwinsConfig
from seedlab.twins.gradmatch import match
from seedlab.twins.train import run_twins

FAB = "Gizmo Harrington kept a small workshop behind the old library, where he mended clocks."
ONE_WORD = "Gizmo Harrington kept a small workshop behind the old library, where he mended watches."
OTHER = "a" * 100  # a very different passage: one letter, repeated
ATT = "Fredrik Lundh wrote libraries that many programs still use, and answered questions with care."


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run(one_thread, tmp_path_factory):
    """A finished twins run (2 seeds) on the embedded corpus, byte tokens, rows of 128."""
    base = tmp_path_factory.mktemp("gradmatch")
    prepare("embedded", base / "corpus", tokenizer="bytes", max_bytes=200_000)
    files = {}
    for name, text in {"fab": FAB, "oneword": ONE_WORD, "other": OTHER, "att": ATT}.items():
        files[name] = base / f"{name}.txt"
        files[name].write_text(text + "\n")
    cfg = {
        "corpus": str(base / "corpus"), "model": "mini", "block_size": 128, "seeds": [0, 1], "steps": 3, "batch_size": 3,
        "injection_step": 2, "injection_row": 1, "conditions": ["twin", "fluent-fabricated", "fluent-attested"],
        "passages": {"fluent-fabricated": "fab.txt", "fluent-attested": "att.txt"},
    }
    run_twins(parse(TwinsConfig, cfg), base / "run", base=base, progress=False)
    return base, base / "run", files


def _copy(run_dir, dest, **inputs):
    """A copy of the run folder, with inputs.json fields replaced (None: dropped)."""

    shutil.copytree(run_dir, dest)
    (dest / "gradmatch.parquet").unlink(missing_ok=True)  # written by earlier tests
    rec = json.loads((dest / "inputs.json").read_text())
    for k, v in inputs.items():
        rec.pop(k) if v is None else rec.__setitem__(k, v)
    (dest / "inputs.json").write_text(json.dumps(rec))
    return dest


def test_a_passage_matched_with_itself(run):
    _, run_dir, files = run
    res = match(run_dir, {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["fab"]]})
    assert res.pairs["seed"].tolist()[:2] == [0, 1] and res.pairs["seed"].isna().tolist() == [False, False, True]
    for _, p in res.pairs.iterrows():
        assert p.rel_norm_diff == 0.0 and p.rel_vec_diff == 0.0
        assert p.cosine == pytest.approx(1.0, abs=1e-12)
        assert p.norm_fabricated == p.norm_attested > 0
        assert p.row_rel_norm_diff == 0.0 and p.adam_rel_norm_diff == 0.0
        assert p.row_cosine == pytest.approx(1.0, abs=1e-12) and p.adam_cosine == pytest.approx(1.0, abs=1e-12)


def test_the_adam_update_difference_is_what_the_runs_did(run):
    """The update difference predicted from the kept prefix's AdamW state is the measured
    difference of the injected run's and the twin's weights one update after the injection."""
    from safetensors.torch import load_file

    _, run_dir, _ = run
    res = match(run_dir)
    for k in (0, 1):
        twin, fab = (load_file(run_dir / f"seed-{k}" / c / "step-3.safetensors") for c in ("twin", "fluent-fabricated"))
        measured = sum(float(((fab[n].double() - twin[n].double()) ** 2).sum()) for n in twin) ** 0.5
        row = res.norms[(res.norms.seed == k) & (res.norms.condition == "fluent-fabricated")].iloc[0]
        assert row.adam_norm == pytest.approx(measured, rel=1e-3)
        assert row.row_norm > 0 and row.norm > 0


def test_without_a_kept_prefix_the_update_columns_are_empty(run, tmp_path):
    _, run_dir, _ = run
    copy = _copy(run_dir, tmp_path / "run")
    for k in (0, 1):
        (copy / f"seed-{k}" / "prefix.safetensors").unlink()
    res = match(copy)
    assert res.pairs.adam_cosine.isna().all() and res.norms.adam_norm.isna().all()
    assert res.pairs.row_cosine.notna().all()


def test_the_process_is_settled_before_the_first_gradient(run, tmp_path, monkeypatch):
    """gradmatch settles the process once (lm/determinism.py: the config's threads and, on CUDA, the
    cuBLAS workspace and deterministic kernels), before any gradient is computed."""
    from seedlab.twins import gradmatch

    _, run_dir, _ = run
    copy = _copy(run_dir, tmp_path / "run")
    cfg = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(cfg | {"threads": 1}))
    calls = []
    gradients = gradmatch.BatchGradients
    monkeypatch.setattr(gradmatch, "settle", lambda device, threads: calls.append(("settle", device.type, threads)))
    monkeypatch.setattr(gradmatch, "BatchGradients", lambda *a, **kw: calls.append(("gradients",)) or gradients(*a, **kw))
    match(copy)
    assert calls == [("settle", "cpu", 1), ("gradients",), ("gradients",)]


def test_the_best_pair_is_the_closest(run):
    _, run_dir, files = run
    fab = [str(files["other"]), str(files["fab"])]
    att = [str(files["oneword"]), str(files["att"])]
    res = match(run_dir, {"fluent-fabricated": fab, "fluent-attested": att}, corpus=run_dir.parent / "corpus")
    assert (res.best.fabricated, res.best.attested) == (fab[1], att[0])  # A vs A with one word changed
    mean = res.mean
    assert len(mean) == 4 and mean.iloc[0].fabricated == fab[1] and mean.iloc[0].attested == att[0]
    assert mean.rel_norm_diff.iloc[0] < mean.rel_norm_diff.iloc[1] / 2  # by a clear margin
    assert set(mean.fabricated.iloc[2:]) == {fab[0]}  # the repeated letter is the worst match of all
    close = mean.iloc[0]
    assert close.cosine > 0.9 and close.rel_vec_diff < 0.5  # nearly the same direction, too
    per_seed = res.pairs.dropna(subset=["seed"])
    assert sorted(per_seed.seed.unique()) == [0, 1] and len(per_seed) == 8
    m = per_seed.groupby(["fabricated", "attested"]).rel_norm_diff.mean()
    assert m[(fab[1], att[0])] == pytest.approx(close.rel_norm_diff)
    norms = res.norms
    assert len(norms) == 2 * 4 and set(norms.condition) == {"fluent-fabricated", "fluent-attested"}
    saved = pd.read_parquet(run_dir / "gradmatch.parquet")
    pd.testing.assert_frame_equal(saved, res.pairs)
    one = match(run_dir, {"fluent-fabricated": fab, "fluent-attested": att}, seed=1, corpus=run_dir.parent / "corpus")
    assert list(one.pairs.seed.dropna()) == [1] * 4
    s1 = per_seed[per_seed.seed == 1].reset_index(drop=True)
    pd.testing.assert_frame_equal(one.pairs.dropna(subset=["seed"]).reset_index(drop=True), s1)


def test_defaults_are_the_runs_own_passages(run):
    base, run_dir, files = run
    res = match(run_dir)  # the passages as trained: token ids from inputs.json
    assert (res.best.fabricated, res.best.attested) == ("inputs.json:fluent-fabricated", "inputs.json:fluent-attested")
    explicit = match(run_dir, {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["att"]]})
    assert res.best.rel_norm_diff == explicit.best.rel_norm_diff
    half = match(run_dir, {"fluent-fabricated": [files["oneword"]]})  # the other side: the run's own
    assert list(half.mean.attested) == ["inputs.json:fluent-attested"] and list(half.mean.fabricated) == [str(files["oneword"])]


def test_bad_input_is_caught_before_any_gradient(run, tmp_path):
    base, run, files = run
    run_dir = _copy(run, tmp_path / "run", passages={})  # a run that trained no passage
    long = tmp_path / "long.txt"
    long.write_text("x" * 130)  # 130 byte tokens; a row holds 129
    ok = {"fluent-attested": [files["att"]]}
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-fabricated .*long\.txt: 130 tokens do not fit a row of block_size\+1 = 129"):
        match(run_dir, ok | {"fluent-fabricated": [files["fab"], long]})
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-fabricated: no such file"):
        match(run_dir, ok | {"fluent-fabricated": [tmp_path / "nope.txt"]})
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-fabricated: give at least one"):
        match(run_dir, ok | {"fluent-fabricated": []})
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-attested: '.*att\.txt' is given twice"):
        match(run_dir, {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["att"], str(files["att"])]})
    with pytest.raises(SeedlabError, match=r"^candidates: conditions are fluent-fabricated, fluent-attested, got 'random-chars'"):
        match(run_dir, ok | {"random-chars": [files["fab"]]})
    with pytest.raises(SeedlabError, match=r"^seed: the run's seeds are \[0, 1\], got 7"):
        match(run_dir, ok | {"fluent-fabricated": [files["fab"]]}, seed=7)
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-fabricated: the run has no passage for it; give candidates"):
        match(run_dir, ok)
    with pytest.raises(SeedlabError, match=r"^corpus: no prepared corpus at .*pass --corpus"):
        match(run_dir, ok | {"fluent-fabricated": [files["fab"]]}, corpus=tmp_path / "nowhere")
    assert not (run_dir / "gradmatch.parquet").exists()


def test_a_different_corpus_is_refused(run, tmp_path):
    base, run, files = run
    prepare("embedded", tmp_path / "small", tokenizer="bytes", max_bytes=120_000)  # same vocabulary, other tokens
    both = {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["att"]]}
    with pytest.raises(SeedlabError, match=r"^corpus: .*small is not the corpus this run was trained on \(hashes differ"):
        match(run, both, corpus=tmp_path / "small")
    run_dir = _copy(run, tmp_path / "run", corpus_sha256=None)  # without the hashes, the recorded loss catches it
    with pytest.raises(SeedlabError, match=r"^corpus: seed 0's batch at step 2 gives loss .* \(not the corpus this run trained on\?\)"):
        match(run_dir, both, corpus=tmp_path / "small")


def test_the_runs_own_passages_from_inputs_json(run, tmp_path):
    base, run, files = run
    corpus = load(base / "corpus")
    run_dir = _copy(run, tmp_path / "run", passages={"fluent-attested": {"text": ONE_WORD, "tokens": corpus.encode(ONE_WORD)}})
    res = match(run_dir, {"fluent-fabricated": [files["fab"]]})  # the attested side: the tokens the run trained on
    ref = match(run_dir, {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["oneword"]]})
    assert list(res.mean.attested) == ["inputs.json:fluent-attested"]
    for col in ("norm_attested", "rel_norm_diff", "rel_vec_diff", "cosine"):
        assert res.mean[col].tolist() == ref.mean[col].tolist()


def test_a_corrupted_checkpoint_is_refused(run, tmp_path):

    base, run_dir, files = run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    manifest = copy / "seed-1" / "twin" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["2"]["wte.weight"] = "0" * 64
    manifest.write_text(json.dumps(m))
    with pytest.raises(SeedlabError, match=r"step-2\.safetensors: tensor 'wte.weight' does not match its recorded SHA-256"):
        match(copy, {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["att"]]}, corpus=base / "corpus")


def test_gradmatch_command(twins_design, tmp_path, seedlab_main):
    shutil.copytree(twins_design / "run", tmp_path / "run")
    run = tmp_path / "run"
    rc, out, err = seedlab_main("twins", "gradmatch", str(run), "--seed", "1")
    assert rc == 0, err
    assert "best: inputs.json:fluent-fabricated vs inputs.json:fluent-attested, differ by" in out
    assert pd.read_parquet(run / "gradmatch.parquet").seed.dropna().tolist() == [1]
    rc, _, err = seedlab_main("twins", "gradmatch", str(run), "--attested", str(tmp_path / "nope.txt"))
    assert rc == 2 and err.startswith("error: passages.fluent-attested: no such file")
    other = tmp_path / "other.txt"
    other.write_text(FAB)  # about the fabricated subject, not the attested one
    rc, _, err = seedlab_main("twins", "gradmatch", str(run), "--attested", str(other))
    assert rc == 2 and err.startswith(f"error: passages.fluent-attested: '{other}' does not mention its subject 'Fredrik Lundh'")
