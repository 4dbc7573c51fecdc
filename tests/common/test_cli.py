"""The command line: contracts of `shortcut data` / `shortcut train` / `corpus` / `presets copy`, bad input ->
one line, exit 2, and the study registry (every registered study's commands reachable; the registry and the
shipped presets agree; `seedlab --help` imports no study)."""

import importlib
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from seedlab import presets
from seedlab.cli import STUDIES, app, study_commands, study_configs

TINY = {
    "model": {"layers": 1, "heads": 1},
    "data": {"n_train": 128, "n_val": 32, "n_adv": 32, "vocab": 10},
    "train": {"epochs": 4, "eval_every": 2},
    "members": {"ratio": [0.5, 0.9], "seed": [0, 1]},
}


def _write(tmp_path, cfg):
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_data_contract(seedlab_cli, tmp_path):
    rc, out, err = seedlab_cli("shortcut", "data", "--task", "sum3-first", "--ratio", "0.15", "--n-train", "500", "--seed", "4", "--out", str(tmp_path / "d"))
    assert rc == 0, err
    assert out.strip() == f"wrote {tmp_path / 'd'}/{{train,val,adv}}.npz: train 500 (75 consistent), val 2048, adv 2048"
    for split, n in (("train", 500), ("val", 2048), ("adv", 2048)):
        with np.load(tmp_path / "d" / f"{split}.npz") as z:
            assert set(z.files) == {"x", "y", "shortcut"}
            assert z["x"].shape == (n, 5) and z["y"].shape == (n,) and z["shortcut"].shape == (n,)
            assert z["x"].dtype.kind == "i"
    with np.load(tmp_path / "d" / "train.npz") as z:
        assert int((z["y"] == z["shortcut"]).sum()) == 75


def test_train_contract(seedlab_main, tmp_path):
    rc, out, err = seedlab_main("shortcut", "train", str(_write(tmp_path, TINY)), "--out", str(tmp_path / "run"), "--no-progress")
    assert rc == 0, err
    s = pd.read_parquet(tmp_path / "run" / "summary.parquet")
    assert len(s) == 4 and set(s.ratio) == {0.5, 0.9}
    c = pd.read_parquet(tmp_path / "run" / "curves.parquet")
    assert set(c.split) == {"train", "val", "adv"}
    # a second run into the same folder refuses to overwrite
    rc, _, err = seedlab_main("shortcut", "train", str(_write(tmp_path, TINY)), "--out", str(tmp_path / "run"))
    assert rc == 2 and "already exists" in err


def _bad(over):
    cfg = yaml.safe_load(yaml.safe_dump(TINY))
    for path, v in over.items():
        sec, key = path.split(".")
        cfg.setdefault(sec, {})[key] = v
    return cfg


@pytest.mark.parametrize(
    "over,field",
    [
        ({"members.ratio": [0.5, 1.3]}, "members.ratio"),
        ({"members.task": ["sum2-min"]}, "members.task"),
        ({"members.task": ["sum2-max", "sum3-max"]}, "members.task"),
        ({"data.n_train": 0}, "data.n_train"),
        ({"data.n_train": -5}, "data.n_train"),
        ({"model.heads": 3}, "model.heads"),
        ({"data.vocab": 3}, "vocab"),
        ({"train.epocs": 10}, "train.epocs"),
        ({"model.layers": "two"}, "model.layers"),
        ({"optim.weight_decay": -1}, "optim.weight_decay"),
    ],
)
def test_train_bad_input(seedlab_main, tmp_path, over, field):
    out = tmp_path / "run"
    rc, stdout, err = seedlab_main("shortcut", "train", str(_write(tmp_path, _bad(over))), "--out", str(out))
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), err
    assert "Traceback" not in err
    assert not out.exists()  # nothing written


def test_unknown_top_level_field_lists_allowed(seedlab_main, tmp_path):
    rc, _, err = seedlab_main("shortcut", "train", str(_write(tmp_path, TINY | {"optimiser": {}})), "--out", str(tmp_path / "r"))
    assert rc == 2 and "optimiser: unknown field (allowed: model, data, optim, train, members)" in err


@pytest.mark.parametrize(
    "args,field",
    [
        (["--ratio", "1.5"], "ratio"),
        (["--task", "mpsp"], "task"),
        (["--n-train", "0"], "n_train"),
        (["--vocab", "2"], "vocab"),
    ],
)
def test_data_bad_input(seedlab_main, tmp_path, args, field):
    base = {"--task": "sum2-max", "--ratio": "0.5", "--n-train": "100", "--seed": "0", "--out": str(tmp_path / "d")}
    base[args[0]] = args[1]
    rc, _, err = seedlab_main("shortcut", "data", *[a for kv in base.items() for a in kv])
    assert rc == 2 and err.strip().startswith(f"error: {field}:"), err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_missing_config_file(seedlab_cli, tmp_path):
    rc, _, err = seedlab_cli("shortcut", "train", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "r"))
    assert rc == 2 and err.startswith("error: config: no such file")


def test_corpus_commands(seedlab_main, tmp_path):
    rc, out, err = seedlab_main("corpus", "prepare", "embedded", "--out", str(tmp_path / "c"), "--max-bytes", "60000")
    assert rc == 0, err
    rc, out, err = seedlab_main("corpus", "verify", str(tmp_path / "c"))
    assert rc == 0 and out.startswith("ok: train"), err
    rc, out, _ = seedlab_main("corpus", "count", str(tmp_path / "c"), "Gizmo Harrington")
    assert rc == 0 and "text=0 tokens=0" in out
    with open(tmp_path / "c" / "train.bin", "r+b") as f:  # corrupt one byte
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 1]))
    rc, _, err = seedlab_main("corpus", "verify", str(tmp_path / "c"))
    assert rc == 2 and "SHA-256 mismatch" in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the study registry


def _commands(name: str) -> list[str]:
    return list(study_commands(name).commands)


def test_every_registered_study_and_its_commands_are_reachable():
    runner = CliRunner()
    root = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert root.exit_code == 0, root.output
    for name, study in STUDIES.items():
        assert name in root.output and study.help in root.output
        commands = _commands(name)
        assert commands, f"{study.module}: no commands"
        res = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0 and study.help in res.output, res.output
        for command in commands:
            assert command in res.output
            assert runner.invoke(app, [name, command, "--help"]).exit_code == 0
    assert _commands("shortcut") == ["data", "train", "sweep", "analyze", "report"]
    assert _commands("corpus") == ["prepare", "verify", "count"]
    assert _commands("twins") == ["run", "measure", "gradmatch", "match", "export", "report"]
    assert _commands("attribution") == ["bank", "attribute", "metagrad", "rowscores", "report", "export", "score", "leaderboard"]


def test_the_registry_and_the_shipped_presets_agree():
    """A study with presets names them (PRESETS, its own name) and is registered; every presets folder is a
    registered study's, listed by `seedlab presets`."""
    named = {name: getattr(importlib.import_module(study.module), "PRESETS", None) for name, study in STUDIES.items()}
    assert all(folder in (None, name) for name, folder in named.items()), named
    assert {folder for folder in named.values() if folder} == set(presets.STUDIES)
    assert {"shortcut", "twins", "attribution"} <= set(presets.STUDIES)


def test_help_and_presets_import_no_study():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom seedlab.cli import app\n"
            "for args in (['--help'], ['presets']):\n    assert CliRunner().invoke(app, args).exit_code == 0\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'seedlab'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert set(loaded) <= {"seedlab", "seedlab.cli", "seedlab.errors", "seedlab.presets", "seedlab.store"}, loaded


def test_presets_copy(seedlab_main, tmp_path):
    out = tmp_path / "mine"
    rc, stdout, err = seedlab_main("presets", "copy", "shortcut/quick", str(out))
    assert rc == 0, err
    assert stdout.strip() == f"{out / 'quick.yaml'} (0 more file(s) beside it)"
    assert (out / "quick.yaml").read_bytes() == presets.find("shortcut", "quick").read_bytes()
    assert presets.copy("twins/mini", out) == [out / rel for rel in presets.files("twins", "mini")]
    rc, _, err = seedlab_main("presets", "copy", "shortcut/quick", str(out))
    assert rc == 2 and err.startswith("error: --out:") and "already exists" in err and len(err.strip().splitlines()) == 1
    assert seedlab_main("presets", "copy", "shortcut/quick", str(out), "--force")[0] == 0


@pytest.mark.parametrize("args", [
    ["presets", "copy", "nope/quick", "X"],
    ["presets", "copy", "quick", "X"],
    ["twins", "export", "X", "--seed", "0", "--out", "Y"],
    ["attribution", "attribute", "X"],
    ["shortcut", "report", "X"],
])
def test_bad_input_in_every_room_is_one_line_exit_2(seedlab_main, tmp_path, args):
    args = [str(tmp_path / a) if a in ("X", "Y") else a for a in args]
    rc, _, err = seedlab_main(*args)
    assert rc == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert not (tmp_path / "X").exists() and not (tmp_path / "Y").exists()


# --------------------------------------------------------------------------- config fields: presets show, --help


def test_presets_show_prints_every_field_with_its_value_default_and_help(seedlab_main):
    res = CliRunner().invoke(app, ["presets", "show", "attribution/mini"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("attribution/mini: The attribution bank at CPU scale")
    row = next(line for line in lines if line.startswith("candidates.heldout "))
    assert row.split()[:3] == ["candidates.heldout", "25", "16"]  # the field, its value in mini, its default
    assert row.endswith("K rows drawn from the held-out split, block_size + 1 tokens each: ordinary data (not stated)")
    assert next(line for line in lines if line.startswith("corpus ")).split()[1:3] == ["runs/corpus-embedded-bpe", "(required)"]
    # a name one study has needs no study; a shortcut preset is the config its command reads; a file too
    quick = CliRunner().invoke(app, ["presets", "show", "quick"]).output
    assert quick.splitlines()[1].startswith("seedlab.shortcut.config.SweepConfig") and "\ngrid.seed " in quick
    demo = CliRunner().invoke(app, ["presets", "show", "demo"]).output
    assert demo.splitlines()[1].startswith("seedlab.shortcut.config.EnsembleConfig") and "\nmembers.seed " in demo
    path = str(presets.find("twins", "mini"))
    assert "\nmeasure.alphas " in CliRunner().invoke(app, ["presets", "show", path]).output
    for args, words in ((["nope"], "name: a preset (attribution/gpt2-124m"),
                        (["mini"], "name: 'mini' is a preset of attribution and twins: say which")):
        rc, out, err = seedlab_main("presets", "show", *args)
        assert rc == 2 and not out and err.startswith(f"error: {words}") and len(err.strip().splitlines()) == 1, err


def test_every_command_taking_set_lists_its_config_fields_in_help():
    """A command with --set declares its config (seedlab.cli.config_command): its --help lists the
    config's fields, each with its default and help, and `presets show` reads the study's presets with it."""
    runner = CliRunner()
    for name in STUDIES:
        for command, cmd in study_commands(name).commands.items():
            if not any("--set" in getattr(p, "opts", ()) for p in cmd.params):
                continue
            assert getattr(cmd, "config", None), f"{name} {command}: --set without config_command"
            res = runner.invoke(app, [name, command, "--help"], env={"COLUMNS": "300"})
            assert res.exit_code == 0 and "Config fields (--set NAME=VALUE" in res.output, res.output
    text = runner.invoke(app, ["twins", "run", "--help"], env={"COLUMNS": "300"}).output
    assert "steps (300): optimizer updates of the schedule (paper: 9,536)" in text
    assert "measure.smooth_steps_alt (5): a second, narrower window" in text and "corpus (required): " in text
    attribute = runner.invoke(app, ["attribution", "attribute", "--help"], env={"COLUMNS": "300"}).output
    assert "attribute.fit_rows (256): " in attribute and "candidates.heldout" not in attribute  # --set reaches attribute.*
    assert study_configs("shortcut") == ["seedlab.shortcut.config:EnsembleConfig", "seedlab.shortcut.config:SweepConfig"]
