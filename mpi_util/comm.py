"""Ranks, printing, reductions, and the non-spinning wait every collective here goes through.

MPICH's blocking collectives busy-poll: a rank waiting in ``MPI_Gatherv`` while rank 0 runs a two-second
update burns a whole core. With 8 ranks on 2 cores that steals the cores the update needs. So every
collective in ``mpi_util`` takes two rounds: ranks exchange a fixed-size digest of what they pass (shapes,
dtypes, keys) in a non-blocking all-gather polled with short, growing sleeps, which is where they wait for
each other; then, all present, the data moves in one blocking buffer-based operation (blocking there is
short, and large messages move in chunks that need every rank polling without pause). Each round on
oversubscribed cores costs milliseconds, so rounds are kept few.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

COMM_WORLD: MPI.Comm = MPI.COMM_WORLD
rank: int = COMM_WORLD.Get_rank()
nworkers: int = COMM_WORLD.Get_size()

# Polling schedule of a waiting rank: busy-poll for a few microseconds (a collective whose ranks are all there
# completes at once), then sleep, doubling up to MAX, so a long wait costs about 1% of a core. MAX bounds the
# latency each step of a multi-step collective can add once the last rank arrives.
_POLL_SPIN_S = 50e-6
_POLL_FIRST_SLEEP_S = 50e-6
_POLL_MAX_SLEEP_S = 1e-3

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


def wait_without_spinning(requests: MPI.Request | list[MPI.Request], what: str) -> None:
    """Complete ``requests`` by polling ``Test`` with short sleeps instead of a busy ``Wait``.

    ``what`` names the collective in the stall error.
    """
    pending = requests if isinstance(requests, list) else [requests]
    started = time.monotonic()
    while time.monotonic() - started < _POLL_SPIN_S:
        if MPI.Request.Testall(pending):
            return
    sleep_s = _POLL_FIRST_SLEEP_S
    while not MPI.Request.Testall(pending):
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


def signature_digest(signature: object) -> int:
    """A 63-bit digest of a small description (shapes, dtypes, keys) that ranks compare before moving data."""
    return int.from_bytes(hashlib.blake2b(repr(signature).encode(), digest_size=8).digest(), "little") >> 1


def exchange_int64(comm: MPI.Comm, values: list[int], what: str) -> np.ndarray:
    """Every rank's ``values`` (the same count on each) as an int64 array (size, len(values)), without spinning.

    This is also where ranks meet: the others may arrive much later (rank 0 finishing its update).
    """
    mine = np.array(values, dtype=np.int64)
    everyone = np.empty((comm.Get_size(), len(values)), dtype=np.int64)
    wait_without_spinning(comm.Iallgather(mine, everyone), what)
    return everyone


def _allreduce_sum(x: Any, comm: MPI.Comm, what: str) -> np.ndarray:
    sendbuf, out_dtype = _reduction_buffer(x, what)
    if comm.Get_size() == 1:
        return sendbuf.astype(out_dtype, copy=False)
    digests = exchange_int64(comm, [signature_digest((sendbuf.shape, sendbuf.dtype.str))], what)
    if np.any(digests[:, 0] != digests[0, 0]):
        shapes = comm.allgather((sendbuf.shape, str(out_dtype)))
        raise ValueError(f"{what}: ranks passed different shapes or dtypes {shapes}; every rank must pass the same")
    recvbuf = np.empty_like(sendbuf)
    comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)  # every rank has arrived: blocking is short
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
