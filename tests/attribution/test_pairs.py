"""Pair arms (issue 20 §1, additivity): two candidates in two rows of one batch. A pair whose first
is the own-row control is bitwise its second's replicate; additivity.parquet's columns are what
they say; its numbers are the textbook ones; bad input is one line, exit 2, nothing written; a bank
with pairs resumes and reads back."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from seedlab.attribution.analyses.additivity import DIFF, PAIR, SWAPPED, additivity, summarise
from seedlab.attribution.bank.run import run_bank
from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.measure import PAIR_COLUMNS, write_additivity
from seedlab.attribution.report.additivity import additivity_section
from seedlab.attribution.bank.rundir import BankDir, open_bank
from seedlab.config import load_config, parse
from seedlab.errors import SeedlabError
from seedlab.lm.stack import Stack
from seedlab.lm.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

#: one seed, s = 4, 4 updates after it, two horizons: 5 candidates (3 passages, 1 held-out row, the
#: own-row control), their replicates in row 2, three pairs — one of them with the own-row control first
PAIRS = [["own-row", "passage-0"], ["passage-0", "heldout-0"], ["passage-1", "passage-2"]]
SMALL = {"seeds": [0], "steps": 8, "horizons": [1, "end"],
         "candidates": {"file": "candidates.txt", "heldout": 1, "own_row": True, "replicate_row": 2, "pairs": PAIRS},
         "queries": {"heldout": 2, "probes": "probes.jsonl"}}


@pytest.fixture(scope="module")
def paired_bank(tmp_path_factory, twins_inputs, bank_design):
    """SMALL trained: (its config, the folder of design.yaml, the bank)."""
    base = tmp_path_factory.mktemp("pairs")
    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(base, twins_inputs[0], **SMALL))
    run_bank(cfg, base / "bank", base=folder, progress=False)
    return cfg, folder, base / "bank"


def test_a_pair_with_the_own_row_first_is_bitwise_its_seconds_replicate(paired_bank):
    cfg, _, root = paired_bank
    rd = BankDir(root)
    s, horizons = cfg.injection_step, list(cfg.horizon_steps())
    pair, again = rd.pair(0, "own-row", "passage-0"), rd.replicate_of(0, "passage-0")
    assert pair.path == root / "seed-0" / "pairs" / "own-row..passage-0" and pair.finished
    hashes = pair.read_manifest()
    assert sorted(map(int, hashes)) == [s, *horizons]  # hashed at s and every horizon
    assert hashes == again.read_manifest()  # every tensor, every hashed step
    assert hashes != rd.candidate(0, "passage-0").read_manifest()  # the other row: not the candidate run
    own, rep = (pd.read_parquet(w.queries).set_index(["step", "text"]).loss for w in (pair, again))
    assert (own.loc[rep.index] == rep).all()  # the same floats on every text the replicate evaluated
    assert set(own.index.get_level_values("text")) == {"own-row", "passage-0", "query-0", "query-1", "probe-gizmo"}
    record = json.loads(rd.integrity.read_text())["seeds"]["0"]
    assert record["own_row_pairs"] == {"pair.own-row..passage-0": {"bitwise_equal_to": "replicate.passage-0",
                                                                   "steps_compared": [s, *horizons]}}
    arm = record["arms"]["pair.passage-0..heldout-0"]["injections"]
    assert [(i["step"], i["row"]) for i in arm] == [(s, cfg.injection_row), (s, 2)]
    # the two other pairs are neither of their parts
    other = rd.pair(0, "passage-0", "heldout-0").read_manifest()[str(horizons[-1])]
    assert other != rd.candidate(0, "passage-0").read_manifest()[str(horizons[-1])]
    assert other != rd.replicate_of(0, "heldout-0").read_manifest()[str(horizons[-1])]


def test_additivity_columns_are_what_they_say(paired_bank):
    _, _, root = paired_bank
    rd = BankDir(root)
    a, m = pd.read_parquet(rd.additivity), pd.read_parquet(rd.measured)
    assert list(a.columns) == PAIR_COLUMNS
    assert len(a) == 3 * 3 * 2  # pairs x shared queries (2 rows, 1 probe: no own text) x horizons
    assert set(a.query_kind) == {"heldout", "probe"} and set(a.label) == {"s+1", "end"}
    assert np.array_equal(a["sum"], a.measured_first + a.measured_second)
    assert np.array_equal(a.interaction, a.measured_pair - a["sum"])
    assert np.array_equal(a.swapped, a.first_other_row + a.second_other_row)
    by = m.set_index(["candidate", "query", "horizon"])

    def at(who: str, col: str) -> np.ndarray:
        return by.loc[list(zip(a[who], a["query"], a.horizon)), col].to_numpy()

    assert np.array_equal(a.measured_first, at("first", "measured"))  # Δ(c₁ at r): its candidate run
    assert np.array_equal(a.measured_second, at("second", "measured_replicate"))  # Δ(c₂ at r′): its replicate
    assert np.array_equal(a.first_other_row, at("first", "measured_replicate"))
    assert np.array_equal(a.second_other_row, at("second", "measured"))
    for r in a[a.pair == "pair.passage-1..passage-2"].itertuples():  # from the pair run's own file
        q = pd.read_parquet(rd.pair(0, "passage-1", "passage-2").queries).set_index(["step", "text"]).loss
        t = pd.read_parquet(rd.twin(0).queries).set_index(["step", "text"]).loss
        assert r.measured_pair == q[(r.horizon, r.query)] - t[(r.horizon, r.query)]
    own = a[a["first"] == "own-row"]
    assert (own.measured_first == 0).all() and (own.interaction == 0).all()  # exactly: the same floats
    ordinary = a[a["first"] != "own-row"]
    assert (ordinary.interaction != 0).all()  # two rows at once are not exactly additive

    # the numbers: one seed, so each is the textbook statistic over the ordinary pairs x queries of a kind
    st = additivity(a, resamples=200)
    assert set(st.query_kind) == {"heldout", "probe", "all"} and set(st.comparison) == {PAIR, SWAPPED, DIFF}
    for kind, g in [("heldout", ordinary[ordinary.query_kind == "heldout"]), ("all", ordinary)]:
        for h, gh in g.groupby("horizon"):
            row = st[(st.query_kind == kind) & (st.comparison == PAIR) & (st.horizon == h)].iloc[0]
            assert row.pearson == pytest.approx(np.corrcoef(gh["sum"], gh.measured_pair)[0, 1], abs=1e-12)
            assert row.spearman == pytest.approx(sps.spearmanr(gh["sum"], gh.measured_pair)[0], abs=1e-12)
            assert row.slope == pytest.approx(np.polyfit(gh["sum"], gh.measured_pair, 1)[0], rel=1e-9)
            rel = (gh.interaction.abs() / (gh.measured_first.abs() + gh.measured_second.abs())).median()
            assert row.interaction == pytest.approx(rel, rel=1e-12)
            ctl = st[(st.query_kind == kind) & (st.comparison == SWAPPED) & (st.horizon == h)].iloc[0]
            assert ctl.slope == pytest.approx(np.polyfit(gh["sum"], gh.swapped, 1)[0], rel=1e-9)
            diff = st[(st.query_kind == kind) & (st.comparison == DIFF) & (st.horizon == h)].iloc[0]
            assert diff.interaction == pytest.approx(row.interaction - ctl.interaction, abs=1e-15)
            assert row.interaction_low <= row.interaction <= row.interaction_high
    summary = summarise(a, resamples=200)
    pd.testing.assert_frame_equal(summary.numbers, st)  # the same numbers: same resamples, same order of draws
    assert (summary.rows, summary.own_row, summary.own_row_exact) == (len(a), ["pair.own-row..passage-0"], True)
    broken = a.copy()
    broken.loc[broken["first"] == "own-row", "interaction"] = 1e-9
    assert not summarise(broken, resamples=10).own_row_exact
    text = additivity_section(summary)
    assert text.startswith("## Additivity: two rows at once\n\nOver 2 pair(s) and 1 seed(s), a pair's effect on the "
                           "shared queries departs from the sum of its two single-row effects by a median relative "
                           "interaction")
    assert "interaction is exactly 0 at every seed, query and horizon: yes." in text and "### heldout queries" in text
    assert additivity_section(summarise(a.iloc[:0])) == "## Additivity: two rows at once\n\nNo pair run finished: " \
        "nothing to compare."


def test_a_bank_with_pairs_resumes_and_reads_back(paired_bank, monkeypatch, capsys):
    cfg, folder, root = paired_bank
    rd = BankDir(root)
    bank = open_bank(root)
    assert list(bank.inputs.pairs) == ["pair.own-row..passage-0", "pair.passage-0..heldout-0",
                                       "pair.passage-1..passage-2"]
    assert bank.inputs.pairs["pair.passage-1..passage-2"] == ("passage-1", "passage-2")
    before = {p: (rd.pair(0, *p).read_manifest(), pd.read_parquet(rd.pair(0, *p).queries))
              for p in [("passage-0", "heldout-0"), ("passage-1", "passage-2")]}
    additive, measured = pd.read_parquet(rd.additivity), pd.read_parquet(rd.measured)
    shutil.rmtree(rd.pair(0, "passage-1", "passage-2").path)  # as if interrupted there
    write_additivity(root)  # the unfinished pair left out, with a warning
    assert "warning: missing seed 0 pair.passage-1..passage-2 (not finished)" in capsys.readouterr().err
    assert set(pd.read_parquet(rd.additivity).pair) == {"pair.own-row..passage-0", "pair.passage-0..heldout-0"}
    advance, stacked, calls = Trainer.advance, Stack.advance, [0]

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return advance(self, *args, **kwargs)

    def counted_stack(self, rows, **kwargs):  # a stack's update is one update of each of its runs
        calls[0] += len(rows)
        return stacked(self, rows, **kwargs)

    monkeypatch.setattr(Trainer, "advance", counted)
    monkeypatch.setattr(Stack, "advance", counted_stack)
    run_bank(cfg, root, base=folder, progress=False)
    # that pair alone, from the kept prefix, and the twin's update of s once more: its state at s + 1, which the
    # pair's dose is taken against (forks/dose.py; the finished twin is not trained again)
    assert calls[0] == cfg.end - cfg.injection_step + 1
    for p, (hashes, queries) in before.items():
        assert rd.pair(0, *p).read_manifest() == hashes
        pd.testing.assert_frame_equal(pd.read_parquet(rd.pair(0, *p).queries), queries)
    pd.testing.assert_frame_equal(pd.read_parquet(rd.additivity), additive)
    pd.testing.assert_frame_equal(pd.read_parquet(rd.measured), measured)
    calls[0] = 0
    run_bank(cfg, root, base=folder, progress=False)
    assert calls[0] == 0


def test_drawn_pairs_are_disjoint_seeded_and_the_same_for_every_seed(bank_design, twins_inputs, tmp_path):
    from seedlab.attribution.bank.texts import load_inputs

    over = {**SMALL, "seeds": [0, 1], "candidates": {**SMALL["candidates"], "heldout": 3, "pairs": 3}}
    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(tmp_path, twins_inputs[0], **over))
    inputs = load_inputs(cfg, folder)
    pairs = list(inputs.pairs.values())
    names = [n for p in pairs for n in p]
    assert len(pairs) == 3 and len(set(names)) == 6 and "own-row" not in names  # disjoint, never the control
    assert pairs == list(load_inputs(cfg, folder).pairs.values())  # seeded
    from seedlab.attribution.bank.arms import arms

    for seed in (0, 1):
        assert [a.name for a in arms(inputs, seed) if a.name.startswith("pair.")] == list(inputs.pairs)
    other = cfg.model_copy(update={"candidates": cfg.candidates.model_copy(update={"seed": 1})})
    assert list(load_inputs(other, folder).pairs.values()) != pairs


def test_more_pairs_than_fit_disjointly_are_distinct_pairs(bank_design, twins_inputs, tmp_path):
    """Past 2P > candidates the draw takes distinct unordered pairs (each candidate in several): 12 of the 15
    pairs of 6 candidates, no pair twice (in either order), seeded."""
    from seedlab.attribution.bank.texts import load_inputs

    over = {**SMALL, "candidates": {**SMALL["candidates"], "heldout": 3, "pairs": 12}}
    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(tmp_path, twins_inputs[0], **over))
    pairs = list(load_inputs(cfg, folder).pairs.values())
    assert len(pairs) == 12 and len({frozenset(p) for p in pairs}) == 12 and all(a != b for a, b in pairs)
    assert "own-row" not in {n for p in pairs for n in p}
    assert pairs == list(load_inputs(cfg, folder).pairs.values())


# --------------------------------------------------------------------------- bad input: one line, exit 2, nothing written


@pytest.mark.parametrize("sets, files, match", [
    (["candidates.pairs=1"], {}, "candidates.pairs: needs candidates.replicate_row, the pair's second row"),
    (["candidates.replicate_row=2", "candidates.pairs=[[passage-0, passage-0]]"], {},
     r"candidates.pairs: a pair of identical candidates \('passage-0' twice\)"),
    (["candidates.replicate_row=2", "candidates.pairs=[[passage-0, passage-1]]"], {"candidates.txt": "Same.\n\nSame.\n"},
     r"candidates.pairs: a pair of identical candidates \('passage-0' and 'passage-1' have the same text\)"),
    (["candidates.replicate_row=2", "candidates.pairs=[[passage-0, nope]]"], {},
     r"candidates.pairs: 'nope' is not a candidate \(candidates: heldout-0, "),
    (["candidates.replicate_row=2", "candidates.pairs=16"], {},
     r"candidates.pairs: 16 distinct pairs need more candidates of distinct texts \(the own-row control aside\) "
     r"than this bank's 6 \(15 pairs at most\)"),
    (["candidates.replicate_row=0", "candidates.pairs=1"], {},  # the pair's second row is the injected row
     r"candidates.replicate_row \(also the pairs. second row\): another row of the batch than injection_row 0 \(0 .. 3\), got 0"),
    (["candidates.replicate_row=2", "candidates.pairs=[[a, b], [a, b]]"], {},
     r"candidates.pairs: the pair \('a', 'b'\) is listed twice"),
    (["candidates.file=c.jsonl"], {"c.jsonl": '{"name": "pair.x", "text": "ok"}\n'},
     r"names: 'pair.x' is taken .* the prefixes 'replicate.', 'pair.', 'weight.', 'nudge.'"),
])
def test_cli_bad_pairs_one_line_exit_2(seedlab_main, tmp_path, twins_inputs, bank_design, sets, files, match):
    import re

    path = bank_design.write(tmp_path, twins_inputs[0])
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    rc, _, err = seedlab_main("attribution", "bank", str(path), "--out", str(tmp_path / "bank"), "--no-progress",
                             *(a for s in sets for a in ("--set", s)))
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert re.search(match, err), err
    assert not (tmp_path / "bank").exists()


def test_a_pair_of_the_own_row_and_a_candidate_of_its_text_is_refused(bank_design, twins_inputs, tmp_path):
    """The own-row control's text depends on the seed: a candidate equal to it is caught per seed,
    when the arms are made (before anything is written)."""
    from seedlab.attribution.bank.arms import arms
    from seedlab.attribution.bank.texts import load_inputs

    cfg, folder = load_config(AttributionConfig, "attribution", bank_design.write(tmp_path, twins_inputs[0], **SMALL))
    inputs = load_inputs(cfg, folder)
    assert len(arms(inputs, 0)) == 1 + 5 + 5 + 3 + 2  # twin, candidates, replicates, pairs, nudges
    inputs.candidates["passage-0"] = inputs.candidates_of(1)["own-row"]  # seed 1's replaced row
    arms(inputs, 0)
    with pytest.raises(SeedlabError, match=r"candidates.pairs: a pair of identical candidates \('own-row' and "
                                           r"'passage-0' have the same text in seed 1\)"):
        arms(inputs, 1)


def test_config_pairs(bank_design):
    ok = parse(AttributionConfig, {**bank_design.config, "corpus": "x",
                                   "candidates": {"heldout": 2, "replicate_row": 1, "pairs": [["a", "b"], ["b", "a"]]}})
    assert ok.candidates.pairs == [("a", "b"), ("b", "a")]  # the two orders are two arms
    assert parse(AttributionConfig, {**bank_design.config, "corpus": "x"}).candidates.pairs == 0
    with pytest.raises(SeedlabError, match="candidates.pairs"):
        parse(AttributionConfig, {**bank_design.config, "corpus": "x",
                                  "candidates": {"heldout": 2, "replicate_row": 1, "pairs": -1}})
