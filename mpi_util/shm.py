"""Shared-memory MPI windows: an int64 array every rank of one host reads and writes with plain loads and stores."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from mpi4py import MPI

_Allocated = TypeVar("_Allocated", bound=tuple)


def all_on_one_host(comm: MPI.Comm) -> bool:
    """Whether every rank of ``comm`` runs on the same host; the same answer on every rank. Collective."""
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    mine = node_comm.Get_size() == comm.Get_size()
    node_comm.Free()
    return bool(comm.allreduce(mine, op=MPI.LAND))


def shared_int64(comm: MPI.Comm, shape: tuple[int, ...]) -> tuple[MPI.Win, np.ndarray]:
    """A zeroed int64 array of ``shape`` held by rank 0 of ``comm`` (all on one host) and mapped into every rank.

    Collective. The window is returned locked for passive access (``Lock_all``), so ranks may load, store, call
    ``window.Sync()`` as a memory barrier, or use MPI atomics on it at any time; the zeros are visible on every rank
    when this returns.
    """
    nbytes = 8 * int(np.prod(shape)) if comm.Get_rank() == 0 else 0
    window = MPI.Win.Allocate_shared(nbytes, 8, comm=comm)
    buffer, _ = window.Shared_query(0)
    array = np.ndarray(buffer=buffer, dtype=np.int64, shape=shape)
    window.Lock_all(MPI.MODE_NOCHECK)
    if comm.Get_rank() == 0:
        array[...] = 0
    window.Sync()
    comm.Barrier()
    return window, array


def free_shared(window: MPI.Win) -> None:
    """Unlock and free a window from ``shared_int64``. Collective over its communicator."""
    window.Unlock_all()
    window.Free()


def shared_segments(comm: MPI.Comm, nbytes: int) -> tuple[MPI.Win, list[np.ndarray]]:
    """One MPI shared-memory window in which each rank of ``comm`` (all on one host) holds its own ``nbytes``
    (may differ per rank, 0 allowed): returns the window and every rank's segment as a uint8 array (segment r is
    rank r's), mapped into this rank. Collective; locked for passive access as in ``shared_int64``. Raises
    MPI.Exception when the system refuses the memory."""
    info = MPI.Info.Create()
    info.Set("alloc_shared_noncontig", "true")  # each segment on its owner's pages; nobody needs them contiguous
    try:
        window = MPI.Win.Allocate_shared(nbytes, 1, info=info, comm=comm)
    finally:
        info.Free()
    segments = []
    for r in range(comm.Get_size()):
        buffer, _ = window.Shared_query(r)
        segments.append(np.frombuffer(buffer, dtype=np.uint8) if len(buffer) else np.empty(0, dtype=np.uint8))
    window.Lock_all(MPI.MODE_NOCHECK)
    return window, segments


def shared_memory_room() -> int | None:
    """Bytes free in /dev/shm, where MPICH keeps shared-memory windows on Linux; None where there is no such place."""
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def room_for(comm: MPI.Comm, nbytes: int) -> bool:
    """Whether a shared window of every rank's ``nbytes`` together would take at most half the free shared memory;
    the same answer on every rank. Collective.

    Why ask first: tmpfs hands out pages when they are first written, so a window larger than the free space is
    allocated without complaint and then kills the job with SIGBUS (seen with a 64 MB /dev/shm, as containers get
    by default, and two 40 MiB segments). Half, so that MPI itself and other jobs keep room too.
    """
    total = comm.allreduce(nbytes, op=MPI.SUM)
    room = shared_memory_room()
    return bool(comm.allreduce(room is None or 2 * total <= room, op=MPI.LAND))


def allocate_agreed(comm: MPI.Comm, nbytes: int, allocate: Callable[[], _Allocated]) -> _Allocated | None:
    """Call ``allocate`` (a collective allocation of a shared window, ``nbytes`` of it on this rank, returning
    (window, ...)) only if every rank agrees there is room for it (room_for); its result on every rank, or None on
    every rank when there is no room or the system refused the memory on some rank (a file size limit, say; the
    windows made elsewhere are freed again). Collective over ``comm``."""
    allocated = None
    if room_for(comm, nbytes):
        try:
            allocated = allocate()
        except MPI.Exception:
            pass
    if comm.allreduce(allocated is not None, op=MPI.LAND):
        return allocated
    if allocated is not None:
        free_shared(allocated[0])
    return None
