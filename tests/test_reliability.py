"""Failures a training job survives or ends cleanly from, under a real mpiexec: an exception or SIGKILL on one
rank, Ctrl-C / SIGTERM, a stalled rank, NaN rewards, corrupted checkpoints, a full disk, bad directories."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FEW_MINIBATCHES, REPO, USES_SMALL_RUN, WAITS, JobOutput, run_bounded
from test_train import TRAIN, progress, train

import mpi_util
from mpi_util import launch
from trainer.checkpoint import load_latest_checkpoint

FAULTY = "tests.faulty_env:FaultyPendulum-v0"


def train_with_fault(tmp_path: Path, kind: str, rank: int, at_step: int, extra: tuple[str, ...] = (),
                     after_file: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A 3-rank run of the faulty env; the time bound (well under the default 600 s stall timeout) shows that the
    failure itself ended the job. after_file: a glob the failing rank waits for first (FAULT_AFTER_FILE)."""
    env = {"FAULT_KIND": kind, "FAULT_RANK": str(rank), "FAULT_AT_STEP": str(at_step), "FAULT_AFTER_FILE": after_file,
           **(env or {})}
    return run_bounded([sys.executable, TRAIN, FAULTY, "--nprocs", "3", "--batch_size", "1536",
                        *FEW_MINIBATCHES, "--total_steps", "100000", "--logdir", str(tmp_path), *extra],
                       timeout=150, env=env)


def assert_no_process_left(tmp_path: Path) -> None:
    # Every rank's command line names the log directory; none may outlive the job.
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"


def test_exception_on_one_rank_ends_job_naming_rank(tmp_path):
    result = train_with_fault(tmp_path, "raise", rank=2, at_step=1200)  # rank 2, iteration 3
    assert result.returncode != 0
    assert "uncaught exception on rank 2" in result.stderr
    assert "RuntimeError: injected fault at step 1200" in result.stderr
    assert "Traceback" in result.stderr
    assert_no_process_left(tmp_path)
    rows = progress(next(tmp_path.iterdir()))
    assert len(rows) == 2  # it died in the third iteration, nothing after


def test_sigkill_of_one_rank_ends_job_and_keeps_last_checkpoint(tmp_path):
    # Rank 1 dies 176 steps into iteration 3, a few milliseconds after iteration 2's checkpoint gather: it first
    # waits for that checkpoint to be on disk, else the job's end could kill rank 0 mid-write (seen once in a
    # fresh-clone .ci/run under load), leaving checkpoint 1 as the last good one: correct, but not what is asserted.
    result = train_with_fault(tmp_path, "kill", rank=1, at_step=1200, extra=("--checkpoint_every", "1"),
                              after_file=str(tmp_path / "*" / "checkpoints" / "ckpt_00000002.npz"))
    assert result.returncode != 0
    assert_no_process_left(tmp_path)
    path, state, warnings = load_latest_checkpoint(next(tmp_path.iterdir()) / "checkpoints")
    assert path.name == "ckpt_00000002.npz" and not warnings
    assert int(state["counters"][1]) == 2 * 1536


@WAITS
def test_stalled_rank_aborts_job_naming_it(tmp_path):
    result = train_with_fault(tmp_path, "hang", rank=1, at_step=700, extra=("--stall_timeout", "20"))
    assert result.returncode != 0
    assert "no progress for 20 s in rank0_accum_batches" in result.stderr
    assert "rank 1 has not arrived (last entered rank0_bcast_wts" in result.stderr
    # Said once, by rank 0, in train.py's own line, and the job's last line names the rank that stalled.
    assert result.stderr.count("train.py: error: ") == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.replace("\0", "").strip().splitlines()[-1]  # Open MPI's mpiexec may write a NUL before it
    assert re.fullmatch(r"mpi_util: rank 1 \(on host \S+, pid \d+\) stopped making progress, and rank 0 ended the job "
                        r"\(exit status 1\)", last), last
    assert_no_process_left(tmp_path)


@WAITS
def test_default_stall_limit_reports_a_rank_hung_in_the_first_rollout_within_150_s(tmp_path):
    # Rank 1's env hangs at its 100th step, in the first iteration: the ranks waiting for it see its heartbeats stop,
    # and 60 s later (the "auto" limit for a rank that has ticked) the job ends, naming it.
    started = time.monotonic()
    result = train_with_fault(tmp_path, "hang", rank=1, at_step=100)
    assert result.returncode != 0
    assert time.monotonic() - started < 150
    assert "no progress for 60 s in rank0_accum_batches" in result.stderr
    assert "rank 1 has not arrived" in result.stderr
    assert_no_process_left(tmp_path)


@WAITS
def test_slow_rank_that_advances_is_not_blamed(tmp_path):
    # Rank 1's env is slow (+24 ms a step: its 512-step rollout takes over 12 s, the others' a fraction of a second),
    # so ranks 0 and 2 wait about 12 s in each gather, 3x the 4 s stall limit; rank 1's heartbeats keep it unblamed.
    # The limit leaves room for rank 0's first update, which traces TensorFlow's functions between two heartbeats:
    # under a loaded suite that took over 2 s once (2026-11-29) and rank 0 was blamed.
    env = {"FAULT_SLOW_S": "0.024"}
    result = train_with_fault(tmp_path, "slow", rank=1, at_step=1, extra=("--stall_timeout", "4", "--total_steps",
                                                                           "3072"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(progress(next(tmp_path.iterdir()))) == 2


@WAITS
def test_stop_request_with_a_hung_rank_ends_the_job_within_the_grace_naming_it(tmp_path):
    # Rank 1 hangs in iteration 2; a SIGTERM after iteration 1 asks for a stop, which iteration 2 never reaches.
    env = dict(os.environ, PYTHONPATH=str(REPO), FAULT_KIND="hang", FAULT_RANK="1", FAULT_AT_STEP="700")
    job = subprocess.Popen([sys.executable, TRAIN, FAULTY, "--nprocs", "3", "--batch_size", "1536", *FEW_MINIBATCHES,
                            "--checkpoint_every", "1", "--total_steps", "100000", "--stop_grace", "5", "--logdir",
                            str(tmp_path)],
                           cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(tmp_path.glob("*/checkpoints/ckpt_00000001.npz")):
            time.sleep(0.2)
        signalled = time.monotonic()
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=90)
        ended_after_s = time.monotonic() - signalled
    finally:
        job.kill()
    assert job.returncode != 0
    assert ended_after_s < 5 + 20, ended_after_s
    assert "5 s after the stop request (signal 15): rank 1 has not arrived" in stderr, stderr[-3000:]
    assert "the last good checkpoint, ckpt_00000001.npz, is kept" in stderr
    assert_no_process_left(tmp_path)


def test_nan_reward_names_rank_and_step(tmp_path):
    result = train_with_fault(tmp_path, "nan", rank=1, at_step=300)
    assert result.returncode != 0
    assert "uncaught exception on rank 1" in result.stderr
    assert "non-finite observation or reward at step 299 of this collect" in result.stderr
    assert_no_process_left(tmp_path)


# SIGINT (Ctrl-C at the launcher); SIGTERM, to every process and in every phase, and the exact resume after a stop
# are test_nothing_lost's.
@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_signal_stops_at_safe_point_with_checkpoint(tmp_path, signum):
    common = ["Pendulum-v1", "--nprocs", "2", "--batch_size", "1024", "--checkpoint_every", "1000", *FEW_MINIBATCHES]
    job = subprocess.Popen([sys.executable, TRAIN, *common, "--total_steps", "1000000", "--logdir",
                            str(tmp_path / "stopped")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        deadline = time.monotonic() + 120
        csv_files: list[Path] = []
        # Wait (bounded) until two iterations are logged, then interrupt the launcher as a user would.
        while time.monotonic() < deadline:
            csv_files = list((tmp_path / "stopped").glob("*/progress.csv"))
            if csv_files and len(csv_files[0].read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        job.send_signal(signum)
        stdout, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0, stderr[-3000:]
    assert f"stopped by signal {int(signum)}" in stdout
    run_dir = csv_files[0].parent
    stopped_at = len(progress(run_dir))
    path, state, _ = load_latest_checkpoint(run_dir / "checkpoints")
    assert int(state["counters"][0]) == stopped_at  # the checkpoint is of the last finished iteration
    assert_no_process_left(tmp_path)


@USES_SMALL_RUN
def test_corrupted_checkpoint_is_reported_and_previous_used(small_run):
    newest = small_run / "checkpoints" / "ckpt_00000002.npz"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated, as by a crash mid-copy
    _, out = train("--resume", str(small_run), "--total_steps", "4608")
    assert "skipping" in out and "ckpt_00000002.npz is truncated or corrupted (checksum mismatch)" in out
    assert "from ckpt_00000001.npz: iteration 1, step 1536" in out
    assert [int(r["iteration"]) for r in progress(small_run)] == [1, 2, 3]


def test_full_disk_at_checkpoint_names_last_good_one(tmp_path):
    run_dir, _ = train(FAULTY, "--nprocs", "2", "--total_steps", "4096", "--checkpoint_every", "2",
                       *FEW_MINIBATCHES, "--logdir", str(tmp_path))
    good = (run_dir / "checkpoints" / "ckpt_00000002.npz").read_bytes()
    assert len(good) > 60_000
    # From iteration 4 on (1024 env steps per rank per iteration, counted from the run's start: the env comes back from
    # the checkpoint with its count; the shared memory is made by then), writes past 60 kB fail (EFBIG), as writes to
    # a full disk fail (ENOSPC): logs fit, the checkpoint not.
    result = run_bounded([sys.executable, TRAIN, FAULTY, "--resume", str(run_dir), "--nprocs", "2", "--total_steps",
                          "8192"],
                         timeout=150, env={"FAULT_KIND": "file_limit", "FAULT_FILE_BYTES": "60000",
                                           "FAULT_AT_STEP": "3073"})
    assert result.returncode != 0
    assert ("train.py: error: cannot write the checkpoint of iteration 4" in result.stderr
            and "the last good checkpoint, ckpt_00000002.npz, is kept: free space" in result.stderr), \
        result.stderr[-2000:]
    assert (run_dir / "checkpoints" / "ckpt_00000002.npz").read_bytes() == good
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp file left


def test_unwritable_log_directory_fails_before_training(tmp_path):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("")
    result = run_bounded([sys.executable, TRAIN, "CartPole-v1", "--logdir", str(blocker / "runs")], timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("train.py: error: ") and "Not a directory" in result.stderr


def test_missing_mpiexec_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(launch, "_loaded_mpi_library_path", lambda: "/nowhere/lib/libmpi.so.12")
    monkeypatch.setattr(sys, "executable", "/nowhere/bin/python")
    monkeypatch.setattr(sys, "prefix", "/nowhere")
    monkeypatch.setenv("PATH", "/nowhere/bin")
    with pytest.raises(mpi_util.MpiexecNotFoundError, match="no mpiexec found .*pip install mpich"):
        mpi_util.find_mpiexec()


def test_signal_after_training_ended_still_exits_cleanly(tmp_path):
    # A Ctrl-C just after the last iteration (during shutdown) used to kill ranks inside MPI_Finalize.
    job = subprocess.Popen([sys.executable, TRAIN, "Pendulum-v1", "--nprocs", "3", "--batch_size", "1536",
                            "--total_steps", "3072", *FEW_MINIBATCHES, "--logdir", str(tmp_path)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    output = JobOutput(job)
    try:
        output.wait_for("^done:", 120, "the run's closing line")
        job.send_signal(signal.SIGINT)
        output.finish(timeout=60)
    finally:
        job.kill()
    assert job.returncode == 0
    assert_no_process_left(tmp_path)


@USES_SMALL_RUN
def test_run_directory_in_use_is_refused(small_run):
    run_dir = small_run
    job = subprocess.Popen([sys.executable, TRAIN, "--resume", str(run_dir), "--total_steps", "1000000"], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:  # rank 0 holds the lock once it prints its first iteration
        JobOutput(job).wait_for(r"^\s*3\s", 120, "the resumed run's first iteration")
        result = run_bounded([sys.executable, TRAIN, "--resume", str(run_dir)], timeout=60)
    finally:
        job.send_signal(signal.SIGTERM)
        job.communicate(timeout=60)
    assert result.returncode == 2
    assert f"train.py: error: {run_dir} is in use by another training job" in result.stderr
