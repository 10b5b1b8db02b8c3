"""``rank0_accum_batches``: gather every rank's batch to rank 0, through shared memory on one host, else with
buffer-based ``Igatherv``."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from mpi4py import MPI

from .comm import COMM_WORLD, exchange_int64, host_doorbell, meet, move_data, signature_digest
from .shm import allocate_agreed, free_shared, shared_segments


class BatchMismatchError(ValueError):
    """Ranks passed batches that cannot be concatenated; raised with the same message on every rank."""


# What one rank tells the others about its batch before any data moves:
# {key: (dtype string, trailing shape, number of rows)} or a string describing why its batch is unusable.
_Signature = dict[str, tuple[str, tuple[int, ...], int]] | str


def _local_signature(batch: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], _Signature]:
    if not isinstance(batch, Mapping):
        return {}, f"expected a dict of numpy arrays, got {type(batch).__name__}"
    arrays: dict[str, np.ndarray] = {}
    signature: dict[str, tuple[str, tuple[int, ...], int]] = {}
    for key, value in batch.items():
        if not isinstance(key, str):
            return {}, f"key {key!r} is not a string; use string keys"
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufc":
            return {}, f"key '{key}' has non-numeric dtype {arr.dtype}; pass numbers or bools (e.g. .astype(float))"
        if arr.ndim == 0:
            return {}, f"key '{key}' is a scalar; every value needs a leading row dimension (use np.atleast_1d)"
        arr = np.ascontiguousarray(arr)  # after the scalar check: this would make a scalar 1-d
        arrays[key] = arr
        signature[key] = (arr.dtype.str, arr.shape[1:], arr.shape[0])
    row_counts = {key: sig[2] for key, sig in signature.items()}
    if len(set(row_counts.values())) > 1:
        return {}, f"arrays have different numbers of rows {row_counts}; every key needs the same leading length"
    return arrays, signature


def _describe_mismatch(signatures: list[_Signature]) -> str | None:
    """The first problem across all ranks' signatures, worded the same on every rank; None when all agree."""
    for r, sig in enumerate(signatures):
        if isinstance(sig, str):
            return f"rank0_accum_batches: rank {r}: {sig}"
    reference = signatures[0]
    assert isinstance(reference, dict)
    for r, sig in enumerate(signatures[1:], start=1):
        assert isinstance(sig, dict)
        missing = sorted(set(reference) - set(sig))
        extra = sorted(set(sig) - set(reference))
        if missing or extra:
            key = (missing or extra)[0]
            where = "lacks" if missing else "has extra"
            return (
                f"rank0_accum_batches: rank {r} {where} key '{key}' (rank 0 keys {sorted(reference)}, "
                f"rank {r} keys {sorted(sig)}); pass the same keys on every rank"
            )
        for key, (dtype, trailing, _) in reference.items():
            other_dtype, other_trailing, _ = sig[key]
            if other_dtype != dtype:
                return (
                    f"rank0_accum_batches: rank {r} key '{key}' has dtype {np.dtype(other_dtype)} but rank 0 has "
                    f"{np.dtype(dtype)}; cast to one dtype on every rank"
                )
            if other_trailing != trailing:
                return (
                    f"rank0_accum_batches: rank {r} key '{key}' has rows of shape {other_trailing} but rank 0 has "
                    f"{trailing}; every rank must pass the same shape after the first axis"
                )
    return None


# How a rank's batch travels in a gather on one host, told to the others in the exchange round.
_FITS = 0  # in this rank's shared segment (rank 0's own rows, and zero rows, need none)
_GROW = 1  # too large for its segment but within the limit: this call goes through MPI, then segments grow
_TOO_LARGE = 2  # over the per-rank limit: MPI (which moves large messages as fast as memory copies)
_NOT_ON_HOST = 3  # no shared segments: not COMM_WORLD with a doorbell, or the system refused the memory

# The most bytes all ranks together put into shared segments per gather (a rank's share: this / (ranks - 1)).
# Segments are double, so the window holds up to twice this; with the broadcast's window (16 MiB) well under the
# 64 MB /dev/shm a container gets by default. Larger batches go through MPI, as fast as memory copies at that size.
_HOST_GATHER_MAX_BYTES = 8 << 20
_MIN_SEGMENT_BYTES = 64 << 10


class _HostSegments:
    """Each rank's shared-memory segment for gathers over COMM_WORLD on one host (rank 0 holds none).

    A rank's segment is two halves of ``capacity`` bytes; gather number g uses half g % 2. A rank writes gather g
    into its half before the exchange round of g, and rank 0 copies it out after that round. Rank 0 has finished
    copying gather g - 2 when it enters gather g - 1, and a rank leaves the exchange of g - 1 only once rank 0 has
    entered it, so a rank never overwrites a half rank 0 is still reading, without waiting for it.
    """

    def __init__(self) -> None:
        self.window: MPI.Win | None = None
        self.segments: list[np.ndarray] = []  # every rank's, as mapped into this rank
        self.gathers = 0  # gathers over COMM_WORLD since the doorbell was set up
        self.through_shared_memory = 0  # of which the data went through the segments
        self.refused = False  # the system refused the memory once: every rank agreed to use MPI from then on

    def capacity(self, r: int) -> int:
        """Bytes of one half of rank r's segment (0 before any)."""
        return len(self.segments[r]) // 2 if self.segments else 0

    def half(self, r: int, parity: int) -> np.ndarray:
        capacity = self.capacity(r)
        return self.segments[r][parity * capacity : (parity + 1) * capacity]

    def grow(self, comm: MPI.Comm, needed: int, limit: int) -> None:
        """Reallocate every rank's segment, this one to hold at least ``needed`` bytes per half (with room to
        spare, up to ``limit``). Collective over ``comm``; all ranks must be past any read of the old segments."""
        meet(comm, "rank0_accum_batches")  # the allocation's MPI calls spin: start it with every rank there
        rank = comm.Get_rank()
        capacity = 0 if rank == 0 else min(limit, max(self.capacity(rank), 2 * needed, _MIN_SEGMENT_BYTES))
        if self.window is not None:
            free_shared(self.window)
            self.window, self.segments = None, []
        allocated = allocate_agreed(comm, 2 * capacity, lambda: shared_segments(comm, 2 * capacity))
        if allocated is None:  # no room in /dev/shm, or the system refused it: MPI from now on
            self.refused = True
            return
        self.window, self.segments = allocated


_host = _HostSegments()


def rank0_accum_batches(batch: Mapping[str, np.ndarray], comm: MPI.Comm | None = None) -> dict[str, np.ndarray]:
    """Gather each rank's batch to rank 0, concatenated in rank order.

    batch: {key: array (n_r, *trailing)}; n_r rows on rank r (0 allowed, equal for all keys of one rank); any
    numeric or bool dtype; keys, dtypes and trailing shapes equal on every rank.
    Returns on rank 0 {key: array (sum_r n_r, *trailing)} in rank 0's key order, rows of rank 0 first, then
    rank 1, ...; on other ranks the batch passed in (as contiguous arrays). Every rank must call it.
    Raises BatchMismatchError on every rank, naming the rank and key, when the batches do not fit together.

    An exchange of (digest of keys, dtypes and trailing shapes; row count), waited on without spinning, is where
    ranks meet. With every rank of COMM_WORLD on one host (the doorbell in use), each rank has first copied its
    batch into its own shared-memory segment, and rank 0 copies all of them out once the exchange is over: no other
    round, and the other ranks go on at once (at 8 processes on 2 cores the MPI data round cost rank 0 several
    milliseconds of waiting for ranks the scheduler had not run). Elsewhere, or for batches over 8 MiB in all,
    one buffer-based Igatherv per key moves the data, from each rank's array straight into rank 0's result.
    """
    comm = COMM_WORLD if comm is None else comm
    arrays, signature = _local_signature(batch)
    if comm.Get_size() == 1:
        problem = _describe_mismatch([signature])
        if problem:
            raise BatchMismatchError(problem)
        return arrays

    is_root = comm.Get_rank() == 0
    keys = sorted(arrays)  # the same order on every rank, whatever order each built its dict in
    on_host = host_doorbell(comm) is not None and not _host.refused
    my_bytes = sum(a.nbytes for a in arrays.values())
    limit = _HOST_GATHER_MAX_BYTES // (comm.Get_size() - 1)
    parity = _host.gathers % 2
    if not on_host:
        route = _NOT_ON_HOST
    elif is_root or my_bytes == 0:
        route = _FITS
    elif my_bytes > limit:
        route = _TOO_LARGE
    elif my_bytes > _host.capacity(comm.Get_rank()):
        route = _GROW
    else:
        route = _FITS
        mine, offset = _host.half(comm.Get_rank(), parity), 0
        for key in keys:
            mine[offset : offset + arrays[key].nbytes] = arrays[key].reshape(-1).view(np.uint8)
            offset += arrays[key].nbytes
    if on_host:
        _host.gathers += 1

    if isinstance(signature, str):
        digest, rows, bad = 0, 0, 1
    else:
        # Sorted: ranks may build their dicts in different orders; the data moves in sorted key order too.
        digest = signature_digest(sorted((key, dtype, trailing) for key, (dtype, trailing, _) in signature.items()))
        rows, bad = (next(iter(signature.values()))[2] if signature else 0), 0
    exchanged = exchange_int64(comm, [digest, bad, rows, route], "rank0_accum_batches")
    if np.any(exchanged[:, 1]) or np.any(exchanged[:, 0] != exchanged[0, 0]):
        problem = _describe_mismatch(comm.allgather(signature))  # the error path: one more, slower round is fine
        raise BatchMismatchError(problem or "rank0_accum_batches: ranks passed batches that do not match")
    assert isinstance(signature, dict)
    rows_per_rank = exchanged[:, 2].tolist()
    routes = exchanged[:, 3]
    gathered: dict[str, np.ndarray] = {}
    if is_root:
        for key in keys:
            gathered[key] = np.empty((sum(rows_per_rank), *arrays[key].shape[1:]), dtype=arrays[key].dtype)

    if np.all(routes == _FITS):
        _host.through_shared_memory += 1
        if is_root:
            _copy_from_segments(arrays, keys, gathered, rows_per_rank, parity)
        return {key: gathered[key] for key in arrays} if is_root else arrays

    # Every rank has arrived (the exchange above), so the data round is short; a rank sleeps until all have posted
    # their part (rank 0 may be late, allocating or descheduled) and then completes it without pause, since a large
    # message moves in pipelined chunks. One Gatherv per key, straight from each rank's array into rank 0's result
    # (packing keys together only adds copies; measured in benchmarks/collectives.py).
    def post() -> list[MPI.Request]:
        requests = []
        for key in keys:
            send = [arrays[key].reshape(-1).view(np.uint8), MPI.BYTE]
            if is_root:
                out = gathered[key]
                row_bytes = out.itemsize * int(np.prod(out.shape[1:], dtype=np.int64))
                counts = [n * row_bytes for n in rows_per_rank]
                displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
                receive = [out.reshape(-1).view(np.uint8), counts, displacements, MPI.BYTE]
                requests.append(comm.Igatherv(send, receive, root=0))
            else:
                requests.append(comm.Igatherv(send, None, root=0))
        return requests

    move_data(comm, post, "rank0_accum_batches")
    if on_host and np.any(routes == _GROW) and not np.any(routes == _TOO_LARGE):
        _host.grow(comm, my_bytes, limit)  # the same decision on every rank (the same routes)
    return {key: gathered[key] for key in arrays} if is_root else arrays


def _copy_from_segments(
    arrays: dict[str, np.ndarray], keys: list[str], gathered: dict[str, np.ndarray], rows_per_rank: list[int],
    parity: int,
) -> None:
    """Rank 0: fill ``gathered`` (key -> (total rows, *trailing)) with its own ``arrays`` and every other rank's
    rows from half ``parity`` of that rank's segment, where each rank put its keys' bytes one after the other in
    ``keys`` order."""
    if _host.window is not None:  # None only while every other rank has sent zero rows
        _host.window.Sync()  # read what the others wrote only after their arrival (seen in the exchange)
    row_offsets = np.concatenate([[0], np.cumsum(rows_per_rank)]).tolist()
    for key in keys:
        gathered[key][: rows_per_rank[0]] = arrays[key]
    for r in range(1, len(rows_per_rank)):
        if rows_per_rank[r] == 0:
            continue
        theirs, offset = _host.half(r, parity), 0
        for key in keys:
            out = gathered[key][row_offsets[r] : row_offsets[r + 1]]
            out.reshape(-1).view(np.uint8)[...] = theirs[offset : offset + out.nbytes]
            offset += out.nbytes
