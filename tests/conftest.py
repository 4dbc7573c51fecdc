import os

import pytest
import torch

# the suite is sized for a 2-core machine; keep torch from oversubscribing it: one thread in each of make test's
# two worker processes (pytest-xdist sets PYTEST_XDIST_WORKER), two in one process
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _cuda_workspace_setting_restored():
    """A run records CUBLAS_WORKSPACE_CONFIG in its environment and refuses to resume under another value; code
    that settles a CUDA device sets it for the process (lm/determinism.py). Each test leaves it as it found it,
    so a test never sees another's setting (make test's workers run many files in one process)."""
    before = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    if before is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = before


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
    arguments and cwd ``tmp_path`` (helpers.seedlab_main): (returncode, stdout, stderr)."""
    from helpers import seedlab_main

    return lambda *args: seedlab_main(*args, cwd=tmp_path)


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
