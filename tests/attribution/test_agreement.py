"""attribution/stats.py on frames whose answers are known, and the report on the session's tiny bank."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pandas as pd
import pytest

from seedlab.attribution import stats
from seedlab.attribution.report import write_report


def _frame(estimate, seeds=(0, 1, 2), n=6, queries=("q0", "q1"), noise=0.0):
    """attribution.parquet's shape: one estimator, two horizons, measured = a candidate effect shared by
    every seed (plus seeded noise), estimate = estimate(measured)."""
    rng = np.random.default_rng(0)
    base = {(c, q): rng.normal() for c in range(n) for q in queries}
    rows = []
    for k in seeds:
        for h, label in ((5, "s+1"), (9, "end")):
            for (c, q), m in base.items():
                m = m + noise * rng.normal()
                rows.append({"seed": k, "candidate": f"c{c}", "candidate_kind": "heldout", "query": q,
                             "query_kind": "heldout", "horizon": h, "after": h - 4, "label": label, "measured": m,
                             "estimator": "e", "estimate": estimate(m)})
            rows.append({"seed": k, "candidate": "own-row", "candidate_kind": "control", "query": "q0",
                         "query_kind": "heldout", "horizon": h, "after": h - 4, "label": label, "measured": 0.0,
                         "estimator": "e", "estimate": 0.0})
    return pd.DataFrame(rows)


def test_perfect_and_reversed_estimates():
    s = stats.summary(_frame(lambda m: 3 * m + 1))  # Pearson and Spearman do not see scale or offset
    e = s[s.estimator == "e"]
    assert np.allclose(e.spearman, 1) and np.allclose(e.pearson, 1)
    assert set(e.seeds) == {3} and set(e.candidates) == {6}  # the own-row control left out
    c = s[s.estimator == stats.CEILING]
    assert np.allclose(c.spearman, 1) and np.allclose(e.spearman_of_ceiling, 1)  # every seed measured the same
    r = stats.summary(_frame(lambda m: -m))
    assert np.allclose(r[r.estimator == "e"].spearman, -1) and np.allclose(r[r.estimator == "e"]["sign"], 0)


def test_noise_lowers_the_ceiling_and_two_seeds_have_no_interval():
    noisy = stats.summary(_frame(lambda m: m, noise=1.0, seeds=range(5)))
    c = noisy[noisy.estimator == stats.CEILING]
    assert (c.spearman < 0.9).all() and (c.spearman_low < c.spearman).all()
    two = stats.summary(_frame(lambda m: m, noise=1.0, seeds=(0, 1)))
    c2 = two[two.estimator == stats.CEILING]
    assert c2.spearman_low.isna().all() and c2.spearman.notna().all()


def test_mean_ci_and_constant_inputs():
    m, lo, _, n = stats.mean_ci([0.2, 0.4, np.nan, 0.6])
    assert (m, n) == (pytest.approx(0.4), 3) and lo == pytest.approx(0.4 - 4.302653 * 0.2 / math.sqrt(3), rel=1e-6)
    assert stats.mean_ci([np.nan])[3] == 0
    flat = stats.agreement(_frame(lambda m: 0.5))  # a constant estimate has no correlation
    assert flat.spearman.isna().all() and flat["sign"].notna().all()


def test_effects_table():
    e = stats.effects(_frame(lambda m: m))
    assert list(e.label) == ["s+1", "end"] and set(e.n) == {36}


def test_report_sections_and_figures(tiny_bank, tmp_path):
    bank = shutil.copytree(tiny_bank / "bank", tmp_path / "bank")
    df = pd.read_parquet(bank / "attribution.parquet")
    df[df.estimator.isin(["sgd", "ekfac"])].to_parquet(bank / "attribution.parquet")  # fewer panels: a faster test
    path = write_report(bank)
    text = path.read_text()
    for section in ("## Integrity", "## The measured effects", "### self queries", "### heldout queries",
                    "### probe queries", "## How close each estimator gets to the ceiling", "## What the estimators are"):
        assert section in text
    assert "Replica control (seed 0)" in text and "measured effect exactly 0 at every horizon: yes" in text
    assert "every estimate exactly 0: yes" in text
    assert "| **ceiling** |" in text and "Skipped" not in text
    for png in ("scatter-self.png", "scatter-heldout.png", "scatter-probe.png", "correlation-spearman.png",
                "correlation-pearson.png"):
        assert (bank / png).stat().st_size > 5000
