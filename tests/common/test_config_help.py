"""Every config field carries its help as ``Field(description=...)``: the fields are listed (dotted, as
``--set`` names them) by ``seedlab.config.config_fields``; moving the help out of comments changed no
config a run records, no content hash and no sweep job key."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import seedlab
from seedlab import presets
from seedlab.cli import STUDIES, study_configs
from seedlab.config import Strict, config_fields, load_config, resolve
from seedlab.errors import SeedlabError

SRC = Path(seedlab.__file__).resolve().parent
ROOT = SRC.parent.parent

#: the shipped presets and default configs (below), as the code was before the help moved into the
#: fields (commit 1943965 and this tree agree): sha256 of their model_dump (JSON and Python), the sweeps'
#: job keys and the twins' pre-registration; since issue 30, with the fork designs' arm_batch and stack_memory
#: (at their defaults: null and 2.0); since issue 31, with the bank's candidates.weights ([1]) and chaos section
#: (two nudges, every step) and the presets attribution/mini-size and attribution/grid (one cell of the B x lr grid);
#: since issue 32, the twins' nulls: conditions matched-noise -> matched-gradient + weight-kick in every twins preset
#: and the default, nulls.ordinary_rows (4; set in the presets too) and measure.ordinary_margin (0.25, in the
#: pre-registration); then the null sign-gradient in the twins' conditions (default, mini, mini-long, gpt2-124m);
#: since issue 33, the bank's loo and groups sections (null: off, in every attribution preset)
#: then the twins' scale-axis presets (twins/scale-b16, -b64, -b256, -b16-long, -wide-b64) and the GPT mini-wide, with
#: sign-gradient among their nulls; then the fork design's decay_steps (null: the decay ends with the run) in every
#: twins and attribution config; then the twins' dose axis: nulls.ordinary_rows_per_seed (false) and row_weights ([])
#: in every twins config, and the preset twins/dose-b16; then the bank's ceiling and trak sections (null: off, in every
#: attribution preset)
#: and the presets attribution/loo-b32 and loo-b128 (the ceiling and TRAK's subsets on)
#: then the scale axis's schedule, rate and width cells (twins/scale-b16-floor, -b16-longdecay, -b16-lr3e-3,
#: -b16-lr1e-3, -wide-heads-b64) and the GPT mini-wide-heads
#: then the bank's attribute.metagrad_window (10: metagrad-trunc's window) in every attribution config
#: then the preset twins/dose-b16-lr5e-3 (dose-b16 at peak 5e-3 on seeds 5000-5007: the pre-registered dose test)
#: then the run's-length cells twins/scale-b16-after300 and -after500 (without them the hash is the one before)
PINNED = "0a69354e63feaa9479607d2b56398917b84fefe7ce58521db002f39d5938bf22"


def _fingerprint() -> str:
    from seedlab.attribution.bank.config import AttributeConfig, CandidatesConfig, QueriesConfig
    from seedlab.lm.gptconfig import PRESETS
    from seedlab.shortcut.config import EnsembleConfig, SweepConfig
    from seedlab.shortcut.sweep import plan
    from seedlab.twins.config import MeasureConfig, NullsConfig

    record: dict = {}
    for study in presets.STUDIES:
        for name in presets.names(study):
            for target in study_configs(study):  # a shortcut preset is an ensemble (train) or a sweep
                try:
                    cfg, _ = load_config(resolve(target), study, name)
                    break
                except SeedlabError:
                    continue
            r = {"dump": cfg.model_dump(mode="json"), "py": repr(cfg.model_dump())}
            if isinstance(cfg, SweepConfig):
                r["jobs"] = [j.key for j in plan(cfg)]
            if hasattr(cfg, "preregistration"):
                r["prereg"] = cfg.preregistration()
            record[f"{study}/{name}"] = r
    for cls in (EnsembleConfig, SweepConfig, MeasureConfig, NullsConfig, CandidatesConfig, QueriesConfig, AttributeConfig):
        record[cls.__name__] = cls().model_dump(mode="json")
    record["gpt"] = {k: v.model_dump(mode="json") for k, v in PRESETS.items()}
    record["jobs-default"] = [j.key for j in plan(SweepConfig())]
    assert len(record) == 37, sorted(record)  # every preset was read (28) and every default config
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def test_shipped_configs_dumps_and_job_keys_are_unchanged():
    assert _fingerprint() == PINNED


def _config_classes() -> list[type[Strict]]:
    """Every Strict subclass defined in src, found statically (a class whose base is Strict or one of
    them), then imported; the imported set is checked against Strict's own subclasses."""
    defined: dict[str, tuple[str, list[str]]] = {}
    for path in SRC.rglob("*.py"):
        module = ".".join(["seedlab", *path.relative_to(SRC).with_suffix("").parts]).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                defined[f"{module}:{node.name}"] = (node.name, bases)
    strict = {"Strict"}
    while True:
        more = {name for name, bases in defined.values() if strict & set(bases)} - strict
        if not more:
            break
        strict |= more
    classes = [resolve(t) for t, (name, _) in defined.items() if name in strict and name != "Strict"]
    assert all(issubclass(c, Strict) for c in classes)

    def subclasses(c):
        return {s for d in c.__subclasses__() for s in (d, *subclasses(d))}

    assert {c for c in subclasses(Strict) if c.__module__.startswith("seedlab.")} == set(classes)
    return classes


def test_every_field_of_every_config_has_a_description():
    classes = _config_classes()
    assert len(classes) >= 18  # GPTConfig, ForkDesign, the twins', attribution's and shortcut's configs
    missing = [f"{c.__module__}.{c.__qualname__}.{name}" for c in classes
               for name, f in c.model_fields.items() if not (f.description or "").strip()]
    assert not missing, missing


def test_every_field_not_stated_by_a_paper_is_in_the_assumptions():
    """docs/assumptions.md lists every number a paper does not state: each field whose help says
    "not stated" appears there by its dotted name, in backquotes."""
    named = set(re.findall(r"`([^`]+)`", (ROOT / "docs" / "assumptions.md").read_text()))
    marked = {f.name for study in STUDIES for t in study_configs(study) for f in config_fields(resolve(t))
              if "not stated" in f.help}
    assert {"data.vocab", "min_lr", "measure.smooth_steps_alt", "candidates.heldout", "attribute.h_star_rho"} <= marked
    assert not marked - named, sorted(marked - named)


def test_config_fields_are_dotted_with_value_default_and_help():
    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.shortcut.config import SweepConfig

    rows = {f.name: f for f in config_fields(AttributionConfig)}
    assert rows["candidates"].section and not rows["candidates.heldout"].section
    h = rows["candidates.heldout"]
    assert (h.default, h.value, h.required) == (16, 16, False) and "(not stated)" in h.help
    assert rows["corpus"].required and rows["corpus"].default is None
    names = list(rows)
    assert names.index("candidates") + 1 == names.index("candidates.file")  # a section's fields follow it
    cfg, _ = load_config(AttributionConfig, "attribution", "mini")
    mini = {f.name: f for f in config_fields(AttributionConfig, cfg)}
    assert mini["candidates.heldout"].value == cfg.candidates.heldout != 16 and mini["candidates.heldout"].default == 16
    assert mini["horizons"].value == [1, 10, 50, "end"]
    # a union whose value is not the nested config (several grids) is one field holding its whole value
    paper, _ = load_config(SweepConfig, "shortcut", "paper")
    grid = next(f for f in config_fields(SweepConfig, paper) if f.name.startswith("grid"))
    assert grid.name == "grid" and not grid.section and isinstance(grid.value, list) and len(grid.value) == len(paper.grid)
    assert "grid.seed" in {f.name for f in config_fields(SweepConfig)}  # the mapping form's fields, without a value
