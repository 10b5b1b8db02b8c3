"""Run scripts under a real mpiexec, bounded in time, and read what each rank wrote."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from mpi_util import find_mpiexec
from mpi_util.launch import OPEN_MPI_DEFAULTS, mpi_library_is_open_mpi

# TensorFlow imports JAX when it is installed, and JAX's import sets TF_CPP_MIN_LOG_LEVEL=1 in os.environ: every job
# this process starts after a test imported TensorFlow would inherit it and print TensorFlow's start-up lines. JAX
# runs only in the jobs of the tests that use it.
sys.modules.setdefault("jax", None)  # type: ignore[arg-type]
# The test command installs torch with pip --no-compile (pip compiles on one core: 16 of its 24 s) and the rest with
# uv --compile-bytecode. Python then writes the bytecode of a torch module the first time a job imports it, unless
# PYTHONDONTWRITEBYTECODE is set, as some machines' environments do; cleared for this process and every job it starts,
# lest each of the suite's 50-odd torch processes compile torch again (1.6 CPU-s each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# Three workers share two cores (pyproject.toml), so a process with a second OpenMP or BLAS thread oversubscribes them,
# and torch's OpenMP threads spin while they wait for a descheduled sibling: test_sb3 took 207 CPU-s with torch's
# default two threads and 163 with one, test_examples 143 and 121, the same tests passing (3 workers, 2 cores). One
# thread for every job, as mpi_fork gives its workers; a value the machine sets is kept. train.py's ranks hold their
# own settings (trainer.kernels), and test_mpi_fork gives the thread settings it checks.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Tests read TensorBoard's event files with tensorboard's TensorFlow-free reader (its documented switch, the one
# mpi_util.sb3 sets): the reader otherwise imports TensorFlow, about 4 CPU-s and 0.5 GB in each worker that reads,
# and in a worker that has imported torch, risks LLVM's abort. Writing (trainer.logger) never loads TensorFlow.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"
# Tests of anything but learning pass this: 512-row minibatches, 4 Adam steps an epoch of a 2,048-step batch instead of
# 32. It no longer shortens a job's start: the epoch is one traced graph loop (algos.learner_batch.minibatch_loop), so
# CartPole's first update took 0.62 s with 64-row minibatches and 0.61 s with these; later updates 0.14 s and 0.07 s.
FEW_MINIBATCHES = ("--minibatch_size", "512")


def run_bounded(command: list[str], timeout: float, env: dict[str, str] | None = None,
                cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run ``command`` (in ``cwd``) in its own process group; on timeout kill the whole group and fail the test (a
    deadlock must fail, not hang CI)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.Popen(
        command, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"timed out after {timeout} s: {' '.join(command)}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
        )
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


class JobOutput:
    """A running job's piped stdout and stderr, read as they come, so that a test that waits for a line does so
    with a deadline, and so that the pipe the test is not waiting on cannot fill and block the job's writes to it."""

    def __init__(self, job: subprocess.Popen):
        self.job = job
        self._fds = [stream.fileno() if stream is not None else -1 for stream in (job.stdout, job.stderr)]
        self._read_so_far = {fd: bytearray() for fd in self._fds}
        self._open = {fd for fd in self._fds if fd >= 0}

    @property
    def stdout(self) -> str:
        return self._read_so_far[self._fds[0]].decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self._read_so_far[self._fds[1]].decode(errors="replace")

    def _complete_lines(self) -> str:
        """The job's stdout up to its last newline."""
        text = self.stdout
        return text[:text.rfind("\n") + 1]

    def _read(self, deadline: float) -> bool:
        """Read what is ready before ``deadline``; False when nothing came by then or both streams have ended."""
        left = deadline - time.monotonic()
        if not self._open or left <= 0:
            return False
        ready = select.select(list(self._open), [], [], left)[0]
        for fd in ready:
            chunk = os.read(fd, 65536)  # the descriptor itself: select() cannot see what a buffered reader holds
            if chunk:
                self._read_so_far[fd] += chunk
            else:
                self._open.discard(fd)
        return bool(ready)

    def wait_for(self, pattern: str, timeout: float, what: str, count: int = 1) -> str:
        """Read until ``count`` of the job's complete stdout lines match ``pattern`` (a regular expression, ^ and $ at
        each line), and return those lines so far; fail the test, with both streams' ends, when the job's output ends
        or ``timeout`` s pass first."""
        deadline = time.monotonic() + timeout
        while len(re.findall(pattern, lines := self._complete_lines(), re.MULTILINE)) < count:
            if not self._read(deadline):
                state = "the job's output ended" if not self._open else f"not within {timeout} s"
                pytest.fail(f"{what}: {state}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}\n"
                            f"the job's processes (pid, state, kernel wait, command):\n{process_tree(self.job.pid)}")
        return lines

    def finish(self, timeout: float) -> tuple[str, str]:
        """Read both streams to their end and wait for the job, within ``timeout`` s; its whole stdout and stderr."""
        deadline = time.monotonic() + timeout
        while self._read(deadline):
            pass
        self.job.wait(timeout=max(deadline - time.monotonic(), 1))
        return self.stdout, self.stderr


def process_tree(root: int) -> str:
    """One line for ``root`` and each of its descendants: pid, state, where in the kernel it waits, its command."""
    # Imported here, on a failure only: faults.py loads trainer's checkpoint and envs' modules, which every pytest
    # worker would otherwise import at its start.
    from faults import cmdline, descendants, process_table

    table, lines = process_table(), []
    for pid in descendants(root, table):
        try:
            wait = Path("/proc", str(pid), "wchan").read_text() or "-"
        except OSError:
            wait = "?"
        lines.append(f"{pid} {table[pid][1]} {wait} {cmdline(pid)[:160]}")
    return "\n".join(lines)


def launcher(*args: str) -> tuple[list[str], dict[str, str]]:
    """The project's mpiexec with ``args``, and the environment to run it in, as a user would start it: under Open
    MPI with --oversubscribe (these tests start more ranks than cores), --allow-run-as-root when root (CI is root)
    and the settings mpi_fork gives a job (OPEN_MPI_DEFAULTS)."""
    if not mpi_library_is_open_mpi():
        return [find_mpiexec(), *args], {}
    flags = ["--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]
    settings = {name: os.environ.get(name, value) for name, value in OPEN_MPI_DEFAULTS.items()}
    return [find_mpiexec(), *flags, *args], settings


def mpiexec(nprocs: int, script: str, *args: str, timeout: float = 90, env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run tests/mpi_scripts/``script`` as ``nprocs`` ranks under the project's mpiexec."""
    command, launch_env = launcher("-n", str(nprocs), sys.executable, "-u", str(SCRIPTS / script), *args)
    result = run_bounded(command, timeout, {**launch_env, **(env or {})})
    if check and result.returncode != 0:
        pytest.fail(f"exit {result.returncode}: {' '.join(command)}\nstdout:\n{result.stdout[-3000:]}\n"
                    f"stderr:\n{result.stderr[-3000:]}")
    return result


@pytest.fixture
def run_mpi():
    return mpiexec


# MPICH's setting that makes a job's odd and even ranks two nodes (cliques) on one machine: mpi_util takes its "several
# hosts" paths, and MPICH makes each node its own start-up file in /dev/shm.
ODD_EVEN_CLIQUES = {"MPIR_CVAR_ODD_EVEN_CLIQUES": "1"}


# A finished CartPole run of two 1,536-step iterations on two processes, a checkpoint after each: what the tests that
# resume a run, or are refused, start from. Trained once by the worker that runs the group (each test gets a copy).
SMALL_RUN = ("CartPole-v1", "--nprocs", "2", "--batch_size", "1536", "--total_steps", "3072", "--checkpoint_every", "1",
             *FEW_MINIBATCHES)
USES_SMALL_RUN = pytest.mark.xdist_group("small_run")


@pytest.fixture(scope="session")
def _small_run_trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logdir = tmp_path_factory.mktemp("small_run")
    result = run_bounded([sys.executable, str(REPO / "train.py"), *SMALL_RUN, "--logdir", str(logdir)], timeout=120)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return next(logdir.glob("*/config.json")).parent


@pytest.fixture
def small_run(_small_run_trained: Path, tmp_path: Path) -> Path:
    """A copy of SMALL_RUN's run directory for this test alone (mark the test USES_SMALL_RUN)."""
    return Path(shutil.copytree(_small_run_trained, tmp_path / _small_run_trained.name))


@pytest.fixture(autouse=True, scope="session")
def _sb3_logs_under_pytests_temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """SB3's logger makes a folder SB3-<date> in the system's temporary directory at each learn() given no
    tensorboard_log, in every rank, and never removes it (some 37 a run of the suite). SB3_LOGDIR, which it reads
    first, puts them under pytest's own temporary directory, which pytest prunes; the jobs inherit it."""
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))


# Tests that mostly wait (a real Slurm's time limit and requeue, stall limits running out, ranks slowed by sleeps) share
# one xdist group: one of the three workers (pyproject.toml) runs them in turn, asleep most of the time, while the other
# two keep both cores busy with the tests that compute.
WAITS = pytest.mark.xdist_group("waits")
# Tests that build TensorFlow's learner in the pytest process. Their modules import TensorFlow inside the tests, not at
# the top: every xdist worker imports every module to collect it, and TensorFlow costs each about 3.5 CPU-s and 0.5 GB.
# One xdist group, so that one worker imports it.
TENSORFLOW_IN_PROCESS = pytest.mark.xdist_group("tensorflow_in_process")
# Modules whose tests take minutes (a real Slurm's requeues, two namespace hosts, stall limits, the trained runs one
# worker shares): collected first, in this order, so that pytest-xdist hands them out at the start and the other
# workers run the short tests meanwhile, instead of one worker running them alone at the end.
STARTED_FIRST = ("test_slurm.py", "test_train.py", "test_multihost.py", "test_nothing_lost.py", "test_reliability.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = {name: index for index, name in enumerate(STARTED_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(STARTED_FIRST)))  # stable: the rest keep their order
