"""``rank0_accum_batches``: gather every rank's batch to rank 0 with buffer-based ``Gatherv``."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from mpi4py import MPI

from .comm import COMM_WORLD, meet


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


def rank0_accum_batches(batch: Mapping[str, np.ndarray], comm: MPI.Comm | None = None) -> dict[str, np.ndarray]:
    """Gather each rank's batch to rank 0, concatenated in rank order.

    batch: {key: array (n_r, *trailing)}; n_r rows on rank r (0 allowed, equal for all keys of one rank); any
    numeric or bool dtype; keys, dtypes and trailing shapes equal on every rank.
    Returns on rank 0 {key: array (sum_r n_r, *trailing)} in rank 0's key order, rows of rank 0 first, then
    rank 1, ...; on other ranks the batch passed in (as contiguous arrays). Every rank must call it.
    Raises BatchMismatchError on every rank, naming the rank and key, when the batches do not fit together.
    """
    comm = COMM_WORLD if comm is None else comm
    arrays, signature = _local_signature(batch)
    if comm.Get_size() == 1:
        problem = _describe_mismatch([signature])
        if problem:
            raise BatchMismatchError(problem)
        return arrays

    meet(comm, "rank0_accum_batches")
    signatures: list[_Signature] = comm.allgather(signature)
    problem = _describe_mismatch(signatures)
    if problem:
        raise BatchMismatchError(problem)

    is_root = comm.Get_rank() == 0
    gathered: dict[str, np.ndarray] = {}
    for key, (dtype_str, trailing, _) in signatures[0].items():  # type: ignore[union-attr]
        dtype = np.dtype(dtype_str)
        row_bytes = dtype.itemsize * int(np.prod(trailing, dtype=np.int64))
        rows_per_rank = [sig[key][2] for sig in signatures]  # type: ignore[index]
        send_bytes = arrays[key].reshape(-1).view(np.uint8)
        if is_root:
            out = np.empty((sum(rows_per_rank), *trailing), dtype=dtype)
            counts = [n * row_bytes for n in rows_per_rank]
            displacements = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
            recv_bytes = out.reshape(-1).view(np.uint8)
            comm.Gatherv([send_bytes, MPI.BYTE], [recv_bytes, counts, displacements, MPI.BYTE], root=0)
            gathered[key] = out
        else:
            comm.Gatherv([send_bytes, MPI.BYTE], None, root=0)
    return gathered if is_root else arrays
