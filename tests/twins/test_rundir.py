"""The twins run folder: its layout (the files later tools read), the folder policy of
``seedlab twins run`` (another run refused, --force removes, the same run resumes) and
reading a checkpoint back, hash-checked."""

import json
from pathlib import Path

import pytest
import torch
import yaml

from seedlab.errors import SeedlabError
from seedlab.lm.distributed import World
from seedlab.lm.model import GPT, PRESETS
from seedlab.store import LOCK
from seedlab.twins.config import TwinsConfig
from seedlab.twins.rundir import RunDir, config_record, run_record

from helpers import tiny_twins

T = 16  # steps of the twins_design fixture (conftest.py)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, twins_inputs):
    base = tmp_path_factory.mktemp("rundir")
    corpus, files = twins_inputs
    cfg = tiny_twins(corpus, files)
    return base, cfg


def test_the_layout():
    rd = RunDir(Path("R"))
    c = rd.condition(3, "twin")
    assert [str(p) for p in (rd.config, rd.preregistration, rd.inputs, rd.prefix(3))] == [
        "R/config.json", "R/preregistration.json", "R/inputs.json", "R/seed-3/prefix.safetensors"]
    assert [str(p) for p in (c.checkpoint(12), c.manifest, c.losses, c.state)] == [
        "R/seed-3/twin/step-12.safetensors", "R/seed-3/twin/manifest.json", "R/seed-3/twin/losses.parquet",
        "R/seed-3/twin/state.safetensors"]
    assert [str(p) for p in (rd.measure_table("paths"), rd.measures_json, rd.gradmatch, rd.report, rd.figure("cka.png"))] == [
        "R/paths.parquet", "R/measures.json", "R/gradmatch.parquet", "R/report.md", "R/cka.png"]


def test_finished_is_the_done_marker(tmp_path):
    c = RunDir(tmp_path).condition(0, "twin")
    assert not c.finished
    c.mark_finished(24)
    assert c.finished and (tmp_path / "seed-0" / "twin" / "done.json").read_text().split() == ["{", '"steps":', "24", "}"]


def test_the_folder_policy(tmp_path):
    cfg, world = TwinsConfig(corpus="c"), World()
    record = config_record(cfg, independent=False, world=world)
    assert record["injection_rank"] == 0 and record["world_size"] == 1 and not record["independent"]
    rd = RunDir(tmp_path / "run")
    claim = lambda c, independent=False, force=False: rd.claim(run_record(c, independent=independent, world=world),
                                                               force=force, world=world)
    claim(cfg)  # absent: a new run
    assert not rd.root.exists()
    rd.start(record | {"injection_rank": 5}, {"passages": {}}, {}, cfg.preregistration())
    (rd.root / "seed-0").mkdir()
    claim(cfg)  # the same run (whatever its injection rank): it resumes
    assert (rd.root / "seed-0").is_dir()
    other = cfg.model_copy(update={"steps": 301})
    with pytest.raises(SeedlabError, match=r"^--out: .*run holds another twins design \(config.json differs\); use another "
                                           r"folder, or --force to overwrite it$"):
        claim(other)
    with pytest.raises(SeedlabError, match="holds another twins design"):
        claim(cfg, independent=True)
    claim(other, force=True)  # --force: emptied (but for the lock file a starting command may hold)
    assert list(rd.root.iterdir()) == []


def test_start_writes_the_preregistration_once(tmp_path):
    cfg = TwinsConfig(corpus="c")
    rd = RunDir(tmp_path)
    record = config_record(cfg, independent=False, world=World())
    rd.start(record, {"passages": {}}, {}, cfg.preregistration())
    first = rd.preregistration.read_text()
    stamp = rd.config.stat().st_mtime_ns
    rd.start(record, {"passages": {}}, {}, {"hash": "later"})
    assert rd.preregistration.read_text() == first  # fixed before the first step
    assert rd.config.stat().st_mtime_ns == stamp  # unchanged: left untouched


def test_a_different_run_in_the_same_folder_is_refused(setup, tmp_path, seedlab_main):
    base, cfg = setup
    p1, p2 = base / "r1.yaml", base / "r2.yaml"
    p1.write_text(yaml.safe_dump(cfg | {"steps": 10, "injection_step": 4}))
    p2.write_text(yaml.safe_dump(cfg | {"steps": 12, "injection_step": 4}))
    assert seedlab_main("twins", "run", str(p1), "--out", str(tmp_path / "o"), "--no-progress")[0] == 0
    rc, _, err = seedlab_main("twins", "run", str(p2), "--out", str(tmp_path / "o"), "--no-progress")
    assert rc == 2 and "holds another twins design" in err


def test_export_command_gives_the_same_logits(twins_design, tmp_path, seedlab_main):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from seedlab.corpus import load

    design = twins_design
    rc, out, err = seedlab_main("twins", "export", str(design / "run"), "--seed", "1", "--condition", "fluent-attested",
                               "--out", str(tmp_path / "hf"))
    assert rc == 0, err
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    corpus = load(design / "corpus")
    model = GPT(PRESETS["mini"].model_copy(update={"vocab_size": corpus.vocab_size, "block_size": 128}))
    model.load_state_dict(load_file(design / "run" / "seed-1" / "fluent-attested" / f"step-{T}.safetensors"))
    x = torch.randint(0, corpus.vocab_size, (2, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(x).logits - model(x)[0]).abs().max() < 1e-5
    rc, _, err = seedlab_main("twins", "export", str(design / "run"), "--seed", "1", "--step", "7", "--out", str(tmp_path / "h2"))
    assert rc == 2 and "no checkpoint at step 7" in err


def test_inputs_are_written_once_and_checked_on_resume(tmp_path):
    cfg = TwinsConfig(corpus="c")
    rd = RunDir(tmp_path)
    inputs = {"corpus": "/a", "corpus_sha256": {"train": "1", "heldout": "2"}, "eot_id": 0,
              "passages": {"fluent-attested": {"text": "x y", "tokens": [1, 2]}}}
    rd.check_inputs(inputs)  # nothing yet: anything goes
    rd.start(config_record(cfg, independent=False, world=World()), inputs, {}, cfg.preregistration())
    moved = inputs | {"corpus": "/b"}
    rd.check_inputs(moved)  # the same corpus, moved: resumes
    rd.start(config_record(cfg, independent=False, world=World()), moved, {}, cfg.preregistration())
    assert json.loads(rd.inputs.read_text())["corpus"] == "/a"  # never rewritten
    with pytest.raises(SeedlabError, match=r"^corpus: /b is not the corpus .* was started with \(its hashes differ"):
        rd.check_inputs(moved | {"corpus_sha256": {"train": "1", "heldout": "3"}})
    edited = {"fluent-attested": {"text": "x y", "tokens": [1, 3]}}
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-attested: the passage was edited since"):
        rd.check_inputs(inputs | {"passages": edited})
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-fabricated: the passage is new since"):
        rd.check_inputs(inputs | {"passages": inputs["passages"] | {"fluent-fabricated": {"text": "z", "tokens": [4]}}})


def test_a_resume_under_another_environment_is_refused(setup, tmp_path, seedlab_main):
    """environment.json records what the bits depend on; a resume elsewhere is one line, exit 2, nothing
    written, unless --allow-env-change (then the change is recorded)."""
    base, cfg = setup
    path = base / "env.yaml"
    path.write_text(yaml.safe_dump(cfg | {"steps": 10, "injection_step": 4, "threads": 1}))
    out = tmp_path / "o"
    assert seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress")[0] == 0
    env = json.loads((out / "environment.json").read_text())
    assert env["changes"] == [] and env["environment"]["threads"] == 1 and env["environment"]["device"] == "cpu"
    elsewhere = env | {"environment": env["environment"] | {"torch": "0.0.0"}}
    (out / "environment.json").write_text(json.dumps(elsewhere))
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != LOCK}  # the lock: its holder's pid
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress")
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"error: environment: {out} was started with torch = '0.0.0', now ")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != LOCK} == before  # nothing written
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress", "--allow-env-change")
    assert rc == 0, err
    assert json.loads((out / "environment.json").read_text())["changes"] == [env["environment"]]


def test_a_preregistration_text_is_kept_before_the_first_step(setup, tmp_path, seedlab_main):
    """--preregistration FILE: the text and its SHA-256 kept at the start; another text, or one added to a
    started run, refused in one line."""
    import hashlib

    base, cfg = setup
    path, text = base / "prereg.yaml", "H1: the own passage drops more than the other.\n"
    path.write_text(yaml.safe_dump(cfg | {"steps": 10, "injection_step": 4, "threads": 1, "conditions": ["twin", "fluent-fabricated"]}))
    (tmp_path / "h.md").write_text(text)
    out = tmp_path / "o"
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress", "--preregistration", str(tmp_path / "h.md"))
    assert rc == 0, err
    assert (out / "preregistration.md").read_text() == text
    assert json.loads((out / "preregistration.json").read_text())["text_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    (tmp_path / "h.md").write_text(text + "H2: changed afterwards.\n")
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(out), "--no-progress", "--preregistration", str(tmp_path / "h.md"))
    assert rc == 2 and "was pre-registered with another text" in err and err.count("\n") == 1
    assert (out / "preregistration.md").read_text() == text
    other = tmp_path / "o2"
    assert seedlab_main("twins", "run", str(path), "--out", str(other), "--no-progress")[0] == 0
    rc, _, err = seedlab_main("twins", "run", str(path), "--out", str(other), "--no-progress", "--preregistration", str(tmp_path / "h.md"))
    assert rc == 2 and "has started without one" in err
