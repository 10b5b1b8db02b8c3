"""Ranks, printing, reductions, and the non-spinning wait every collective here goes through.

MPICH's blocking collectives busy-poll: a rank waiting in ``MPI_Gatherv`` while rank 0 runs a two-second
update burns a whole core. With 8 ranks on 2 cores that steals the cores the update needs. So every
collective in ``mpi_util`` first meets the other ranks in a non-blocking barrier that is polled with short,
growing sleeps; the data then moves with a buffer-based collective that all ranks reach at once.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

COMM_WORLD: MPI.Comm = MPI.COMM_WORLD
rank: int = COMM_WORLD.Get_rank()
nworkers: int = COMM_WORLD.Get_size()

# Polling schedule of a waiting rank: the first polls come fast (a collective that completes at once costs
# microseconds), then the sleep doubles up to MAX so a long wait costs well under 1% of a core.
_POLL_FIRST_SLEEP_S = 20e-6
_POLL_MAX_SLEEP_S = 2e-3

_stall_timeout_s: float | None = None
_env_timeout = os.environ.get("MPI_UTIL_STALL_TIMEOUT")
if _env_timeout:
    _stall_timeout_s = float(_env_timeout)


class CollectiveStallError(RuntimeError):
    """A rank waited longer than the stall timeout for the others to reach a collective."""


def set_stall_timeout(seconds: float | None) -> None:
    """Abort a wait in any mpi_util collective after ``seconds`` without the other ranks arriving.

    None (the default, or the MPI_UTIL_STALL_TIMEOUT environment variable when set) waits forever.
    """
    global _stall_timeout_s
    if seconds is not None and not seconds > 0:
        raise ValueError(f"stall timeout must be > 0 seconds or None, got {seconds!r}")
    _stall_timeout_s = seconds


def wait_without_spinning(request: MPI.Request, what: str) -> None:
    """Complete ``request`` by polling ``Test`` with short sleeps instead of a busy ``Wait``.

    ``what`` names the collective in the stall error.
    """
    sleep_s = _POLL_FIRST_SLEEP_S
    started = time.monotonic()
    while not request.Test():
        if _stall_timeout_s is not None and time.monotonic() - started > _stall_timeout_s:
            raise CollectiveStallError(
                f"rank {COMM_WORLD.Get_rank()}: no progress for {_stall_timeout_s:g} s in {what}; "
                "another rank is stuck or dead (raise the timeout with MPI_UTIL_STALL_TIMEOUT if it is just slow)"
            )
        time.sleep(sleep_s)
        sleep_s = min(2 * sleep_s, _POLL_MAX_SLEEP_S)


def meet(comm: MPI.Comm, what: str) -> None:
    """Block until every rank of ``comm`` has called ``meet``, without spinning the CPU."""
    if comm.Get_size() > 1:
        wait_without_spinning(comm.Ibarrier(), what)


def print0(*args: Any, comm: MPI.Comm | None = None, **kwargs: Any) -> None:
    """``print`` on rank 0 of ``comm`` only, flushed at once (output from mpiexec is otherwise held back)."""
    comm = COMM_WORLD if comm is None else comm
    if comm.Get_rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def _reduction_buffer(x: Any, what: str) -> tuple[np.ndarray, np.dtype]:
    """Return (send buffer, dtype to give back) for a sum of ``x``; bool and float16 are summed wider."""
    arr = np.array(x, copy=True, order="C")
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{what}: expected numbers, got an array of dtype {arr.dtype}; pass a numeric scalar or array")
    if arr.dtype.kind == "b":
        return arr.astype(np.int64), np.dtype(np.int64)
    if arr.dtype == np.float16:
        # MPI has no standard half-precision type; sum in float32 and return float16.
        return arr.astype(np.float32), arr.dtype
    return arr, arr.dtype


def _allreduce_sum(x: Any, comm: MPI.Comm, what: str) -> np.ndarray:
    sendbuf, out_dtype = _reduction_buffer(x, what)
    meet(comm, what)
    shapes = comm.allgather(sendbuf.shape)
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"{what}: ranks passed different shapes {shapes}; every rank must pass the same shape")
    recvbuf = np.empty_like(sendbuf)
    comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)
    return recvbuf.astype(out_dtype, copy=False)


def all_sum(x: Any, comm: MPI.Comm | None = None) -> Any:
    """Sum of ``x`` over all ranks, on every rank.

    x: a number or an array of any numeric dtype, the same shape on every rank. Returns a Python number for a
    scalar, an array of x's shape and dtype otherwise (bool sums to int64).
    """
    comm = COMM_WORLD if comm is None else comm
    total = _allreduce_sum(x, comm, "all_sum")
    return total.item() if total.ndim == 0 else total


def all_mean(x: Any, comm: MPI.Comm | None = None) -> Any:
    """Mean of ``x`` over all ranks, on every rank: float64 for integer or bool input, x's float dtype otherwise."""
    comm = COMM_WORLD if comm is None else comm
    arr = np.asarray(x)
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)
    total = _allreduce_sum(arr, comm, "all_mean")
    mean = (total / comm.Get_size()).astype(total.dtype, copy=False)
    return mean.item() if mean.ndim == 0 else mean


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


def install_abort_on_exception() -> None:
    """Make an uncaught exception on any rank print its traceback and abort the whole MPI job.

    Without this, the other ranks wait forever in their next collective for the rank that died.
    """
    if COMM_WORLD.Get_size() == 1:
        return
    previous_hook = sys.excepthook

    def abort_hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        sys.stderr.write(f"mpi_util: uncaught exception on rank {COMM_WORLD.Get_rank()}, aborting all ranks\n")
        previous_hook(exc_type, exc, tb)
        sys.stderr.flush()
        sys.stdout.flush()
        COMM_WORLD.Abort(1)

    sys.excepthook = abort_hook
