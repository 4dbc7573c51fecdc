"""experiments/attribution_regime_prereg.py: the four pre-registered tests read the right cells, their one-sided
bootstrap p-values and Holm's step-down, and a test whose inputs are missing is undecided (synthetic banks)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "attribution_regime_prereg.py"
spec = importlib.util.spec_from_file_location("attribution_regime_prereg", SCRIPT)
p = importlib.util.module_from_spec(spec)
spec.loader.exec_module(p)

END = 130
KINDS = ("heldout", "probe")  # two kinds, so lds.py pools them as "all" (what the tests read)


def _groups(rng, estimators: dict[str, float], retest_noise: float, seeds=3, queries=4, subsets=30, rows=40):
    """groups, group_rows, scores and retest of a synthetic bank: each estimator's value is the truth plus noise of
    the given size (0: the truth); α = 5 % is read, α = 1 % a decoy where every estimator is perfect."""
    true = rng.normal(size=(seeds, queries, rows))
    measured, members, retest = [], [], []
    for s in range(seeds):
        for a, n in ((0.05, 6), (0.01, 2)):
            for k in range(subsets):
                pick = rng.choice(rows, size=n, replace=False)
                members += [{"seed": s, "alpha": a, "subset": k, "step": 100 + int(j) // 4, "row": int(j) % 4}
                            for j in pick]
                for q in range(queries):
                    m = true[s, q, pick].sum()
                    for h, label in ((END, "end"), (101, "s+1")):
                        measured.append({"seed": s, "alpha": a, "subset": k, "query": f"q{q}", "query_kind": KINDS[q % 2],
                                         "horizon": h, "label": label, "measured": m})
                        retest.append({"seed": s, "removal": "group", "arm": f"group.{a:g}.{k}", "nudge": "w",
                                       "step": -1, "row": -1, "alpha": a, "subset": k, "query": f"q{q}",
                                       "query_kind": KINDS[q % 2], "horizon": h, "label": label, "measured": m,
                                       "retest": m + (retest_noise if a == 0.05 else 0) * rng.normal()})
    scores = []
    for s in range(seeds):
        for q in range(queries):
            for j in range(rows):
                for e, noise in estimators.items():
                    for h in (END, 101):
                        scores.append({"estimator": e, "unit": "nats/token", "seed": s, "query": f"q{q}", "horizon": h,
                                       "step": 100 + j // 4, "row": j % 4, "value": true[s, q, j] + noise * rng.normal()})
    return pd.DataFrame(measured), pd.DataFrame(members), pd.DataFrame(scores), pd.DataFrame(retest)


def _attribution(rng, gap: float, seeds=3, candidates=12):
    """attribution.parquet-like rows at the end: unroll = measured, the estimators at θ_s measured blended with
    noise so that their ρ is about 1 − gap."""
    rows = []
    for s in range(seeds):
        for q in range(3):
            m = rng.normal(size=candidates)
            for c in range(candidates):
                for e in ["unroll", *p.THETA_S]:
                    est = m[c] if e == "unroll" else (1 - gap) * m[c] + gap * 3 * rng.normal()
                    rows.append({"seed": s, "candidate": f"c{c}", "candidate_kind": "heldout", "query": f"q{q}",
                                 "query_kind": "heldout", "horizon": END, "after": 30, "label": "end",
                                 "measured": m[c], "measured_replicate": np.nan, "estimator": e, "estimate": est})
    return pd.DataFrame(rows)


def _bank(rng, estimators, retest_noise, gap):
    g, m, s, r = _groups(rng, estimators, retest_noise)
    return p.Bank(g, m, s, r, _attribution(rng, gap))


@pytest.fixture(scope="module")
def decided():
    rng = np.random.default_rng(0)
    p.RESAMPLES = 300
    b8 = _bank(rng, {"metagrad": 30.0, p.TRUNCATED: 0.3}, retest_noise=3.0, gap=0.9)
    b128 = _bank(rng, {"metagrad": 0.3, p.TRUNCATED: 0.3}, retest_noise=0.1, gap=0.95)
    return b8, b128, p.decide(b8, b128).set_index("id")


def test_each_test_reads_its_cell_and_confirms_what_the_banks_plant(decided):
    _, _, d = decided
    assert list(d.index) == ["R1", "R2", "R3", "R4"] and list(d.columns) == p.COLUMNS[1:]
    assert d.confirmed.tolist() == [True, True, True, True]
    assert d.loc["R1", "value"] > 0.5 and d.loc["R2", "value"] > 0.5  # planted: the truth against noise
    assert d.loc["R3", "value"] > p.MARGIN and d.loc["R3", "margin"] == p.MARGIN
    assert d.loc["R4", "value"] > 0.2
    assert (d.p <= d.holm_p).all() and (d.holm_p < p.FAMILY).all()


def test_a_test_against_its_hypothesis_is_not_confirmed_and_a_missing_one_undecided(decided):
    b8, b128, _ = decided
    d = p.decide(b128, b8).set_index("id")  # the banks swapped: R1 and R4 run the other way
    c = d.confirmed.to_dict()
    assert c["R1"] is False and c["R4"] is False and d.loc["R1"].p > 0.5
    rng = np.random.default_rng(1)
    close = _bank(rng, {"metagrad": 0.3, p.TRUNCATED: 0.3}, retest_noise=0.1, gap=0.2)  # unroll only ~0.2 above
    assert p.decide(b8, close).set_index("id").confirmed.to_dict()["R3"] is False  # within the margin of 0.3
    gone = p.Bank(b8.groups, b8.group_rows, b8.scores[b8.scores.estimator != p.TRUNCATED], None, None)
    d = p.decide(gone, b128).set_index("id")
    c = d.confirmed.to_dict()
    assert c["R2"] is None and math.isnan(d.loc["R2"].p) and c["R4"] is None
    assert c["R1"] is True  # the others are decided without them


def test_p_values_and_holm():
    assert p.p_value(np.array([1.0, 2.0, 3.0])) == pytest.approx(1 / 4)
    assert p.p_value(np.array([-1.0, 2.0, np.nan, 3.0]), margin=0.0) == pytest.approx(2 / 4)
    assert p.p_value(np.array([0.2, 0.5]), margin=0.3) == pytest.approx(2 / 3)
    assert math.isnan(p.p_value(np.array([np.nan])))
    assert p.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    h = p.holm([0.01, math.nan, 0.04])  # an undecided test takes no share
    assert h[0] == pytest.approx(0.02) and math.isnan(h[1]) and h[2] == pytest.approx(0.04)
