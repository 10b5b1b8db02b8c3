"""This process in the MPI job: its rank, the number of ranks, printing on rank 0, and ending the whole job."""

from __future__ import annotations

import array
import fcntl
import os
import stat
import sys
import termios
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, cast

from mpi4py import MPI

from .children import ChildCommWorld, in_child_of_rank, launcher_rank_and_size
from .supervise import note_exit, release_start_up_shared_memory

if not in_child_of_rank:
    COMM_WORLD: MPI.Comm = MPI.COMM_WORLD
    rank: int = COMM_WORLD.Get_rank()
    """This process's rank in COMM_WORLD, 0 to ``nworkers - 1``: 0 in a script that no launcher started, and in
    a multiprocessing child of a rank that rank's number (read from the launcher's variables). In the recipe rank 0
    alone learns."""
    nworkers: int = COMM_WORLD.Get_size()
    """The number of ranks in COMM_WORLD: 1 in a script that no launcher started (or before ``mpi_fork`` relaunches
    it), and in a multiprocessing child of a rank the job's size (read from the launcher's variables)."""
else:
    # A multiprocessing child of a rank, without MPI (children.py): the rank it belongs to, from the launcher's
    # variables, and a COMM_WORLD that says where collectives belong when one is called here.
    rank, nworkers = launcher_rank_and_size(os.environ)
    COMM_WORLD = cast(MPI.Comm, ChildCommWorld(rank))


def write_whole_lines() -> None:
    """Make each line this rank prints reach stdout or stderr in one write. The launcher merges every rank's output
    write by write, and a rank started with ``python -u`` (mpi_fork starts them so) writes print's text and its newline
    separately: two ranks printing at once then came out as "rank 1 ...rank 2 ...", then two newlines (160 lines of
    900 glued in a 3-rank job printing after each barrier). Line buffering holds a line until its newline, and without
    ``-u`` keeps a pipe's block buffer from cutting lines at 8 KiB. ``flush=True`` still writes a line's start at once.
    A stream that is not Python's own (replaced by a capture or a logger) is left as it is."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError, OSError):
            continue


def print0(*args: Any, comm: MPI.Comm | None = None, **kwargs: Any) -> None:
    """``print`` on rank 0 of ``comm`` only, flushed at once (output from mpiexec is otherwise held back).

    Not a collective: the other ranks return at once.

    Args:
        *args: what ``print`` prints.
        comm: the communicator whose rank 0 prints; None for COMM_WORLD.
        **kwargs: ``print``'s keywords (``file``, ``end``, ...); ``flush`` defaults to True.
    """
    comm = COMM_WORLD if comm is None else comm
    if comm.Get_rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def mpi_library_is_open_mpi() -> bool:
    """Whether the MPI library mpi4py loaded is Open MPI (else MPICH or another)."""
    return "Open MPI" in MPI.Get_library_version()


# Set by mpi_fork in every rank under Open MPI: the rank among COMM_WORLD's ranks on this host, in world-rank order.
_world_node_rank: int | None = None


def local_rank(comm: MPI.Comm | None = None) -> int:
    """Rank of this process among the ranks on the same host (for pinning one GPU per process): the position of
    its world rank among those on its host, so rank 0 of each host gets GPU 0, the next rank GPU 1, and so on.

    For COMM_WORLD read from the launcher without communicating: MPICH's MPI_LOCALRANKID, Slurm's SLURM_LOCALID.
    Open MPI's OMPI_COMM_WORLD_LOCAL_RANK follows its mapping instead (0, 2, 1, 3 for ranks 0-3 of one host under
    the default --map-by), so under Open MPI ``mpi_fork``, which every rank calls, computes the host's order once;
    a script that skips mpi_fork gets Open MPI's value, still one distinct number per rank of a host. Otherwise (or
    for another communicator) a shared-memory communicator split, a collective: then every rank must call this.

    Args:
        comm: the communicator; None for COMM_WORLD.

    Returns:
        This rank's position among ``comm``'s ranks on its host, 0 for the first.
    """
    comm = COMM_WORLD if comm is None else comm
    if comm is COMM_WORLD:
        if _world_node_rank is not None:
            return _world_node_rank
        from_launcher = launcher_local_rank(os.environ)
        if from_launcher is not None:
            return from_launcher
    return _node_rank(comm)


# Launchers' local-rank variables, the most specific first: mpiexec started inside a Slurm allocation (sbatch, salloc)
# inherits the batch step's SLURM_LOCALID (0 in every rank), so MPICH's and Open MPI's own variables win.
_LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "SLURM_LOCALID")


def launcher_local_rank(environ: Mapping[str, str]) -> int | None:
    """The local rank a launcher put in ``environ`` (MPICH's mpiexec: MPI_LOCALRANKID; Open MPI's:
    OMPI_COMM_WORLD_LOCAL_RANK; PMIx: PMIX_LOCAL_RANK; srun: SLURM_LOCALID), None when it set none."""
    for name in _LOCAL_RANK_VARIABLES:
        if name in environ:
            return int(environ[name])
    return None


def _node_rank(comm: MPI.Comm) -> int:
    """This rank's rank among ``comm``'s ranks on its host (world-rank order). Collective."""
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node_comm.Get_rank()
    finally:
        node_comm.Free()


def settle_local_rank() -> None:
    """Called by every rank at start-up (mpi_fork does): where the launcher's local rank may not follow the world
    ranks on a host (Open MPI), compute the one that does, once. Collective over COMM_WORLD under Open MPI."""
    global _world_node_rank
    if _world_node_rank is None and COMM_WORLD.Get_size() > 1 and "MPI_LOCALRANKID" not in os.environ \
            and mpi_library_is_open_mpi():
        _world_node_rank = _node_rank(COMM_WORLD)


def stdout_is_terminal() -> bool:
    """Whether what this process prints reaches a terminal (for drawing a progress bar).

    Under mpiexec a rank's stdout is the launcher's: a pipe under MPICH, a pseudo-terminal under Open MPI even when
    the user sent the output to a file. So when the launcher (mpiexec, mpirun, prterun) is an ancestor of this
    process, the answer is whether the launcher's own stdout is a terminal; elsewhere under Open MPI (a rank on
    another host) False; otherwise ``sys.stdout.isatty()``.

    Returns:
        True when this process's output reaches a terminal.
    """
    launcher = _launcher_stdout()
    if launcher is not None:
        return launcher
    if "PRTE_LAUNCHED" in os.environ or "OMPI_COMM_WORLD_SIZE" in os.environ:
        return False
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


_LAUNCHER_NAMES = ("mpiexec", "mpirun", "mpiexec.hydra", "prterun", "orterun")


def _launcher_stdout() -> bool | None:
    """Whether the nearest ancestor that is an MPI launcher has a terminal on fd 1; None without such an ancestor
    (or where /proc cannot tell)."""
    try:
        pid = os.getppid()
        for _ in range(6):
            if pid <= 1:
                return None
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            if name in _LAUNCHER_NAMES:
                fd = os.open(f"/proc/{pid}/fd/1", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
                try:
                    return os.isatty(fd)
                finally:
                    os.close(fd)
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def abort(message: str, code: int = 1, late_ranks: Sequence[int] = ()) -> NoReturn:
    """Print ``message`` to stderr and end the whole MPI job (every rank) with exit status ``code``. Never returns.

    For a rank that cannot go on while the others are, or soon will be, waiting for it in a collective. Not a
    collective: one rank calls it.

    Args:
        message: what to print to stderr, one or more lines.
        code: the job's exit status.
        late_ranks: the ranks the job ends for, when they stopped making progress
            (CollectiveStallError.late_ranks): mpi_fork's launching process then names them, not this rank, in its
            last line.
    """
    note_exit("aborted", late_ranks)  # for the launching process: this rank ended the job, it was not killed
    release_start_up_shared_memory()  # for a job init() did not set up: MPI_Abort leaves it
    sys.stdout.flush()
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()
    _wait_for_reader(sys.stderr)
    # MPICH's MPI_Abort adds a line of its own ("Abort(1) on node 0 (rank 0 in comm 0): application called
    # MPI_Abort(...)") after the message that says what happened: the user's stderr has had all it needs.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
    except OSError:
        pass
    COMM_WORLD.Abort(code)
    # MPICH's MPI_Abort returns once it has asked the launcher to end the job, and the launcher kills this process a
    # moment later: meanwhile the caller's code would go on (seen: a rank finished its loop and wrote its results).
    os._exit(code)


def _wait_for_reader(stream: Any, timeout_s: float = 2.0) -> None:
    """Wait (at most ``timeout_s``) until the launcher has read what this rank wrote to ``stream``'s pipe.

    Under mpiexec a rank's stderr is a pipe that the launcher drains; MPI_Abort makes it kill the job, and bytes
    still in the pipe are lost, which happened to about 1 traceback in 6. Not a pipe (a file, a terminal): no wait.
    """
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        deadline = time.monotonic() + timeout_s
        unread = array.array("i", [0])
        while time.monotonic() < deadline:
            fcntl.ioctl(fd, termios.FIONREAD, unread)
            if unread[0] == 0:
                return
            time.sleep(0.005)
    except (OSError, ValueError, AttributeError):
        return


def install_abort_on_exception() -> None:
    """Make an uncaught exception on any rank print its traceback and abort the whole MPI job.

    Without this, the other ranks wait forever in their next collective for the rank that died. With one rank it
    does nothing. Every rank's ``mpi_fork`` call installs it.
    """
    if COMM_WORLD.Get_size() == 1:
        return

    def abort_hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        # The exception on the first line and the traceback in the same single write, so that what reaches the
        # user names the error even if mpiexec forwards only part of it.
        summary = "".join(traceback.format_exception_only(exc_type, exc)).strip()
        abort(f"mpi_util: uncaught exception on rank {COMM_WORLD.Get_rank()} (on {MPI.Get_processor_name()}), "
              f"aborting all ranks: {summary}\n"
              + "".join(traceback.format_exception(exc_type, exc, tb)), late_ranks=getattr(exc, "late_ranks", ()))

    sys.excepthook = abort_hook
