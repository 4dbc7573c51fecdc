"""The command line: contracts of `shortcut data` / `shortcut train` / `corpus`, and bad input -> one line, exit 2."""

import numpy as np
import pandas as pd
import pytest
import yaml

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
    for split, n in (("train", 500), ("val", 2048), ("adv", 2048)):
        with np.load(tmp_path / "d" / f"{split}.npz") as z:
            assert set(z.files) == {"x", "y", "shortcut"}
            assert z["x"].shape == (n, 5) and z["y"].shape == (n,) and z["shortcut"].shape == (n,)
            assert z["x"].dtype.kind == "i"
    with np.load(tmp_path / "d" / "train.npz") as z:
        assert int((z["y"] == z["shortcut"]).sum()) == 75


def test_train_contract(seedlab_cli, tmp_path):
    rc, out, err = seedlab_cli("shortcut", "train", str(_write(tmp_path, TINY)), "--out", str(tmp_path / "run"), "--no-progress")
    assert rc == 0, err
    s = pd.read_parquet(tmp_path / "run" / "summary.parquet")
    assert len(s) == 4 and set(s.ratio) == {0.5, 0.9}
    c = pd.read_parquet(tmp_path / "run" / "curves.parquet")
    assert set(c.split) == {"train", "val", "adv"}
    # a second run into the same folder refuses to overwrite
    rc, _, err = seedlab_cli("shortcut", "train", str(_write(tmp_path, TINY)), "--out", str(tmp_path / "run"))
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
def test_train_bad_input(seedlab_cli, tmp_path, over, field):
    out = tmp_path / "run"
    rc, stdout, err = seedlab_cli("shortcut", "train", str(_write(tmp_path, _bad(over))), "--out", str(out))
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), err
    assert "Traceback" not in err
    assert not out.exists()  # nothing written


def test_unknown_top_level_field_lists_allowed(seedlab_cli, tmp_path):
    rc, _, err = seedlab_cli("shortcut", "train", str(_write(tmp_path, TINY | {"optimiser": {}})), "--out", str(tmp_path / "r"))
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
def test_data_bad_input(seedlab_cli, tmp_path, args, field):
    base = {"--task": "sum2-max", "--ratio": "0.5", "--n-train": "100", "--seed": "0", "--out": str(tmp_path / "d")}
    base[args[0]] = args[1]
    rc, _, err = seedlab_cli("shortcut", "data", *[a for kv in base.items() for a in kv])
    assert rc == 2 and err.strip().startswith(f"error: {field}:"), err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_missing_config_file(seedlab_cli, tmp_path):
    rc, _, err = seedlab_cli("shortcut", "train", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "r"))
    assert rc == 2 and err.startswith("error: config: no such file")


def test_corpus_commands(seedlab_cli, tmp_path):
    rc, out, err = seedlab_cli("corpus", "prepare", "embedded", "--out", str(tmp_path / "c"), "--max-bytes", "60000")
    assert rc == 0, err
    rc, out, err = seedlab_cli("corpus", "verify", str(tmp_path / "c"))
    assert rc == 0 and out.startswith("ok: train"), err
    rc, out, _ = seedlab_cli("corpus", "count", str(tmp_path / "c"), "Gizmo Harrington")
    assert rc == 0 and "text=0 tokens=0" in out
    with open(tmp_path / "c" / "train.bin", "r+b") as f:  # corrupt one byte
        f.seek(10)
        b = f.read(1)
        f.seek(10)
        f.write(bytes([b[0] ^ 1]))
    rc, _, err = seedlab_cli("corpus", "verify", str(tmp_path / "c"))
    assert rc == 2 and "SHA-256 mismatch" in err and len(err.strip().splitlines()) == 1
