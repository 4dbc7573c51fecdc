"""Shared by the twins tests: one tiny real design, trained and measured once per session."""

import pytest
import yaml


@pytest.fixture(scope="session")
def twins_design(tmp_path_factory, twins_inputs):
    """Two seeds x (twin, fabricated, attested, two ordinary rows, nudge, matched-gradient, weight-kick), 16 steps,
    injection at step 6, trained and measured.
    Returns the folder holding ``corpus`` (a link to the embedded corpus), ``design.yaml`` and ``run``."""
    from seedlab.config import parse
    from seedlab.twins.config import TwinsConfig
    from seedlab.twins.measure import measure
    from seedlab.twins.train import run_twins

    base = tmp_path_factory.mktemp("measure")
    corpus, files = twins_inputs
    (base / "corpus").symlink_to(corpus)
    cfg = {
        "corpus": str(base / "corpus"), "model": "mini", "block_size": 128, "seeds": [0, 1], "steps": 16, "batch_size": 4,
        "injection_step": 6, "peak_lr": 3e-3,
        "conditions": ["twin", "fluent-fabricated", "fluent-attested", "ordinary-row", "nudge", "matched-gradient", "weight-kick"],
        "nulls": {"ordinary_rows": 2},
        "passages": {c: str(f) for c, f in files.items()}, "checkpoint_every": 4, "threads": 1,
        "subjects": {"fluent-fabricated": "Gizmo Harrington", "fluent-attested": "Fredrik Lundh"},
        "measure": {"alphas": [0, 0.25, 0.5, 0.75, 1], "heldout_rows": 8, "probe_rows": 4, "eval_rows": 4},
    }
    (base / "design.yaml").write_text(yaml.safe_dump(cfg))
    run_twins(parse(TwinsConfig, cfg), base / "run", base=base, progress=False)
    measure(base / "run", progress=False)
    return base


@pytest.fixture
def design(twins_design):
    """The session's measured design (see twins_design): the folder with ``corpus``, ``design.yaml``, ``run``."""
    return twins_design
