"""Nothing of a run is lost to what a cluster does to a job: a kill or a full disk at each write a resume makes.

Faults are real: strace fails (ENOSPC) or kills (SIGKILL) rank 0 at a chosen write to a chosen file of the run
directory, under the job's real mpiexec.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_bounded
from test_train import TRAIN, progress, reproducible_part, train

from algos.checkpoint import list_checkpoints, load_latest_checkpoint

STRACE = shutil.which("strace")
COMMON = ("CartPole-v1", "--nprocs", "2", "--batch_size", "1024", "--checkpoint_every", "2",
          "--lr_schedule", "constant")

# (file of the run directory, system call, fault): the writes a resume makes, in the order it makes them. config.json
# and progress.csv are replaced whole (written to .NAME.tmp, then renamed); progress.csv's new rows are appended.
RESUME_WRITES = [
    (".config.json.tmp", "write", "error=ENOSPC"),
    (".config.json.tmp", "write", "signal=KILL"),
    (".progress.csv.tmp", "write", "error=ENOSPC"),
    (".progress.csv.tmp", "write", "signal=KILL"),
    ("progress.csv", "write", "error=ENOSPC"),  # the first row appended after the resume
    ("progress.csv", "write", "signal=KILL"),
]


def weights(run_dir: Path) -> list[np.ndarray]:
    return load_latest_checkpoint(run_dir / "checkpoints")[1]["ac_state"]


@pytest.mark.skipif(STRACE is None, reason="needs strace to inject the faults (apt-get install strace)")
def test_kill_or_full_disk_at_each_write_of_a_resume_loses_no_row_and_the_next_resume_is_exact(tmp_path):
    # A run that logged iterations 1-4 and whose newest checkpoint is of iteration 2, as when rank 0 is killed between
    # iteration 4's row and its checkpoint: a resume must drop rows 3-4 and redo them.
    run_dir, _ = train(*COMMON, "--total_steps", "4096", "--logdir", str(tmp_path / "run"))
    (run_dir / "checkpoints" / "ckpt_00000004.pkl").unlink()
    before = progress(run_dir)
    assert [int(row["iteration"]) for row in before] == [1, 2, 3, 4]

    for name, call, fault in RESUME_WRITES:
        result = run_bounded([STRACE, "-f", "-qq", "-o", "/dev/null", "-P", str(run_dir / name), "-e",
                              f"trace={call}", "-e", f"inject={call}:{fault}:when=1", sys.executable, TRAIN,
                              "--resume", str(run_dir), "--total_steps", "6144"], timeout=150)
        case = f"{fault} at the first {call} to {name}"
        assert result.returncode != 0, f"{case}: the fault did not happen\n{result.stdout[-2000:]}"
        # Every row up to the checkpoint is there, unchanged; the checkpoint too.
        assert progress(run_dir)[:2] == before[:2], case
        assert [path.name for path in list_checkpoints(run_dir / "checkpoints")] == ["ckpt_00000002.pkl"], case
        if "ENOSPC" in fault:
            assert "No space left on device" in result.stderr, f"{case}\n{result.stderr[-2000:]}"
            assert "Traceback" not in result.stderr, f"{case}\n{result.stderr[-3000:]}"

    resumed, _ = train("--resume", str(run_dir), "--total_steps", "6144")
    assert not [path.name for path in [*run_dir.iterdir(), *(run_dir / "checkpoints").iterdir()]
                if path.name.endswith(".tmp")]  # what the kills left is cleared
    whole, _ = train(*COMMON, "--total_steps", "6144", "--logdir", str(tmp_path / "whole"))
    assert reproducible_part(progress(resumed)) == reproducible_part(progress(whole))
    for mine, theirs in zip(weights(resumed), weights(whole), strict=True):
        np.testing.assert_array_equal(mine, theirs)
