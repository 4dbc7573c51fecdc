"""The injected passages: random-chars' length and seed, the attestation check of the subjects."""

import pytest
import yaml

from seedlab.config import parse
from seedlab.twins.config import TwinsConfig


@pytest.fixture(scope="module")
def setup(tmp_path_factory, twins_inputs):
    base = tmp_path_factory.mktemp("passages")
    corpus, files = twins_inputs
    cfg = {
        "corpus": str(corpus), "model": "mini", "block_size": 128, "seeds": [3], "steps": 24, "batch_size": 4,
        "injection_step": 8, "passages": {c: str(f) for c, f in files.items()}, "checkpoint_every": 4,
    }
    return base, cfg, files


def test_attestation_checks(setup, tmp_path, seedlab_cli):
    base, cfg, _ = setup
    bad = base / "fabricated-occurs.yaml"
    bad.write_text(yaml.safe_dump(cfg | {"subjects": {"fluent-fabricated": "Return"}}))
    rc, _, err = seedlab_cli("twins", "run", str(bad), "--out", str(tmp_path / "o1"), "--no-progress")
    assert rc == 2 and "'Return' occurs" in err and "(not fabricated)" in err
    warn = base / "attested-missing.yaml"
    warn.write_text(yaml.safe_dump(cfg | {"steps": 10, "injection_step": 4, "subjects": {"fluent-attested": "Gizmo Harrington"}}))
    rc, _, err = seedlab_cli("twins", "run", str(warn), "--out", str(tmp_path / "o2"), "--no-progress")
    assert rc == 0 and "warning: subjects.fluent-attested: 'Gizmo Harrington' does not occur" in err


def test_random_chars_length(setup):
    from seedlab.corpus import load
    from seedlab.twins.passages import load_passages

    base, cfg, files = setup
    corpus = load(cfg["corpus"])
    fab = corpus.encode(files["fluent-fabricated"].read_text())
    same = load_passages(parse(TwinsConfig, cfg), base, corpus)
    assert len(same["random-chars"]) == len(fab) and same["random-chars"] != fab
    fixed = load_passages(parse(TwinsConfig, cfg | {"random_chars_tokens": 40, "random_chars_seed": 7}), base, corpus)
    assert len(fixed["random-chars"]) == 40 and fixed["random-chars"][:20] != same["random-chars"][:20]
    with pytest.raises(Exception, match="random_chars_tokens"):
        load_passages(parse(TwinsConfig, cfg | {"conditions": ["twin", "random-chars"]}), base, corpus)
