"""The dose axis's arms in a twins design: ordinary rows drawn per seed (nulls.ordinary_rows_per_seed) and row-weight
arms (row_weights: ``<arm>@w<w>``, registered in twins/variants.py) train, record their dose at s, and are measured
and reported; the defaults leave every design as it was; bad input is one line, exit 2, before any training."""

import json

import pytest
import yaml
from matplotlib.colors import to_rgb

from seedlab.config import parse
from seedlab.errors import SeedlabError
from seedlab.twins.config import TwinsConfig
from seedlab.twins.variants import (VARIANTS, Variant, color, register, split_weight, variant_of,
                                    weighted_name)

pytestmark = pytest.mark.usefixtures("one_thread")


def config(twins_inputs, **over) -> dict:
    corpus, files = twins_inputs
    return {"corpus": str(corpus), "model": "mini", "block_size": 128, "seeds": [0, 1], "steps": 8, "batch_size": 4,
            "injection_step": 4, "peak_lr": 3e-3, "threads": 1,
            "conditions": ["twin", "fluent-fabricated", "ordinary-row"],
            "nulls": {"ordinary_rows": 2, "ordinary_rows_per_seed": True}, "row_weights": [0.5],
            "passages": {"fluent-fabricated": str(files["fluent-fabricated"])},
            "measure": {"alphas": [0, 0.5, 1], "heldout_rows": 4, "probe_rows": 2, "eval_rows": 4}, **over}


def test_row_weight_arms_are_named_registered_and_apart_from_the_ordinary_rows():
    assert weighted_name("fluent-fabricated", 0.25) == "fluent-fabricated@w0.25"
    assert weighted_name("ordinary-row.0", 1e-5) == "ordinary-row.0@w1e-05"
    for arm, w in (("fluent-fabricated", 0.25), ("ordinary-row.0", 0.5), ("ordinary-row.3", 1 / 3)):
        assert split_weight(weighted_name(arm, w)) == (arm, w)  # the weight read back exactly
    assert split_weight("ordinary-row.2") == ("ordinary-row.2", 1.0) and split_weight("x@wz") == ("x@wz", 1.0)
    assert variant_of("fluent-fabricated@w0.25") is VARIANTS["fluent-fabricated"]
    assert variant_of("ordinary-row.0@w0.5") is VARIANTS["ordinary-row"]
    assert variant_of("nudge@w0.5") is None  # only a row-weighted variant has such arms
    assert not VARIANTS["ordinary-row"].owns("ordinary-row.0@w0.5")  # not pooled with the ordinary rows at w = 1
    base, light = to_rgb(color("fluent-fabricated")), to_rgb(color("fluent-fabricated@w0.25"))
    assert light != base and all(b <= c <= 1 for b, c in zip(base, light))  # its arm's colour, lighter
    assert to_rgb(color("ordinary-row.0@w0.25")) != to_rgb(color("ordinary-row.0@w0.5"))
    with pytest.raises(SeedlabError, match=r"^variant 'half@w0.5': '@w' marks a row-weight arm"):
        register(Variant("half@w0.5", "null", "data", "tab:cyan", "no", lambda inputs, v: []))


def test_the_config_names_the_arms_and_refuses_bad_weights(twins_inputs):
    cfg = parse(TwinsConfig, config(twins_inputs, row_weights=[0.25, 0.5]))
    assert cfg.arm_names == ["twin", "fluent-fabricated", "ordinary-row.0", "ordinary-row.1", "fluent-fabricated@w0.25",
                             "fluent-fabricated@w0.5", "ordinary-row.0@w0.25", "ordinary-row.0@w0.5"]
    plain = parse(TwinsConfig, config(twins_inputs, row_weights=[], nulls={"ordinary_rows": 2}))
    assert plain.arm_names == ["twin", "fluent-fabricated", "ordinary-row.0", "ordinary-row.1"]
    assert not plain.nulls.ordinary_rows_per_seed and plain.row_weights == []  # the defaults: designs as they were
    for weights, message in (([0.5, 0.5], "row_weights: each weight once"), ([1.0], "row_weights.0"),
                             ([0.0], "row_weights.0")):
        with pytest.raises(SeedlabError, match=message):
            parse(TwinsConfig, config(twins_inputs, row_weights=weights))
    with pytest.raises(SeedlabError, match="row_weights: the design has no condition whose row is weighed"):
        parse(TwinsConfig, config(twins_inputs, conditions=["twin", "nudge"]))


def test_the_default_draws_the_same_rows_as_before_and_per_seed_draws_differ(twins_inputs):
    """Shared rows: random.Random(ordinary_row_seed) as before; per seed: each seed its own, from the reserved slice,
    the same on every call; the shared texts then hold none."""
    from seedlab.corpus import load
    from seedlab.twins.heldout import ordinary_draw, ordinary_ranges
    from seedlab.twins.passages import load_passages, seed_passages

    corpus = load(twins_inputs[0])
    same = parse(TwinsConfig, config(twins_inputs, nulls={"ordinary_rows": 2}))
    shared = load_passages(same, twins_inputs[1]["fluent-fabricated"].parent, corpus)
    n, held = len(shared["fluent-fabricated"]), corpus.heldout
    ranges = ordinary_ranges(len(held), 128, n, 2, 0)
    assert [shared[f"ordinary-row.{i}"] for i in range(2)] == [held[r.start:r.stop].tolist() for r in ranges]
    assert ordinary_draw(0) == 0 and seed_passages(same, None, corpus, shared) == {}
    own = parse(TwinsConfig, config(twins_inputs))
    base = twins_inputs[1]["fluent-fabricated"].parent
    first = load_passages(own, base, corpus)
    assert "ordinary-row.0" not in first and first["fluent-fabricated"] == shared["fluent-fabricated"]
    per = seed_passages(own, base, corpus, first)
    assert set(per) == {0, 1} and per == seed_passages(own, base, corpus, first)
    for k in (0, 1):
        rs = ordinary_ranges(len(held), 128, n, 2, ordinary_draw(0, k))
        assert [per[k][f"ordinary-row.{i}"] for i in range(2)] == [held[r.start:r.stop].tolist() for r in rs]
    assert per[0] != per[1] and per[0]["ordinary-row.0"] != shared["ordinary-row.0"]


def test_more_rows_a_seed_than_the_slice_holds_is_one_line_exit_2_before_training(twins_inputs, tmp_path, seedlab_main):
    from seedlab.twins.heldout import RESERVED_ROWS

    n = len(twins_inputs[1]["fluent-fabricated"].read_text().encode())  # byte tokens
    slots = RESERVED_ROWS * 129 // n
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(config(twins_inputs, nulls={"ordinary_rows": slots + 1, "ordinary_rows_per_seed": True})))
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(tmp_path / "out"), "--no-progress")
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: nulls.ordinary_rows: {slots + 1} ordinary rows a seed (nulls.ordinary_rows_per_seed) of "
                          f"{n} tokens do not fit the held-out split's reserved slice")
    assert not (tmp_path / "out").exists()


def test_a_design_with_both_trains_measures_and_reports_them(twins_inputs, tmp_path):
    """Two seeds x (twin, fabricated, two per-seed ordinary rows, each of the two at w = 1/2): every seed's texts in
    inputs.json; each weighted arm injects its arm's own text (that seed's ordinary row) at weight 1/2 and its dose at
    s is below its arm's; measure reads each seed's own texts; the report's per-arm tables list the weighted arms."""
    from seedlab.corpus import load
    from seedlab.twins import report
    from seedlab.twins.measure import measure
    from seedlab.twins.rundir import open_run
    from seedlab.twins.train import conditions, run_twins

    cfg = parse(TwinsConfig, config(twins_inputs))
    run_twins(cfg, tmp_path / "run", base=tmp_path, progress=False)
    root = tmp_path / "run"
    inputs = json.loads((root / "inputs.json").read_text())
    assert set(inputs["seed_passages"]) == {"0", "1"} and "ordinary-row.0" not in inputs["passages"]
    run = open_run(root)
    integrity = json.loads((root / "integrity.json").read_text())
    for k in (0, 1):
        texts = run.texts(k)
        assert texts["ordinary-row.0"] == inputs["seed_passages"][str(k)]["ordinary-row.0"]["tokens"]
        arms = {a.name: a for a in conditions(cfg, texts, load(cfg.corpus).eot_id)}
        assert list(arms) == cfg.arm_names
        for name, of in (("fluent-fabricated@w0.5", "fluent-fabricated"), ("ordinary-row.0@w0.5", "ordinary-row.0")):
            assert arms[name].injections == arms[of].injections and arms[name].weights == {(4, 0): 0.5}
            rec = integrity["seeds"][str(k)]["arms"][name]["injections"][0]
            assert rec["weight"] == 0.5 and rec["sha256"] == integrity["seeds"][str(k)]["arms"][of]["injections"][0]["sha256"]
            dose = {a: json.loads((root / f"seed-{k}" / a / "dose.json").read_text()) for a in (name, of)}
            assert 0 < dose[name]["exp_avg"]["l2"] < dose[of]["exp_avg"]["l2"]
    assert run.texts(0)["ordinary-row.0"] != run.texts(1)["ordinary-row.0"]
    out = measure(root, progress=False)
    m = out["measures"]
    assert set(m[m.kind == "injected"].condition) == set(cfg.arm_names) - {"twin"}
    ck = out["checkpoints"].set_index(["seed", "condition", "step"])
    from seedlab.measures.text import text_ce
    from seedlab.lm.model import GPT

    model = GPT(run.gcfg)
    for k in (0, 1):  # each seed's own ordinary row, under its own twin at s (the arm is bitwise the twin there)
        model.load_state_dict(run.weights(k, "twin", 4))
        want = text_ce(model.eval(), run.texts(k)["ordinary-row.1"])
        assert ck.loc[(k, "ordinary-row.1", 4), "twin_passage_ce"] == pytest.approx(want, rel=1e-6)
    text = report.write_report(root).read_text()
    assert "| fluent-fabricated@w0.5 |" in text and "| ordinary-row.0@w0.5 |" in text


def test_the_dose_preset_is_scale_b16_with_the_dose_axis_and_its_stated_run_count():
    import re

    from seedlab import presets
    from seedlab.config import load_config

    cfg, base = load_config(TwinsConfig, "twins", "dose-b16")
    b16, _ = load_config(TwinsConfig, "twins", "scale-b16")
    same = ("model", "block_size", "steps", "batch_size", "injection_step", "injection_row", "peak_lr", "min_lr", "passages")
    assert all(getattr(cfg, f) == getattr(b16, f) for f in same)
    assert cfg.seeds == [0, 1, 2, 3] and cfg.nulls.ordinary_rows == 8 and cfg.nulls.ordinary_rows_per_seed
    assert cfg.row_weights == [0.25, 0.5] and {"matched-gradient", "sign-gradient", "nudge", "weight-kick"} <= set(cfg.conditions)
    s, runs = cfg.injection_step, len(cfg.arm_names)
    updates = len(cfg.seeds) * (s + runs * (cfg.steps - s)) + len(cfg.replica_seeds) * (cfg.steps - s)
    header = (presets.folder("twins") / "dose-b16.yaml").read_text()
    assert f"x {runs} runs after s" in header and re.search(rf"= {updates:,} run-updates", header) and "estimated" in header
