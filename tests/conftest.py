import os

import pytest
import torch

# the suite is sized for a 2-core machine; keep torch from oversubscribing it
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture
def seedlab_cli(tmp_path):
    """Run the real console entry point in a subprocess: (returncode, stdout, stderr)."""
    import subprocess
    import sys

    def run(*args: str):
        p = subprocess.run([sys.executable, "-m", "seedlab", *args], capture_output=True, text=True, cwd=tmp_path)
        return p.returncode, p.stdout, p.stderr

    return run
