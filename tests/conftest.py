import os

import pytest
import torch

# the suite is sized for a 2-core machine; keep torch from oversubscribing it
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="module")
def one_thread():
    """Row-sized models: one thread is as fast, and far faster on a shared, busy CPU.
    (Use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``.)"""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seedlab_cli(tmp_path):
    """Run the real console entry point in a subprocess: (returncode, stdout, stderr)."""
    import subprocess
    import sys

    def run(*args: str):
        p = subprocess.run([sys.executable, "-m", "seedlab", *args], capture_output=True, text=True, cwd=tmp_path)
        return p.returncode, p.stdout, p.stderr

    return run


@pytest.fixture
def seedlab_main(tmp_path):
    """``seedlab_cli`` without the subprocess: ``seedlab.cli.main`` called in this process with the same
    arguments, cwd ``tmp_path``, stdout and stderr captured, the exit code as a process would have it
    (SystemExit's code; an uncaught exception: its traceback on stderr and 1): (returncode, stdout, stderr).

    It saves the ~2-4 s a fresh interpreter pays to import torch and the study. What a process would not carry
    over is reset around the call: torch's thread count and the torch, numpy and random RNG states (restored),
    the once-per-process precision warning (cleared), Python's default warning filters (a warning is printed
    on the captured stderr, as a fresh process prints it). The real console entry point (exit code 2 and one
    line from a subprocess, kill -9 of a process) is still tested with ``seedlab_cli`` in tests/common/test_cli.py
    and elsewhere."""
    import contextlib
    import io
    import random
    import sys
    import traceback
    import warnings

    import numpy as np

    from seedlab import cli, precision

    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    def run(*args: str):
        out, err = io.StringIO(), io.StringIO()
        threads, rng = torch.get_num_threads(), (torch.get_rng_state(), np.random.get_state(), random.getstate())
        argv, cwd = sys.argv, os.getcwd()
        precision.warn_precision.cache_clear()
        code = 0
        try:
            sys.argv = ["seedlab", *args]
            os.chdir(tmp_path)
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
            os.chdir(cwd)
            torch.set_num_threads(threads)
            torch.set_rng_state(rng[0])
            np.random.set_state(rng[1])
            random.setstate(rng[2])
        return code, out.getvalue(), err.getvalue()

    return run


TWINS_PASSAGES = {
    "fluent-fabricated": "Gizmo Harrington kept a small workshop behind the old library, where he mended clocks.",
    "fluent-attested": "Fredrik Lundh wrote libraries that many programs still use, and answered questions with care.",
}


@pytest.fixture(scope="session")
def twins_inputs(tmp_path_factory):
    """Shared by the twins tests: the embedded corpus (byte tokens, 200 kB) and the two fluent
    passages. Returns (corpus dir, {condition: passage file}), absolute paths for configs."""
    from seedlab.corpus import prepare

    base = tmp_path_factory.mktemp("twins-inputs")
    prepare("embedded", base / "corpus", tokenizer="bytes", max_bytes=200_000)
    files = {}
    for cond, text in TWINS_PASSAGES.items():
        files[cond] = base / f"{cond}.txt"
        files[cond].write_text(text)
    return base / "corpus", files
