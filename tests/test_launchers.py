"""train.py and mpi_util started by an outside launcher (mpiexec / mpirun), with a hostfile or extra mpiexec flags,
under whichever MPI mpi4py loaded (MPICH in .venv; Open MPI through .ci/openmpi)."""

from __future__ import annotations

import csv
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FEW_MINIBATCHES, REPO, SCRIPTS, launcher, run_bounded

from mpi_util.launch import mpi_library_is_open_mpi

TRAIN = str(REPO / "train.py")
OPEN_MPI = mpi_library_is_open_mpi()


def only_run_dir(logdir: Path) -> Path:
    runs = list(logdir.iterdir())
    assert len(runs) == 1, runs  # only rank 0 writes the run directory, and one of it
    return runs[0]


def test_train_started_by_mpirun_writes_one_run_directory_no_bar_and_what_nprocs_gives(tmp_path):
    # mpirun is the name both MPICH and Open MPI install beside mpiexec. Output to a file: under Open MPI a rank's
    # stdout is a pseudo-terminal all the same, and the progress bar must not be drawn into the file. --max_restarts
    # is ignored under a launcher, with a one-line note (the training is the same).
    command, env = launcher("-np", "2", sys.executable, "-u", TRAIN, "CartPole-v1", "--total_steps", "2048",
                            "--max_restarts", "2", "--batch_size", "1024", *FEW_MINIBATCHES,
                            "--logdir", str(tmp_path / "runs"))
    command[0] = str(Path(command[0]).with_name("mpirun"))
    with open(tmp_path / "out.txt", "w") as out:
        proc = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, text=True, timeout=240,
                              env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd=tmp_path)
    text = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, proc.stderr[-3000:] + text[-3000:]
    assert proc.stderr == ("train.py: note: --max_restarts is ignored under a launcher (mpiexec, mpirun or srun); "
                           "train.py restarts only a job it launched itself (python train.py ... --nprocs N)\n")
    assert "PPO on CartPole-v1: 2 processes" in text, text
    assert "\r" not in text and "step/s" not in text, text  # tqdm's bar: carriage returns and a rate
    run_dir = only_run_dir(tmp_path / "runs")
    with open(run_dir / "progress.csv") as f:
        started_by_mpirun = list(csv.DictReader(f))
    assert [int(row["total_steps"]) for row in started_by_mpirun] == [1024, 2048]
    # train.py --nprocs 2 starts the ranks itself (mpi_fork): the same numbers, to the last digit. Both fix BLAS's
    # threads and kernels before numpy loads (trainer/kernels.py); set after, they once moved the 8th digit.
    forked = run_bounded([sys.executable, TRAIN, "CartPole-v1", "--nprocs", "2", "--total_steps", "2048",
                          "--batch_size", "1024", *FEW_MINIBATCHES, "--logdir", str(tmp_path / "forked")], timeout=240)
    assert forked.returncode == 0, forked.stderr[-3000:]
    with open(only_run_dir(tmp_path / "forked") / "progress.csv") as f:
        started_by_fork = list(csv.DictReader(f))
    learned = ["total_episodes", "ep_return_mean", "pi_loss", "v_loss", "entropy", "kl", "explained_var"]
    assert [[row[c] for c in learned] for row in started_by_fork] == [[row[c] for c in learned]
                                                                     for row in started_by_mpirun]


def test_train_nprocs_with_hostfile_and_mpiexec_args(tmp_path):
    # A host list of this machine with two slots, in each MPI's own format, and a launcher flag whose effect shows:
    # each output line tagged with its rank.
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n" if OPEN_MPI else "localhost:2\n")
    tag_flag = "--tag-output" if OPEN_MPI else "-prepend-rank"
    result = run_bounded([sys.executable, TRAIN, "CartPole-v1", "--nprocs", "2", "--hostfile", str(hostfile),
                          f"--mpiexec_args={tag_flag}", "--total_steps", "1024", "--batch_size", "1024",
                          *FEW_MINIBATCHES, "--logdir", str(tmp_path / "runs")], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^\[1?,?0\].*PPO on CartPole-v1: 2 processes", result.stdout, re.MULTILINE), result.stdout
    only_run_dir(tmp_path / "runs")


def test_local_rank_is_the_rank_among_the_ranks_of_this_host(tmp_path):
    # Open MPI's own local rank follows its mapping (0, 2, 1, 3 for ranks 0-3 here); local_rank() must follow the
    # world ranks on the host, as the shared-memory split numbers them. Output to a file: no terminal on any rank.
    command, env = launcher("-n", "4", sys.executable, str(SCRIPTS / "launch_probe.py"), str(tmp_path / "ranks"))
    result = run_bounded(command, timeout=90, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in (tmp_path / "ranks").read_text().splitlines()]
    assert [(int(world), int(local), int(node)) for world, local, node, _ in rows] == [(r, r, r) for r in range(4)]
    assert all(tty == "False" for *_, tty in rows), rows


def run_in_terminal(command: list[str], env: dict[str, str], timeout: float) -> str:
    """Run ``command`` with a pseudo-terminal as its stdout and stderr, as a user at a terminal would; fails the test
    unless it exits 0 within ``timeout`` s. Returns what it wrote to the terminal."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal,
                                env={**os.environ, "PYTHONPATH": str(REPO), **env}, start_new_session=True)
        os.close(terminal)
        output, deadline = b"", time.monotonic() + timeout
        while time.monotonic() < deadline:  # drain the terminal so the job never blocks on a full one
            if not select.select([controller], [], [], 1.0)[0]:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the job closed the terminal
                break
            output += chunk
        try:
            returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"timed out after {timeout} s: {' '.join(command)}\n{output.decode(errors='replace')[-3000:]}")
        assert returncode == 0, output.decode(errors="replace")[-3000:]
    finally:
        os.close(controller)
    return output.decode(errors="replace")


def test_stdout_is_terminal_follows_the_launchers_terminal(tmp_path):
    command, env = launcher("-n", "2", sys.executable, str(SCRIPTS / "launch_probe.py"), str(tmp_path / "ranks"))
    run_in_terminal(command, env, timeout=90)
    rows = [line.split() for line in (tmp_path / "ranks").read_text().splitlines()]
    assert [tty for *_, tty in rows] == ["True", "True"], rows


def test_train_nprocs_at_a_terminal_draws_the_progress_bar(tmp_path):
    # The ranks' stdout is a pipe to mpiexec: rank 0 finds the user's terminal on the stdout of the mpiexec that
    # train.py's launching process started, which is the user's.
    output = run_in_terminal([sys.executable, TRAIN, "CartPole-v1", "--nprocs", "2", "--total_steps", "2048",
                              "--batch_size", "1024", *FEW_MINIBATCHES, "--logdir", str(tmp_path / "runs")],
                             {}, timeout=180)
    assert "PPO on CartPole-v1: 2 processes" in output and "step/s" in output and "\r" in output, output[-3000:]


def test_fork_job_with_shared_windows_prints_nothing_on_stderr():
    # The one-host transport allocates shared-memory windows; Open MPI's osc_ucx would complain about each.
    result = run_bounded([sys.executable, str(SCRIPTS / "fork_job.py"), "3"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
