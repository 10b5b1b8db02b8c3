"""The batch script through a real Slurm time limit and a real preemption: tests/slurm_check.sh's requeue and preempt
steps, on a one-node Slurm (Debian's slurmctld, slurmd and munge) that the script starts and removes. Needs root and
those packages, or apt to install them; skips with the reason elsewhere."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import REPO, WAITS

SLURM_CHECK = REPO / "tests" / "slurm_check.sh"
PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")
COMMANDS = ("slurmctld", "slurmd", "srun", "munged")
RUN_LIMIT = 800  # s: the two steps (about 2 and 1.5 minutes here; 480 s each at most), the daemons and clean-up


def slurm_or_skip() -> None:
    """Skip, with the reason, where slurm_check.sh cannot run: not root, or no Slurm and no way to install it."""
    if os.geteuid() != 0:
        pytest.skip("a real Slurm needs root (slurm_check.sh starts slurmd and munged)")
    if all(shutil.which(command) for command in COMMANDS):
        return
    if shutil.which("apt-get") is None:
        pytest.skip(f"Slurm is not installed ({', '.join(COMMANDS)}) and there is no apt-get to install it")
    try:
        result = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
                                capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.skip("Slurm is not installed and apt-get install did not finish in 180 s")
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"Slurm is not installed and apt-get install failed: {last}")


@WAITS
@pytest.mark.timeout(RUN_LIMIT + 60)
def test_a_job_past_its_time_limit_or_preempted_checkpoints_requeues_and_finishes_its_budget():
    slurm_or_skip()
    env = {**os.environ, "CHECKS": "requeue preempt"}
    env.pop("KEEP_SCRATCH", None)
    proc = subprocess.Popen(["bash", str(SLURM_CHECK), sys.executable], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the script's own clean-up: cancel the job, stop the daemons
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"slurm_check.sh did not end within {RUN_LIMIT} s:\n{out[-6000:]}")
    assert proc.returncode == 0, out[-6000:]
    passed = [line for line in out.splitlines() if line.startswith("-- PASS: ") and "slurm_train.sbatch" in line]
    assert len(passed) == 2 and all("ran 2 times" in line for line in passed), out[-6000:]
    assert "preempted by job" in passed[1], out[-6000:]
    assert "no process of this cluster left" in out, out[-3000:]
