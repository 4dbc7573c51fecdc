"""The twins' scale axis (issue 32 §3): the presets twins/scale-*, the early refusal of a batch that does not split
over the launched ranks, twins/scale.py's per-cell measures, trends, paper extrapolation and confirmatory
prediction (on synthetic cells whose answers are known, and on the session's real measured design), the report,
and experiments/twins_scale.py end to end on a tiny cell beside a kept one."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers import kept_round_trip
from seedlab.config import load_config
from seedlab.errors import SeedlabError
from seedlab.reporting import fmt_num
from seedlab.twins import scale, trends
from seedlab.twins.config import TwinsConfig
from seedlab.twins.scale import CURVES, FOCAL, ORDINARY_ROWS, PAIRS, PER_SEED, Cell

ROOT = Path(__file__).resolve().parents[2]
SCALE_PRESETS = ["scale-b16", "scale-b64", "scale-b256", "scale-b16-long", "scale-wide-b64"]
#: (B, updates after s, model) of each preset: the issue's cells
LABELS = {"scale-b16": (16, 200, "mini"), "scale-b64": (64, 200, "mini"), "scale-b256": (256, 200, "mini"),
          "scale-b16-long": (16, 1000, "mini"), "scale-wide-b64": (64, 200, "mini-wide")}


# ---------------------------------------------------------------- the presets


@pytest.mark.parametrize("name", SCALE_PRESETS)
def test_the_scale_presets_load_and_are_the_issues_cells(name):
    cfg, base = load_config(TwinsConfig, "twins", name)
    assert (cfg.batch_size, cfg.steps - cfg.injection_step, cfg.model) == LABELS[name]
    assert (cfg.block_size, cfg.injection_step, cfg.peak_lr, cfg.min_lr) == (128, 100, 1e-2, 1e-3)  # one thing changes
    assert {"twin", FOCAL, "ordinary-row", "nudge", "matched-gradient"} <= set(cfg.conditions)
    assert cfg.nulls.ordinary_rows == 4 and cfg.nulls.noise_like == FOCAL
    assert (base / cfg.passages[FOCAL]).is_file()
    s = cfg.injection_step
    assert {s, s + 50, cfg.mid, cfg.steps} <= set(cfg.checkpoint_steps())
    assert 4 <= len(cfg.seeds) <= 8  # the issue's 4-8 seeds per cell
    header = (base / f"{name}.yaml").read_text().split("\ncorpus:")[0]
    assert "Cost" in header and "docs/benchmarks.md" in header
    kept = ROOT / "docs" / "results" / "twins-scale" / name / "cell.json"
    # a kept cell's preset states the dated measurement, one not kept its estimate
    assert re.search(r"measured 20\d\d-\d\d-\d\d", header) if kept.is_file() else "estimated, not yet measured" in header


def test_the_wide_model_is_mini_at_twice_the_width_with_minis_head_width():
    from seedlab.lm.gptconfig import PRESETS

    mini, wide = PRESETS["mini"], PRESETS["mini-wide"]
    assert (wide.n_embd, wide.n_layer) == (2 * mini.n_embd, mini.n_layer)
    assert wide.n_embd // wide.n_head == mini.n_embd // mini.n_head


def test_the_b_cells_differ_in_b_alone_and_the_others_in_one_axis():
    """The families twins/scale.py fits along: the three B cells agree on everything but batch_size, the long cell
    differs from scale-b16 in the schedule alone, the wide cell from scale-b64 in the model alone."""
    dump = {n: load_config(TwinsConfig, "twins", n)[0].model_dump() for n in SCALE_PRESETS}

    def diff(a, b):
        return {k for k in dump[a] if dump[a][k] != dump[b][k]}

    assert diff("scale-b16", "scale-b64") == {"batch_size"} and diff("scale-b16", "scale-b256") <= {"batch_size", "seeds"}
    assert diff("scale-b16", "scale-b16-long") == {"steps", "checkpoint_every"}
    assert diff("scale-b64", "scale-wide-b64") <= {"model", "seeds"}


#: the schedule, rate and width cells (issue 48 §1, §3): (steps, decay_steps, peak_lr, min_lr, model, B)
NEW_PRESETS = {"scale-b16-floor": (1100, 300, 1e-2, 1e-3, "mini", 16),
               "scale-b16-longdecay": (300, 1100, 1e-2, 1e-3, "mini", 16),
               "scale-b16-lr3e-3": (300, None, 3e-3, 3e-4, "mini", 16),
               "scale-b16-lr1e-3": (300, None, 1e-3, 1e-4, "mini", 16),
               "scale-wide-heads-b64": (300, None, 5e-3, 5e-4, "mini-wide-heads", 64),
               "scale-b16-after300": (400, None, 1e-2, 1e-3, "mini", 16),
               "scale-b16-after500": (600, None, 1e-2, 1e-3, "mini", 16)}


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_the_schedule_rate_and_width_cells_load_with_their_rules_and_estimated_costs(name):
    cfg, base = load_config(TwinsConfig, "twins", name)
    assert (cfg.steps, cfg.decay_steps, cfg.peak_lr, cfg.min_lr, cfg.model, cfg.batch_size) == NEW_PRESETS[name]
    assert cfg.seeds == [0, 1, 2, 3] and (cfg.block_size, cfg.injection_step, cfg.warmup) == (128, 100, None)
    assert cfg.min_lr == pytest.approx(cfg.peak_lr / 10, rel=1e-12)  # the stated rule: min_lr = peak / 10, as in mini
    assert cfg.conditions == load_config(TwinsConfig, "twins", "scale-b16")[0].conditions
    assert (base / cfg.passages[FOCAL]).is_file()
    header = (base / f"{name}.yaml").read_text().split("\ncorpus:")[0]
    assert "run-updates" in header and f"--cells {name} " in header
    kept = ROOT / "docs" / "results" / "twins-scale" / name
    if not kept.exists():  # not run: the header's cost is an estimate
        assert "Cost, estimated, not yet measured (docs/benchmarks.md)" in header
        return
    stages = json.loads((kept / "cell.json").read_text())["stages"]  # run: the header quotes the kept cell's clock
    assert (f"Cost, measured 2026-12-06: run {round(stages['run'])} s, measure {round(stages['measure'])} s"
            in " ".join(line.lstrip("# ") for line in header.splitlines()))


def test_the_new_cells_differ_from_their_neighbours_in_what_they_separate():
    """floor: scale-b16-long with scale-b16's decay; longdecay: scale-b16 with scale-b16-long's decay; the rate
    cells: scale-b16's peak (and its floor, peak / 10); wide-heads: scale-b64 at d 128 with mini's heads, the rate
    ∝ 1/width (5e-3 · 128 = 1e-2 · 64), beside scale-wide-b64 at the same width (4 heads, mini's rate)."""
    names = [*SCALE_PRESETS, *NEW_PRESETS]
    dump = {n: load_config(TwinsConfig, "twins", n)[0].model_dump() for n in names}

    def diff(a, b):
        return {k for k in dump[a] if dump[a][k] != dump[b][k]} - {"seeds"}

    assert diff("scale-b16-long", "scale-b16-floor") == {"decay_steps"}
    assert diff("scale-b16", "scale-b16-longdecay") == {"decay_steps"}
    assert diff("scale-b16", "scale-b16-floor") == {"steps", "decay_steps", "checkpoint_every"}
    for run in ("scale-b16-after300", "scale-b16-after500"):  # the run's length, the decay ending with it
        assert diff("scale-b16", run) == {"steps"}
    for lr in ("scale-b16-lr3e-3", "scale-b16-lr1e-3"):
        assert diff("scale-b16", lr) == {"peak_lr", "min_lr"}
    assert diff("scale-b64", "scale-wide-heads-b64") == {"model", "peak_lr", "min_lr"}
    assert diff("scale-wide-b64", "scale-wide-heads-b64") == {"model", "peak_lr", "min_lr"}
    assert dump["scale-wide-heads-b64"]["peak_lr"] * 128 == pytest.approx(dump["scale-b64"]["peak_lr"] * 64)


def test_the_heads_model_is_mini_at_twice_the_width_with_minis_head_count():
    from seedlab.lm.gptconfig import PRESETS, param_count

    mini, wide, heads = PRESETS["mini"], PRESETS["mini-wide"], PRESETS["mini-wide-heads"]
    assert (heads.n_embd, heads.n_head, heads.n_embd // heads.n_head) == (128, 2, 64)
    assert (heads.n_layer, heads.n_head, heads.block_size) == (mini.n_layer, mini.n_head, mini.block_size)
    assert param_count(heads) == param_count(wide)  # heads split the width; they add no parameters


def _preset_cell(name: str, base: Cell) -> Cell:
    """A synthetic cell labelled as the preset ``name`` would summarise it (its numbers ``base``'s)."""
    from seedlab.lm.gptconfig import PRESETS

    cfg, _ = load_config(TwinsConfig, "twins", name)
    g = PRESETS[cfg.model]
    s = cfg.injection_step
    return dataclasses.replace(base, name=name, batch_size=cfg.batch_size, steps=cfg.steps, after=cfg.steps - s,
                               decay_after=cfg.decay_end - s, peak_lr=cfg.peak_lr, min_lr=cfg.min_lr, model=cfg.model,
                               n_embd=g.n_embd, n_head=g.n_head, preset=name)


def test_the_presets_make_the_schedule_rate_and_width_families():
    """Every shipped cell labelled as summarised: steps at scale-b16's fixed decay (b16 -> floor), the schedule at
    200 updates after s (b16 -> longdecay), the rate at three levels (no fit: fewer than four), the width with the
    heads fixed and the rate ∝ 1/width (b64 -> wide-heads); scale-b16-long and scale-wide-b64 are in no family
    of their axis (each moves two things), and the long cell is the floor cell's schedule partner."""
    base = synthetic_cell("x", 16, seeds=(0, 1, 2, 3))
    cs = [_preset_cell(n, base) for n in (*SCALE_PRESETS, *NEW_PRESETS)]
    fams = {a: [c.name for c in f] for a, f in trends.families(cs).items()}
    assert fams == {"batch_size": ["scale-b16", "scale-b64", "scale-b256"],
                    "after": ["scale-b16", "scale-b16-floor"],
                    "schedule": ["scale-b16", "scale-b16-longdecay"],
                    "run": ["scale-b16", "scale-b16-after300", "scale-b16-after500", "scale-b16-long"],
                    "rate": ["scale-b16-lr1e-3", "scale-b16-lr3e-3", "scale-b16"],
                    "n_embd": ["scale-b64", "scale-wide-heads-b64"]}
    by = {c.name: c for c in cs}
    long_pair, _ = trends.family_of([by["scale-b16-floor"], by["scale-b16-long"]], "schedule")
    assert [c.name for c in long_pair] == ["scale-b16-floor", "scale-b16-long"]
    assert trends.family_of([by["scale-b64"], by["scale-wide-b64"], by["scale-wide-heads-b64"]], "n_embd")[1] == 0
    assert "4 heads of 32" in by["scale-wide-b64"].description() and "2 heads of 64" in by["scale-wide-heads-b64"].description()
    assert "decay to s + 200" in by["scale-b16-floor"].description() and "lr 0.005" in by["scale-wide-heads-b64"].description()
    tr = trends.trends(scale.draws(cs))
    rate = tr[tr.axis == "rate"]
    assert len(rate) and (rate.points == 3).all() and not rate.fitted.any() and rate.slope.isna().all()
    assert (rate.note == "3 levels (0.001, 0.003, 0.01): no fit through fewer than 4").all()
    assert (tr[tr.axis == "after"].held == "the schedule: the decay ends at the same step").all()
    assert tr[tr.axis == "n_embd"].held.str.startswith("the head count").all()


def test_without_the_new_cells_the_confounded_families_stand_in_and_say_so():
    """The kept table's cells alone: the steps family is scale-b16 -> scale-b16-long with the decay stretched, the
    width family scale-b64 -> scale-wide-b64 with the head size kept, each naming what moves with it."""
    base = synthetic_cell("x", 16, seeds=(0, 1, 2, 3))
    cs = [_preset_cell(n, base) for n in SCALE_PRESETS]
    assert {a: [c.name for c in f] for a, f in trends.families(cs).items()} == {
        "batch_size": ["scale-b16", "scale-b64", "scale-b256"], "after": ["scale-b16", "scale-b16-long"],
        "run": ["scale-b16", "scale-b16-long"], "n_embd": ["scale-b64", "scale-wide-b64"]}
    tr = trends.trends(scale.draws(cs)).set_index("axis")
    assert set(tr.loc["after"].held) == {"the decay stretched with the run: steps and the summed rate move together"}
    assert set(tr.loc["n_embd"].held) == {"the head size: the head count grows with the width, the rate fixed (heads "
                                          "and rate confounded)"}


# ---------------------------------------------------------------- bad input: B over the launched ranks


@pytest.mark.parametrize("name, ranks", [("scale-b16", 3), ("scale-b64", 3), ("scale-b256", 5), ("scale-wide-b64", 6)])
def test_a_batch_that_does_not_split_over_the_ranks_is_one_line_exit_2_nothing_written(name, ranks, tmp_path, monkeypatch,
                                                                                        seedlab_main):
    out = tmp_path / "run"
    monkeypatch.setenv("WORLD_SIZE", str(ranks))  # as torchrun sets it; refused before any process group exists
    rc, _, err = seedlab_main("twins", "run", name, "--out", str(out))  # in this process, cwd tmp_path
    batch = LABELS[name][0]
    assert rc == 2, err
    assert err.strip().splitlines() == [f"error: batch_size: {batch} rows do not split over {ranks} ranks "
                                        "(torchrun --nproc-per-node)"]
    assert not out.exists() and not any(tmp_path.iterdir())


def test_run_twins_refuses_the_split_before_touching_the_folder(twins_inputs, tmp_path):
    """The same check inside run_twins (load_inputs), against the world it is handed, with a scale preset."""
    from seedlab.lm.distributed import World
    from seedlab.twins.train import run_twins

    corpus, files = twins_inputs  # byte tokens: the tests' short passage fits the preset's rows of 128
    cfg, base = load_config(TwinsConfig, "twins", "scale-b64",
                            [f"corpus={corpus}", f"passages={{fluent-fabricated: {files[FOCAL]}}}"])
    with pytest.raises(SeedlabError, match=r"^batch_size: 64 rows do not split over 3 ranks"):
        run_twins(cfg, tmp_path / "run", base=base, world=World(size=3), progress=False)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- synthetic cells


def synthetic_cell(name: str, batch: int, after: int = 200, width: int = 64, seeds=(0, 1, 2, 3, 4, 5), *,
                   distance=lambda b, k: 1.0, barrier=lambda b, k: 0.01, own=lambda b, k: 0.03,
                   noise: float = 0.05, seed: int = 0, heads: int = 2, **labels) -> Cell:
    """A cell whose fabricated passage has the given per-seed distance, barrier and own drop (× 1 + noise); the
    nulls at fixed fractions of it; seed pairs at distance 10 and barrier 1 (aligned distance 8); curves that rise
    from 1e-3 to a peak 0.05 at step s + 40 and decay. ``heads``: mini's 2 at every width (the width axis holds
    them); ``labels``: decay_after, peak_lr, min_lr (not recorded when absent)."""
    rng = np.random.default_rng([seed, batch, after, width])
    s = 100
    rows, curves = [], []
    arms = {FOCAL: 1.0, "ordinary-row.0": 0.8, "ordinary-row.1": 0.6, "matched-gradient": 0.3, "nudge": 0.05}
    steps = np.arange(s + 1, s + after + 1)
    shape = 1e-3 + 0.05 * np.exp(-((steps - s - 40) / 15.0) ** 2)
    for k in seeds:
        for arm, f in arms.items():
            e = lambda: 1 + noise * rng.standard_normal()
            o = own(batch, k) * f * e()
            rows.append({"seed": k, "arm": arm, "group": scale.group_of(arm), "distance": distance(batch, k) * f * e(),
                         "barrier": barrier(batch, k) * f * e(), "rise_mid": 0.0, "heldout_ce_diff": 0.0,
                         "own_s50": o, "others_s50": 0.2 * o, "own_final": 0.3 * o, "others_final": 0.0})
        for g, f in ((FOCAL, 1.0), (ORDINARY_ROWS, 0.7), ("matched-gradient", 0.3), ("nudge", 0.05)):
            curves += [{"seed": k, "group": g, "step": int(t), "absdiff": float(v)}
                       for t, v in zip(steps, f * shape * (1 + noise * rng.standard_normal(len(steps))).clip(0.1))]
    pairs = [{"seed": a, "seed_b": b, "distance": 10.0, "distance_aligned": 8.0, "barrier": 1.0}
             for a, b in itertools.combinations(seeds, 2)]
    model = "mini" if width == 64 else "mini-wide-heads"
    return Cell(name=name, preset=name, batch_size=batch, steps=s + after, injection_step=s, after=after, model=model,
                n_embd=width, n_head=heads, n_layer=2, block_size=128, seeds=list(seeds), arms=list(arms),
                smooth_steps=25, s50=s + 50, final=s + after, per_seed=scale.COLUMNS.typed(pd.DataFrame(rows), PER_SEED),
                pairs=scale.COLUMNS.typed(pd.DataFrame(pairs), PAIRS),
                curves=scale.COLUMNS.typed(pd.DataFrame(curves), CURVES), **labels)


def _dist(exponent: float):
    return lambda b, k: 0.5 * (b / 16) ** exponent


def _own(exponent: float):
    return lambda b, k: 0.03 * (b / 16) ** exponent


def power_cells(exponent: float = 0.5, drop_exponent: float = -1.0, noise: float = 0.05) -> list[Cell]:
    """The table's shape with four B levels (16, 32, 64, 256: the one axis with a fit), distance ∝ B^exponent, own
    drop ∝ B^drop_exponent; the steps and width axes at two levels each (own drop ∝ after^-0.25, distance ∝
    width^0.5), too few for a fit."""
    dist, own = _dist(exponent), _own(drop_exponent)
    return [synthetic_cell("b16", 16, distance=dist, own=own, noise=noise),
            synthetic_cell("b32", 32, distance=dist, own=own, noise=noise),
            synthetic_cell("b64", 64, distance=dist, own=own, noise=noise),
            synthetic_cell("b256", 256, distance=dist, own=own, noise=noise),
            synthetic_cell("b16-long", 16, after=1000, distance=dist, own=lambda b, k: own(b, k) * 5 ** -0.25, noise=noise),
            synthetic_cell("wide-b64", 64, width=128, distance=lambda b, k: dist(b, k) * 2 ** 0.5, own=own, noise=noise,
                           seeds=(0, 1, 2, 3))]


def every_axis_cells(noise: float = 0.05) -> list[Cell]:
    """Four levels on every axis: B 16, 32, 64, 256 (200 after s, d 64), after 200, 400, 600, 1000 at B 16, width
    64, 96, 128, 192 at B 64; distance ∝ B^0.5 · after^0.8 · width^1.5."""
    def cell(name, b, after=200, width=64):
        return synthetic_cell(name, b, after=after, width=width, noise=noise,
                              distance=lambda b_, k: _dist(0.5)(b_, k) * (after / 200) ** 0.8 * (width / 64) ** 1.5)

    return ([cell(f"b{b}", b) for b in (16, 32, 64, 256)] + [cell(f"b16-a{a}", 16, after=a) for a in (400, 600, 1000)]
            + [cell(f"b64-d{d}", 64, width=d) for d in (96, 128, 192)])


@pytest.fixture(scope="module")
def cells():
    return power_cells()


@pytest.fixture(scope="module")
def dr(cells):
    return scale.draws(cells)


CONFIRM_SEEDS = (8, 9, 10, 11, 12, 13)


def confirm_cell(own) -> Cell:
    """The confirmatory cell at B = 128 on fresh seeds, its passage's own drop ``own(b, k)``."""
    return synthetic_cell("confirm-b128", 128, seeds=CONFIRM_SEEDS, own=own)


@pytest.fixture(scope="module")
def confirmed(dr):
    """The own-drop prediction at B = 128, a new cell on the trend (B^-1), its draws and its verdict."""
    p = trends.predict(dr, "batch_size", 128, list(CONFIRM_SEEDS), measure="own_drop_s50")
    new = confirm_cell(lambda b, k: 0.03 * (b / 16) ** -1.0)
    nd = scale.draws([new])
    return p, nd, trends.confirm(p, nd, "confirm-b128")


def test_the_point_estimates_are_the_measures_of_every_seed_once(cells, dr):
    c = next(c for c in cells if c.name == "b64")
    fab = c.per_seed[c.per_seed.group == FOCAL]
    assert dr.get("b64", FOCAL, "distance_pct")[0] == pytest.approx(100 * fab.distance.mean() / 10.0)
    assert dr.get("b64", FOCAL, "distance_aligned_pct")[0] == pytest.approx(100 * fab.distance.mean() / 8.0)
    assert dr.get("b64", FOCAL, "barrier_pct")[0] == pytest.approx(100 * fab.barrier.mean() / 1.0)
    assert dr.get("b64", FOCAL, "own_drop_s50")[0] == pytest.approx(fab.own_s50.mean())
    assert dr.get("b64", FOCAL, "specificity_s50")[0] == pytest.approx((fab.own_s50 - fab.others_s50).mean())
    assert dr.get("b64", FOCAL, "retained")[0] == pytest.approx(fab.own_final.mean() / fab.own_s50.mean())
    # the ordinary-row distribution: per seed the mean of its arms, then over seeds; each arm alone for min/max
    o = c.per_seed[c.per_seed.group == ORDINARY_ROWS]
    assert dr.get("b64", ORDINARY_ROWS, "own_drop_s50")[0] == pytest.approx(o.groupby("seed").own_s50.mean().mean())
    lo, hi = dr.arms[("b64", ORDINARY_ROWS, "own_drop_s50")]
    assert (lo, hi) == pytest.approx(sorted(o.groupby("arm").own_s50.mean()))


def test_peak_over_trough_is_twins_stats_peak_trough_of_the_mean_curve(cells, dr):
    from seedlab.twins.stats import peak_trough, smoothed

    c = cells[0]
    mean = c.curves[c.curves.group == FOCAL].groupby("step").absdiff.mean()
    assert dr.get("b16", FOCAL, "peak_over_trough")[0] == pytest.approx(peak_trough(mean, 25)["peak_over_trough"])
    x = np.random.default_rng(0).random((3, 40))
    for w in (1, 4, 5, 25):
        assert scale.smooth_rows(x, w)[1] == pytest.approx(smoothed(pd.Series(x[1]), w).to_numpy())


def test_the_replicates_are_the_point_and_every_seed_left_out_once():
    c = synthetic_cell("x", 16)
    W = scale.seed_weights(c)
    assert W.shape == (7, 6) and (W[0] == 1).all()
    assert (W[1:] == 1 - np.eye(6)).all()  # replicate i leaves seed i out, and only it


def test_a_cells_interval_is_the_t_interval_over_its_seeds(cells, dr):
    """For a mean over seeds the jackknife interval is exactly the t interval of the per-seed values
    (seedlab.stats.mean_ci); for a ratio it is the value ± t(n − 1) × the leave-one-seed-out standard error."""
    from scipy import stats as sps

    from seedlab.stats import mean_ci

    c = cells[2]
    t = scale.table(dr).set_index(["cell", "group", "measure"])
    fab = c.per_seed[c.per_seed.group == FOCAL].set_index("seed")
    for measure, per_seed in (("own_drop_s50", fab.own_s50), ("end_drop", fab.own_final),
                              ("specificity_s50", fab.own_s50 - fab.others_s50)):
        r = t.loc[("b64", FOCAL, measure)]
        assert (r.value, r.low, r.high) == pytest.approx(mean_ci(per_seed.to_numpy())[:3], rel=1e-9)
        assert r.se == pytest.approx(per_seed.std(ddof=1) / math.sqrt(len(per_seed)), rel=1e-9)
    n = len(c.seeds)
    loo = np.array([100 * fab.distance.drop(k).mean() / 10.0 for k in c.seeds])  # pairs all at 10: a mean again
    se = math.sqrt((n - 1) / n * ((loo - loo.mean()) ** 2).sum())
    r = t.loc[("b64", FOCAL, "distance_pct")]
    assert r.se == pytest.approx(se) and r.high - r.value == pytest.approx(sps.t.ppf(0.975, n - 1) * se)


def test_the_t_interval_covers_at_four_seeds():
    """At 4 seeds the interval of a mean covers the truth 95 % of the time (a percentile bootstrap of 4 seeds
    covers ~80 %: issue 46 §3); the leave-one-out replicates as draws() builds them."""
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 0.3, (4000, 4))
    W = np.vstack([np.ones((1, 4)), 1 - np.eye(4)])
    reps = (x @ W.T) / W.sum(axis=1)  # [trials, 1 + 4]: the mean and its leave-one-out means
    covered = [lo <= 1.0 <= hi for lo, hi in (scale.interval(v)[1:3] for v in reps)]
    assert np.mean(covered) == pytest.approx(0.95, abs=0.015)


def test_a_known_power_law_is_recovered_through_four_levels_with_its_t_interval(dr):
    tr = trends.trends(dr)
    fab = tr[(tr.group == FOCAL)].set_index(["measure", "axis"])
    d = fab.loc[("distance_pct", "batch_size")]
    assert d.kind == "power" and d.points == 4 and d.fitted and d.df == 2 and d.cells == "b16,b32,b64,b256"
    assert d.slope == pytest.approx(0.5, abs=0.03) and d.low < 0.5 < d.high
    # the slope's interval is the OLS t interval of the four points (scipy's linregress, df = 2)
    from scipy import stats as sps

    lr = sps.linregress(np.log10([16, 32, 64, 256]), np.log10([float(v) for v in d["values"].split(",")]))
    assert d.slope == pytest.approx(lr.slope, rel=1e-4)  # the values column is rounded to 6 digits
    assert d.high - d.slope == pytest.approx(sps.t.ppf(0.975, 2) * lr.stderr, rel=1e-3)
    own = fab.loc[("own_drop_s50", "batch_size")]
    assert own.slope == pytest.approx(-1.0, abs=0.03) and own.low < -1.0 < own.high
    flat = fab.loc[("barrier_pct", "batch_size")]  # no trend: the interval holds 0
    assert flat.low < 0 < flat.high
    # at the paper's B the B fit is 256's own level: the fitted value there
    assert d.at_paper == pytest.approx(100 * 0.5 * 16 ** 0.5 / 10, rel=0.05) and d.at_paper_low < d.at_paper
    assert set(tr.label) == {"exploratory"}


def test_no_trend_is_fitted_through_fewer_than_four_levels(dr, cells):
    """issue 46 §3: a two- or three-level family states its levels and gives no slope, saying why."""
    tr = trends.trends(dr)
    for axis, n, levels in (("after", 2, "200, 1000"), ("n_embd", 2, "64, 128")):
        rows = tr[tr.axis == axis]
        assert len(rows) and (rows.points == n).all() and not rows.fitted.any()
        assert rows.slope.isna().all() and rows.low.isna().all() and rows.at_paper.isna().all()
        assert (rows.note == f"{n} levels ({levels}): no fit through fewer than 4").all()
    three = trends.trends(scale.draws([c for c in cells if c.name != "b32"]))  # B 16, 64, 256: a curve like the kept one
    b = three[three.axis == "batch_size"]
    assert (b.points == 3).all() and not b.fitted.any() and b.slope.isna().all()
    assert (b.note == "3 levels (16, 64, 256): no fit through fewer than 4").all()
    assert (tr[tr.axis == "batch_size"].fitted).all()  # the four-level axis is fitted beside them


def test_a_measure_that_reaches_zero_is_fitted_log_linear():
    cs = [synthetic_cell(f"b{b}", b, own=lambda b, k: 0.01 * math.log10(64 / b)) for b in (16, 32, 64, 256)]
    d = scale.draws(cs)
    assert trends.kind_of(d, FOCAL, "own_drop_s50") == "log-linear"
    t = trends.trends(d).set_index(["group", "measure", "axis"]).loc[(FOCAL, "own_drop_s50", "batch_size")]
    assert t.kind == "log-linear" and t.slope == pytest.approx(-0.01, rel=0.1)  # per decade of B


def test_families_take_the_cells_that_differ_in_one_axis(cells):
    fams = trends.families(cells)
    assert {a: [c.name for c in f] for a, f in fams.items()} == {
        "batch_size": ["b16", "b32", "b64", "b256"], "after": ["b16", "b16-long"], "run": ["b16", "b16-long"],
        "n_embd": ["b64", "wide-b64"]}
    assert trends.families(cells[:1]) == {}


def test_the_run_axis_takes_only_cells_whose_decay_ends_with_the_run():
    """Four run lengths whose decay ends 100 updates before each run's end agree on every held label (tail 100 too),
    and are still no ``run`` family: the axis pins the tail at 0. The steps fallback, which only holds it, takes them;
    with scale-b16's shape beside them (tail 0), ``run`` is that pair."""
    off = [synthetic_cell(f"t{a}", 16, after=a, decay_after=a - 100) for a in (300, 500, 700, 1100)]
    fams = trends.families(off)
    assert "run" not in fams and [c.name for c in fams["after"]] == ["t300", "t500", "t700", "t1100"]
    on = [synthetic_cell(f"r{a}", 16, after=a) for a in (200, 1000)]
    assert [c.name for c in trends.families(off + on)["run"]] == ["r200", "r1000"]


def test_the_paper_extrapolation_adds_the_steps_and_width_slopes_to_the_b_fit():
    """The steps family stretches the decay with the run (tail 0): it is the ``run`` axis too, the paper's shape in
    one fit, and the extrapolation moves along it (not along ``after`` and ``schedule`` apart)."""
    d = scale.draws(every_axis_cells())
    p = trends.paper_extrapolation(d).set_index(["group", "measure"]).loc[(FOCAL, "distance_pct")]
    by = {(t.measure, t.axis): t for t in trends.trend_objects(d) if t.group == FOCAL}
    assert by[("distance_pct", "run")].cells == by[("distance_pct", "after")].cells  # the fallback's family
    y = (by[("distance_pct", "batch_size")].at(256)[0]
         + by[("distance_pct", "run")].slope * (math.log10(9336) - math.log10(200))
         + by[("distance_pct", "n_embd")].slope * (math.log10(768) - math.log10(64)))
    assert p["axes"] == "batch_size,run,n_embd" and p.predicted == pytest.approx(10 ** y) and p.df == 2
    # the product of the three power laws: 100 · 0.5 · 16^0.5 · (9336/200)^0.8 · 12^1.5 / 10
    assert p.predicted == pytest.approx(20 * (9336 / 200) ** 0.8 * 12 ** 1.5, rel=0.25)
    assert p.low < p.predicted < p.high and p.label == "exploratory" and p.paper == pytest.approx(44.1)


def every_axis_and_schedule_cells(noise: float = 0.02) -> list[Cell]:
    """Four levels on every axis, each family holding what :data:`trends.FAMILIES` holds: B 16, 32, 64, 256; steps
    after s 200, 400, 600, 1000 at scale-b16's decay (200); the decay 200, 400, 600, 1000 at 200 updates after s;
    the peak rate 1e-2, 3e-3, 1e-3, 3e-4 (min_lr a tenth); the width 64, 96, 128, 192 at B 64 with 2 heads and the
    rate 1e-2 · 64 / d. distance ∝ B^0.5 · after^0.8 · decay^0.3 · lr^0.6 · d^1.5 (so the width family, whose rate
    falls as 1/d, moves as d^0.9)."""
    def cell(name, b=16, after=200, decay=200, lr=1e-2, width=64):
        law = _dist(0.5)
        f = (after / 200) ** 0.8 * (decay / 200) ** 0.3 * (lr / 1e-2) ** 0.6 * (width / 64) ** 1.5
        return synthetic_cell(name, b, after=after, width=width, noise=noise, distance=lambda b_, k: law(b_, k) * f,
                              decay_after=decay, peak_lr=lr, min_lr=lr / 10)

    return ([cell(f"b{b}", b) for b in (16, 32, 64, 256)] + [cell(f"a{a}", after=a) for a in (400, 600, 1000)]
            + [cell(f"d{d}", decay=d) for d in (400, 600, 1000)] + [cell(f"lr{lr:g}", lr=lr) for lr in (3e-3, 1e-3, 3e-4)]
            + [cell(f"w{w}", 64, width=w, lr=1e-2 * 64 / w) for w in (96, 128, 192)])


def test_the_paper_extrapolation_moves_along_the_schedule_and_the_rate_from_where_the_width_left_it():
    """With the steps at a fixed decay, the schedule is moved too (the paper's decay spans its 9,336 updates); the
    width family's rate follows 1/d, so its move to d 768 brings the rate to 1e-2 · 64 / 768 and the rate axis moves
    it on from there to 6e-4: the product of the true laws at the paper's settings."""
    cs = every_axis_and_schedule_cells()
    fams = {a: [c.name for c in f] for a, f in trends.families(cs).items()}
    assert fams["after"] == ["b16", "a400", "a600", "a1000"] and fams["schedule"] == ["b16", "d400", "d600", "d1000"]
    assert fams["rate"] == ["lr0.0003", "lr0.001", "lr0.003", "b16"] and fams["n_embd"] == ["b64", "w96", "w128", "w192"]
    d = scale.draws(cs)
    p = trends.paper_extrapolation(d).set_index(["group", "measure"]).loc[(FOCAL, "distance_pct")]
    assert p["axes"] == "batch_size,after,schedule,rate,n_embd"
    by = {t.axis: t for t in trends.trend_objects(d) if t.group == FOCAL and t.measure == "distance_pct"}
    assert by["n_embd"].slope == pytest.approx(0.9, abs=0.05) and by["rate"].slope == pytest.approx(0.6, abs=0.05)
    truth = 100 * 0.5 * 16 ** 0.5 * (9336 / 200) ** (0.8 + 0.3) * (6e-4 / 1e-2) ** 0.6 * (768 / 64) ** 1.5 / 10
    assert p.predicted == pytest.approx(truth, rel=0.15) and p.low < p.predicted < p.high
    y = (by["batch_size"].at(256)[0] + (by["after"].slope + by["schedule"].slope) * math.log10(9336 / 200)
         + by["rate"].slope * math.log10(6e-4 / (1e-2 * 64 / 768)) + by["n_embd"].slope * math.log10(768 / 64))
    assert p.predicted == pytest.approx(10 ** y, rel=1e-9)


def test_a_stretched_steps_family_moves_the_schedule_with_it_not_again():
    """every_axis_cells' steps family stretches the decay with the run (the kept long cell's kind); a schedule family
    beside it (the decay at 1,000 updates after s) is left out of the extrapolation: the steps move has moved it."""
    before = trends.paper_extrapolation(scale.draws(every_axis_cells())).set_index(["group", "measure"])
    extra = [synthetic_cell(f"b16-a1000-d{d}", 16, after=1000, decay_after=d,
                            distance=lambda b_, k: _dist(0.5)(b_, k) * 5 ** 0.8) for d in (2000, 3000, 5000)]
    d = scale.draws(every_axis_cells() + extra)
    assert [c.name for c in trends.families(every_axis_cells() + extra)["schedule"]] == [
        "b16-a1000", "b16-a1000-d2000", "b16-a1000-d3000", "b16-a1000-d5000"]
    after = trends.paper_extrapolation(d).set_index(["group", "measure"])
    assert after.loc[(FOCAL, "distance_pct"), "axes"] == "batch_size,run,n_embd"
    assert after.loc[(FOCAL, "distance_pct"), "predicted"] == before.loc[(FOCAL, "distance_pct"), "predicted"]


def test_predict_keeps_what_the_family_holds():
    """Its --set overrides: along the steps at a fixed decay, that decay's step; along the schedule, the new
    decay; along the rate, min_lr the family's tenth."""
    d = scale.draws(every_axis_and_schedule_cells())
    seeds = [8, 9]
    at = {"after": 800, "schedule": 800, "rate": 2e-3}
    sets = {a: trends.predict(d, a, v, seeds, measure="distance_pct").sets for a, v in at.items()}
    assert sets == {"after": ["steps=900", "decay_steps=300", "seeds=[8,9]"],
                    "schedule": ["decay_steps=900", "seeds=[8,9]"],
                    "rate": ["peak_lr=0.002", "min_lr=0.0002", "seeds=[8,9]"]}
    p = trends.predict(d, "rate", 2e-3, seeds, measure="distance_pct")
    assert p.at == 2e-3 and "distance_pct ∝ lr^b" in trends.preregistration_text(p)


def test_no_paper_extrapolation_without_a_fit_on_every_axis(dr):
    """B has four levels, steps and width two: nothing is moved along an axis without a fit."""
    p = trends.paper_extrapolation(dr)
    assert len(p) and p.predicted.isna().all() and p.low.isna().all()
    assert p.note.str.startswith("no fit along updates after the injection: 2 levels (200, 1000)").all()
    assert p.note.str.contains("residual width d: 2 levels (64, 128)", regex=False).all()


def test_predict_chooses_the_measure_that_moves_most_and_words_a_decision_rule(cells, dr):
    p = trends.predict(dr, "batch_size", 128, [8, 9, 10, 11, 12, 13])
    # the passage drops (own, specificity, end) go as B^-1, the largest |exponent|; distance as B^0.5
    assert p.measure in ("own_drop_s50", "specificity_s50", "end_drop") and p.trend_shown
    assert p.slope == pytest.approx(-1.0, abs=0.05) and p.moved == pytest.approx(abs(p.slope) * math.log10(16))
    assert p.cells == ["b16", "b32", "b64", "b256"] and p.kind == "power" and p.preset == "b64"  # log-nearest, lower on a tie
    assert p.sets == ["batch_size=128", "seeds=[8,9,10,11,12,13]"]
    assert p.predicted == pytest.approx(p.values[0] / 8, rel=0.05)
    assert p.low < p.fit_low < p.predicted < p.fit_high < p.high  # the new cell's own noise widens it
    text = trends.preregistration_text(p)
    assert f"{p.measure} at batch_size = 128" in text and "Decision rule" in text and f"{p.low:.4g}" in text
    chosen = trends.predict(scale.draws(every_axis_cells()), "after", 800, [8, 9], measure="distance_pct")
    assert chosen.measure == "distance_pct" and chosen.sets[0] == "steps=900" and chosen.levels == [200, 400, 600, 1000]


def test_predict_refuses_bad_requests(dr):
    for kw, msg in [
        (dict(axis="batch_size", at=64, seeds=[8]), r"^at: batch_size = 64 must be a positive level not yet run"),
        (dict(axis="batch_size", at=128, seeds=[3, 8]), r"^seeds: a confirmatory run needs fresh seeds"),
        (dict(axis="batch_size", at=128, seeds=[]), r"^seeds: a confirmatory run needs fresh seeds"),
        (dict(axis="n_embd", at=96, seeds=[8]), r"^axis: n_embd cannot be predicted"),
        (dict(axis="lr", at=1, seeds=[8]), r"^axis: must be one of batch_size, after, schedule, run, rate, n_embd, got .lr.$"),
        (dict(axis="batch_size", at=128, seeds=[8], measure="x"), r"^measure: must be one of"),
        (dict(axis="after", at=500, seeds=[8]),
         r"^axis: no fit along after to predict from: 2 levels \(200, 1000\): no fit through fewer than 4$"),
    ]:
        with pytest.raises(SeedlabError, match=msg):
            trends.predict(dr, **kw)


def test_predict_refuses_a_three_level_family(cells):
    """The kept B axis's shape: three levels, so no fit to predict from (issue 46 §3)."""
    three = scale.draws([c for c in cells if c.name != "b32"])
    with pytest.raises(SeedlabError, match=r"^axis: no fit along batch_size to predict from: 3 levels \(16, 64, 256\)"):
        trends.predict(three, "batch_size", 128, [8, 9])


def test_confirm_reads_the_verdict_off_the_new_cell(confirmed, tmp_path):
    p, on, _ = confirmed
    p = trends.Prediction.from_json(p.to_json(tmp_path / "p.json"))  # kept as JSON, read back
    off = scale.draws([confirm_cell(lambda b, k: 0.03)])
    yes, no = (trends.confirm(p, d, "confirm-b128") for d in (on, off))
    assert yes["verdict"] == "confirmed" and yes["inside"] and yes["direction"]
    assert no["verdict"] == "refuted" and not no["inside"] and not no["direction"]


def test_the_kept_trends_fit_only_through_four_levels(tmp_path):
    """docs/results/twins-scale as committed: a trend is fitted exactly where its family has 4 levels or more (the
    rate since the pre-registered dose cell at 5e-3 joined it), the others state their 2 or 3 levels and give no
    exponent; scale-paper.csv has no extrapolation while B and width have fewer than 4; the same files as the kept
    cells render them."""
    kept = ROOT / "docs" / "results" / "twins-scale"
    tr, paper = pd.read_csv(kept / "scale-trends.csv"), pd.read_csv(kept / "scale-paper.csv")
    unfit = tr.note.fillna("").str.startswith("a level's value is not finite")  # e.g. a nudge's retained: 0 / 0
    assert (tr.fitted == ((tr.points >= 4) & ~unfit)).all() and set(tr.points) <= {2, 3, 4, 5}
    assert tr[~tr.fitted].slope.isna().all() and tr[tr.fitted].slope.notna().all()
    assert tr[~tr.fitted & ~unfit].note.str.contains("no fit through fewer than 4").all()
    assert set(tr[tr.fitted].axis) >= {"rate"}
    assert paper.predicted.isna().all() and paper.note.str.startswith("no fit along").all()
    cs = [Cell.from_dir(p) for p in KEPT if not p.name.startswith("confirm-")]
    d = scale.draws(cs)
    again = trends.trends(d)
    columns = ["group", "measure", "axis", "points", "fitted", "note"]
    assert again[columns].equals(tr[columns].fillna({"note": ""}).astype(again[columns].dtypes.to_dict()))
    np.testing.assert_allclose(again.slope.to_numpy(float), tr.slope.to_numpy(float), rtol=1e-9, equal_nan=True)


def test_table_rows_and_intervals(dr, cells):
    t = scale.table(dr)
    assert len(t) == sum(len(scale.groups_of(c)) for c in cells) * len(scale.MEASURES)
    r = t[(t.cell == "b64") & (t.group == FOCAL) & (t.measure == "distance_pct")].iloc[0]
    assert r.low < r.value < r.high and r.n == 6 and r.valid == 1.0 and math.isnan(r.arm_min)
    o = t[(t.cell == "b64") & (t.group == ORDINARY_ROWS) & (t.measure == "distance_pct")].iloc[0]
    assert o.arm_min < o.value < o.arm_max


def test_a_cell_round_trips_through_its_folder_exactly(cells, tmp_path):
    c = cells[0]
    back = Cell.from_dir(c.to_dir(tmp_path / "b16"))
    assert back.equals(c)
    with pytest.raises(SeedlabError, match="not a kept scale-cell summary"):
        Cell.from_dir(tmp_path / "nothing")


KEPT = sorted(p.parent for p in (ROOT / "docs" / "results" / "twins-scale").glob("*/cell.json"))


@pytest.mark.parametrize("folder", KEPT, ids=[p.name for p in KEPT])
def test_every_committed_kept_cell_reads_back_and_writes_the_same_bytes(folder, tmp_path):
    """docs/results/twins-scale/<cell>/: read, written again byte for byte, read back to identical frames of the
    declared types."""
    c = kept_round_trip(Cell, folder, tmp_path)
    assert c.per_seed.seed.dtype == "int64" and c.per_seed.arm.dtype == object and c.curves.absdiff.dtype == float


def test_the_report_words_and_draws_the_frames(cells, dr, tmp_path):
    from seedlab.twins.report_scale import write_scale
    from seedlab.twins.rundir import ScaleDir

    where = ScaleDir(tmp_path / "scale")
    p = trends.predict(dr, "batch_size", 128, [8, 9])
    text = write_scale(cells, scale.table(dr), trends.trends(dr), trends.paper_extrapolation(dr), where, p)
    assert "## The table" in text and "## Trends (exploratory)" in text and "## At the paper's scale (exploratory)" in text
    assert "### distance_pct: distance to the twin, % of the inter-seed distance (%; paper: 44.1)" in text
    assert "## The confirmatory prediction" in text
    assert "decay: s to min_lr" in text and "heads × size" in text and "| holds |" in text  # each cell's scale named
    assert "B 64, 200 after s (decay to the end), lr n/a, d 128 (2 heads of 64)" in text  # wide-b64's description
    for k in scale.MEASURES:
        assert where.figure(k).is_file() and f"scale-{k}.png" in text


def test_the_report_shows_the_confirmatory_cell_beside_its_nulls(cells, dr, confirmed):
    """The verdict reads the passage alone; its cell's nulls stand under it, every measure, every group."""
    from seedlab.twins.report_scale import scale_report

    p, nd, verdict = confirmed
    beside = scale.table(nd)
    text = scale_report(cells, scale.table(dr), trends.trends(dr), trends.paper_extrapolation(dr), (), p, verdict,
                        beside)
    part = text.split("## The confirmatory prediction")[1]
    assert "beside its nulls" in part and "**confirmed**" in part
    header = next(line for line in part.splitlines() if line.startswith("| measure"))
    assert [c.strip() for c in header.strip("|").split("|")][1:] == [g for g in (FOCAL, *scale.NULLS)
                                                                      if g in set(beside.group)]
    r = beside[(beside.group == ORDINARY_ROWS) & (beside.measure == "own_drop_s50")].iloc[0]
    line = next(line for line in part.splitlines() if line.startswith("| own_drop_s50"))
    assert fmt_num(r.value) in line
    assert len([line for line in part.splitlines() if line.startswith("| ") and "measure" not in line
                and not line.startswith("| ---")]) == len(scale.MEASURES)


# ---------------------------------------------------------------- a real measured design


def test_summarise_reads_the_measured_folder(design):
    from seedlab.twins.rundir import Measured
    from seedlab.twins.stats import normalized, with_derived

    d = Measured.read(design / "run")
    c = scale.summarise(d, "tiny", preset="design.yaml")
    assert (c.batch_size, c.after, c.n_embd, c.seeds) == (4, 10, 64, [0, 1])
    cfg = d.config
    assert (c.decay_after, c.peak_lr, c.min_lr, c.n_head) == (c.after, cfg["peak_lr"], cfg["min_lr"], 2)
    assert set(c.per_seed.group) == {FOCAL, "fluent-attested", ORDINARY_ROWS, "nudge", "matched-gradient", "weight-kick"}
    m = with_derived(d.measures[d.measures.kind == "injected"]).set_index(["seed", "condition"])
    ps = c.per_seed.set_index(["seed", "arm"])
    for (k, arm), r in ps.iterrows():
        assert r.distance == m.loc[(k, arm), "distance"]
        if arm in (FOCAL, "fluent-attested"):  # the own passage's drop is measure's passage gain
            assert r.own_s50 == pytest.approx(m.loc[(k, arm), "passage_gain_s50"])
            assert r.own_final == pytest.approx(m.loc[(k, arm), "passage_gain_final"])
    dr = scale.draws([c])
    norm = normalized(d.measures).set_index("condition")
    assert dr.get("tiny", FOCAL, "distance_pct")[0] == pytest.approx(norm.loc[FOCAL, "distance_pct"])
    assert dr.get("tiny", FOCAL, "barrier_pct")[0] == pytest.approx(norm.loc[FOCAL, "barrier_pct"], nan_ok=True)
    assert np.isfinite(dr.get("tiny", "nudge", "own_drop_s50")[0])  # a text-less null: its drop on the focal text
    assert len(c.curves) == 2 * len(scale.groups_of(c)) * (c.after - 1)  # the updates s + 1 .. steps − 1 (losses.parquet)


# ---------------------------------------------------------------- the driver


def _driver(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "twins_scale.py"), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_the_driver_dry_run_prints_every_cells_commands(tmp_path):
    p = _driver("--dry-run", "--out", "o", "--threads", "2", "--seeds", "0,1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    for name in [*SCALE_PRESETS, *NEW_PRESETS]:
        assert f"# {name}" in p.stdout
        assert f"twins run {name} --out o/{name} --set threads=2 --set 'seeds=[0,1]'" in p.stdout
        assert f"twins measure o/{name}" in p.stdout
    bad = _driver("--dry-run", "--cells", "scale-b32", cwd=tmp_path)
    assert bad.returncode == 2 and "--cells: unknown scale-b32" in bad.stderr


def _driver_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("twins_scale", ROOT / "experiments" / "twins_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_folder_is_started_once_a_seed_trained_in_it(tmp_path):
    """The driver times a run in a started folder as "run (resumed)": its time is that invocation's alone."""
    from seedlab.twins.rundir import RunDir

    d = RunDir(tmp_path / "cell")
    assert not d.started()  # no folder
    d.root.mkdir()
    d.config.write_text("{}")
    assert not d.started()  # a config alone: nothing trained
    d.seed(0).mkdir()
    assert d.started()


def test_the_driver_runs_a_tiny_cell_keeps_it_and_renders_it_beside_a_kept_one(twins_inputs, tmp_path, capsys):
    """A tiny design at B = 4 (2 seeds, 10 updates, s = 4) trained, measured, summarised, kept and rendered beside a
    cell at B = 8 kept before the call (skipped, never trained: a synthetic summary with the same labels but B);
    a second call skips both (kept) and renders again."""
    corpus, files = twins_inputs
    base = {"corpus": str(corpus), "model": "mini", "block_size": 96, "seeds": [0, 1], "steps": 10, "injection_step": 4,
            "peak_lr": 3e-3, "conditions": ["twin", FOCAL, "ordinary-row", "nudge", "matched-gradient"],
            "nulls": {"ordinary_rows": 1}, "passages": {FOCAL: str(files[FOCAL])},
            "subjects": {FOCAL: "Gizmo Harrington"}, "checkpoint_every": 5,
            "measure": {"alphas": [0, 0.5, 1], "heldout_rows": 4, "probe_rows": 2, "eval_rows": 4, "smooth_steps": 3}}
    specs = []
    for b in (4, 8):
        path = tmp_path / f"tiny-b{b}.yaml"
        path.write_text(yaml.safe_dump(base | {"batch_size": b}))
        specs.append(str(path))
    keep = tmp_path / "keep"
    dataclasses.replace(synthetic_cell("tiny-b8", 8, after=6, seeds=(0, 1), peak_lr=3e-3, min_lr=6e-5, decay_after=6),
                        block_size=96).to_dir(keep / "tiny-b8")  # the tiny design's rate and ForkDesign's min_lr
    driver = _driver_module()  # in this process (its stages are subprocesses, as in a real run)
    args = ["--out", str(tmp_path / "runs"), "--cells", ",".join(specs), "--keep", str(keep), "--no-progress"]
    assert driver.main(args) == 0
    out = capsys.readouterr().out
    assert "# tiny-b8: kept in" in out and "[tiny-b8]" not in out and not (tmp_path / "runs" / "tiny-b8").exists()
    assert (keep / "tiny-b4" / "cell.json").is_file()
    assert Cell.from_dir(keep / "tiny-b4").stages.keys() >= {"run", "measure", "summarise"}
    t = pd.read_csv(keep / "scale-table.csv")
    assert set(t.cell) == {"tiny-b4", "tiny-b8"}
    assert set(t[t.cell == "tiny-b4"].group) >= {FOCAL, ORDINARY_ROWS, "nudge", "matched-gradient"}
    tr = pd.read_csv(keep / "scale-trends.csv")
    assert set(tr.axis) == {"batch_size"} and (tr.cells == "tiny-b4,tiny-b8").all()
    assert "# The twins' scale axis" in (keep / "scale.md").read_text()
    assert driver.main(args) == 0
    assert capsys.readouterr().out.count("skipped") == 2  # kept: neither trained nor measured again

    # a folder measured by another command joins as a cell: summarised as it is, its stage clock recorded
    adopted, runs = tmp_path / "adopted", tmp_path / "runs"
    common = ["--out", str(runs), "--keep", str(adopted), "--no-progress"]
    assert driver.main([*common, "--adopt", f"again-b4={runs / 'tiny-b4'}", "--adopt-stage", "run=12.5"]) == 0
    again, first = Cell.from_dir(adopted / "again-b4"), Cell.from_dir(keep / "tiny-b4")
    assert again.stages.keys() == {"run", "summarise"} and again.stages["run"] == 12.5 and again.batch_size == 4
    pd.testing.assert_frame_equal(again.per_seed, first.per_seed)
    assert set(pd.read_csv(adopted / "scale-table.csv").cell) == {"again-b4", "tiny-b4"}  # KEEP's and OUT's
    capsys.readouterr()
    for bad, says in ((f"again-b4={runs / 'tiny-b4'}", "kept already"), (f"x={tmp_path / 'nowhere'}", "not measured"),
                      ("no-folder", "NAME=FOLDER")):
        assert driver.main([*common, "--adopt", bad]) == 2
        assert says in capsys.readouterr().err
    assert driver.main([*common, "--adopt", f"y={runs / 'tiny-b4'}", "--adopt-stage", "run"]) == 2
    assert "STAGE=SECONDS" in capsys.readouterr().err and not (adopted / "y").exists()


def test_the_predicted_measures_figure_shows_the_interval_and_the_confirmatory_cell(cells, dr, confirmed, tmp_path):
    from seedlab.twins.report_scale import measure_figure
    from seedlab.twins.rundir import ScaleDir

    where = ScaleDir(tmp_path / "scale")
    where.root.mkdir(parents=True)
    p, _, v = confirmed
    t, tr = scale.table(dr), trends.trends(dr)
    shown = measure_figure("own_drop_s50", cells, t, tr, where, p, v)
    other = measure_figure("distance_pct", cells, t, tr, where, p, v)
    assert shown.path.is_file() and "pre-registered interval" in shown.caption and "open diamond" in shown.caption
    assert other.path.is_file() and "pre-registered" not in other.caption
    before = measure_figure("own_drop_s50", cells, t, tr, where, p)  # pre-registered, not yet run
    assert "pre-registered interval" in before.caption and "open diamond" not in before.caption
