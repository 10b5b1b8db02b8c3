"""Nothing of a run is lost to what a cluster does to a job: a kill or a full disk at each write a resume makes.

Faults are real: strace fails (ENOSPC) or kills (SIGKILL) rank 0 at a chosen write to a chosen file of the run
directory, under the job's real mpiexec.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import FEW_MINIBATCHES, REPO, run_bounded
from faults import cmdline, descendants, entries_that_differ, process_table, same_value
from test_train import TRAIN, progress, reproducible_part, train

from trainer.checkpoint import list_checkpoints, load_latest_checkpoint

STRACE = shutil.which("strace")
COMMON = ("CartPole-v1", "--nprocs", "2", "--batch_size", "1024", "--checkpoint_every", "2",
          "--lr_schedule", "constant", *FEW_MINIBATCHES)

# (file of the run directory, system call, fault): the writes a resume makes, in the order it makes them. config.json
# and progress.csv are replaced whole (written to .NAME.tmp, then renamed); progress.csv's new rows are appended.
# Each of the three writes once, a full disk and a kill between them (each fault at each write: the fault table,
# tests/fault_table.py); the kill where the old code lost rows, in the rewrite of progress.csv.
RESUME_WRITES = [
    (".config.json.tmp", "write", "error=ENOSPC"),
    (".progress.csv.tmp", "write", "signal=KILL"),
    ("progress.csv", "write", "error=ENOSPC"),  # the first row appended after the resume
]


def weights(run_dir: Path) -> list[np.ndarray]:
    return load_latest_checkpoint(run_dir / "checkpoints")[1]["ac_state"]


@pytest.mark.skipif(STRACE is None, reason="needs strace to inject the faults (apt-get install strace)")
def test_kill_or_full_disk_at_each_write_of_a_resume_loses_no_row_and_the_next_resume_is_exact(tmp_path):
    # A run that logged iterations 1-6 and whose newest checkpoint is of iteration 2, as when rank 0 is killed between
    # iteration 6's row and its checkpoint and the one of iteration 4 was lost: a resume must drop rows 3-6 and redo
    # them. Before the checkpoints go, the run's rows and last weights are what an uninterrupted run ends with.
    run_dir, _ = train(*COMMON, "--total_steps", "6144", "--logdir", str(tmp_path / "run"))
    before, whole_weights = progress(run_dir), weights(run_dir)
    assert [int(row["iteration"]) for row in before] == [1, 2, 3, 4, 5, 6]
    for iteration in (4, 6):
        (run_dir / "checkpoints" / f"ckpt_{iteration:08d}.npz").unlink()

    for name, call, fault in RESUME_WRITES:
        # --seccomp-bpf stops the job at its write calls alone instead of at every system call (TensorFlow's import
        # makes tens of thousands): a few seconds a resume instead of about 20. With it strace 6.1 made no signal=KILL
        # fault here (the job ran to its end, five runs of five), so that case runs without it.
        only_writes = ["--seccomp-bpf"] if fault.startswith("error=") else []
        result = run_bounded([STRACE, "-f", *only_writes, "-qq", "-o", "/dev/null", "-P", str(run_dir / name), "-e",
                              f"trace={call}", "-e", f"inject={call}:{fault}:when=1", sys.executable, TRAIN,
                              "--resume", str(run_dir), "--total_steps", "6144"], timeout=150)
        case = f"{fault} at the first {call} to {name}"
        assert result.returncode != 0, f"{case}: the fault did not happen\n{result.stdout[-2000:]}"
        # Every row up to the checkpoint is there, unchanged; the checkpoint too.
        assert progress(run_dir)[:2] == before[:2], case
        assert [path.name for path in list_checkpoints(run_dir / "checkpoints")] == ["ckpt_00000002.npz"], case
        if "ENOSPC" in fault:
            assert "No space left on device" in result.stderr, f"{case}\n{result.stderr[-2000:]}"
            assert "Traceback" not in result.stderr, f"{case}\n{result.stderr[-3000:]}"

    resumed, _ = train("--resume", str(run_dir), "--total_steps", "6144")
    assert not [path.name for path in [*run_dir.iterdir(), *(run_dir / "checkpoints").iterdir()]
                if path.name.endswith(".tmp")]  # what the kills left is cleared
    assert reproducible_part(progress(resumed)) == reproducible_part(before)
    for mine, theirs in zip(weights(resumed), whole_weights, strict=True):
        np.testing.assert_array_equal(mine, theirs)


# --- Stop requests as a cluster sends them ---------------------------------------------------------------------------

FAULTY = "tests.faulty_env:FaultyPendulum-v0"
# Each phase: the job's settings, and what the phase needs (more on each in wait_for_phase). In "rollout" rank 0's env
# sleeps 4 ms a step (2 s for its 512 steps); in "update" PPO runs 200 epochs of 64-row minibatches with no early
# stop (about 2 s).
PHASES = {
    "start-up": ((FAULTY, *FEW_MINIBATCHES), {}),
    "rollout": ((FAULTY, *FEW_MINIBATCHES),
                {"FAULT_KIND": "slow", "FAULT_RANK": "0", "FAULT_AT_STEP": "0", "FAULT_SLOW_S": "0.004"}),
    "update": (("CartPole-v1", "--epochs", "200", "--kl_targ", "1000"), {}),
}
STOP_COMMON = ("--nprocs", "2", "--batch_size", "1024", "--checkpoint_every", "1000", "--lr_schedule", "constant")


def job_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents before children (launcher, mpiexec, proxy, ranks)."""
    return descendants(pid, process_table())


def ranks_of(launcher: int) -> list[int]:
    """The job's ranks: the processes of its tree that run train.py, less the launcher."""
    return [pid for pid in job_tree(launcher)[1:] if "train.py" in cmdline(pid) and "mpiexec" not in cmdline(pid)]


def catches(pid: int, signum: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signum - 1) & 1)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def poll(condition, timeout: float, what: str) -> None:
    """Wait for ``condition()``, at most ``timeout`` seconds; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def rows_logged(logdir: Path) -> int:
    files = list(logdir.glob("*/progress.csv"))
    return max(len(files[0].read_text().splitlines()) - 1, 0) if files else 0


def wait_for_phase(phase: str, launcher: subprocess.Popen, logdir: Path) -> None:
    """Return once the job is in ``phase``: "start-up", every rank started and catching SIGTERM, before the first
    iteration; "rollout", iteration 1 logged (rank 0 then rolls out for 2 s); "update", iteration 1 logged and rank 0
    has since used 0.3 s of CPU, which its 512-step CartPole rollout cannot take (a few ms): it is in the update."""
    def alive() -> bool:
        if launcher.poll() is not None:
            pytest.fail(f"the job ended before the {phase} (exit {launcher.returncode})")
        return True

    if phase == "start-up":
        poll(lambda: alive() and len(ranks := ranks_of(launcher.pid)) == 2
             and all(catches(pid, signal.SIGTERM) for pid in ranks), 120, "the ranks to start")
        assert rows_logged(logdir) == 0
        return
    poll(lambda: alive() and rows_logged(logdir) >= 1, 120, "iteration 1")
    if phase == "update":
        rank0 = ranks_of(launcher.pid)[0]
        start = cpu_seconds(rank0)
        poll(lambda: alive() and cpu_seconds(rank0) - start > 0.3, 60, "rank 0's update")
        assert rows_logged(logdir) == 1


def start_training(logdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    logdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, TRAIN, *args, "--logdir", str(logdir)], cwd=REPO,
                            stdout=open(logdir / "stdout.txt", "w"), stderr=open(logdir / "stderr.txt", "w"),  # noqa: SIM115
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, start_new_session=True)


def finish(job: subprocess.Popen, logdir: Path, timeout: float = 90) -> tuple[int, str, str]:
    try:
        job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        for pid in job_tree(job.pid):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the job did not end within {timeout} s")
    return job.returncode, (logdir / "stdout.txt").read_text(), (logdir / "stderr.txt").read_text()


def assert_stopped_with_checkpoint(returncode: int, stdout: str, stderr: str, logdir: Path) -> Path:
    assert returncode == 0, f"exit {returncode}\n{stdout[-2000:]}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    run_dir = next(logdir.glob("*/progress.csv")).parent
    _, state, _ = load_latest_checkpoint(run_dir / "checkpoints")
    assert int(state["counters"][0]) == len(progress(run_dir))  # the checkpoint is of the last iteration logged
    left = subprocess.run(["pgrep", "-f", str(logdir)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"
    return run_dir


@pytest.mark.parametrize("way", ["process group", "each process in turn"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_sigterm_to_every_process_stops_once_with_a_checkpoint(tmp_path, phase, way):
    settings, env = PHASES[phase]
    common = (*settings, *STOP_COMMON)
    logdir = tmp_path / "stopped"
    job = start_training(logdir, *common, "--total_steps", "1000000", env=env)
    wait_for_phase(phase, job, logdir)
    if way == "process group":  # the launcher's group: mpiexec has a session of its own, so the launcher alone
        os.killpg(job.pid, signal.SIGTERM)
    else:  # as a scheduler's cancel: every process of the job, launcher first
        for pid in job_tree(job.pid):
            os.kill(pid, signal.SIGTERM)
    returncode, stdout, stderr = finish(job, logdir)
    run_dir = assert_stopped_with_checkpoint(returncode, stdout, stderr, logdir)
    assert stdout.count("received signal 15: stopping after this iteration") == 1, stdout[-2000:]
    stopped_at = len(progress(run_dir))
    assert stopped_at == (1 if phase == "start-up" else 2)  # the iteration under way when the signal came

    if phase == "update" and way == "process group":
        # The checkpoint the stop wrote is the one a run that was not stopped writes at that iteration: everything a
        # resume reads (weights, optimizer, random states, every rank's envs, counters) is equal, so a resume from it
        # continues bit for bit (test_train's resume test shows that for such a checkpoint).
        whole, _ = train(*common, "--total_steps", str(stopped_at * 1024), "--logdir", str(tmp_path / "whole"))
        assert reproducible_part(progress(run_dir)) == reproducible_part(progress(whole))
        stopped, unstopped = (load_latest_checkpoint(run / "checkpoints")[1] for run in (run_dir, whole))
        assert stopped.keys() == unstopped.keys()
        # The counters' last two are flags for the end (the budget was spent in one run, not in the other), which a
        # resume does not read; the budgets in the configurations differ, and the clocks.
        assert same_value(stopped["counters"][:3], unstopped["counters"][:3])
        differ = entries_that_differ(stopped, unstopped, ("config", "elapsed_s", "counters"))
        assert not differ, differ


def test_launcher_killed_the_ranks_stop_with_a_checkpoint_and_clean_up(tmp_path):
    # Killed in iteration 2's rollout, which the slowed env makes last 2 s: the ranks learn of it within it (CI
    # once saw a plain Pendulum job, whose iterations take a few hundred ms under load, stop after iteration 3).
    logdir = tmp_path / "orphaned"
    settings, env = PHASES["rollout"]
    job = start_training(logdir, *settings, *STOP_COMMON, "--total_steps", "1000000", env=env)
    wait_for_phase("rollout", job, logdir)
    tree = job_tree(job.pid)
    mpiexec_pid = tree[1]
    job_dir = dict(line.split("=", 1) for line in Path(f"/proc/{mpiexec_pid}/environ").read_text().split("\0")
                   if "=" in line)["MPI_UTIL_JOB_DIR"]
    shared_memory = {path for pid in ranks_of(job.pid) for path in Path(f"/proc/{pid}/maps").read_text().split()
                     if path.startswith("/dev/shm/")}
    job.kill()  # SIGKILL, as the OOM killer does
    job.wait()
    poll(lambda: not any(Path(f"/proc/{pid}").exists() and "train.py" in cmdline(pid) for pid in tree[1:]), 60,
         "the ranks to end")
    stdout, stderr = (logdir / "stdout.txt").read_text(), (logdir / "stderr.txt").read_text()
    assert "the launching process has ended: stopping after this iteration with a checkpoint" in stdout
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    run_dir = next(logdir.glob("*/progress.csv")).parent
    _, state, _ = load_latest_checkpoint(run_dir / "checkpoints")
    assert int(state["counters"][0]) == len(progress(run_dir)) == 2
    assert not Path(job_dir).exists()
    assert shared_memory and not [path for path in shared_memory if Path(path).exists()]


def test_sighup_to_the_launcher_stops_like_sigterm(tmp_path):
    # A closed terminal: SIGHUP to the launching process alone (the job has its own session).
    settings, env = PHASES["rollout"]
    logdir = tmp_path / "hup"
    job = start_training(logdir, *settings, *STOP_COMMON, "--total_steps", "1000000", env=env)
    wait_for_phase("rollout", job, logdir)
    job.send_signal(signal.SIGHUP)
    returncode, stdout, stderr = finish(job, logdir)
    assert_stopped_with_checkpoint(returncode, stdout, stderr, logdir)
    assert "received signal 15: stopping after this iteration" in stdout  # the launcher passes it on as SIGTERM
    assert "UCX" not in stdout + stderr  # UCX's debug handler, SIGHUP's default catcher under MPI, never runs


def test_a_second_ctrl_c_after_the_notice_stops_at_once_in_one_line(tmp_path):
    # Rank 0 rolls out for 5 s: the second Ctrl-C comes while the iteration the first one asked to finish goes on.
    settings, env = PHASES["rollout"]
    logdir = tmp_path / "twice"
    job = start_training(logdir, *settings, *STOP_COMMON, "--total_steps", "1000000",
                         env={**env, "FAULT_SLOW_S": "0.01"})
    wait_for_phase("rollout", job, logdir)
    first = time.monotonic()
    job.send_signal(signal.SIGINT)  # a terminal's Ctrl-C reaches the launcher's process group: the launcher
    poll(lambda: "received signal 2: stopping" in (logdir / "stdout.txt").read_text(), 30, "the notice")
    assert rows_logged(logdir) == 1  # said at once, in the middle of the rollout
    poll(lambda: time.monotonic() - first > 1.2, 5, "a person's pause between two Ctrl-C")
    job.send_signal(signal.SIGINT)
    returncode, stdout, stderr = finish(job, logdir)
    assert returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: stopped at once by a second Ctrl-C, without a final checkpoint"), stderr[-2000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert rows_logged(logdir) == 1
