"""mpi_util alone installs and runs without TensorFlow, gymnasium or torch (pip install mpi-batch-rl, no extras);
train.py then says in one line what to install."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import REPO, SCRIPTS, run_bounded


def test_base_install_has_mpi_util_without_tensorflow(tmp_path):
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    assert run_bounded([sys.executable, "-m", "venv", str(venv)], timeout=120).returncode == 0
    installed = run_bounded([str(python), "-m", "pip", "install", "-q", str(REPO)], timeout=600,
                            env={"PYTHONPATH": ""}, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = run_bounded([str(python), "-m", "pip", "list", "--format=freeze"], timeout=120,
                         env={"PYTHONPATH": ""}).stdout.lower()
    for heavy in ("tensorflow", "torch", "gymnasium", "keras"):
        assert f"\n{heavy}==" not in f"\n{listed}", listed
    # The installed copy (not this checkout: PYTHONPATH is empty, the working directory elsewhere) forks 3 ranks
    # under its own mpiexec and gathers.
    job = run_bounded([str(python), str(SCRIPTS / "fork_job.py"), "3"], timeout=120, env={"PYTHONPATH": ""},
                      cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "gathered [0, 1, 2]" in job.stdout
    where = run_bounded([str(python), "-c", "import mpi_util; print(mpi_util.__file__)"], timeout=60,
                        env={"PYTHONPATH": ""}, cwd=tmp_path).stdout
    assert str(venv) in where, where
    assert (Path(where.strip()).parent / "py.typed").is_file()  # type checkers read mpi_util's hints (PEP 561)
    result = run_bounded([str(python), str(REPO / "train.py"), "Walker2d"], timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.py needs the rl extra: pip install -e '.[rl]'" in lines[0], result.stderr
