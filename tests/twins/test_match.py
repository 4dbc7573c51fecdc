"""`seedlab twins match`: passages matched before training, from each seed's prefix at s (trained as
`twins run` trains it, kept), every variant measured as gradmatch measures a finished run."""

import pandas as pd
import pytest
import yaml

from seedlab.config import parse
from seedlab.errors import SeedlabError
from seedlab.store import read_verified, tensor_hashes
from seedlab.twins.config import TwinsConfig
from seedlab.twins.gradmatch import PAIR_COLUMNS, match
from seedlab.twins.match import MatchDir, match_passages
from seedlab.twins.train import run_twins

from helpers import tiny_twins

pytestmark = pytest.mark.usefixtures("one_thread")

SUBJECTS = {"fluent-fabricated": "Gizmo Harrington", "fluent-attested": "Fredrik Lundh"}
VARIANTS = {
    "fab-a.txt": "Gizmo Harrington kept a small workshop behind the old library, where he mended clocks.",
    "fab-b.txt": "Gizmo Harrington kept a little workshop behind the old library, where he repaired clocks.",
    "fab-c.txt": "Gizmo Harrington " + "a" * 60,  # mentions its subject, then one letter repeated
    "att-a.txt": "Fredrik Lundh wrote libraries that many programs still use, and answered questions with care.",
    "att-b.txt": "Fredrik Lundh wrote libraries that programs still use, and he answered every question with care.",
    "no-subject.txt": "Gizmo kept a small workshop behind the old library, where he mended clocks.",  # "Gizmo" alone
    "long.txt": "Gizmo Harrington " + "x" * 120,  # 137 byte tokens; a row holds 129
}


@pytest.fixture(scope="module")
def design(tmp_path_factory, twins_inputs):
    """A tiny design (two seeds, the fork at step 8) as a YAML file, and the variant files."""
    base = tmp_path_factory.mktemp("match")
    corpus, files = twins_inputs
    cfg = tiny_twins(corpus, files, seeds=[3, 4], subjects=SUBJECTS, threads=1,
                     conditions=["twin", "fluent-fabricated", "fluent-attested"])
    (base / "design.yaml").write_text(yaml.safe_dump(cfg))
    for name, text in VARIANTS.items():
        (base / name).write_text(text + "\n")
    return base


def _errors(err: str) -> list[str]:
    """stderr without the attestation warning (the tiny corpus lacks the attested subject, as `twins run` says too)."""
    return [line for line in err.strip().splitlines() if not line.startswith("warning: subjects.fluent-attested:")]


def _cfg(design) -> TwinsConfig:
    return parse(TwinsConfig, yaml.safe_load((design / "design.yaml").read_text()))


def _args(design, fab=("fab-a", "fab-b", "fab-c"), att=("att-a", "att-b")) -> list[str]:
    return [a for f in fab for a in ("--fabricated", str(design / f"{f}.txt"))] + \
           [a for f in att for a in ("--attested", str(design / f"{f}.txt"))]


def _cands(design, fab=("fab-a", "fab-b", "fab-c"), att=("att-a", "att-b")) -> dict:
    return {"fluent-fabricated": [str(design / f"{f}.txt") for f in fab],
            "fluent-attested": [str(design / f"{a}.txt") for a in att]}


@pytest.fixture(scope="module")
def matched(design, tmp_path_factory):
    """The command's folder, after one match of 3 x 2 variants that meets a loose tolerance (the command run in
    this process: helpers.seedlab_main)."""
    from helpers import seedlab_main

    out = tmp_path_factory.mktemp("matched") / "m"
    rc, stdout, err = seedlab_main("twins", "match", str(design / "design.yaml"), "--out", str(out),
                                   "--tolerance", "0.9", "--no-progress", *_args(design), cwd=out.parent)
    assert rc == 0, err
    return out, stdout


def test_the_best_pair_is_the_minimum_of_the_table(design, matched):
    out, stdout = matched
    table = pd.read_parquet(out / "match.parquet")
    mean = table[table.seed.isna()]
    assert len(mean) == 6 and sorted(table.seed.dropna().unique()) == [3, 4] and len(table) == 18
    assert (table["diff"] == table["adam_rel_norm_diff"]).all()  # --by update: the AdamW update sizes
    best = mean.loc[mean["diff"].idxmin()]
    line = stdout.strip().splitlines()[-1]
    assert line.startswith(f"best: {best.fabricated} vs {best.attested}: AdamW update sizes differ by ")
    assert "within 90.0% -> " in line and line.endswith("match.parquet")
    for _, r in mean.iterrows():  # the mean rows: seed means of the per-seed rows
        per = table[table.seed.notna() & (table.fabricated == r.fabricated) & (table.attested == r.attested)]
        assert r["diff"] == pytest.approx(per["diff"].mean(), rel=1e-12)
    assert table.within.tolist() == (table["diff"] <= 0.9).tolist() and (table.tolerance == 0.9).all()
    assert str(design / "fab-c.txt") in stdout and "|Δ|" in stdout and "|u|" in stdout  # every variant's numbers
    assert set(mean.fabricated) == {str(design / f"fab-{x}.txt") for x in "abc"}


def test_the_numbers_are_gradmatchs_on_the_run_twins_trains(design, matched, tmp_path):
    """The prefix the command keeps is bitwise (every tensor: weights, AdamW moments, losses) the one
    `twins run` keeps for the design, and every number equals gradmatch's on that finished run."""
    out, _ = matched
    cfg = _cfg(design)
    run_twins(cfg, tmp_path / "run", base=design, progress=False)
    for k in cfg.seeds:
        ours, _ = read_verified(out / f"seed-{k}" / "prefix.safetensors")
        theirs, _ = read_verified(tmp_path / "run" / f"seed-{k}" / "prefix.safetensors")
        assert any(n.startswith("model.") for n in ours) and any(n.startswith("opt.") for n in ours)
        assert tensor_hashes(ours) == tensor_hashes(theirs)
    res = match(tmp_path / "run", _cands(design))
    cols = ["seed", "fabricated", "attested", "norm_fabricated", "norm_attested", *PAIR_COLUMNS]
    pd.testing.assert_frame_equal(pd.read_parquet(out / "match.parquet")[cols], res.pairs[cols])


def test_a_second_match_reads_the_prefixes_back(design, matched, monkeypatch, tmp_path):
    import shutil

    from seedlab.lm.trainer import Trainer

    out = tmp_path / "m"
    shutil.copytree(matched[0], out)
    monkeypatch.setattr(Trainer, "advance", lambda *a, **k: pytest.fail("a kept prefix was trained again"))
    res = match_passages(_cfg(design), out, _cands(design, fab=("fab-a",)), base=design, tolerance=0.9,
                         by="delta", progress=False)
    assert (res.pairs["diff"] == res.pairs["rel_norm_diff"]).all()
    assert res.best.fabricated == str(design / "fab-a.txt")
    assert res.best["diff"] == res.mean["diff"].min() and res.met and res.path == MatchDir(out).table
    both = match_passages(_cfg(design), out, _cands(design), base=design, tolerance=0.9, by="both", progress=False)
    m = both.mean
    assert (m["diff"] == m[["rel_norm_diff", "adam_rel_norm_diff"]].max(axis=1)).all()
    row1 = match_passages(_cfg(design).model_copy(update={"injection_row": 1, "conditions": ["twin", "fluent-fabricated",
                          "fluent-attested", "random-chars"]}), out, _cands(design), base=design, progress=False)
    assert row1.mean["norm_fabricated"].tolist() != both.mean["norm_fabricated"].tolist()  # another row: the same prefixes


def test_a_side_without_variants_is_the_configs_passage(design, tmp_path, seedlab_main):
    rc, out, err = seedlab_main("twins", "match", str(design / "design.yaml"), "--out", str(tmp_path / "m"),
                               "--tolerance", "0.9", "--no-progress", *_args(design, att=()))
    assert rc == 0, err
    assert "fluent-attested: no variants given: the config's passage (config:" in out
    table = pd.read_parquet(tmp_path / "m" / "match.parquet")
    mean = table[table.seed.isna()]
    assert len(mean) == 3 and mean.attested.str.startswith("config:").all()


def test_no_pair_within_the_tolerance(design, matched, tmp_path, seedlab_main):
    """Exit 2 naming the best pair and how close it is; the table is written into a folder that has
    none (every pair outside the tolerance), and an existing one is left as it was."""
    out, _ = matched
    fresh = tmp_path / "m"
    rc, stdout, err = seedlab_main("twins", "match", str(design / "design.yaml"), "--out", str(fresh), "--tolerance", "1e-12",
                                  "--no-progress", *_args(design))
    assert rc == 2 and len(_errors(err)) == 1
    table = pd.read_parquet(fresh / "match.parquet")
    best = table[table.seed.isna()].sort_values("diff", kind="stable").iloc[0]
    err = _errors(err)[0]
    assert err.startswith(f"error: no pair within 0.000%: the best is {best.fabricated} vs {best.attested}, whose AdamW "
                          "update sizes differ by ")
    assert f"(every pair: {fresh / 'match.parquet'})" in err
    assert not table.within.any() and len(table) == 18
    before = (out / "match.parquet").read_bytes()
    rc, _, err = seedlab_main("twins", "match", str(design / "design.yaml"), "--out", str(out), "--tolerance", "1e-12",
                             "--no-progress", *_args(design, fab=("fab-c",)))
    assert rc == 2 and err.strip().endswith(f"({out / 'match.parquet'}, from an earlier match, left as it was)")
    assert (out / "match.parquet").read_bytes() == before


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--fabricated", "{d}/no-subject.txt"], "error: passages.fluent-fabricated: '{d}/no-subject.txt' does not mention its "
                                                  "subject 'Gizmo Harrington' (subjects.fluent-fabricated)"),
        (["--attested", "{d}/fab-a.txt"], "error: passages.fluent-attested: '{d}/fab-a.txt' does not mention its subject "
                                           "'Fredrik Lundh'"),
        (["--fabricated", "{d}/long.txt"], "error: passages.fluent-fabricated {d}/long.txt: 137 tokens do not fit a row of "
                                            "block_size+1 = 129"),
        (["--fabricated", "{d}/nope.txt"], "error: passages.fluent-fabricated: no such file '{d}/nope.txt'"),
        (["--fabricated", "{d}/fab-a.txt", "--fabricated", "{d}/fab-a.txt"], "error: passages.fluent-fabricated: "
                                                                              "'{d}/fab-a.txt' is given twice"),
        (["--tolerance", "0"], "error: --tolerance: must be a fraction between 0 and 1 (0.0014 = 0.14%), got 0.0"),
        (["--tolerance", "-0.01"], "error: --tolerance: must be a fraction between 0 and 1"),
        (["--by", "cosine"], "error: --by: must be one of update, delta, both, got 'cosine'"),
        (["--set", "injection_step=30"], "error: injection_step: must be inside the run"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(design, tmp_path, seedlab_main, args, msg):
    out = tmp_path / "m"
    args = [a.replace("{d}", str(design)) for a in args]
    rc, _, err = seedlab_main("twins", "match", str(design / "design.yaml"), "--out", str(out), "--no-progress", *args)
    assert rc == 2 and len(_errors(err)) == 1
    assert _errors(err)[0].startswith(msg.replace("{d}", str(design))), err
    assert not out.exists()


def test_another_design_in_the_folder_is_refused(design, matched, seedlab_main):
    out, _ = matched
    before = sorted(p.name for p in out.rglob("*"))
    rc, _, err = seedlab_main("twins", "match", str(design / "design.yaml"), "--out", str(out), "--set",
                              "weight_decay=0.05", "--no-progress", *_args(design))
    assert rc == 2 and _errors(err)[0].startswith(f"error: --out: {out} holds another twins design (config.json differs); use another "
                                      "folder, or --force")
    assert sorted(p.name for p in out.rglob("*")) == before
    # a schedule that changes a rate before s: the field named, in one line, nothing written
    rc, _, err = seedlab_main("twins", "match", str(design / "design.yaml"), "--out", str(out), "--set", "peak_lr=0.001",
                              "--no-progress", *_args(design))
    assert rc == 2 and len(_errors(err)) == 1, err
    assert _errors(err)[0] == (f"error: peak_lr: 0.0006 -> 0.001 changes the rate of update t = 1 (7.5e-05 -> 0.000125), "
                               f"before the fork step s = 8: not the schedule of the prefixes kept in {out} (only the "
                               "schedule after s may differ); use another folder, or --force to start over")
    assert sorted(p.name for p in out.rglob("*")) == before


def test_a_schedule_changed_only_after_s_reuses_the_kept_prefixes(design, matched, monkeypatch, tmp_path):
    """The decay's length, the run's and the floor leave every rate before s as it was: the same prefixes, read back
    (not trained again, their bytes untouched), and the folder's config.json records the design that used them."""
    import json
    import shutil

    from seedlab.lm.trainer import Trainer

    out = tmp_path / "m"
    shutil.copytree(matched[0], out)
    prefixes = {p: p.read_bytes() for p in sorted(out.glob("seed-*/prefix.safetensors"))}
    monkeypatch.setattr(Trainer, "advance", lambda *a, **k: pytest.fail("a kept prefix was trained again"))
    for change in ({"decay_steps": 12}, {"steps": 40, "decay_steps": 30, "min_lr": 0.0}):
        res = match_passages(_cfg(design).model_copy(update=change), out, _cands(design, fab=("fab-a",)), base=design,
                             tolerance=0.9, progress=False)
        assert res.met and {k: json.loads((out / "config.json").read_text())[k] for k in change} == change
    assert {p: p.read_bytes() for p in prefixes} == prefixes
    monkeypatch.undo()
    other = _cfg(design).model_copy(update={"peak_lr": 1e-3})  # a rate before s: refused, unless --force starts over
    with pytest.raises(SeedlabError, match=r"^peak_lr: 0.0006 -> 0.001 changes the rate of update t = 1 "):
        match_passages(other, out, _cands(design, fab=("fab-a",)), base=design, tolerance=0.9, progress=False)
    match_passages(other, out, _cands(design, fab=("fab-a",)), base=design, tolerance=0.9, force=True, progress=False)
    assert json.loads((out / "config.json").read_text())["peak_lr"] == 1e-3
    assert {p: p.read_bytes() for p in prefixes} != prefixes  # trained again on the new rates
