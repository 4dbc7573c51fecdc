"""Gradient matching: the full-batch gradient delta of an injected passage, and the best-matched pair."""

import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from seedlab.config import parse
from seedlab.corpus import load, prepare
from seedlab.errors import SeedlabError
from seedlab.lm.batches import get_batch, inject
from seedlab.lm.gradients import gradient_delta
from seedlab.lm.model import GPT
from seedlab.twins.gradmatch import match
from seedlab.twins.rundir import open_run
from seedlab.twins.train import TwinsConfig, model_config, run_twins

FAB = "Gizmo Harrington kept a small workshop behind the old library, where he mended clocks."
ONE_WORD = "Gizmo Harrington kept a small workshop behind the old library, where he mended watches."
OTHER = "a" * 100  # a very different passage: one letter, repeated
ATT = "Fredrik Lundh wrote libraries that many programs still use, and answered questions with care."


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Row-sized models: one thread is as fast, and far faster on a shared, busy CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
        "corpus": "corpus", "model": "mini", "block_size": 128, "seeds": [0, 1], "steps": 3, "batch_size": 3,
        "injection_step": 2, "injection_row": 1, "conditions": ["twin", "fluent-fabricated", "fluent-attested"],
        "passages": {"fluent-fabricated": "fab.txt", "fluent-attested": "att.txt"},
    }
    run_twins(parse(TwinsConfig, cfg), base / "run", base=base, progress=False)
    return base, base / "run", files


def _copy(run_dir, dest, **inputs):
    """A copy of the run folder, with inputs.json fields replaced (None: dropped)."""
    import shutil

    shutil.copytree(run_dir, dest)
    (dest / "gradmatch.parquet").unlink(missing_ok=True)  # written by earlier tests
    rec = json.loads((dest / "inputs.json").read_text())
    for k, v in inputs.items():
        rec.pop(k) if v is None else rec.__setitem__(k, v)
    (dest / "inputs.json").write_text(json.dumps(rec))
    return dest


def _state(run_dir, seed):
    """The injection checkpoint in a freshly built model, and its batch (an independent reading)."""
    cfg = open_run(run_dir).cfg
    corpus = load(run_dir.parent / "corpus")
    model = GPT(model_config(cfg, corpus.vocab_size))
    model.load_state_dict(load_file(str(run_dir / f"seed-{seed}" / "twin" / f"step-{cfg.injection_step}.safetensors")))
    x, y = get_batch(corpus.train, seed, cfg.injection_step, cfg.batch_size, 128)
    return cfg, corpus, model.eval(), x, y


def test_injecting_the_rows_own_tokens_changes_nothing(run):
    _, run_dir, _ = run
    cfg, corpus, model, x, y = _state(run_dir, 0)
    r = cfg.injection_row
    own = torch.cat([x[r], y[r, -1:]])  # the ordinary row as a passage of block_size + 1 tokens
    d = gradient_delta(model, x, y, r, own.tolist(), corpus.eot_id)
    assert d.n_targets == x.numel()
    assert d.norm == 0.0 and not d.vec.any()  # exactly, not approximately
    assert d.grad_norm == d.base_grad_norm > 0


def test_delta_equals_direct_autograd_of_the_two_batch_losses(run):
    _, run_dir, _ = run
    cfg, corpus, model, x, y = _state(run_dir, 1)
    ids = corpus.encode(FAB)
    params = list(model.parameters())

    def grad(xb, yb, mb):  # the whole batch at once, GPT.forward's own masked mean
        _, loss = model(xb, yb, mb)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).double()

    xp, yp, mp = inject(x, y, cfg.injection_row, ids, corpus.eot_id)
    direct = grad(xp, yp, mp) - grad(x, y, torch.ones_like(mp))
    for micro in (None, 1):
        d = gradient_delta(model, x, y, cfg.injection_row, ids, corpus.eot_id, micro_batch=micro)
        assert d.n_targets == 2 * 128 + len(ids) - 1
        assert d.norm == pytest.approx(float(direct.norm()), rel=1e-4)
        assert float((d.vec - direct).norm()) < 1e-4 * float(direct.norm())


def test_a_passage_matched_with_itself(run):
    _, run_dir, files = run
    res = match(run_dir, {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["fab"]]})
    assert res.pairs["seed"].tolist()[:2] == [0, 1] and res.pairs["seed"].isna().tolist() == [False, False, True]
    for _, p in res.pairs.iterrows():
        assert p.rel_norm_diff == 0.0 and p.rel_vec_diff == 0.0
        assert p.cosine == pytest.approx(1.0, abs=1e-12)
        assert p.norm_fabricated == p.norm_attested > 0


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
    import shutil

    base, run_dir, files = run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    manifest = copy / "seed-1" / "twin" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["2"]["wte.weight"] = "0" * 64
    manifest.write_text(json.dumps(m))
    with pytest.raises(SeedlabError, match=r"step-2\.safetensors: tensor 'wte.weight' does not match its recorded SHA-256"):
        match(copy, {"fluent-fabricated": [files["fab"]], "fluent-attested": [files["att"]]}, corpus=base / "corpus")
