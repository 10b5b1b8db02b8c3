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
from typing import Any, NoReturn

from mpi4py import MPI

COMM_WORLD: MPI.Comm = MPI.COMM_WORLD
rank: int = COMM_WORLD.Get_rank()
nworkers: int = COMM_WORLD.Get_size()


def print0(*args: Any, comm: MPI.Comm | None = None, **kwargs: Any) -> None:
    """``print`` on rank 0 of ``comm`` only, flushed at once (output from mpiexec is otherwise held back)."""
    comm = COMM_WORLD if comm is None else comm
    if comm.Get_rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def local_rank(comm: MPI.Comm | None = None) -> int:
    """Rank of this process among the ranks on the same host (for pinning one GPU per process).

    Read from the launcher's environment when it sets one; otherwise computed with a shared-memory
    communicator split, which is a collective: then every rank must call this.
    """
    comm = COMM_WORLD if comm is None else comm
    if comm is COMM_WORLD:
        for name in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "SLURM_LOCALID"):
            if name in os.environ:
                return int(os.environ[name])
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node_comm.Get_rank()
    finally:
        node_comm.Free()


def abort(message: str, code: int = 1) -> NoReturn:
    """Print ``message`` to stderr and end the whole MPI job (every rank) with exit status ``code``. Never returns.

    For a rank that cannot go on while the others are, or soon will be, waiting for it in a collective.
    """
    sys.stdout.flush()
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()
    _wait_for_reader(sys.stderr)
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

    Without this, the other ranks wait forever in their next collective for the rank that died.
    """
    if COMM_WORLD.Get_size() == 1:
        return

    def abort_hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        # The exception on the first line and the traceback in the same single write, so that what reaches the
        # user names the error even if mpiexec forwards only part of it.
        summary = "".join(traceback.format_exception_only(exc_type, exc)).strip()
        abort(f"mpi_util: uncaught exception on rank {COMM_WORLD.Get_rank()}, aborting all ranks: {summary}\n"
              + "".join(traceback.format_exception(exc_type, exc, tb)))

    sys.excepthook = abort_hook
