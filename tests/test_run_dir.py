"""Run directories on cluster filesystems: names no two jobs share, created atomically, and the lock file used where
flock is refused (as on Lustre without flock or NFS without a lock daemon; here an flock that raises stands in)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FEW_MINIBATCHES, REPO, launcher

from trainer.run_dir import (
    OWNER_FILE,
    RunDirInUseError,
    create_run_dir,
    lock_run_dir,
    node_local_flock,
    run_dir_name,
)

TRAIN = str(REPO / "train.py")

# A process that takes the lock where flock is refused (or, with a second argument, where flock is granted on each
# node alone), says HELD, and keeps it until its stdin closes.
HOLDER = """
import errno, sys
from pathlib import Path
from trainer.run_dir import lock_run_dir

def refused(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

if len(sys.argv) > 2:
    lock = lock_run_dir(Path(sys.argv[1]), flock=lambda fd, operation: None, flock_scope=lambda path: sys.argv[2])
else:
    lock = lock_run_dir(Path(sys.argv[1]), flock=refused)
print("HELD", flush=True)
sys.stdin.read()
lock.release()
"""


def refuse_flock(code: int):
    def flock(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))
    return flock


def start_holder(run_dir: Path, *prefix: str, node_local: str = "") -> subprocess.Popen:
    """A real process holding run_dir's lock file; returns once it holds it. ``node_local``: why its flock is granted
    on its node alone (flock itself then always succeeds there), or "" where flock is refused."""
    holder = subprocess.Popen([*prefix, sys.executable, "-c", HOLDER, str(run_dir), *[node_local][:bool(node_local)]],
                              stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert holder.stdout.readline() == "HELD\n"  # bounded by the test's timeout
    return holder


def test_run_dir_name_adds_the_slurm_job_when_there_is_one():
    now = 1_800_000_000.0
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    assert run_dir_name("CartPole-v1", "ppo", 3, {}, now) == f"CartPole-v1_ppo_s3_{stamp}"
    assert run_dir_name("CartPole-v1", "ppo", 3, {"SLURM_JOB_ID": "812"}, now) == f"CartPole-v1_ppo_s3_{stamp}_job812"
    array_task = {"SLURM_JOB_ID": "815", "SLURM_ARRAY_JOB_ID": "812", "SLURM_ARRAY_TASK_ID": "3"}
    assert run_dir_name("CartPole-v1", "ppo", 3, array_task, now) == f"CartPole-v1_ppo_s3_{stamp}_job812_3"


@pytest.mark.timeout(60)
def test_processes_creating_one_name_at_once_each_get_their_own(tmp_path):
    # Six real processes create the same path at the same moment (they wait on one pipe, then race).
    path = tmp_path / "runs" / "Walker2d-v5_ppo_s0_20261124-120000"
    racer = ("import sys; from pathlib import Path; from trainer.run_dir import create_run_dir; sys.stdin.read(); "
             "print(create_run_dir(Path(sys.argv[1])))")
    read_end, write_end = os.pipe()
    racers = [subprocess.Popen([sys.executable, "-c", racer, str(path)], stdin=read_end, stdout=subprocess.PIPE,
                               text=True, env=dict(os.environ, PYTHONPATH=str(REPO))) for _ in range(6)]
    os.close(read_end)
    os.close(write_end)  # every racer's read returns now
    created = [racer.communicate(timeout=30)[0].strip() for racer in racers]
    assert all(racer.returncode == 0 for racer in racers)
    assert sorted(created) == sorted([str(path)] + [f"{path}-{n}" for n in range(2, 7)])
    assert create_run_dir(path) == path.with_name(f"{path.name}-7")


def test_flock_lock_refuses_a_second_holder(tmp_path):
    lock = lock_run_dir(tmp_path)
    assert not lock.uses_lock_file
    with pytest.raises(RunDirInUseError, match="is in use by another training job; wait for it to end"):
        lock_run_dir(tmp_path)  # a second open file description conflicts, even in one process
    lock.release()
    lock_run_dir(tmp_path).release()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_without_flock_a_lock_file_names_the_holder(tmp_path, code):
    holder = start_holder(tmp_path)
    try:
        owner = (tmp_path / OWNER_FILE).read_text()
        assert owner.startswith(f"host={socket.gethostname()} pid={holder.pid} ")
        with pytest.raises(RunDirInUseError) as refused:
            lock_run_dir(tmp_path, flock=refuse_flock(code))
        assert str(refused.value) == (
            f"{tmp_path} is in use by another training job (pid {holder.pid} on this host; flock on this filesystem "
            f"is missing or holds on one node only, so its lock file {tmp_path / OWNER_FILE} says so); wait for it to "
            f"end, or if that job has ended, rm {tmp_path / OWNER_FILE}")
    finally:
        holder.communicate(timeout=30)  # closes its stdin: it releases the lock and exits
    assert holder.returncode == 0
    assert not (tmp_path / OWNER_FILE).exists()  # removed by its holder
    lock = lock_run_dir(tmp_path, flock=refuse_flock(code))
    assert lock.uses_lock_file
    lock.release()
    assert not (tmp_path / OWNER_FILE).exists()


def test_other_flock_errors_are_not_taken_for_a_missing_flock(tmp_path):
    with pytest.raises(OSError, match="Input/output error"):
        lock_run_dir(tmp_path, flock=refuse_flock(errno.EIO))
    assert not (tmp_path / OWNER_FILE).exists()


@pytest.mark.timeout(60)
def test_lock_file_of_a_killed_process_on_this_host_is_taken_over(tmp_path, capfd):
    holder = start_holder(tmp_path)
    holder.kill()  # SIGKILL: no chance to remove its lock file, as after an MPI abort
    holder.communicate(timeout=30)
    assert f"pid={holder.pid} " in (tmp_path / OWNER_FILE).read_text()
    lock = lock_run_dir(tmp_path, flock=refuse_flock(errno.ENOLCK))
    assert f"pid={os.getpid()} " in (tmp_path / OWNER_FILE).read_text()
    assert capfd.readouterr().err == (f"run directory {tmp_path}: taking over the lock left by pid {holder.pid} on "
                                      f"{socket.gethostname()}, which has ended\n")
    lock.release()
    assert os.listdir(tmp_path) == [".lock"]  # no lock file, nothing moved aside left behind


@pytest.mark.timeout(60)
def test_lock_file_left_on_another_host_is_reported_with_how_to_remove_it(tmp_path):
    # A process on "far-host" (its own UTS namespace) takes the lock and is killed: from here its end cannot be told.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give a process another host name")
    holder = start_holder(tmp_path, "unshare", "--uts", "sh", "-c", 'hostname far-host && exec "$0" "$@"')
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate(timeout=30)
    assert (tmp_path / OWNER_FILE).read_text().startswith(f"host=far-host pid={holder.pid} ")
    with pytest.raises(RunDirInUseError) as refused:
        lock_run_dir(tmp_path, flock=refuse_flock(errno.ENOLCK))
    assert f"(pid {holder.pid} on host far-host;" in str(refused.value)
    assert str(refused.value).endswith(f"if that job has ended, rm {tmp_path / OWNER_FILE}")


@pytest.mark.timeout(60)
def test_where_flock_holds_on_one_node_only_a_job_on_another_node_is_refused_by_the_lock_file(tmp_path):
    # Lustre with localflock: flock succeeds on every node. A job on "far-host" holds the run; a job here is refused.
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give a process another host name")
    local = "lustre mounted with localflock"
    holder = start_holder(tmp_path, "unshare", "--uts", "sh", "-c", 'hostname far-host && exec "$0" "$@"',
                          node_local=local)
    with pytest.raises(RunDirInUseError, match=rf"\(pid {holder.pid} on host far-host; flock on this filesystem is "
                                               "missing or holds on one node only"):
        lock_run_dir(tmp_path, flock=lambda fd, operation: None, flock_scope=lambda path: local)
    holder.communicate("", timeout=30)  # it ends, releasing both
    lock = lock_run_dir(tmp_path, flock=lambda fd, operation: None, flock_scope=lambda path: local)
    assert lock.uses_lock_file and f"pid={os.getpid()} " in (tmp_path / OWNER_FILE).read_text()
    lock.release()
    assert os.listdir(tmp_path) == [".lock"]


def test_the_mount_s_options_say_where_flock_holds_on_one_node_only(tmp_path):
    def line(mount_point: str, fstype: str, options: str) -> str:
        return f"36 25 0:52 / {mount_point} rw,relatime shared:1 - {fstype} server:/export rw,{options}"

    runs = "/scratch/my\\040runs"  # a space, as mountinfo writes it
    mountinfo = "\n".join([line("/", "ext4", "errors=remount-ro"), line("/scratch", "lustre", "flock"),
                            line(runs, "nfs4", "vers=4.2,local_lock=flock,addr=10.0.0.1")])
    assert node_local_flock(Path("/scratch/my runs/CartPole_ppo"), mountinfo) == "nfs4 mounted with local_lock=flock"
    assert node_local_flock(Path("/scratch/other"), mountinfo) == ""  # Lustre with flock: it holds on every node
    assert node_local_flock(Path("/scratch/x"), line("/scratch", "lustre", "localflock")) == \
        "lustre mounted with localflock"
    assert node_local_flock(Path("/home/u"), line("/home", "nfs", "vers=3,nolock,local_lock=all")) == \
        "nfs mounted with local_lock=all"
    assert node_local_flock(tmp_path) == ""  # this machine's own /tmp


def test_a_lock_file_naming_no_process_is_reported(tmp_path):
    (tmp_path / OWNER_FILE).write_text("garbage\n")
    with pytest.raises(RunDirInUseError, match=rf"names no process \(it holds 'garbage'\); if no job uses "
                                               rf".*, remove it: rm {re.escape(str(tmp_path / OWNER_FILE))}"):
        lock_run_dir(tmp_path, flock=refuse_flock(errno.ENOLCK))


def done_run_dir(stdout: str) -> Path:
    match = re.search(r"done: .* run directory (\S+)", stdout)
    assert match, stdout[-3000:]
    return Path(match.group(1))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["outside_mpiexec_twice", "mpi_fork_and_outside_mpiexec", "slurm_array_tasks"])
def test_two_runs_started_together_get_their_own_run_directories(tmp_path, kind):
    # The same env, algorithm and seed started at the same moment: the same name (or, under Slurm, the same name
    # but for the job), which used to make one of them abort with "in use by another training job".
    common = ["CartPole-v1", "--seed", "5", "--batch_size", "512", *FEW_MINIBATCHES, "--total_steps", "1024",
              "--logdir", str(tmp_path)]
    base = dict(os.environ, PYTHONPATH=str(REPO))
    if kind == "slurm_array_tasks":
        jobs = [([sys.executable, TRAIN, *common], dict(base, SLURM_JOB_ID=str(4300 + task),
                                                         SLURM_ARRAY_JOB_ID="4242", SLURM_ARRAY_TASK_ID=str(task)))
                for task in (1, 2)]
    else:  # under an outside mpiexec (or srun) rank 0 names the directory after the ranks have started
        outside, settings = launcher("-n", "2", sys.executable, TRAIN, *common)
        other = outside if kind == "outside_mpiexec_twice" else [sys.executable, TRAIN, *common, "--nprocs", "2"]
        jobs = [(other, dict(base, **settings)), (outside, dict(base, **settings))]
    runs = [subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True) for command, env in jobs]
    try:
        outputs = [run.communicate(timeout=200) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
    for run, (stdout, stderr) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, f"{stdout[-2000:]}\n{stderr[-2000:]}"
    run_dirs = [done_run_dir(stdout) for stdout, _ in outputs]
    assert run_dirs[0] != run_dirs[1]
    assert sorted(tmp_path.iterdir()) == sorted(run_dirs)  # no third, empty directory
    for run_dir in run_dirs:
        assert (run_dir / "config.json").is_file() and (run_dir / "progress.csv").is_file()
        assert run_dir.name.startswith("CartPole-v1_ppo_s5_")
    if kind == "slurm_array_tasks":
        assert sorted(d.name.rsplit("_job", 1)[1] for d in run_dirs) == ["4242_1", "4242_2"]
