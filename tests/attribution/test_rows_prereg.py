"""experiments/attribution_rows_prereg.py: the five pre-registered decisions read the right rows and thresholds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "attribution_rows_prereg.py"
spec = importlib.util.spec_from_file_location("attribution_rows_prereg", SCRIPT)
p = importlib.util.module_from_spec(spec)
spec.loader.exec_module(p)


def _age(young=(0.9, 0.7, 0.97), old=(0.0, -0.3, 0.3)):
    rows = []
    for (h, (v, lo, hi)) in ((101, young), (200, old)):
        rows.append({"estimator": "metagrad", "query_kind": "all", "step": 100, "horizon": h, "rho_within": v,
                     "rho_within_low": lo, "rho_within_high": hi})
        # a decoy: another kind and another estimator with the opposite verdicts
        rows.append({"estimator": "tracin", "query_kind": "all", "step": 100, "horizon": h, "rho_within": -v,
                     "rho_within_low": -1, "rho_within_high": -0.9})
        rows.append({"estimator": "metagrad", "query_kind": "heldout", "step": 100, "horizon": h, "rho_within": -v,
                     "rho_within_low": -1, "rho_within_high": -0.9})
    return pd.DataFrame(rows)


def _table(ekfac_low=0.02, worst_high=0.2, missing=()):
    rows = []
    for e in p.ESTIMATORS:
        if e in missing:
            continue
        rows.append({"estimator": e, "alpha": 0.05, "query_kind": "all", "horizon": 200, "lds": 0.1,
                     "low": ekfac_low if e == "ekfac" else -0.05, "high": worst_high if e == "trak" else 0.15})
        rows.append({"estimator": e, "alpha": 0.01, "query_kind": "all", "horizon": 200, "lds": 0.9, "low": 0.8,
                     "high": 0.95})  # α = 1 %: not read
    return pd.DataFrame(rows)


def _metagrad(ratio=50.0, seeds=4):
    rows = []
    for s in range(seeds):
        for age, v in ((7, 1.0), (30, ratio if s else ratio * 100), (1, 1e6)):
            rows += [{"seed": s, "query": "q", "horizon": 101, "step": 101 - age, "row": i, "value": v * (-1) ** i}
                     for i in range(3)]
    return pd.DataFrame(rows)


def test_all_confirmed_and_each_threshold_decides():
    d = p.decide(_age(), _table(), _metagrad(), 100, 200).set_index("id")
    assert list(d.index) == ["D1", "D2", "D3", "D4", "D5"] and d.confirmed.all()
    assert d.loc["D3"].value == 50.0  # the smallest seed's ratio, |values| (signs alternate)
    assert "trak" in d.loc["D5"].statistic
    d = p.decide(_age(young=(0.9, 0.5, 0.97), old=(0.0, -0.5, 0.3)), _table(ekfac_low=0.0, worst_high=0.3),
                 _metagrad(ratio=10.0), 100, 200).set_index("id")
    assert not d.confirmed.any()  # every bound is strict


def test_missing_statistics_are_undecided_not_confirmed():
    d = p.decide(_age().iloc[:0], _table(missing=("ekfac", "trak")), pd.DataFrame(columns=["seed", "query", "horizon", "step", "row", "value"]), 100, 200)
    assert d.confirmed.isna().all() or (d.confirmed.map(lambda v: v is None)).all()
    assert np.isnan(d.set_index("id").loc["D1"].value)
    assert "undecided" in p.render(d)


def test_magnitudes_by_age_are_medians_of_absolute_values_per_bin():
    m = p.magnitudes(_metagrad(ratio=50.0), 101)
    assert m[pd.Interval(5, 10)] == 1.0 and m[pd.Interval(0, 1)] == 1e6
    assert m[pd.Interval(20, 50)] == 50.0  # seeds 1-3 hold 50, seed 0 5,000: the median over rows


def test_the_growth_table_reads_each_bank_at_its_end_and_refuses_a_missing_horizon(tmp_path, capsys):
    """experiments/metagrad_growth.py: D3's statistic per seed and the magnitudes by age, per bank, from the tested
    functions above; a bank without the horizon asked for is one line, exit 2."""
    import json

    spec2 = importlib.util.spec_from_file_location("metagrad_growth", SCRIPT.with_name("metagrad_growth.py"))
    g = importlib.util.module_from_spec(spec2)
    spec2.loader.exec_module(g)
    bank = tmp_path / "bank"
    bank.mkdir()
    (bank / "config.json").write_text(json.dumps({"steps": 101}))
    _metagrad(ratio=50.0).to_parquet(bank / "metagrad.parquet")
    assert g.main([str(bank)]) == 0
    out = capsys.readouterr().out
    assert "| bank | 101 | 5e+03, 50, 50, 50 | 1e+06 | 1 | 50 |" in out  # a column per age bin some bank holds
    assert g.main([str(bank), "--horizon", "130"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
