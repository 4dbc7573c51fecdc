"""experiments/twins_dose_prereg.py: the three pre-registered tests of docs/preregistration/twins-dose.md on synthetic
dose tables (no training): a passage planted on the ordinary rows' line passes D1 and one 1.5x off fails it, a weight
kick below the line passes D2 and one on it fails, the planted exponent passes D3 inside (0, 1.5) and fails outside;
the TOST's p against statsmodels' and against the 90 % interval; Holm over the tests decided, an undecided test taking
no share; the script read end to end from a run folder through dose.summarize; the preset it decides."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from seedlab.twins import dose
from seedlab.twins.rundir import RunDir

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "twins_dose_prereg.py"
spec = importlib.util.spec_from_file_location("twins_dose_prereg", SCRIPT)
p = importlib.util.module_from_spec(spec)
spec.loader.exec_module(p)

S, END = 100, 300
SEEDS = p.DESIGN["seeds"]
PASSAGE, KICK = p.PASSAGE, p.KICK
TEXTLESS = ("matched-gradient", "nudge", "weight-kick", "sign-gradient")


def frames(*, passage=1.0, kick=0.1, exponent=0.8, seeds=SEEDS, noise=0.03, seed=0, drop=()):
    """measures, checkpoints and doses of a hand-made measured run of the design: per seed k a line log10 distance =
    a_k + b_k log10 dose (its own intercept and slope, b_k around ``exponent``) through 8 ordinary rows (doses around
    0.1, different on every seed) and ordinary-row.0's weight arms at half and a quarter of its dose; the passage at
    dose 0.11 placed at ``passage`` x its seed's line, its weight arms on the line, the weight kick at the passage's
    dose at ``kick`` x the line, sign-gradient at x0.5, the nudge at dose 2e-5 on the line; log10 noise ``noise``.
    ``drop``: (seed, arm) pairs left out of every frame."""
    rng = np.random.default_rng(seed)
    m, ck, ds = [], [], []
    for k in seeds:
        a, b = rng.normal(0.6, 0.1), rng.normal(exponent, 0.05)
        runs = {f"ordinary-row.{i}": (10 ** rng.uniform(-1.05, -0.95), 1.0) for i in range(8)}
        x0 = runs["ordinary-row.0"][0]
        runs |= {"ordinary-row.0@w0.5": (x0 / 2, 1.0), "ordinary-row.0@w0.25": (x0 / 4, 1.0)}
        x = 0.11 * 10 ** rng.normal(0, 0.02)
        runs |= {PASSAGE: (x, passage), f"{PASSAGE}@w0.5": (x / 2, 1.0), f"{PASSAGE}@w0.25": (x / 4, 1.0),
                 KICK: (x, kick), "sign-gradient": (0.95 * x, 0.5), "matched-gradient": (5 * x, 0.7), "nudge": (2e-5, 1.0)}
        for arm, (dose_, factor) in runs.items():
            if (k, arm) in drop:
                continue
            dist = factor * 10 ** (a + b * np.log10(dose_) + rng.normal(0, noise))
            text = not arm.startswith(TEXTLESS)
            ce_s = rng.uniform(5, 7) if text else np.nan
            d50, dend = (0.005 * ce_s, 0.002 * ce_s) if text else (np.nan, np.nan)
            m.append({"kind": "injected", "seed": k, "condition": arm, "step": END, "distance": dist,
                      "distance_aligned": np.nan, "barrier": 1e-5 * dist, "heldout_ce_diff": rng.normal(0, 1e-3),
                      "passage_ce_s50": ce_s - d50, "twin_passage_ce_s50": ce_s, "passage_ce_final": ce_s - dend,
                      "twin_passage_ce_final": ce_s})
            ck.append({"seed": k, "condition": arm, "step": S, "passage_ce": ce_s, "twin_passage_ce": ce_s})
            ds.append({"seed": k, "condition": arm, "step": S, "theta_l2": dose_, "theta_q50": dose_ / 1e3,
                       "theta_q90": dose_ / 1e2, "theta_q99": dose_ / 10, "theta_max": dose_, "changed_fraction": 0.9,
                       "exp_avg_l2": dose_ / 10, "exp_avg_sq_l2": dose_ / 1e4})
    return pd.DataFrame(m), pd.DataFrame(ck), pd.DataFrame(ds)


def response(**kw) -> dose.DoseResponse:
    m, ck, ds = frames(**kw)
    return dose.dose_response(dose.arm_table(m, ck, ds, S))


def decided(**kw) -> pd.DataFrame:
    return p.decide(response(**kw), seeds=SEEDS).set_index("id")


def test_the_planted_design_passes_every_test_and_holm_is_applied():
    d = decided()
    assert list(d.index) == ["D1", "D2", "D3"] and list(d.columns) == p.COLUMNS[1:]
    assert d.confirmed.tolist() == [True, True, True] and (d.n == 8).all()
    assert d.loc["D1", "value"] == pytest.approx(0.0, abs=0.03) and d.loc["D1", "factor"] == pytest.approx(1.0, abs=0.07)
    assert -p.MARGIN < d.loc["D1", "low90"] < d.loc["D1", "high90"] < p.MARGIN  # the TOST's reading
    assert d.loc["D2", "value"] == pytest.approx(-1.0, abs=0.05) and d.loc["D2", "factor"] == pytest.approx(0.1, rel=0.15)
    assert d.loc["D3", "value"] == pytest.approx(0.8, abs=0.08) and math.isnan(d.loc["D3", "factor"])
    # Holm over the three: statsmodels' step-down on the raw p's
    from statsmodels.stats.multitest import multipletests

    assert d.holm_p.tolist() == pytest.approx(multipletests(d.p.tolist(), method="holm")[1].tolist())
    assert (d.holm_p >= d.p).all() and (d.holm_p < p.FAMILY).all()


def test_the_tests_read_dose_py_s_line_and_residuals():
    dr = response(passage=1.1)
    r = p.seed_residuals(dr, PASSAGE)
    row = dr.residuals[(dr.residuals.measure == "distance") & (dr.residuals.condition == PASSAGE)].iloc[0]
    assert list(r.index) == SEEDS and r.mean() == pytest.approx(row.resid)
    ci = dose.t_interval(r.to_numpy())
    assert (ci.low, ci.high) == pytest.approx((row.low, row.high))  # the same unit as the report's 95 % interval
    d = p.decide(dr, seeds=SEEDS).set_index("id")
    assert d.loc["D1", "value"] == pytest.approx(row.resid) and d.loc["D1", "value"] == pytest.approx(np.log10(1.1), abs=0.03)
    line = dr.line_rows.set_index("measure").loc["distance"]
    assert d.loc["D3", "value"] == pytest.approx(line.slope) and line.scale == "log-log"


def test_a_passage_off_the_line_fails_d1_and_a_kick_on_it_fails_d2():
    off = decided(passage=1.5)
    assert off.loc["D1", "confirmed"] is False and off.loc["D1", "p"] > 0.5
    assert off.loc["D1", "value"] == pytest.approx(np.log10(1.5), abs=0.03)
    assert off.confirmed[["D2", "D3"]].tolist() == [True, True]  # the others are decided without it
    low = decided(passage=1 / 1.5)
    assert low.loc["D1", "confirmed"] is False  # the margin holds on both sides
    just = decided(passage=1.3)  # log10 1.3 = 0.114, beyond the margin of 0.0969
    assert just.loc["D1", "confirmed"] is False
    on = decided(kick=1.0)
    assert on.loc["D2", "confirmed"] is False and on.loc["D2", "p"] > 0.05
    above = decided(kick=2.0)
    assert above.loc["D2", "confirmed"] is False and above.loc["D2", "p"] > 0.5


def test_the_exponent_passes_inside_its_bounds_only():
    assert decided(exponent=1.2).loc["D3", "confirmed"] is True
    steep = decided(exponent=1.9)
    assert steep.loc["D3", "confirmed"] is False and steep.loc["D3", "p"] > 0.5
    flat = decided(exponent=-0.2)
    assert flat.loc["D3", "confirmed"] is False and flat.loc["D3", "p"] > 0.5


def test_the_tost_p_is_statsmodels_and_reads_the_90_percent_interval():
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(3)
    for _ in range(200):
        r = rng.normal(rng.uniform(-0.15, 0.15), rng.uniform(0.01, 0.12), 8)
        want = ttost_paired(r, np.zeros_like(r), -p.MARGIN, p.MARGIN)[0]
        got = p.p_between(r, -p.MARGIN, p.MARGIN)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-15)
        lo, hi = p.interval90(r)
        assert (got < 0.05) == (-p.MARGIN < lo and hi < p.MARGIN)
    # one-sided tests by hand: t = mean / (sd / sqrt(n)) on n - 1 degrees of freedom
    from scipy import stats as sps

    v = np.array([-0.3, -0.1, -0.2, 0.05])
    t = v.mean() / (v.std(ddof=1) / 2)
    assert p.p_below(v, 0.0) == pytest.approx(sps.t.cdf(t, 3)) and p.p_above(v, 0.0) == pytest.approx(sps.t.sf(t, 3))
    assert p.p_below([1.0, 1.0], 2.0) == 0.0 and p.p_below([1.0, 1.0], 0.5) == 1.0  # no spread
    assert math.isnan(p.p_below([1.0], 0.0)) and math.isnan(p.p_between([1.0], 0.0, 2.0))


def test_holm_over_the_decided_tests_and_an_undecided_one_takes_no_share():
    assert p.holm_decided([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    h = p.holm_decided([0.01, math.nan, 0.04])
    assert h[0] == pytest.approx(0.02) and math.isnan(h[1]) and h[2] == pytest.approx(0.04)
    assert all(math.isnan(x) for x in p.holm_decided([math.nan] * 3))
    # the kick missing on one seed: D2 undecided (no decision on a subset), Holm over D1 and D3
    d = decided(drop=[(SEEDS[3], KICK)])
    assert d.loc["D2", "confirmed"] is None and math.isnan(d.loc["D2", "p"]) and "no decision on a subset" in d.loc["D2", "note"]
    assert d.loc[["D1", "D3"], "holm_p"].tolist() == pytest.approx(p.holm_decided(d.loc[["D1", "D3"], "p"].tolist()))
    assert d.confirmed[["D1", "D3"]].tolist() == [True, True]
    # the kick absent on every seed: undecided as well
    gone = decided(drop=[(k, KICK) for k in SEEDS])
    assert gone.loc["D2", "confirmed"] is None


def test_no_line_no_log_scale_or_a_seed_short_leaves_every_test_undecided():
    none = p.decide(None, seeds=SEEDS)
    assert none.confirmed.isna().all() and none.p.isna().all() and "dose.json" in none.note.iloc[0]
    m, ck, ds = frames()
    m.loc[m.condition == "nudge", "distance"] = 0.0  # one distance of 0: dose.py's rule puts the line on linear scales
    lin = p.decide(dose.dose_response(dose.arm_table(m, ck, ds, S)), seeds=SEEDS)
    assert lin.confirmed.isna().all() and "not on log10–log10" in lin.note.iloc[0]
    short = p.decide(response(seeds=SEEDS[:7]), seeds=SEEDS)  # a seed of the design never measured
    assert short.confirmed.isna().all() and "missing [5007]" in short.note.iloc[0]
    text = p.render(short)
    assert text.count("undecided") == 3


def _write_run(root: Path, config: dict, **kw) -> None:
    """A measured run folder of the hand-made frames: the tables Measured.read needs and every arm's dose.json."""
    m, ck, ds = frames(**kw)
    rd = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    m.to_parquet(rd.measure_table("measures"))
    ck.to_parquet(rd.measure_table("checkpoints"))
    for name in ("timecourse", "paths"):
        pd.DataFrame({"seed": pd.Series([], dtype=int)}).to_parquet(rd.measure_table(name))
    rd.measures_json.write_text(json.dumps({"steps": {"injection": S, "s50": S + 50, "final": END}}))
    rd.config.write_text(json.dumps(config))
    for r in ds.itertuples():
        path = rd.dose(int(r.seed), r.condition)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": S, "theta": {"l2": r.theta_l2, "per_tensor": {}, "changed_fraction": 0.9,
                                                         "abs_quantiles": {"0.5": r.theta_q50, "0.9": r.theta_q90,
                                                                           "0.99": r.theta_q99, "1.0": r.theta_max}},
                                    "exp_avg": {"l2": r.exp_avg_l2, "per_tensor": {}},
                                    "exp_avg_sq": {"l2": r.exp_avg_sq_l2, "per_tensor": {}}}))


def test_the_script_reads_a_run_folder_through_dose_summarize(tmp_path, capsys):
    run = tmp_path / "dose-confirm"
    _write_run(run, dict(p.DESIGN), passage=1.5)
    assert p.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| D1 |" in out and "**not confirmed**" in out and "Beside (no decision)" in out
    assert "report has not been written" in out  # no dose-*.csv: decided from the measured tables all the same
    v = json.loads((run / p.VERDICT).read_text())
    assert v["preregistered_design"] is True and v["exploratory"] is False and v["family_alpha"] == p.FAMILY
    tests = {t["id"]: t for t in v["tests"]}
    assert tests["D1"]["confirmed"] is False and tests["D2"]["confirmed"] is True and tests["D3"]["confirmed"] is True
    want = decided(passage=1.5)  # the same frames, straight through dose.dose_response
    assert tests["D1"]["value"] == pytest.approx(want.loc["D1", "value"]) and tests["D1"]["n"] == 8
    assert {r["condition"] for r in v["beside"]["residuals"]} >= {PASSAGE, KICK, "sign-gradient", f"{PASSAGE}@w0.5"}


def test_another_design_is_refused_unless_exploratory(tmp_path, capsys):
    run = tmp_path / "dose-b16"
    _write_run(run, {"seeds": [0, 1, 2, 3], "peak_lr": 1e-2, "min_lr": 1e-3}, seeds=[0, 1, 2, 3])
    assert p.main([str(run)]) == 2
    assert "not the pre-registered design" in capsys.readouterr().err and not (run / p.VERDICT).exists()
    out = tmp_path / "v.json"
    assert p.main([str(run), "--exploratory", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "decide nothing" in text and "**confirmed**" not in text and "passes (exploratory)" in text
    v = json.loads(out.read_text())
    assert v["exploratory"] is True and {t["n"] for t in v["tests"]} == {4}
    assert p.main([str(tmp_path / "nothing")]) == 2


def test_the_preset_is_dose_b16_at_5e_3_on_the_fresh_seeds_with_its_stated_run_count():
    import re

    from seedlab import presets
    from seedlab.config import load_config
    from seedlab.twins.config import TwinsConfig

    cfg, _ = load_config(TwinsConfig, "twins", "dose-b16-lr5e-3")
    base, _ = load_config(TwinsConfig, "twins", "dose-b16")
    a, b = cfg.model_dump(), base.model_dump()
    assert {k for k in a if a[k] != b[k]} == {"seeds", "peak_lr", "min_lr"}
    assert cfg.seeds == p.DESIGN["seeds"] and cfg.peak_lr == p.DESIGN["peak_lr"] and cfg.min_lr == p.DESIGN["min_lr"]
    assert cfg.min_lr == pytest.approx(cfg.peak_lr / 10) and 1e-3 < cfg.peak_lr < 1e-2
    s, runs = cfg.injection_step, len(cfg.arm_names)
    updates = len(cfg.seeds) * (s + runs * (cfg.steps - s)) + len(cfg.replica_seeds) * (cfg.steps - s)
    header = (presets.folder("twins") / "dose-b16-lr5e-3.yaml").read_text()
    assert f"x {runs} runs after s" in header and re.search(rf"= {updates:,} run-updates", header)
    assert "estimated" in header and "1,054 s" in header and p.PREREGISTRATION in header
