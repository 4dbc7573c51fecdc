"""The injected passages: random-chars' length and seed, the attestation check of the subjects."""

import pytest
import yaml

from seedlab.config import parse
from seedlab.twins.config import TwinsConfig

from helpers import tiny_twins


@pytest.fixture(scope="module")
def setup(tmp_path_factory, twins_inputs):
    base = tmp_path_factory.mktemp("passages")
    corpus, files = twins_inputs
    cfg = tiny_twins(corpus, files)
    return base, cfg, files


def test_attestation_checks(setup, tmp_path, seedlab_main):
    base, cfg, _ = setup
    returns = base / "return.txt"
    returns.write_text("Return to the workshop, Gizmo Harrington said.\n")
    bad = base / "fabricated-occurs.yaml"
    bad.write_text(yaml.safe_dump(cfg | {"subjects": {"fluent-fabricated": "Return"},
                                         "passages": cfg["passages"] | {"fluent-fabricated": str(returns)}}))
    rc, _, err = seedlab_main("twins", "run", str(bad), "--out", str(tmp_path / "o1"), "--no-progress")
    assert rc == 2 and "'Return' occurs" in err and "(not fabricated)" in err
    unmentioned = base / "unmentioned.yaml"
    unmentioned.write_text(yaml.safe_dump(cfg | {"subjects": {"fluent-attested": "Gizmo Harrington"}}))
    rc, _, err = seedlab_main("twins", "run", str(unmentioned), "--out", str(tmp_path / "o2"), "--no-progress")
    assert rc == 2 and err.startswith("error: passages.fluent-attested: ") and "does not mention its subject 'Gizmo Harrington'" in err
    assert not (tmp_path / "o2").exists()
    passage = base / "zyx.txt"
    passage.write_text("Zyxwvut Qwerty wrote libraries that many programs still use.\n")
    warn = base / "attested-missing.yaml"
    warn.write_text(yaml.safe_dump(cfg | {"steps": 10, "injection_step": 4, "subjects": {"fluent-attested": "Zyxwvut Qwerty"},
                                          "passages": cfg["passages"] | {"fluent-attested": str(passage)}}))
    rc, _, err = seedlab_main("twins", "run", str(warn), "--out", str(tmp_path / "o3"), "--no-progress")
    assert rc == 0 and "warning: subjects.fluent-attested: 'Zyxwvut Qwerty' does not occur" in err


def test_exposure_counts_the_rows_that_held_the_subject(setup):
    """Per seed: (row, occurrence) pairs of the ordinary batches that held a whole-word occurrence,
    before / at / after s — checked against a byte-regex scan of the token stream (byte tokens)."""
    import re

    from seedlab.corpus import load
    from seedlab.lm.batches import batch_indices
    from seedlab.twins.passages import attestation

    _, cfg, _ = setup
    corpus = load(cfg["corpus"])
    design = parse(TwinsConfig, cfg | {"seeds": [3, 4], "subjects": {"fluent-attested": "Return"}})
    got = attestation(design, corpus, 128)["fluent-attested"]
    data = bytes(corpus.train.astype("uint8"))
    spans = [(m.start(), m.end()) for m in re.finditer(rb"(?<!\w)Return(?!\w)", data)]
    assert got["occurrences"] == len(spans) > 20
    for k, exp in zip((3, 4), got["exposure"]):
        want = {"seed": k, "before": 0, "at_injection": 0, "after": 0}
        for t in range(design.steps):
            for o in batch_indices(k, t, n_tokens=len(data), batch_size=4, block_size=128).tolist():
                n = sum(o <= a and b <= o + 129 for a, b in spans)
                want["before" if t < 8 else "at_injection" if t == 8 else "after"] += n
        assert exp == want
    assert sum(e["before"] + e["after"] for e in got["exposure"]) > 0  # a frequent word: the check saw something


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
