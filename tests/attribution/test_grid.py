"""attribution/analyses/grid.py (the B × lr grid's cell summaries, table, law with a fixed ε_nl, and h*'s effect), its words
(report_grid.py) and the driver's --dry-run (experiments/attribution_grid.py), on synthetic frames whose answers are
known: tests/helpers.py's attribution frame, with unroll-tangent = measured·(1 + r(h)) so that ē(1, h) = r/(1 + r)
exactly, candidates' arms at ε1·e^{λ(after − 1)} and nudges growing at λ (test_size.py's and test_chaos.py's
constructions)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import attribution_frame, kept_round_trip
from seedlab.attribution.analyses import grid, size
from seedlab.attribution.analyses.grid import Cell, effect_of, law, summarise, table, weight_one
from seedlab.attribution.bank.measure import WEIGHTED_COLUMNS
from seedlab.attribution.report.grid import grid_report
from seedlab.attribution.bank.rundir import Attributed, BankDir
from seedlab.attribution.analyses.stats import TANGENT, UNROLL
from seedlab.errors import SeedlabError

S = 100  # the injection step
HORIZONS = ((101, "s+1"), (102, "s+2"), (105, "s+5"), (110, "s+10"), (120, "s+20"), (130, "end"))
SEEDS = (0, 1, 2)
LAM, EPS1 = math.log(2), 1e-3
RESAMPLES = 60
ROOT = Path(__file__).resolve().parents[2]


def _ratio(bend_after: int):
    """r(h): ē(1, h) = r/(1 + r) = 0.01 up to the horizon before ``bend_after``, 0.5 from it on."""
    return lambda h: 1.0 if h - S >= bend_after else 1 / 99


def _unroll(last_after: int):
    """unroll = measured + small noise up to ``last_after`` updates after s, independent noise beyond."""
    return lambda m, rng, h: m + 0.05 * rng.normal(size=len(m)) if h - S <= last_after else rng.normal(size=len(m))


def _distances(seeds=SEEDS, n=12, lam=LAM, eps1=EPS1) -> pd.DataFrame:
    """Each candidate's arm (w = 1) at f·ε1·e^{λ(after−1)} (f 0.5, 1, 4 in turn: the median is ε1·e^{...}), a
    replicate arm (left out of ε) and two nudges growing at λ."""
    rows = []
    for k in seeds:
        for a in range(0, HORIZONS[-1][0] - S + 1):
            for c in range(n):
                f = (0.5, 1.0, 4.0)[c % 3]
                d = 0.0 if a == 0 else f * eps1 * math.exp(lam * (a - 1))
                rows.append({"seed": k, "arm": f"c{c}", "kind": "candidate", "candidate": f"c{c}", "weight": 1.0,
                             "step": S + a, "after": a, "distance": d})
                rows.append({"seed": k, "arm": f"replicate.c{c}", "kind": "replicate", "candidate": f"c{c}",
                             "weight": 1.0, "step": S + a, "after": a, "distance": 100 * d})
            nudge = 0.0 if a == 0 else min(1e-9 * math.exp(lam * (a - 1)), 1.0)
            for t in ("a", "b"):
                rows.append({"seed": k, "arm": f"nudge.{t}", "kind": "nudge", "candidate": None, "weight": math.nan,
                             "step": S + a, "after": a, "distance": nudge})
    return pd.DataFrame(rows)[size.DISTANCES]


def _attributed(tmp: Path, *, bend_after=5, last_after=5, batch=8, lr=1e-2, n=12) -> Attributed:
    r = _ratio(bend_after)
    df = attribution_frame({UNROLL: _unroll(last_after), TANGENT: lambda m, rng, h: m * (1 + r(h)),
                            "sgd": lambda m, rng, h: m + rng.normal(size=len(m)),
                            "random": lambda m, rng, h: rng.normal(size=len(m))},
                           horizons=HORIZONS, seeds=SEEDS, n=n, own=0.3, replicate=0.2, s=S)
    config = {"batch_size": batch, "peak_lr": lr, "min_lr": lr / 10, "injection_step": S, "seeds": list(SEEDS),
              "attribute": {"h_star_rho": 0.5}}
    return Attributed(BankDir(tmp), df, config, {}, {}, None, None, _distances(n=n))


@pytest.fixture(scope="module")
def cell(tmp_path_factory) -> Cell:
    return summarise(_attributed(tmp_path_factory.mktemp("bank")), "b8-lr1e-2", resamples=RESAMPLES)


def test_weight_one_is_weighted_parquet_and_passes_the_size_axis(tmp_path):
    a = _attributed(tmp_path)
    w = weight_one(a.df)
    assert list(w.columns) == WEIGHTED_COLUMNS and (w.weight == 1.0).all()
    assert len(w) == len(a.df.drop_duplicates(["seed", "candidate", "query", "horizon"]))
    assert (w.candidate_kind == "control").any()  # the own-row controls kept (size.py leaves them out)
    sz = size.analyse(w, a.df, a.distances, resamples=RESAMPLES)
    h = sz.h_star.iloc[0]
    assert sz.weights == [1.0] and (h.bent_label, h.bent_after, h.bent_previous_after) == ("s+5", 5.0, 2.0)
    e = sz.summary.set_index("after").error
    assert e[1] == pytest.approx(0.01) and e[5] == pytest.approx(0.5)
    assert sz.epsilon.epsilon.iloc[0] == pytest.approx(EPS1) and sz.epsilon.after.iloc[0] == 1
    assert sz.scales.eps_nl.isna().all()  # one weight: no crossing between two weights
    with pytest.raises(SeedlabError, match="missing"):
        weight_one(a.df.drop(columns="label"))


def test_summarise_gives_the_cell_its_numbers(cell):
    assert (cell.batch_size, cell.peak_lr, cell.min_lr, cell.seeds, cell.injection_step) == (8, 1e-2, 1e-3, [0, 1, 2],
                                                                                             S)
    assert cell.rate == pytest.approx(LAM, rel=1e-9) and cell.candidates == 12
    assert cell.epsilon == pytest.approx(EPS1) and cell.epsilon_after == 1
    sz = cell.size.set_index("query_kind").loc["heldout"]
    assert (sz.bent_label, sz.bent_after, sz.bent_previous_after, sz.last_after) == ("s+5", 5.0, 2.0, 30.0)
    # the bend along horizons: ln ē from 0.01 (D = 2ε1) to 0.5 (D = 16ε1) crosses 0.1 at a known distance
    t = (math.log(0.1) - math.log(0.01)) / (math.log(0.5) - math.log(0.01))
    assert sz.eps_bent == pytest.approx(EPS1 * math.exp(math.log(2) + t * math.log(8)), rel=1e-6)
    st = cell.h_star.set_index("response").loc[UNROLL]
    assert (st.status, st.label, st.after, st.previous_after, st.ordinal, st.horizons) == ("reached", "s+10", 10.0,
                                                                                           5.0, 3.0, 6)
    r = cell.responses
    assert {"row invariance", "ceiling", UNROLL, TANGENT} <= set(r.compared)
    e = cell.estimators
    assert {UNROLL, TANGENT, "sgd", "random", "row invariance"} <= set(e.estimator)
    assert e[e.estimator == UNROLL].reference.all() and e[e.estimator == "random"].baseline.all()


def test_a_cell_round_trips_through_its_folder_exactly(cell, tmp_path):
    kept = dataclasses.replace(cell, stages={"bank": 12.5, "attribute": 3.0, "summarise": 0.4})
    back = Cell.from_dir(kept.to_dir(tmp_path / "b8-lr1e-2"))
    assert back.equals(kept) and not back.equals(cell)
    for topic in grid.TOPICS:
        pd.testing.assert_frame_equal(getattr(back, topic), getattr(kept, topic))
    assert back.stages == kept.stages and back.seeds == [0, 1, 2]
    with pytest.raises(SeedlabError, match="cell.json"):
        Cell.from_dir(tmp_path)


KEPT = sorted(p.parent for p in (ROOT / "docs" / "results" / "grid").glob("*/cell.json"))


@pytest.mark.parametrize("folder", KEPT, ids=[p.name for p in KEPT])
def test_every_committed_kept_cell_reads_back_and_writes_the_same_bytes(folder, tmp_path):
    """docs/results/grid/<cell>/: read, written again byte for byte, read back to identical frames of the declared
    types."""
    c = kept_round_trip(Cell, folder, tmp_path)
    assert c.estimators.baseline.dtype == bool and c.errors.horizon.dtype == "int64" and c.size.eps_nl.dtype == float


def _with(c: Cell, *, name, batch=8, lr=1e-2, status="reached", label="s+10", after=10.0, previous=5.0, ordinal=3.0,
          eps_nl=math.nan, bent=("s+5", 2.0, 5.0)) -> Cell:
    """``c`` as another cell: its B and lr, unroll's h*, the bend bracket and its own ε_nl replaced."""
    h = c.h_star.copy()
    u = h.response == UNROLL
    h.loc[u, ["status", "label"]] = [status, label]
    h.loc[u, ["after", "previous_after", "ordinal"]] = [after, previous, ordinal]
    s = c.size.copy()
    s["bent_label"], s["bent_previous_after"], s["bent_after"] = bent[0], bent[1], bent[2]
    s["eps_nl"] = s["eps_nl_low"] = s["eps_nl_high"] = eps_nl
    return dataclasses.replace(c, name=name, batch_size=batch, peak_lr=lr, h_star=h, size=s)


def test_law_predicts_with_the_reference_eps_nl_not_the_cells_own(cell):
    c = dataclasses.replace(_with(cell, name="x", eps_nl=1.0), rate=0.5, rate_low=0.4, rate_high=0.6,
                            rate_window=math.nan, epsilon=1e-3, epsilon_low=1e-3, epsilon_high=1e-3, epsilon_after=1.0)
    out = law([c], {"heldout": (1e-2, 5e-3, 2e-2)}, "the size bank").iloc[0]
    assert out.predicted == pytest.approx(1 + math.log(10) / 0.5)  # 5.61, not 1 + ln(1000)/0.5 from its own 1.0
    assert (out.predicted_low, out.predicted_high) == pytest.approx((1 + math.log(5) / 0.6, 1 + math.log(20) / 0.4))
    assert (out.eps_nl, out.source, out.batch_size, out.peak_lr) == (1e-2, "the size bank", 8, 1e-2)
    # [3.68, 8.49] meets the bend bracket (2, 5] and h*'s (5, 10]
    assert out.consistent_bent and out.consistent
    assert math.isnan(law([c], {"probe": (1e-2, 5e-3, 2e-2)}).iloc[0].predicted)  # no reference for the kind
    # the common-window λ, where measured, is the law's (cells of different lengths compare); windowed=False: the default
    w = dataclasses.replace(c, rate_window=1.0, rate_window_low=1.0, rate_window_high=1.0)
    assert law([w], {"heldout": (1e-2, 1e-2, 1e-2)}).iloc[0].predicted == pytest.approx(1 + math.log(10) / 1.0)
    assert law([w], {"heldout": (1e-2, 1e-2, 1e-2)}, windowed=False).iloc[0].predicted == pytest.approx(
        1 + math.log(10) / 0.5)


def test_consistent_follows_the_brackets(cell):
    base = dict(rate=0.5, rate_low=0.5, rate_high=0.5, rate_window=math.nan, epsilon=1e-3, epsilon_low=1e-3, epsilon_high=1e-3,
                epsilon_after=1.0)
    ref = {"heldout": (1e-2, 1e-2, 1e-2)}  # predicted 5.61 exactly

    def one(**kw):
        return law([dataclasses.replace(_with(cell, name="x", **kw), **base)], ref).iloc[0]

    early = one(bent=("s+5", 2.0, 5.0), label="s+5", after=5.0, previous=2.0)
    assert (early.consistent_bent, early.consistent) == (False, False)  # 5.61 is past (2, 5]
    late = one(bent=("s+10", 5.0, 10.0), label="s+10", after=10.0, previous=5.0)
    assert (late.consistent_bent, late.consistent) == (True, True)
    never = one(bent=("", math.nan, math.nan), status="not reached", label="", after=math.nan, previous=math.nan)
    assert (never.consistent_bent, never.consistent) == (False, False)  # 5.61 < the last horizon, 30
    undefined = one(status="undefined", label="", after=math.nan, previous=math.nan)
    assert undefined.consistent is None


def test_table_has_one_row_per_cell_and_kind(cell):
    cells = [_with(cell, name=f"b{b}-lr{lr:g}", batch=b, lr=lr) for lr in (1e-2, 1e-3) for b in (8, 32, 128)]
    t = table(cells)
    assert len(t) == 6 and list(t.cell) == [c.name for c in cells]
    assert list(t.batch_size) == [8, 32, 128] * 2 and list(t.peak_lr) == [1e-2] * 3 + [1e-3] * 3
    assert (t.query_kind == "heldout").all() and (t.h_star_label == "s+10").all()
    assert [c for c in t.columns if c.startswith("unroll@") and "_" not in c] == [f"unroll@{h}" for _, h in HORIZONS]
    assert t["unroll@s+1"].iloc[0] > 0.9 and t["unroll@end"].iloc[0] < 0.5
    assert (t.first_label == "s+1").all() and (t.last_label == "end").all()
    assert t.invariance_first.iloc[0] > 0.5 and t.best.iloc[0] == "sgd" and t.best_baseline.iloc[0] == "random"
    assert t.epsilon.iloc[0] == pytest.approx(EPS1) and t.rate.iloc[0] == pytest.approx(LAM)


def _effect_table(h: dict[tuple[int, float], float]) -> pd.DataFrame:
    rows = [{"query_kind": "heldout", "batch_size": b, "peak_lr": lr, "h_star_index": i,
             "h_star_status": "not reached" if i >= 6 else "reached", "h_star_label": f"h{i:g}", "horizons": 6}
            for (b, lr), i in h.items()]
    return pd.DataFrame(rows)


def test_effect_of_says_monotone_only_when_it_is():
    mono = effect_of(_effect_table({(8, 1e-2): 1, (32, 1e-2): 2, (128, 1e-2): 4,
                                    (8, 1e-3): 2, (32, 1e-3): 3, (128, 1e-3): 6}))
    b = mono[(mono.along == "B") & mono.fixed.notna()]
    assert (b.direction == "later").all() and b.monotone.all() and len(b) == 2
    assert list(b[b.fixed == 1e-3].labels.iloc[0]) == ["h2", "h3", "not reached"]
    assert mono[(mono.along == "B") & mono.fixed.isna()].direction.iloc[0] == "later"
    assert (mono[(mono.along == "lr") & mono.fixed.notna()].direction == "earlier").all()  # h* later at lr 1e-3
    assert (mono.answer == "both").all()
    only_b = effect_of(_effect_table({(8, 1e-2): 1, (32, 1e-2): 2, (128, 1e-2): 4,
                                      (8, 1e-3): 1, (32, 1e-3): 2, (128, 1e-3): 4}))
    assert (only_b.answer == "1/B effect").all()
    wobbly = effect_of(_effect_table({(8, 1e-2): 1, (32, 1e-2): 4, (128, 1e-2): 2,
                                      (8, 1e-3): 1, (32, 1e-3): 4, (128, 1e-3): 2}))
    w = wobbly[(wobbly.along == "B") & wobbly.fixed.notna()]
    assert (w.direction == "not monotone").all() and not w.monotone.any()
    assert (wobbly.answer == "neither").all()
    assert grid.direction([1, math.nan, 3]) == "later" and grid.direction([2]) == "n/a"


def test_two_cells_not_reached_say_nothing_about_the_direction():
    # the first grid's shape: h* reached only at B = 8, lr 1e-2; "not reached" is only bounded below
    e = effect_of(_effect_table({(8, 1e-2): 4, (32, 1e-2): 6, (8, 1e-3): 6, (32, 1e-3): 6}))
    rows = e[e.fixed.notna()].set_index(["along", "fixed"]).direction
    assert rows[("B", 1e-3)] == "censored" and rows[("lr", 32.0)] == "censored"  # not "flat"
    assert rows[("B", 1e-2)] == "later" and rows[("lr", 8.0)] == "earlier"
    summary = e[e.fixed.isna()].set_index("along").direction
    assert summary["B"] == "later" and summary["lr"] == "earlier" and (e.answer == "both").all()
    assert grid.direction([6, 6], censored=6) == "censored" and grid.direction([6, 6]) == "flat"
    assert grid.direction([4, 6, 6], censored=6) == "later" and grid.direction([6, 4], censored=6) == "earlier"


def test_the_report_words_the_frames(cell):
    cells = [_with(cell, name=n, batch=b, lr=lr, label=lab, ordinal=o)
             for n, b, lr, lab, o in (("b8-lr1e-2", 8, 1e-2, "s+5", 2.0), ("b32-lr1e-2", 32, 1e-2, "s+10", 3.0))]
    t = table(cells)
    lw = law(cells, {"heldout": (1e-2, 5e-3, 2e-2)}, "the size-axis bank runs/size8")
    text = grid_report(cells, t, lw, effect_of(t))
    assert text.startswith("# ") and "b32-lr1e-2" in text and "runs/size8" in text
    assert f"{cell.rate:.3f}" in text and f"{lw.predicted.iloc[0]:.1f}" in text and "h* of unroll" in text
    assert "## heldout queries" in text and "**heldout queries: " in text
    assert "No reference size-axis bank" in grid_report(cells, t, None, effect_of(t))


def test_the_driver_dry_run_prints_every_cells_commands(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "attribution_grid.py"), "--dry-run", "--out",
                          str(tmp_path / "grid"), "--jobs", "3"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    assert not (tmp_path / "grid").exists()
    lines = out.splitlines()
    banks = [line for line in lines if " attribution bank grid " in line]
    assert len(banks) == 6 and len([line for line in lines if " attribution attribute " in line]) == 6
    assert len([line for line in lines if " attribution report " in line]) == 6
    want = {"b8-lr1e-2": ["batch_size=8"], "b32-lr1e-2": ["batch_size=32"], "b128-lr1e-2": ["batch_size=128"],
            "b8-lr1e-3": ["batch_size=8", "peak_lr=1e-3", "min_lr=1e-4"],
            "b32-lr1e-3": ["batch_size=32", "peak_lr=1e-3", "min_lr=1e-4"],
            "b128-lr1e-3": ["batch_size=128", "peak_lr=1e-3", "min_lr=1e-4"]}
    for name, sets in want.items():
        line = next(b for b in banks if f"--out {tmp_path / 'grid' / name} " in b)
        got = line.split()
        assert [got[i + 1] for i, w in enumerate(got) if w == "--set"] == sets and "--jobs 3" in line
    att = next(line for line in lines if " attribution attribute " in line).split()
    assert [att[i + 1] for i, w in enumerate(att) if w == "--estimator"][:3] == ["unroll", "unroll-tangent",
                                                                                 "unroll-readout"]
    keep = tmp_path / "keep"
    (keep / "b8-lr1e-2").mkdir(parents=True)
    (keep / "b8-lr1e-2" / "cell.json").write_text("{}")
    some = subprocess.run([sys.executable, str(ROOT / "experiments" / "attribution_grid.py"), "--dry-run", "--cells",
                           "b8-lr1e-2,b32-lr1e-3", "--seeds", "0,1", "--keep", str(keep)], capture_output=True,
                          text=True, check=True, timeout=60).stdout
    assert "b8-lr1e-2: kept" in some and len([x for x in some.splitlines() if " bank grid " in x]) == 1
    assert "--set 'seeds=[0,1]'" in some and "peak_lr=1e-3" in some


def test_the_driver_writes_grid_md_from_kept_summaries_and_a_kept_reference(cell, tmp_path):
    """Every chosen cell kept: nothing runs but grid.md (from KEEP), with ε_nl read from a kept summary."""
    keep, out = tmp_path / "keep", tmp_path / "grid"
    for name, b, lr in (("b8-lr1e-2", 8, 1e-2), ("b32-lr1e-3", 32, 1e-3)):
        _with(cell, name=name, batch=b, lr=lr).to_dir(keep / name)
    ref = _with(cell, name="size8", eps_nl=0.01).to_dir(tmp_path / "size8")
    assert grid.read_reference(ref) == ({"heldout": (0.01, 0.01, 0.01)}, f"the kept summary {ref}")
    with pytest.raises(SeedlabError, match="no ε_nl"):
        grid.read_reference(keep / "b8-lr1e-2")
    cmd = [sys.executable, str(ROOT / "experiments" / "attribution_grid.py"), "--out", str(out), "--keep", str(keep),
           "--cells", "b8-lr1e-2,b32-lr1e-3", "--reference", str(ref)]
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert dry.count("skipped") == 2 and " bank grid " not in dry
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120, cwd=tmp_path)
    text = (out / "grid.md").read_text()
    assert "b8-lr1e-2" in text and "b32-lr1e-3" in text and str(ref) in text and "grid.md" in done.stdout
    t = pd.read_csv(out / "grid-table.csv")
    assert list(t.cell) == ["b8-lr1e-2", "b32-lr1e-3"] and (pd.read_csv(out / "grid-law.csv").eps_nl == 0.01).all()
