"""What the command line says, read as a newcomer reads it: a flag's help shows no value type, the preset
list shows whole sentences, a malformed ``--set``'s example is a field of the command's own config, and a
value that fits none of a field's forms is one problem, said as one."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from seedlab import presets
from seedlab.cli import STUDIES, app, study_commands, study_configs
from seedlab.config import config_fields, example_override, parse, resolve
from seedlab.errors import SeedlabError
from seedlab.shortcut.config import SweepConfig
from seedlab.twins.config import TwinsConfig

#: the config of every command that takes one (a CONFIG and --set), every study's
CONFIGS = sorted({t for s in STUDIES for t in study_configs(s)})


def _every_command(group, path=()):
    for name, cmd in group.commands.items():
        if not path and name in STUDIES:
            cmd = study_commands(name)
        yield (*path, name), cmd
        if hasattr(cmd, "commands"):
            yield from _every_command(cmd, (*path, name))


def test_no_help_shows_a_flag_as_taking_a_value():
    paths = [(), *(p for p, _ in _every_command(get_command(app)))]
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"], terminal_width=160)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, f"seedlab {' '.join(path)} --help:\n{result.output}"
    doctor = CliRunner().invoke(app, ["doctor", "--help"], terminal_width=160).output
    assert re.search(r"--size\s+<int>", doctor) and re.search(r"--help\s+Show this message", doctor)
    copy = CliRunner().invoke(app, ["presets", "copy", "--help"], terminal_width=160).output
    assert re.search(r"--force\s+--no-force\s+overwrite existing files", copy)


def test_the_preset_list_shows_each_presets_first_sentence_whole(seedlab_main, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    rc, out, err = seedlab_main("presets")
    assert rc == 0, err
    listed: dict[tuple[str, str], str] = {}
    study = name = None
    for line in out.splitlines():
        assert len(line) < 100, line  # wrapped to the terminal
        if not line.startswith(" "):
            study = line.removesuffix(":")
        elif line.startswith(" " * 19):  # a wrapped line: its preset's text goes on
            listed[study, name] += " " + line.strip()
        else:
            name, _, text = line.strip().partition(" ")
            listed[study, name] = text.strip()
    assert listed.keys() == {(s, n) for s in presets.STUDIES for n in presets.names(s)}
    for (study, name), text in listed.items():
        lines = presets.find(study, name).read_text().splitlines()
        comment = " ".join(w for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("#"))]
                           for w in line.lstrip("#").split())
        assert text == presets.describe(study, name) and comment.startswith(text), (study, name)
        assert re.search(r"[.!?]$", text), f"{study}/{name}: cut mid-sentence: {text!r}"


def test_first_sentence_ends_outside_brackets_and_quotes():
    assert presets.first_sentence('A (b. c) d. E f.') == "A (b. c) d."
    assert presets.first_sentence('The protocol ("Learned, Then Lost.", x): y. Z') == 'The protocol ("Learned, Then Lost.", x): y.'
    assert presets.first_sentence("lr 1e-2. Next") == "lr 1e-2." and presets.first_sentence("no end") == "no end"


@pytest.mark.parametrize("target", CONFIGS)
def test_a_malformed_set_names_a_field_of_the_commands_own_config(target):
    model = resolve(target)
    example = example_override(model, {})
    assert example.partition("=")[0] in {f.name for f in config_fields(model) if not f.section}
    assert isinstance(parse(model, {**_required(model), **_as_data(example)}), model)  # the example parses


def _required(model) -> dict:
    return {"corpus": "c"} if "corpus" in model.model_fields else {}


def _as_data(example: str) -> dict:
    import yaml

    key, value = example.split("=", 1)
    data: dict = {}
    node = data
    *parents, last = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = yaml.safe_load(value)
    return data


@pytest.mark.parametrize(("args", "error"), [
    (["twins", "run", "mini", "--out", "o", "--set", "steps"], "error: --set: expected KEY=VALUE (e.g. model=mini), got 'steps'"),
    (["shortcut", "sweep", "quick", "--out", "o", "--set", "epochs"],
     "error: --set: expected KEY=VALUE (e.g. model.layers=2), got 'epochs'"),
    (["attribution", "bank", "mini", "--out", "o", "--set", "seeds"],
     "error: --set: expected KEY=VALUE (e.g. model=mini), got 'seeds'"),
    (["shortcut", "sweep", "quick", "--out", "o", "--set", "grid.seed=abc"],
     "error: grid.seed: Input should be a valid list or a valid integer, unable to parse string as an integer, got 'abc'"),
])
def test_bad_set_values_are_one_line_about_the_study_itself(seedlab_main, tmp_path, args, error):
    rc, out, err = seedlab_main(*args)
    assert rc == 2 and err == error + "\n", err
    assert not (tmp_path / "o").exists()


def test_one_fields_forms_are_one_problem_and_other_fields_are_counted():
    base = SweepConfig().model_dump(mode="json")
    with pytest.raises(SeedlabError, match=r"^grid\.seed: Input should be a valid list or a valid integer, .*, got 'abc'$"):
        parse(SweepConfig, base | {"grid": base["grid"] | {"seed": "abc"}})
    with pytest.raises(SeedlabError, match=r"^train\.epochs: Input should be greater than 0, got -1 \(and 1 more\)$"):
        parse(SweepConfig, base | {"grid": base["grid"] | {"seed": "abc"}, "train": base["train"] | {"epochs": -1}})
    with pytest.raises(SeedlabError, match=r"^passages\.fluent-x: Input should be a valid string, got 3$"):
        parse(TwinsConfig, {"corpus": "c", "passages": {"fluent-x": 3}})  # a mapping's key stays in the name
    with pytest.raises(SeedlabError, match=r"^grid\.sed: unknown field \(allowed: task, ratio, "):
        parse(SweepConfig, base | {"grid": base["grid"] | {"sed": 1}})
