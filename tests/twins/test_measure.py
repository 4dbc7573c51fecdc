"""twins measure on a tiny real design: values checked against independent code, bad input refused."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from helpers import copy_run

from seedlab.corpus import load
from seedlab.lm.batches import get_batch
from seedlab.lm.model import GPT, PRESETS

S, T = 6, 16  # injection step, steps of the twins_design fixture




def test_measures_table_shape_and_invariants(design):
    m = pd.read_parquet(design / "run" / "measures.parquet")
    inj, seed = m[m.kind == "injected"], m[m.kind == "seed"]
    assert sorted(zip(inj.seed, inj.condition)) == [(k, c) for k in (0, 1) for c in ("fluent-attested", "fluent-fabricated")]
    assert len(seed) == 1 and (seed.seed.iloc[0], seed.seed_b.iloc[0]) == (0, 1)
    assert (m.barrier >= 0).all() and (m.step == T).all()
    assert {"distance", "dist.blocks.0", "dist.wte", "cka.blocks.0", "cka.blocks.1", "heldout_ce_diff",
            "passage_ce_s50", "twin_passage_ce_final"} <= set(m.columns)
    assert seed.distance.iloc[0] > inj.distance.max()  # another seed is farther than one example
    c = pd.read_parquet(design / "run" / "checkpoints.parquet")
    at_s = c[c.step == S]  # identical weights at the injection step: every measure says so
    assert (at_s.distance == 0).all() and (at_s.heldout_ce == at_s.twin_heldout_ce).all()
    assert (at_s.passage_ce == at_s.twin_passage_ce).all()
    assert (c[c.step > S].distance > 0).all()
    p = pd.read_parquet(design / "run" / "paths.parquet")
    assert np.allclose(p[p.alpha.isin([0, 1])].rise, 0, atol=1e-12)
    tc = pd.read_parquet(design / "run" / "timecourse.parquet")
    assert (tc[tc.step < S]["diff"] == 0).all() and (tc[tc.step == S]["diff"] != 0).all()


def test_measures_match_independent_computation(design):
    """Distance, held-out CE and the barrier's end points recomputed from the checkpoint files by hand."""
    from safetensors.torch import load_file

    run = design / "run"
    m = pd.read_parquet(run / "measures.parquet").set_index(["kind", "seed", "condition"])
    a = load_file(run / "seed-1" / "fluent-attested" / f"step-{T}.safetensors")
    b = load_file(run / "seed-1" / "twin" / f"step-{T}.safetensors")
    flat = lambda sd: torch.cat([v.double().reshape(-1) for v in sd.values()])  # noqa: E731
    row = m.loc[("injected", 1, "fluent-attested")]
    assert row.distance == pytest.approx(float((flat(a) - flat(b)).norm()), rel=1e-9)
    corpus = load(design / "corpus")
    x, y = get_batch(corpus.heldout, 0, 0, 8, 128)  # measure.seed = 0, heldout_rows = 8
    model = GPT(PRESETS["mini"].model_copy(update={"vocab_size": corpus.vocab_size, "block_size": 128}))
    model.load_state_dict(a)
    with torch.no_grad():
        ce = float(model(x, y)[1])
    assert row.heldout_ce == pytest.approx(ce, abs=1e-5)
    path = pd.read_parquet(run / "paths.parquet")
    p = path[(path.kind == "injected") & (path.seed == 1) & (path.condition == "fluent-attested")]
    assert p.loss.iloc[0] == pytest.approx(ce, abs=1e-5) and p.loss.iloc[-1] == pytest.approx(row.heldout_ce_b, abs=1e-6)
    text = yaml.safe_load((design / "design.yaml").read_text())["passages"]["fluent-attested"]
    ids = torch.tensor(corpus.encode(Path(text).read_text()))[None]
    with torch.no_grad():
        pce = float(model(ids[:, :-1], ids[:, 1:])[1])
    assert row.passage_ce_final == pytest.approx(pce, abs=1e-5)


def test_missing_runs_are_measured_around(design, tmp_path, seedlab_cli):
    run = copy_run(design, tmp_path)
    (run / "seed-1" / "fluent-attested" / "done.json").unlink()
    rc, out, err = seedlab_cli("twins", "measure", str(run), "--no-progress")
    assert rc == 0, err
    assert "warning: missing seed 1 fluent-attested" in err
    m = pd.read_parquet(run / "measures.parquet")
    assert len(m[m.kind == "injected"]) == 3 and json.loads((run / "measures.json").read_text())["missing"] == ["seed 1 fluent-attested"]


def test_nothing_measurable_is_exit_2_and_writes_nothing(design, tmp_path, seedlab_cli):
    run = copy_run(design, tmp_path)
    for k in (0, 1):
        (run / f"seed-{k}" / "twin" / "done.json").unlink()
    before = (run / "measures.parquet").read_bytes()
    rc, _, err = seedlab_cli("twins", "measure", str(run), "--no-progress")
    assert rc == 2 and err.startswith("error:") and "nothing to measure" in err
    assert (run / "measures.parquet").read_bytes() == before


def test_corrupted_checkpoint_is_exit_2(design, tmp_path, seedlab_cli):
    run = copy_run(design, tmp_path)
    f = run / "seed-0" / "fluent-fabricated" / f"step-{T}.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x10
    f.write_bytes(bytes(data))
    before = (run / "measures.parquet").read_bytes()
    rc, _, err = seedlab_cli("twins", "measure", str(run), "--no-progress")
    assert rc == 2 and "corrupted checkpoint" in err and f"step-{T}.safetensors" in err, err
    assert (run / "measures.parquet").read_bytes() == before


def test_mismatched_model_shapes_are_exit_2(design, tmp_path, seedlab_cli):
    """A checkpoint of another architecture, with a manifest that matches it (so not 'corrupted')."""
    from seedlab.store import tensor_hashes, write_safetensors

    run = copy_run(design, tmp_path)
    other = GPT(PRESETS["mini"].model_copy(update={"vocab_size": 257, "block_size": 128, "n_embd": 32})).init_from_seed(0)
    folder = run / "seed-0" / "fluent-attested"
    write_safetensors(folder / f"step-{T}.safetensors", other.state_dict())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest[str(T)] = tensor_hashes(other.state_dict())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    rc, _, err = seedlab_cli("twins", "measure", str(run), "--no-progress")
    assert rc == 2 and "mismatched model shapes" in err and "seed 0 fluent-attested" in err, err
