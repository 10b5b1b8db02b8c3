"""An environment gymnasium does not register, trained with train.py as docs/training.md says ("Your own
environment"): its module on PYTHONPATH, and "module:EnvId" as the env."""

from __future__ import annotations

import csv
import json
import sys

from conftest import FEW_MINIBATCHES, REPO, run_bounded

TRAIN = str(REPO / "train.py")
# What docs/training.md tells a user to run, with tests/corridor_env.py as the env's module.
DOCUMENTED = "PYTHONPATH=tests python train.py corridor_env:Corridor-v0"


def test_train_py_trains_and_plays_an_env_registered_by_importing_its_module(tmp_path):
    assert DOCUMENTED in (REPO / "docs" / "training.md").read_text()
    # Only the documented PYTHONPATH, relative as in the docs: train.py finds its own packages beside itself, and the
    # ranks mpi_fork starts inherit the variable and the working directory.
    env = {"PYTHONPATH": "tests"}
    result = run_bounded([sys.executable, TRAIN, "corridor_env:Corridor-v0", "--nprocs", "2", "--total_steps", "1024",
                          "--batch_size", "512", *FEW_MINIBATCHES, "--logdir", str(tmp_path)], timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    assert json.loads((run_dir / "config.json").read_text())["env_id"] == "corridor_env:Corridor-v0"
    with open(run_dir / "progress.csv") as f:
        assert [int(row["total_steps"]) for row in csv.DictReader(f)] == [512, 1024]
    # --play makes the env again in a new process: the "corridor_env:" prefix, named again, imports the module there.
    played = run_bounded([sys.executable, TRAIN, "corridor_env:Corridor-v0", "--play", str(run_dir), "--episodes",
                          "2"], timeout=120, env=env)
    assert played.returncode == 0, played.stderr[-3000:]
    assert "mean return" in played.stdout and "over 2 episodes" in played.stdout, played.stdout
    # Where the module cannot be imported, --play says so in one line, naming the way to fix it.
    lost = run_bounded([sys.executable, TRAIN, "corridor_env:Corridor-v0", "--play", str(run_dir), "--episodes", "2"],
                       timeout=120)
    assert lost.returncode == 2 and "episode" not in lost.stdout, lost.stdout
    (line,) = lost.stderr.splitlines()
    assert line.startswith("train.py: error: cannot make corridor_env:Corridor-v0 (ModuleNotFoundError: ") and \
        line.endswith("is the module that registers it importable here (PYTHONPATH)?"), line
