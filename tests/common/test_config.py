"""seedlab.config and seedlab.presets: a CONFIG is a file or a preset name, ``--set`` overrides it;
the ``seedlab presets`` commands."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
import yaml

from seedlab import presets
from seedlab.config import apply_overrides, load_config
from seedlab.errors import SeedlabError
from seedlab.shortcut.config import SweepConfig
from seedlab.twins.config import TwinsConfig


def test_load_config_from_a_preset_name_and_from_a_file(tmp_path):
    quick, where = load_config(SweepConfig, "shortcut", "quick")
    assert where == presets.folder("shortcut")
    assert load_config(SweepConfig, "shortcut", "quick.yaml")[0] == quick
    assert load_config(SweepConfig, "shortcut", presets.folder("shortcut") / "quick.yaml")[0] == quick
    mini, where = load_config(TwinsConfig, "twins", "mini")
    assert where == presets.folder("twins") and mini.passages  # relative to the preset's folder
    assert all((where / p).is_file() for p in mini.passages.values())
    # a file path wins, and its folder is what the config's relative paths are relative to
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump({"corpus": "c", "seeds": [5]}))
    cfg, where = load_config(TwinsConfig, "twins", p)
    assert cfg.seeds == [5] and cfg.corpus == "c" and where == tmp_path
    cfg, _ = load_config(TwinsConfig, "twins", str(p))
    assert cfg.seeds == [5]


def test_unknown_preset_is_one_line_listing_the_presets():
    with pytest.raises(SeedlabError) as e:
        load_config(TwinsConfig, "twins", "nope")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (f"config: no such file 'nope', and no twins preset of that name"
                   f" (presets: {', '.join(presets.names('twins'))})")
    assert "mini" in presets.names("twins") and "quick" in presets.names("shortcut")
    with pytest.raises(SeedlabError, match=r"no shortcut preset of that name \(presets: .*quick"):
        load_config(SweepConfig, "shortcut", "mini")  # a preset of the other study is not found
    assert presets.find("twins", "twins/mini") is None  # a name, not a path


def test_set_overrides_parse_as_yaml():
    cfg, _ = load_config(TwinsConfig, "twins", "mini", ["seeds=[7, 8]", "steps=400", "measure.seed=3", "peak_lr=1e-3"])
    assert cfg.seeds == [7, 8] and cfg.steps == 400 and cfg.measure.seed == 3 and cfg.peak_lr == 1e-3
    base, _ = load_config(TwinsConfig, "twins", "mini")
    assert cfg.batch_size == base.batch_size and base.seeds == [0, 1, 2, 3]  # the rest untouched
    assert apply_overrides({"a": {"b": 1}}, ["a.c=x", "d.e=[1, 2]"]) == {"a": {"b": 1, "c": "x"}, "d": {"e": [1, 2]}}
    with pytest.raises(SeedlabError, match=r"--set: expected KEY=VALUE"):
        apply_overrides({}, ["steps"])
    with pytest.raises(SeedlabError, match=r"--set a\.b: 'a' is not a section"):
        apply_overrides({"a": 1}, ["a.b=2"])
    with pytest.raises(SeedlabError, match=r"^steps: "):
        load_config(TwinsConfig, "twins", "mini", ["steps=-1"])  # overrides are validated too


# --------------------------------------------------------------------------- the CLI


def test_presets_lists_every_preset(seedlab_main):
    rc, out, err = seedlab_main("presets")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "shortcut:" and "twins:" in lines and "attribution:" in lines
    listed = {line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")}  # not a wrapped line
    assert listed == set(presets.names("shortcut")) | set(presets.names("twins")) | set(presets.names("attribution"))
    quick = next(line for line in lines if line.split()[0] == "quick")
    assert "CPU-scale reproduction" in quick  # the preset's first comment line says what it is


def test_presets_copy_twins_mini_parses_to_the_same_config(seedlab_main, tmp_path):
    out = tmp_path / "mine"
    rc, stdout, err = seedlab_main("presets", "copy", "twins/mini", str(out))
    assert rc == 0, err
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "mini.yaml", "passages/fluent-attested.txt", "passages/fluent-fabricated.txt"]
    src = presets.folder("twins")
    assert filecmp.cmp(out / "mini.yaml", src / "mini.yaml", shallow=False)
    copied, where = load_config(TwinsConfig, "twins", out / "mini.yaml")
    shipped, shipped_where = load_config(TwinsConfig, "twins", "mini")
    assert copied == shipped and where == out
    for rel in copied.passages.values():
        assert filecmp.cmp(where / rel, shipped_where / rel, shallow=False)
    # a second copy is refused unless --force; an unknown name lists the presets
    rc, _, err = seedlab_main("presets", "copy", "twins/mini", str(out))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert seedlab_main("presets", "copy", "twins/mini", str(out), "--force")[0] == 0
    rc, _, err = seedlab_main("presets", "copy", "twins/nope", str(tmp_path / "x"))
    assert rc == 2 and "twins/mini" in err and "shortcut/quick" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_sweep_with_an_unknown_preset_exits_2_and_writes_nothing(seedlab_main, tmp_path):
    rc, out, err = seedlab_main("shortcut", "sweep", "nope", "--out", str(tmp_path / "X"))
    assert rc == 2 and err.startswith("error: config: no such file 'nope', and no shortcut preset of that name")
    assert len(err.strip().splitlines()) == 1 and "quick" in err
    assert not (tmp_path / "X").exists()


def test_every_preset_file_is_package_data():
    """``pip install seedlab`` ships the presets only if pyproject's package-data globs name every
    file in src/seedlab/presets (checked by hand once with a built wheel; this is the fast check)."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(presets.__file__).resolve().parents[3]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("seedlab is installed without its source tree")
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["seedlab.presets"]
    here = Path(presets.__file__).parent
    files = [p.relative_to(here) for p in here.rglob("*")
             if p.is_file() and p.suffix != ".pyc" and p.name != "__init__.py"]
    assert any(f.as_posix() == "shortcut/quick.yaml" for f in files)
    assert any(f.match("twins/passages/*.txt") for f in files)
    shipped = {p.relative_to(here) for g in globs for p in here.glob(g)}  # glob, as setuptools reads them
    unshipped = [f.as_posix() for f in files if f not in shipped]
    assert not unshipped, f"not package data in pyproject.toml: {unshipped}"


def test_a_record_from_before_a_field_existed_matches_with_its_default():
    """A config.json written before a field was added (here: measure.equivalence_frac and threads)
    equals today's record of the same config once the new fields take their defaults; a changed
    value still differs."""
    from seedlab.config import with_new_defaults

    cfg = TwinsConfig.model_validate({"corpus": "c", "passages": {}, "conditions": ["twin"]})
    now = cfg.model_dump(mode="json")
    old = {k: v for k, v in now.items() if k != "threads"} | {"measure": {k: v for k, v in now["measure"].items() if k != "equivalence_frac"}}
    assert old != now and with_new_defaults(TwinsConfig, old) == now
    assert with_new_defaults(TwinsConfig, old | {"steps": now["steps"] + 1}) != now
