"""What the launching process does when its job goes wrong, under a real mpiexec: it names a killed rank and its
host, restarts the run from its newest checkpoint (--max_restarts), removes the /dev/shm files the ranks mapped,
and refuses more processes than the host allows before starting any."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FEW_MINIBATCHES, REPO, SCRIPTS, JobOutput, run_bounded
from test_reliability import FAULTY, assert_no_process_left
from test_train import TRAIN, progress

from mpi_util.supervise import tasks_of_job


def killed_run(tmp_path: Path, max_restarts: int, total_steps: int = 100_000) -> subprocess.CompletedProcess:
    """3 ranks of the faulty env, checkpoint every iteration; rank 1 kills itself (SIGKILL) once, 176 steps into
    iteration 3, after iteration 2's checkpoint is on disk, having written its pid and mapped /dev/shm files."""
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {"FAULT_KIND": "kill", "FAULT_RANK": "1", "FAULT_AT_STEP": "1200", "FAULT_REPORT_DIR": str(reports),
           "FAULT_ONCE_MARKER": str(tmp_path / "killed_once"),
           "FAULT_AFTER_FILE": str(tmp_path / "runs" / "*" / "checkpoints" / "ckpt_00000002.npz")}
    return run_bounded([sys.executable, TRAIN, FAULTY, "--nprocs", "3", "--batch_size", "1536", *FEW_MINIBATCHES,
                        "--total_steps", str(total_steps), "--checkpoint_every", "1", "--max_restarts",
                        str(max_restarts), "--logdir", str(tmp_path / "runs")], timeout=240, env=env)


def killed_rank_report(tmp_path: Path, rank: int = 1) -> dict:
    """The killed rank's pid and what it had mapped under /dev/shm: "PATH", or "PATH (deleted)" when unnamed."""
    return json.loads((tmp_path / "reports" / f"killed_{rank}.json").read_text())


def left_in_shared_memory(mapped: list[str]) -> list[str]:
    """Which of the files a killed rank had mapped under /dev/shm are still there. Only those: other jobs on this
    machine keep their own files there."""
    return [path for path in (entry.removesuffix(" (deleted)") for entry in mapped) if os.path.exists(path)]


def test_killed_rank_is_named_with_its_host_and_its_shared_memory_removed(tmp_path):
    result = killed_run(tmp_path, max_restarts=0)
    assert result.returncode != 0
    killed = killed_rank_report(tmp_path)
    assert (f"mpi_util: rank 1 (on host {socket.gethostname()}, pid {killed['pid']}) was killed by signal 9 "
            f"(SIGKILL)") in result.stderr, result.stderr[-3000:]
    # The job's start-up file, mapped by every rank: MPICH's lost its name in init (release_start_up_shared_memory),
    # Open MPI's segments keep theirs until the launching process removes them.
    assert [entry for entry in killed["shm"] if os.path.basename(entry).startswith(("mpich_shm_", "sm_segment."))], \
        killed
    assert left_in_shared_memory(killed["shm"]) == []
    assert_no_process_left(tmp_path)


def test_killed_rank_restarts_from_newest_checkpoint_and_run_ends_with_its_budget(tmp_path):
    budget = 6 * 1536
    result = killed_run(tmp_path, max_restarts=1, total_steps=budget)
    assert result.returncode == 0, result.stderr[-3000:]
    killed = killed_rank_report(tmp_path)
    restarts = [line for line in result.stderr.splitlines() if "restarting" in line]
    assert restarts == [f"train.py: rank 1 (on host {socket.gethostname()}, pid {killed['pid']}) was killed by "
                        "signal 9 (SIGKILL); restarting from checkpoint ckpt_00000002 (restart 1 of 1)"], \
        result.stderr[-3000:]
    run_dir = next((tmp_path / "runs").iterdir())
    assert "resuming" in result.stdout and "from ckpt_00000002.npz: iteration 2" in result.stdout
    rows = progress(run_dir)
    assert [int(row["iteration"]) for row in rows] == [1, 2, 3, 4, 5, 6]
    assert int(rows[-1]["total_steps"]) == budget
    assert left_in_shared_memory(killed["shm"]) == []
    assert_no_process_left(tmp_path)


def test_killed_single_process_run_leaves_no_shared_memory(tmp_path):
    # One process has no launcher to clean up after it: MPICH's file for it loses its name at start-up.
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {"FAULT_KIND": "kill", "FAULT_RANK": "0", "FAULT_AT_STEP": "100", "FAULT_REPORT_DIR": str(reports)}
    result = run_bounded([sys.executable, TRAIN, FAULTY, "--nprocs", "1", "--total_steps", "100000", "--logdir",
                          str(tmp_path / "runs")], timeout=120, env=env)
    assert result.returncode == -9
    killed = killed_rank_report(tmp_path, rank=0)
    # MPICH's mpich_shm_*, Open MPI's sm_segment.*: the run had one, and it is gone.
    assert [entry for entry in killed["shm"] if entry.startswith(("/dev/shm/mpich_shm_", "/dev/shm/sm_segment"))], \
        killed
    assert left_in_shared_memory(killed["shm"]) == []


def test_restarts_end_when_used_up(tmp_path):
    # Without the once-marker the fault comes back on every run: one restart, then the run ends, saying so.
    env = {"FAULT_KIND": "kill", "FAULT_RANK": "1", "FAULT_AT_STEP": "200"}
    result = run_bounded([sys.executable, TRAIN, FAULTY, "--nprocs", "2", "--batch_size", "1024", "--total_steps",
                          "100000", "--max_restarts", "1", "--logdir", str(tmp_path)], timeout=240, env=env)
    assert result.returncode != 0
    assert result.stderr.count("restarting from the start (no checkpoint yet) (restart 1 of 1)") == 1, \
        result.stderr[-3000:]
    assert "was killed by signal 9 (SIGKILL); no restarts left (1 made)" in result.stderr
    assert_no_process_left(tmp_path)


def lower_process_limit(limit: int) -> None:
    """In the child before exec: a soft RLIMIT_NPROC of ``limit`` (as ``prlimit --nproc=LIMIT:`` would)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, hard))


def test_more_processes_than_the_limit_are_refused_in_one_line(tmp_path):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, TRAIN, "CartPole-v1", "--nprocs", "50", "--logdir", str(tmp_path)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: lower_process_limit(20))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "train.py: error: 50 processes requested, but this user may run at most 20 (ulimit -u): ask for at most 20, "
        "or raise the limit"], proc.stderr[-3000:]
    assert time.monotonic() - started < 30
    assert_no_process_left(tmp_path)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())  # no run directory left behind


def own_pids_cgroup(version: str) -> Path | str:
    """This process's cgroup in the pids hierarchy of cgroup ``version`` ("v1" or "v2"), where a child cgroup with
    its own pids.max can be made (a limit as a container or a batch scheduler sets); else why not, in one line."""
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if version == "v1" and "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup", controllers, path.lstrip("/"))
        if version == "v2" and controllers == "":
            for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                own = mount / path.lstrip("/")
                try:
                    if "pids" in (own / "cgroup.subtree_control").read_text().split():
                        return own
                except OSError:
                    continue
            return "cgroup v2 gives no child cgroup the pids controller here (cgroup.subtree_control)"
    return f"no cgroup {version} pids controller here"


def remove_cgroup(cgroup: Path, timeout: float = 30) -> None:
    """Kill what is left in ``cgroup`` (processes this test started) and remove it."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in (cgroup / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            cgroup.rmdir()
            return
        except OSError:  # busy until the killed processes are reaped
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.fixture(params=["v1", "v2"])
def pids_cgroup(request) -> Iterator[Path]:
    """A child of this process's cgroup, named after the test, in cgroup v1's or v2's pids hierarchy; removed after
    the test. Skips, saying why, where none can be made."""
    parent = own_pids_cgroup(request.param)
    if isinstance(parent, str):
        pytest.skip(parent)
    cgroup = parent / f"{request.node.originalname}_{request.param}_{os.getpid()}"
    try:
        cgroup.mkdir()
    except OSError as error:
        pytest.skip(f"cannot make a cgroup in {parent}: {error}")
    try:
        yield cgroup
    finally:
        remove_cgroup(cgroup)


def in_cgroup(cgroup: Path, *command: str) -> list[str]:
    """``command``, started inside ``cgroup``: a shell moves itself there, then becomes the command."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *command]


def forks_refused(cgroup: Path) -> int:
    """How often the kernel refused a new task in ``cgroup`` for its pids.max (0 where it does not say)."""
    events = cgroup / "pids.events"
    return int(events.read_text().split()[1]) if events.exists() else 0


@pytest.mark.parametrize("in_child", [False, True], ids=["own", "parent"])
def test_more_processes_than_the_cgroup_allows_are_refused_in_one_line(tmp_path, pids_cgroup, in_child):
    # As a container or a systemd unit limits tasks: before the check, this job printed 27 lines of launcher
    # errors after 11 s and left a run directory holding only its .lock. "parent": the job runs in a child cgroup
    # without a limit of its own, held by its parent's.
    (pids_cgroup / "pids.max").write_text("150")
    job_cgroup = pids_cgroup / "job" if in_child else pids_cgroup
    job_cgroup.mkdir(exist_ok=True)
    logdir = tmp_path / "runs"
    started = time.monotonic()
    try:
        result = run_bounded(in_cgroup(job_cgroup, sys.executable, TRAIN, "CartPole-v1", "--nprocs", "1000",
                                       "--logdir", str(logdir)), timeout=60)
    finally:
        if in_child:
            remove_cgroup(job_cgroup)
    assert result.returncode == 2, result.stderr[-3000:]
    match = re.fullmatch(rf"train.py: error: 1000 processes requested, but {re.escape(str(pids_cgroup))}/pids.max "
                         r"allows 150 tasks, (\d+) in use, and each process takes 3 or more \(its threads\): ask for "
                         r"at most (\d+), or raise the limit\n", result.stderr)
    assert match, result.stderr[-3000:]
    in_use, most = map(int, match.groups())
    assert tasks_of_job(most) <= 150 - in_use < tasks_of_job(most + 1)
    assert time.monotonic() - started < 10
    assert not logdir.exists() or not list(logdir.iterdir())  # no run directory, not even its .lock
    assert forks_refused(pids_cgroup) == 0  # nothing was started that the limit had to stop
    assert (pids_cgroup / "cgroup.procs").read_text() == ""


def test_a_job_within_the_cgroup_limit_trains(tmp_path, pids_cgroup):
    # Room for 2 ranks as check_process_room counts them, and 10 tasks for the launching process itself.
    (pids_cgroup / "pids.max").write_text(str(tasks_of_job(2) + 10))
    result = run_bounded(in_cgroup(pids_cgroup, sys.executable, TRAIN, "CartPole-v1", "--nprocs", "2",
                                   "--batch_size", "1024", *FEW_MINIBATCHES, "--total_steps", "2048", "--logdir",
                                   str(tmp_path)),
                         timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""
    assert [int(row["total_steps"]) for row in progress(next(tmp_path.iterdir()))] == [1024, 2048]
    assert forks_refused(pids_cgroup) == 0
    assert (pids_cgroup / "cgroup.procs").read_text() == ""  # the job left nothing running


def test_more_than_four_ranks_per_cpu_warn_once():
    # One CPU for the job (as a scheduler's CPU set would give), five ranks of a small mpi_util job.
    result = run_bounded(["taskset", "-c", "0", sys.executable, str(SCRIPTS / "fork_job.py"), "5"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == ["mpi_util: warning: 5 processes on 1 CPU (more than 4 per CPU): each waits its turn for a "
                        "CPU and every iteration waits for the slowest; fewer processes are likely faster"]


def test_no_restart_after_the_user_stops_the_job(tmp_path):
    # Rank 1 hangs in iteration 2, so the stop asked for after iteration 1 cannot finish: the job ends once
    # --stop_grace is spent, with a nonzero status (a second SIGTERM changes nothing). That is the user's stop, not a
    # failure to restart from.
    env = dict(os.environ, PYTHONPATH=str(REPO), FAULT_KIND="hang", FAULT_RANK="1", FAULT_AT_STEP="700")
    job = subprocess.Popen([sys.executable, TRAIN, FAULTY, "--nprocs", "3", "--batch_size", "1536", *FEW_MINIBATCHES,
                            "--checkpoint_every", "1", "--total_steps", "100000", "--max_restarts", "2",
                            "--stop_grace", "5", "--logdir", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE,
                           text=True, env=env)
    output = JobOutput(job)
    try:  # iteration 1 logged: rank 1 will hang in iteration 2
        output.wait_for(r"^\s*1\s", 120, "iteration 1's line")
        job.send_signal(signal.SIGTERM)
        output.wait_for("^received signal 15", 60, "the stop's announcement")
        job.send_signal(signal.SIGTERM)
        _, stderr = output.finish(timeout=60)
    finally:
        job.kill()
    assert job.returncode != 0
    assert "restarting" not in stderr, stderr[-3000:]
    assert_no_process_left(tmp_path)
