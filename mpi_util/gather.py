"""``rank0_accum_batches``: gather every rank's batch to rank 0, through shared memory on one host, else with
buffer-based ``Igatherv``; ``gather_objects`` for small picklable objects."""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np
from mpi4py import MPI

from .collective import meet_and_exchange, move_data, signature_digest
from .host import HostTransport, transport
from .process import COMM_WORLD
from .stall import watch


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


# How a rank's batch travels in a gather on one host, told to the others in the exchange.
_FITS = 0  # in this rank's shared segment (rank 0's own rows, and zero rows, need none)
_GROW = 1  # too large for its segment but within the limit: this call goes through MPI, then segments grow
_TOO_LARGE = 2  # over the per-rank limit: MPI (which moves large messages as fast as memory copies)
_NOT_ON_HOST = 3  # no shared segments: not COMM_WORLD with the host transport, or the system refused the memory


def rank0_accum_batches(batch: Mapping[str, np.ndarray], comm: MPI.Comm | None = None) -> dict[str, np.ndarray]:
    """Gather each rank's batch to rank 0, concatenated in rank order. Every rank must call it (a collective).

    Ranks meet in an exchange of (digest of keys, dtypes and trailing shapes; row count; route). With every rank of
    COMM_WORLD on one host (host.py), each rank has first copied its batch into its own shared-memory segment, and rank
    0 copies all of them out once the exchange is over: no other round, and the other ranks go on at once. Elsewhere,
    or for batches over 8 MiB in all, one buffer-based Igatherv per key moves the data, from each rank's array
    straight into rank 0's result.

    Args:
        batch: {key: array (n_r, *trailing)}; n_r rows on rank r (0 allowed, equal for all keys of one rank); any
            numeric or bool dtype; keys, dtypes and trailing shapes equal on every rank.
        comm: the communicator; None for COMM_WORLD.

    Returns:
        On rank 0 {key: array (sum_r n_r, *trailing)} in rank 0's key order, rows of rank 0 first, then rank 1,
        ...; on other ranks the batch passed in (as contiguous arrays).

    Raises:
        BatchMismatchError: on every rank, naming the rank and key, when the batches do not fit together.
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
    host = transport(comm)
    if host is not None and host.segments_refused:
        host = None
    my_bytes = sum(a.nbytes for a in arrays.values())
    route, parity = _route(host, [arrays[key] for key in keys], my_bytes, is_root)
    exchanged = _exchange_signatures(comm, signature, route)
    rows_per_rank = exchanged[:, 2].tolist()
    routes = exchanged[:, 3]
    gathered: dict[str, np.ndarray] = {}
    if is_root:
        for key in keys:
            gathered[key] = np.empty((sum(rows_per_rank), *arrays[key].shape[1:]), dtype=arrays[key].dtype)

    if host is not None and np.all(routes == _FITS):
        host.gathers_through_segments += 1
        if is_root:
            _take_from_segments(host, parity, [arrays[key] for key in keys], [gathered[key] for key in keys],
                                rows_per_rank)
        return {key: gathered[key] for key in arrays} if is_root else arrays

    _gather_through_mpi(comm, arrays, gathered, keys, rows_per_rank)
    if host is not None and np.any(routes == _GROW) and not np.any(routes == _TOO_LARGE):
        host.grow_segments(my_bytes, "rank0_accum_batches", watch.sequence)  # every rank: the same routes
    return {key: gathered[key] for key in arrays} if is_root else arrays


def _route(host: HostTransport | None, arrays: list[np.ndarray], my_bytes: int, is_root: bool) -> tuple[int, int]:
    """How this rank's ``arrays`` (in sorted key order, ``my_bytes`` in all) travel in this gather, and the parity of
    the gather on the host (which of a segment's two halves it uses); a rank whose batch fits has copied it into its
    shared-memory segment by the time this returns."""
    if host is None:
        return _NOT_ON_HOST, 0
    parity = host.gathers % 2
    host.gathers += 1
    if my_bytes > host.gather_limit() and not is_root:
        return _TOO_LARGE, parity
    return (_FITS if host.gather_put(arrays, parity) else _GROW), parity


def _exchange_signatures(comm: MPI.Comm, signature: _Signature, route: int) -> np.ndarray:
    """Meet the other ranks and exchange (digest of keys, dtypes and trailing shapes; unusable; row count; route):
    an array (size, 4), row r rank r's. Raises BatchMismatchError on every rank when the batches do not fit."""
    if isinstance(signature, str):
        digest, rows, bad = 0, 0, 1
    else:
        # Sorted: ranks may build their dicts in different orders; the data moves in sorted key order too.
        digest = signature_digest(sorted((key, dtype, trailing) for key, (dtype, trailing, _) in signature.items()))
        rows, bad = (next(iter(signature.values()))[2] if signature else 0), 0
    exchanged = meet_and_exchange(comm, [digest, bad, rows, route], "rank0_accum_batches")
    if np.any(exchanged[:, 1]) or np.any(exchanged[:, 0] != exchanged[0, 0]):
        problem = _describe_mismatch(comm.allgather(signature))  # the error path: one more, slower round is fine
        raise BatchMismatchError(problem or "rank0_accum_batches: ranks passed batches that do not match")
    assert isinstance(signature, dict)
    return exchanged


def _take_from_segments(host: HostTransport, parity: int, own: list[np.ndarray], gathered: list[np.ndarray],
                        rows_per_rank: list[int]) -> None:
    """Rank 0: fill ``gathered`` (each (sum_r n_r, *trailing), in sorted key order) with its ``own`` rows, then every
    other rank's rows from that rank's shared-memory segment."""
    row_offsets = np.concatenate([[0], np.cumsum(rows_per_rank)]).tolist()
    for out, mine in zip(gathered, own, strict=True):
        out[: rows_per_rank[0]] = mine
    for r in range(1, len(rows_per_rank)):
        if rows_per_rank[r]:
            host.gather_take(r, parity, [out[row_offsets[r] : row_offsets[r + 1]] for out in gathered])


def _gather_through_mpi(comm: MPI.Comm, arrays: dict[str, np.ndarray], gathered: dict[str, np.ndarray],
                        keys: list[str], rows_per_rank: list[int]) -> None:
    """One Igatherv per key, straight from each rank's array into rank 0's result in ``gathered``."""
    is_root = comm.Get_rank() == 0

    # Every rank has arrived (the exchange), so the data round is short. One Gatherv per key, straight from each
    # rank's array into rank 0's result (packing keys together only adds copies; measured with
    # benchmarks/collectives.py, in git at 46cbf68).
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


def gather_objects(obj: Any, comm: MPI.Comm | None = None) -> list[Any] | None:
    """Every rank's picklable ``obj`` on rank 0, as a list in rank order; None on the other ranks.

    For small state that is not an array (episode bookkeeping, RNG states, environment snapshots): the objects travel
    pickled, through rank0_accum_batches, so ranks wait for each other without spinning and within the stall limit.
    Every rank must call it.

    Args:
        obj: this rank's object; anything ``pickle`` takes.
        comm: the communicator; None for COMM_WORLD.

    Returns:
        On rank 0 a list of ``comm``'s size, rank r's object at index r (rank 0's own a copy); None on the other
        ranks.
    """
    comm = COMM_WORLD if comm is None else comm
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
    gathered = rank0_accum_batches({"pickled": payload}, comm)["pickled"]
    if comm.Get_rank() != 0:
        return None
    stream = io.BytesIO(gathered.tobytes())  # the ranks' pickles one after the other; each ends where it says
    return [pickle.load(stream) for _ in range(comm.Get_size())]
