"""trainer.run: train.py from Python, launching its own ranks or running in the ranks of a job mpiexec started."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from conftest import REPO, launcher, run_bounded

EXAMPLE = str(REPO / "examples" / "train_from_python.py")


def rows_of(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "progress.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_run_launches_the_job_as_train_py_does_and_returns_its_run_directory(tmp_path):
    result = run_bounded([sys.executable, EXAMPLE, str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("run directory ")]
    run_dir = Path(line.split()[2].rstrip(":"))
    assert run_dir.parent == tmp_path and [row["iteration"] for row in rows_of(run_dir)] == ["1", "2"]
    assert "PPO on CartPole-v1: 2 processes" in result.stdout  # train.py's own lines, as on the command line


def test_run_in_every_rank_of_a_job_mpiexec_started_trains_once_in_one_directory(tmp_path):
    command, env = launcher("-n", "2", sys.executable, EXAMPLE, str(tmp_path))
    result = run_bounded(command, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("run directory ")]
    assert len(lines) == 2 and lines[0] == lines[1], result.stdout  # every rank returns the same directory
    assert [p.name for p in tmp_path.iterdir()] == [Path(lines[0].split()[2].rstrip(":")).name]


def test_run_refuses_what_train_py_refuses_and_leaves_nothing(tmp_path):
    code = ("import sys, trainer\n"
            "try:\n    trainer.run('CartPole-v1', nproc=2)\nexcept TypeError as error:\n    print(error)\n"
            "try:\n    trainer.run('CartPole-v1', gamma=1.5, logdir=sys.argv[1])\n"
            "except trainer.TrainingFailed as error:\n    print(error.returncode)\n")
    result = run_bounded([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert result.stdout.splitlines() == [
        "run() got option(s) train.py does not have: nproc (see python train.py --help)", "2"], result.stdout
    assert result.stderr.strip() == "train.py: error: --gamma must be in (0, 1], got 1.5"
    assert not list(tmp_path.iterdir())
