"""Plain helper functions shared by test files (importable as ``helpers``: pyproject's pytest
``pythonpath`` puts tests/ on sys.path; fixtures live in conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd


def summary_of_cells(cells, task="sum2-max", **extra) -> pd.DataFrame:
    """A summary frame from (layers, ratio, k, n) cells: k of the n members generalized."""
    rows = []
    for layers, ratio, k, n in cells:
        rows += [dict(task=task, ratio=ratio, layers=layers, heads=1, weight_decay=0.1, generalized=i < k, **extra)
                 for i in range(n)]
    return pd.DataFrame(rows)


def copy_run(design: Path, tmp_path: Path) -> Path:
    """A copy of a twins test design's run folder, to change (files removed, corrupted, ...)
    without touching the session's shared one."""
    shutil.copytree(design / "run", tmp_path / "run")
    return tmp_path / "run"


def seedlab_main(*args: str, cwd: Path) -> tuple[int, str, str]:
    """``python -m seedlab ARGS`` without the subprocess: ``seedlab.cli.main`` called in this process, cwd ``cwd``,
    stdout and stderr captured, the exit code as a process would have it (SystemExit's code; an uncaught
    exception: its traceback on stderr and 1): (returncode, stdout, stderr).

    It saves the ~2-4 s a fresh interpreter pays to import torch and the study (more on a busy machine). What a
    process would not carry over is reset around the call: torch's determinism settings (a fresh process's
    defaults during the call: environment.json records them, and a resume compares them), torch's thread count
    and the torch, numpy and random RNG states (restored), the once-per-process precision warning (cleared),
    Python's default warning filters (a warning is printed on the captured stderr, as a fresh process prints it). The real console entry point
    (exit code 2 and one line from a subprocess, kill -9 of a process) is still tested with the ``seedlab_cli``
    fixture (tests/common/test_cli.py, the kill -9 tests, tests/shortcut/test_sweep.py)."""
    import contextlib
    import io
    import os
    import random
    import sys
    import traceback
    import warnings

    import numpy as np
    import torch

    from seedlab import cli, precision

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    out, err = io.StringIO(), io.StringIO()
    threads, rng = torch.get_num_threads(), (torch.get_rng_state(), np.random.get_state(), random.getstate())
    cudnn = torch.backends.cudnn
    determinism = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                   cudnn.deterministic, cudnn.benchmark)
    argv, here = sys.argv, os.getcwd()
    precision.warn_precision.cache_clear()
    code = 0
    try:
        sys.argv = ["seedlab", *args]
        torch.use_deterministic_algorithms(False)  # a fresh process's settings (lm/determinism.py settle sets them)
        cudnn.deterministic, cudnn.benchmark = False, False
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.resetwarnings()  # Python's defaults, as a fresh interpreter has them
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = show
            try:
                cli.main()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
                if not isinstance(exit_.code, int | None):
                    print(exit_.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
        os.chdir(here)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(determinism[0], warn_only=determinism[1])
        cudnn.deterministic, cudnn.benchmark = determinism[2], determinism[3]
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
    return code, out.getvalue(), err.getvalue()


def kept_round_trip(cls, folder: Path, tmp_path: Path):
    """A committed kept cell summary (seedlab/cells.py ``Summary``) read by ``cls``, written again byte for byte and
    read back to identical frames with the declared columns; returns what was read."""
    c = cls.from_dir(folder)
    again = c.to_dir(tmp_path / folder.name)
    assert sorted(p.name for p in again.iterdir()) == sorted(p.name for p in folder.iterdir())
    for p in folder.iterdir():
        assert (again / p.name).read_bytes() == p.read_bytes(), p.name
    back = cls.from_dir(again)
    assert back.equals(c)
    for name, columns in cls.FRAMES.items():
        pd.testing.assert_frame_equal(getattr(back, name), getattr(c, name), check_exact=True)
        assert list(getattr(c, name).columns) == list(columns)
    return c


#: the tiny fork design the twins tests share: GPT mini on 128-token rows, 4 rows a batch, one seed,
#: the fork at step 8 of 24, a checkpoint every 4 updates (seconds on one core)
TINY_FORK = {"model": "mini", "block_size": 128, "seeds": [3], "steps": 24, "batch_size": 4, "injection_step": 8,
             "checkpoint_every": 4}


def tiny_twins(corpus, files: dict, **over) -> dict:
    """A twins config on TINY_FORK: the corpus folder, the passage files {condition: path}, and ``over``."""
    return {"corpus": str(corpus), **TINY_FORK, "passages": {c: str(f) for c, f in files.items()}, **over}


def attribution_frame(estimators, *, horizons, seeds=(0, 1, 2), n=40, queries=("q0", "q1"), common=1.0, own=0.0,
                      replicate=None, kinds=("heldout",), unit=None, s=4, seed=0) -> pd.DataFrame:
    """attribution.parquet's shape, synthetic: measured(seed, c, q, h) = common·T[c, q] + own·(the seed's own
    normal noise, drawn anew per horizon); measured_replicate = measured + replicate·N(0, 1) when ``replicate``
    is given (a number, or a function of the horizon); ``estimators[name](measured, rng, h)`` the estimate over
    the candidates of one (seed, query, horizon), with the registry's label and unit (``unit`` overrides it);
    candidate kinds in turn from ``kinds``; ``horizons`` ((h, label), ...) after the injection step ``s``; one
    own-row control per seed (measured and estimates 0)."""
    import numpy as np

    from seedlab.attribution.estimators.registry import ESTIMATORS

    rng = np.random.default_rng(seed)
    T = rng.normal(size=(n, len(queries)))
    frames = []
    for k in seeds:
        for qi, q in enumerate(queries):
            for h, label in horizons:
                m = common * T[:, qi] + own * rng.normal(size=n)
                base = {"seed": k, "candidate": [f"c{c}" for c in range(n)], "query": q, "horizon": h, "measured": m,
                        "candidate_kind": [kinds[c % len(kinds)] for c in range(n)], "query_kind": "heldout",
                        "after": h - s, "label": label}
                if replicate is not None:
                    sd = replicate(h) if callable(replicate) else replicate
                    base["measured_replicate"] = m + sd * rng.normal(size=n)
                for e, fn in estimators.items():
                    spec = ESTIMATORS.get(e)
                    about = {"estimator": e, "estimator_label": spec.label if spec else "estimator",
                             "unit": unit or (spec.unit if spec else "nats/token")}
                    frames.append(pd.DataFrame({**base, **about, "estimate": fn(m, rng, h)}))
                    frames.append(pd.DataFrame({**base, **about, "candidate": ["own-row"], "candidate_kind": ["control"],
                                                "measured": [0.0], "estimate": [0.0],
                                                **({"measured_replicate": [0.0]} if replicate is not None else {})}))
    return pd.concat(frames, ignore_index=True)


def reporting_job(spec: tuple[str, int, float]):
    """A job for executors.run_local that reports ``units`` units of ``key`` one at a time, ``pause`` seconds apart
    (importable in a spawned worker: tests/ is on its sys.path)."""
    import time

    from seedlab.executors import report

    key, units, pause = spec
    for _ in range(units):
        report(key, 1)
        time.sleep(pause)
    return key, units
