"""experiments/attribution_size_prereg.py: the seven pre-registered decisions follow their brackets."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest

from seedlab.attribution.analyses import additivity
from seedlab.attribution.analyses.size import H_STAR, SUMMARY, SizeAxis

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "attribution_size_prereg.py"
_spec = importlib.util.spec_from_file_location("attribution_size_prereg", SCRIPT)
prereg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prereg)

W, W64 = prereg.WEIGHT, prereg.NEIGHBOUR


def _star(kind: str, bent: tuple[str | None, float], status: str = "reached", label: str = "s+50",
          after: float = 50.0) -> dict:
    row = dict.fromkeys(H_STAR)
    row.update(query_kind=kind, weight=W, status=status, label=label if status == "reached" else None,
               after=after if status == "reached" else math.nan, bent_label=bent[0], bent_after=bent[1])
    return row


def _axis(stars: list[dict], errors: dict[tuple[str, float], float]) -> SizeAxis:
    summary = pd.DataFrame([dict.fromkeys(SUMMARY) | {"query_kind": k, "after": 1, "weight": w, "error": e}
                            for (k, w), e in errors.items()], columns=SUMMARY)
    empty = pd.DataFrame()
    return SizeAxis(0.1, 0.5, 0.05, 4, [W, W64, 1.0], 100, empty, summary, empty, empty,
                    pd.DataFrame(stars, columns=H_STAR), empty, empty, empty)


def _pairs(slope: float) -> pd.DataFrame:
    return pd.DataFrame([{"query_kind": "heldout", "comparison": additivity.PAIR, "after": 1, "slope": slope,
                          "slope_low": slope - 0.05, "slope_high": slope + 0.05, "pairs": 30}])


def _verdicts(axis: SizeAxis, pairs=None) -> dict[tuple[str, str], bool | None]:
    d = prereg.decide(axis, pairs)
    return {(r.id, r.query_kind): r.confirmed for r in d.itertuples()}


def test_every_bracket_decides_as_written():
    axis = _axis([_star("heldout", ("s+5", 5.0)), _star("self", ("s+10", 10.0)), _star("probe", ("s+2", 2.0))],
                 {("heldout", W): 0.01, ("heldout", W64): 0.02, ("probe", W): 0.05, ("probe", W64): 0.04})
    v = _verdicts(axis, _pairs(1.1))
    assert v[("S1", "heldout")] is True and v[("S2", "self")] is True
    assert v[("S2", "probe")] is False  # bent at s+2: before the law's bracket
    assert v[("S3", "heldout")] is True and v[("S3", "probe")] is False  # ē must fall with w
    assert v[("S4", "heldout")] is True  # h* at s+50
    assert v[("A1", "heldout")] is True
    assert len(prereg.decide(axis, _pairs(1.1))) == 7


@pytest.mark.parametrize(("star", "ok"), [
    (_star("heldout", (None, math.nan), status="not reached"), True),
    (_star("heldout", ("s+20", 20.0), label="s+20", after=20.0), False),
    (_star("heldout", ("s+20", 20.0), label="end", after=100.0), True),
])
def test_s4_and_a_bend_never_reached(star, ok):
    axis = _axis([star], {})
    v = _verdicts(axis, _pairs(0.5))
    assert v[("S4", "heldout")] is ok
    assert v[("S1", "heldout")] is False  # no bend, or one at s+20: outside s+5 .. s+10
    assert v[("A1", "heldout")] is False  # slope 0.5 outside [0.8, 1.2]
    assert v[("S3", "heldout")] is None and v[("S2", "self")] is None  # missing statistics stay undecided


def test_render_counts_the_decisions():
    axis = _axis([_star("heldout", ("s+5", 5.0))], {})
    text = prereg.render(prereg.decide(axis, None), pd.DataFrame(columns=["query_kind", "rate", "epsilon", "eps_nl",
                                                                           "predicted", "low", "high"]), "bank")
    assert "2 of 7 decisions defined, 2 confirmed" in text
