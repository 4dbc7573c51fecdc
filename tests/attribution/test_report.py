"""The attribution report only renders (that its modules load no torch and import no scipy:
tests/common/test_render_only.py): every number it prints comes from a computing module (tested
here: stats.design, stats.integrity, stats.seconds_per_seed; rundir.read_attributed reads the
files), its sections come in a newcomer's order, and every estimator has one colour in every figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import same_color, to_rgba

from helpers import attribution_frame
from seedlab.attribution.report import figures
from seedlab.attribution.analyses import stats
from seedlab.attribution.analyses.horizon import UNROLL, linear_response
from seedlab.attribution.estimators.registry import ESTIMATORS
from seedlab.attribution.report.bank import write_report
from seedlab.attribution.bank.rundir import BankDir, read_attributed
from seedlab.errors import SeedlabError

HORIZONS = ((5, "s+1"), (6, "s+2"), (14, "end"))
CONFIG = {"model": "mini", "injection_step": 4, "batch_size": 4, "optimizer": "adamw", "peak_lr": 0.01, "steps": 14,
          "injection_row": 0, "attribute": {"h_star_rho": 0.5}}


def _frame():
    """unroll tracks the measured effect until s+2, sgd at s+1 only; random: a baseline; a replicate."""
    def until(last, sd):
        return lambda m, rng, h: m + sd * rng.normal(size=len(m)) if h <= last else rng.normal(size=len(m))

    return attribution_frame({UNROLL: until(6, 0.1), "sgd": until(5, 0.3), "random": lambda m, rng, h: rng.normal(
        size=len(m))}, horizons=HORIZONS, own=0.3, n=12, replicate=lambda h: 0.2, kinds=("passage", "heldout"))


def _bank(root: Path) -> Path:
    """An attributed bank folder without training: attribution.parquet, config, integrity and timings."""
    root.mkdir(parents=True)
    _frame().to_parquet(root / "attribution.parquet")
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "integrity.json").write_text(json.dumps({"seeds": {"0": {"replica": {"steps_compared": [4, 5, 6, 14]},
                                                                     "own_row": {}}, "1": {"own_row": {}}}}))
    (root / "attribution.json").write_text(json.dumps({"seconds": {"sgd": {"0": 1.0, "1": 2.5}, UNROLL: {}}}))
    return root


# ---------------------------------------------------------------- the estimator table


def test_the_estimator_table_is_read_without_running_anything():
    assert stats.is_baseline("random") and stats.is_reference(UNROLL) and not stats.is_baseline("sgd")
    assert ESTIMATORS["sgd"].fn.__name__ == "sgd_one_step"  # estimators.sgd_one_step, imported at its first call


# ---------------------------------------------------------------- the numbers the report states of the bank


def test_design_integrity_and_seconds_by_hand():
    df = _frame()
    d = stats.design(df)
    assert d.seeds == [0, 1, 2] and d.candidates == {"passage": 6, "heldout": 6} and d.queries == {"heldout": 2}
    assert not d.self_queries and d.horizons == [("s+1", 5), ("s+2", 6), ("end", 14)]
    assert d.estimators == [UNROLL, "sgd", "random"]
    record = {"seeds": {"0": {"replica": {"steps_compared": [4, 5, 14]}, "own_row": {}}, "1": {"own_row": {}}}}
    i = stats.integrity(record, df)
    assert (i.replica_seeds, i.replica_steps, i.own_row_seeds) == (["0"], (3, 4, 14), ["0", "1"])
    assert i.control_measured_zero and i.control_estimates_zero
    moved = df.copy()
    moved.loc[(moved.candidate_kind == "control") & (moved.estimator == "sgd"), "estimate"] = 1e-12
    i = stats.integrity({}, moved)
    assert (i.replica_seeds, i.replica_steps, i.own_row_seeds) == ([], None, [])
    assert i.control_measured_zero and not i.control_estimates_zero
    assert not stats.integrity({}, df[df.candidate_kind != "control"]).control_measured_zero  # no control: not shown
    assert stats.seconds_per_seed({"sgd": {"0": 1.0, "1": 2.5}, "adam": {}}) == {"sgd": 1.75}


def test_read_attributed(tmp_path):
    root = _bank(tmp_path / "bank")
    a = read_attributed(root)
    assert a.dir == BankDir(root) and a.config == CONFIG and a.pairs is None and "seconds" in a.meta
    pd.testing.assert_frame_equal(a.df, pd.read_parquet(root / "attribution.parquet"))
    (root / "attribution.parquet").unlink()
    with pytest.raises(SeedlabError, match=r"no attribution\.parquet \(run `seedlab attribution attribute "):
        read_attributed(root)


# ---------------------------------------------------------------- the report's order


def test_the_report_opens_with_its_answer_then_the_headline_and_the_figures(tmp_path):
    root = _bank(tmp_path / "bank")
    text = write_report(root).read_text()
    blocks = text.split("\n\n")
    assert blocks[0].startswith("# Attribution") and blocks[1].startswith("**heldout queries.** ")
    assert "exact linear response (unroll)" in blocks[1]  # the first sentence: until when unroll carries
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert heads == ["## Headline: within seed", "## Figures", "## Design", "## Integrity", "## The measured effects",
                     "## Across seeds", "## Against the baselines", "## Decay between horizons",
                     "## The linear-response horizon", "## Sign agreement, weighted by |Δ L|", "## Magnitude",
                     "## Within each candidate kind", "## What the estimators are"]
    assert "(4 steps, 4 .. 14)" in text and "| sgd | " in text.split("## What the estimators are")[1]
    assert "| 1.75 |" in text  # sgd's mean seconds per seed
    for png in ("correlation-spearman.png", "linear_response.png", "scatter-q0.png"):
        assert (root / png).stat().st_size > 5000


# ---------------------------------------------------------------- colours


def test_one_colour_map_every_estimator_its_own_colour():
    names = [*ESTIMATORS, stats.KIND]
    assert set(names) <= set(figures.COLORS)
    colours = [figures.color(n) for n in names]
    assert len({tuple(np.round(to_rgba(c), 3)) for c in colours}) == len(names)  # distinct
    assert not any(same_color(c, s) for c in colours for s in (*figures.SPARE, figures.REFERENCE_COLOR))
    assert all(same_color(figures.color(r), "k") for r in stats.REFERENCES)
    assert figures.color("mypkg.mod:score") == figures.color("mypkg.mod:score") in figures.SPARE  # a plug-in: stable


def test_each_estimator_has_its_colour_in_every_panel_and_figure(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.append(fig) or path)
    df = _frame()
    an = stats.analyse(df, resamples=50)
    figures.correlation_figure(an.correlations, BankDir(tmp_path))
    figures.linear_response_figure(linear_response(df, resamples=50), BankDir(tmp_path))
    seen = {}
    for fig in drawn:
        for ax in fig.axes:
            for line in ax.get_lines():
                label = line.get_label()
                name = label.removeprefix(f"ρ({UNROLL}, ").removesuffix(")")
                if name == f"ρ(measured, {UNROLL}":
                    name = UNROLL
                if name in (*ESTIMATORS, stats.KIND):
                    seen.setdefault(name, []).append(line.get_color())
    assert {"sgd", "random", UNROLL} <= set(seen)
    for name, cs in seen.items():
        assert all(same_color(c, figures.color(name)) for c in cs), name


def test_a_figure_with_no_defined_correlation_says_so(tmp_path):
    df = _frame()
    df[["measured", "measured_replicate"]] = 0.0  # nothing moved: every Spearman with the effect is undefined
    an = stats.analyse(df, resamples=20)
    assert an.correlations.rho.isna().all()
    lr = linear_response(df.assign(estimate=0.0), resamples=20)  # nor does any estimate: ρ(unroll, e) undefined too
    for fig in (figures.correlation_figure(an.correlations, BankDir(tmp_path)),
                figures.linear_response_figure(lr, BankDir(tmp_path))):
        assert fig.path is None and fig.caption == figures.UNDEFINED
    assert not list(tmp_path.iterdir())
