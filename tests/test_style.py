"""The code base stays ruff clean and mpi_util never imports TensorFlow at import time."""

import subprocess
import sys

from conftest import REPO, run_bounded


def test_ruff_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]


def test_importing_mpi_util_does_not_import_tensorflow():
    code = "import sys, mpi_util; print('tensorflow' in sys.modules, 'torch' in sys.modules)"
    result = run_bounded([sys.executable, "-c", code], timeout=60)
    assert result.stdout.strip() == "False False", result.stderr
