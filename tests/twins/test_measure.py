"""twins measure on a tiny real design: values checked against independent code, bad input refused."""

import json
import shutil
import weakref
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
from seedlab.measures import weights

S, T = 6, 16  # injection step, steps of the twins_design fixture
CONDS = ("fluent-fabricated", "fluent-attested", "ordinary-row.0", "ordinary-row.1", "nudge", "matched-gradient",
         "weight-kick")  # the fixture's arms, beside the twin
TEXTED = ("fluent-fabricated", "fluent-attested", "ordinary-row.0", "ordinary-row.1")  # those with a text in the injected row




def test_measures_table_shape_and_invariants(design):
    m = pd.read_parquet(design / "run" / "measures.parquet")
    inj, seed = m[m.kind == "injected"], m[m.kind == "seed"]
    assert sorted(zip(inj.seed, inj.condition)) == [(k, c) for k in (0, 1) for c in sorted(CONDS)]
    assert len(seed) == 1 and (seed.seed.iloc[0], seed.seed_b.iloc[0]) == (0, 1)
    assert (m.barrier >= 0).all() and (m.step == T).all()
    assert {"distance", "dist.blocks.0", "dist.wte", "cka.blocks.0", "cka.blocks.1", "heldout_ce_diff",
            "passage_ce_s50", "twin_passage_ce_final"} <= set(m.columns)
    assert seed.distance.iloc[0] > inj.distance.max()  # another seed is farther than one example
    c = pd.read_parquet(design / "run" / "checkpoints.parquet")
    at_s = c[c.step == S]  # identical weights at the injection step: every measure says so
    assert (at_s.distance == 0).all() and (at_s.heldout_ce == at_s.twin_heldout_ce).all()
    texted = at_s[at_s.condition.isin(TEXTED)]
    assert (texted.passage_ce == texted.twin_passage_ce).all() and len(texted) == 2 * len(TEXTED)
    assert at_s[~at_s.condition.isin(TEXTED)].passage_ce.isna().all()  # nudge, the noise nulls: no passage of their own
    assert (c[c.step > S].distance > 0).all()
    assert (at_s.barrier == 0).all() and (at_s.rise_mid == 0).all()  # identical weights: not evaluated, 0 exactly
    assert sorted(set(c.step)) == [S, 8, 11, 12, T] and (c.barrier >= 0).all() and c.barrier.notna().all()
    end = c[c.step == T].set_index(["seed", "condition"])  # the end of the run is measures.parquet's comparison
    key = inj.set_index(["seed", "condition"])
    assert (end.barrier == key.barrier.reindex(end.index)).all() and (end.rise_mid == key.rise_mid.reindex(end.index)).all()
    p = pd.read_parquet(design / "run" / "paths.parquet")
    assert np.allclose(p[p.alpha.isin([0, 1])].rise, 0, atol=1e-12)
    tc = pd.read_parquet(design / "run" / "timecourse.parquet")
    assert (tc[tc.step < S]["diff"] == 0).all() and (tc[(tc.step == S) & tc.condition.isin(TEXTED)]["diff"] != 0).all()
    assert (tc[(tc.step == S) & (tc.condition == "weight-kick")]["diff"] != 0).all()  # the weights moved before step s's loss
    grad = tc[tc.condition == "matched-gradient"]  # the gradient moved: step s's loss is the twin's, the next one is not
    assert (grad[grad.step <= S]["diff"] == 0).all() and (grad[grad.step == S + 1]["diff"] != 0).all()


def test_the_cross_passage_matrix(design):
    """Every condition's CE on every passage at every saved step from s, beside its twin's: 0 apart at s
    (identical weights); its own passage's entry is the checkpoints table's passage_ce."""
    x = pd.read_parquet(design / "run" / "passages.parquet")
    assert list(x.columns) == ["seed", "condition", "step", "text", "ce", "twin_ce", "diff"]
    assert set(x.text) == set(TEXTED) and set(x.condition) == set(CONDS)
    assert len(x) == 2 * len(CONDS) * len(TEXTED) * len([S, 8, 11, 12, T])  # seeds x conditions x texts x steps
    assert (x[x.step == S]["diff"] == 0).all() and (x["diff"] == x.ce - x.twin_ce).all()
    c = pd.read_parquet(design / "run" / "checkpoints.parquet").set_index(["seed", "condition", "step"])
    own = x[x.text == x.condition].set_index(["seed", "condition", "step"])
    assert (own.ce == c.passage_ce.reindex(own.index)).all() and (own.twin_ce == c.twin_passage_ce.reindex(own.index)).all()
    assert (x[x.step > S].groupby("condition")["diff"].apply(lambda d: (d != 0).any())).all()  # every arm moved


def test_measures_match_independent_computation(design):
    """Distance, held-out CE and the barrier's end points recomputed from the checkpoint files by hand."""
    from safetensors.torch import load_file

    run = design / "run"
    m = pd.read_parquet(run / "measures.parquet").set_index(["kind", "seed", "condition"])
    a = load_file(run / "seed-1" / "fluent-attested" / f"step-{T}.safetensors")
    b = load_file(run / "seed-1" / "twin" / f"step-{T}.safetensors")
    flat = lambda sd: torch.cat([v.double().reshape(-1) for v in sd.values()])
    row = m.loc[("injected", 1, "fluent-attested")]
    assert row.distance == pytest.approx(float((flat(a) - flat(b)).norm()), rel=1e-9)
    corpus = load(design / "corpus")
    evaluated = corpus.heldout[: len(corpus.heldout) - 32 * 129]  # before the reserved slice: 32 rows of 129 tokens
    x, y = get_batch(evaluated, 0, 0, 8, 128)  # measure.seed = 0, heldout_rows = 8
    model = GPT(PRESETS["mini"].model_copy(update={"vocab_size": corpus.vocab_size, "block_size": 128}))
    model.load_state_dict(a)
    with torch.no_grad():
        ce = float(model(x, y)[1])
    assert row.heldout_ce == pytest.approx(ce, abs=1e-5)
    path = pd.read_parquet(run / "paths.parquet")
    p = path[(path.kind == "injected") & (path.seed == 1) & (path.condition == "fluent-attested")]
    assert p.loss.iloc[0] == pytest.approx(ce, abs=1e-5) and p.loss.iloc[-1] == pytest.approx(row.heldout_ce_b, abs=1e-6)
    # the barrier at a checkpoint in the middle of the run, from the two checkpoint files and a hand-made path
    ck = pd.read_parquet(run / "checkpoints.parquet").set_index(["seed", "condition", "step"]).loc[(1, "fluent-attested", 11)]
    a11 = load_file(run / "seed-1" / "fluent-attested" / "step-11.safetensors")
    b11 = load_file(run / "seed-1" / "twin" / "step-11.safetensors")
    losses = []
    for al in (0, 0.25, 0.5, 0.75, 1):  # measure.alphas of the design
        model.load_state_dict({k: (1 - al) * a11[k] + al * b11[k] for k in a11})
        with torch.no_grad():
            losses.append(float(model(x, y)[1]))
    rise = [lo - ((1 - al) * losses[0] + al * losses[-1]) for al, lo in zip((0, 0.25, 0.5, 0.75, 1), losses)]
    assert ck.heldout_ce == pytest.approx(losses[0], abs=1e-5) and ck.twin_heldout_ce == pytest.approx(losses[-1], abs=1e-5)
    assert ck.barrier == pytest.approx(max(rise), abs=1e-5) and ck.rise_mid == pytest.approx(rise[2], abs=1e-5)
    model.load_state_dict(a)
    text = yaml.safe_load((design / "design.yaml").read_text())["passages"]["fluent-attested"]
    ids = torch.tensor(corpus.encode(Path(text).read_text()))[None]
    with torch.no_grad():
        pce = float(model(ids[:, :-1], ids[:, 1:])[1])
    assert row.passage_ce_final == pytest.approx(pce, abs=1e-5)


def test_seed_rows_have_the_aligned_distance(design):
    """distance_aligned: on the seed-vs-seed rows only, finite, no larger than the raw distance, and the same
    weight_distance of seed 0's twin and seed 1's twin permuted to it (lm/align.py), recomputed from the files."""
    from safetensors.torch import load_file

    from seedlab.lm.align import aligned

    run = design / "run"
    m = pd.read_parquet(run / "measures.parquet")
    seed, inj = m[m.kind == "seed"], m[m.kind == "injected"]
    assert len(seed) == 1 and np.isfinite(seed.distance_aligned).all() and inj.distance_aligned.isna().all()
    assert (seed.distance_aligned <= seed.distance).all() and (seed.distance_aligned > 0).all()
    a = load_file(run / "seed-0" / "twin" / f"step-{T}.safetensors")
    b = load_file(run / "seed-1" / "twin" / f"step-{T}.safetensors")
    gcfg = PRESETS["mini"].model_copy(update={"vocab_size": a["wte.weight"].shape[0], "block_size": 128})
    assert seed.distance_aligned.iloc[0] == weights.weight_distance(a, aligned(a, b, gcfg))["all"]


def test_missing_runs_are_measured_around(design, tmp_path, seedlab_main):
    run = copy_run(design, tmp_path)
    (run / "seed-1" / "fluent-attested" / "done.json").unlink()
    rc, out, err = seedlab_main("twins", "measure", str(run), "--no-progress")
    assert rc == 0, err
    assert "warning: missing seed 1 fluent-attested" in err
    m = pd.read_parquet(run / "measures.parquet")
    assert len(m[m.kind == "injected"]) == 2 * len(CONDS) - 1 and json.loads((run / "measures.json").read_text())["missing"] == ["seed 1 fluent-attested"]


def test_nothing_measurable_is_exit_2_and_writes_nothing(design, tmp_path, seedlab_main):
    run = copy_run(design, tmp_path)
    for k in (0, 1):
        (run / f"seed-{k}" / "twin" / "done.json").unlink()
    before = (run / "measures.parquet").read_bytes()
    rc, _, err = seedlab_main("twins", "measure", str(run), "--no-progress")
    assert rc == 2 and err.startswith("error:") and "nothing to measure" in err
    assert (run / "measures.parquet").read_bytes() == before


def test_corrupted_checkpoint_is_exit_2(design, tmp_path, seedlab_main):
    run = copy_run(design, tmp_path)
    f = run / "seed-0" / "fluent-fabricated" / f"step-{T}.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x10
    f.write_bytes(bytes(data))
    before = (run / "measures.parquet").read_bytes()
    rc, _, err = seedlab_main("twins", "measure", str(run), "--no-progress")
    assert rc == 2 and "corrupted checkpoint" in err and f"step-{T}.safetensors" in err, err
    assert (run / "measures.parquet").read_bytes() == before


def test_mismatched_model_shapes_are_exit_2(design, tmp_path, seedlab_main):
    """A checkpoint of another architecture, with a manifest that matches it (so not 'corrupted')."""
    from seedlab.store import tensor_hashes, write_safetensors

    run = copy_run(design, tmp_path)
    other = GPT(PRESETS["mini"].model_copy(update={"vocab_size": 257, "block_size": 128, "n_embd": 32})).init_from_seed(0)
    folder = run / "seed-0" / "fluent-attested"
    write_safetensors(folder / f"step-{T}.safetensors", other.state_dict())
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest[str(T)] = tensor_hashes(other.state_dict())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    rc, _, err = seedlab_main("twins", "measure", str(run), "--no-progress")
    assert rc == 2 and "mismatched model shapes" in err and "seed 0 fluent-attested" in err, err


# --------------------------------------------------------------------------- memory: bounded in the number of seeds


@pytest.fixture
def four_seeds(design, tmp_path):
    """The session's design as four seeds without training more: seeds 2 and 3 are copies of seeds 0
    and 1, and config.json is cut down to twin + fabricated, checkpoints at s, the mid-point and the
    end, and a 3-point α grid (what measure reads)."""
    run = copy_run(design, tmp_path)
    for k in (0, 1):
        shutil.copytree(run / f"seed-{k}", run / f"seed-{k + 2}")
    cfg = json.loads((run / "config.json").read_text())
    cfg |= {"seeds": [0, 1, 2, 3], "conditions": ["twin", "fluent-fabricated"], "checkpoint_every": None}
    cfg["measure"] |= {"alphas": [0, 0.5, 1], "heldout_rows": 4, "probe_rows": 2}
    (run / "config.json").write_text(json.dumps(cfg))
    return run


def test_measure_memory_does_not_grow_with_seeds(four_seeds, tmp_path, monkeypatch):
    """A memory probe: every tensor measure gets from a checkpoint read (Run.weights), an
    interpolation (measures.weights.interpolate) or a probe batch's residual streams (Evaluator.residuals)
    is tracked by a weak reference; at each of those calls and at every held-out evaluation the
    bytes still alive are summed. The peak is the same whether 2 or 4 seeds are measured: measure
    keeps no seed's weights or residuals while it goes on (the seed-vs-seed baselines read the
    twins' final weights again). Keeping each seed's final twin and residuals instead would
    add at least one weight set per seed."""
    from seedlab.twins import measure as measure_mod
    from seedlab.twins.rundir import Run

    live: list[tuple[weakref.ref, int]] = []
    peak = {"bytes": 0}

    def sample():
        live[:] = [(r, n) for r, n in live if r() is not None]
        peak["bytes"] = max(peak["bytes"], sum(n for _, n in live))

    def tracked(fn, tensors_of):
        def wrapper(*a, **kw):
            out = fn(*a, **kw)
            live.extend((weakref.ref(t), t.nbytes) for t in tensors_of(out))
            sample()
            return out
        return wrapper

    monkeypatch.setattr(Run, "weights", tracked(Run.weights, lambda sd: sd.values()))
    monkeypatch.setattr(measure_mod.Evaluator, "residuals", tracked(measure_mod.Evaluator.residuals, lambda rs: rs))
    monkeypatch.setattr(weights, "interpolate", tracked(weights.interpolate, lambda sd: sd.values()))
    monkeypatch.setattr(measure_mod.Evaluator, "heldout_ce", tracked(measure_mod.Evaluator.heldout_ce, lambda _: ()))
    peaks = {}
    for n in (2, 4):
        run = tmp_path / f"seeds-{n}"
        shutil.copytree(four_seeds, run)
        for k in range(n, 4):  # seeds past n are 'not finished': measured around
            for cond in ("twin", "fluent-fabricated"):
                (run / f"seed-{k}" / cond / "done.json").unlink()
        peak["bytes"] = 0
        out = measure_mod.measure(run, progress=False)
        assert len(out["measures"]) == n + n * (n - 1) // 2  # n injected rows + the seed pairs
        assert len(out["checkpoints"]) == 3 * n and out["checkpoints"].barrier.notna().all()
        peaks[n] = peak["bytes"]
    from safetensors.torch import load_file

    state = sum(v.nbytes for v in load_file(four_seeds / "seed-0" / "twin" / f"step-{T}.safetensors").values())
    assert 2 * state <= peaks[2] <= 4 * state, (peaks, state)  # two read weight sets + an interpolation (+ residuals)
    assert peaks[4] == peaks[2], (peaks, state)
