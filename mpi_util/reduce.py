"""Sums and means over ranks, on every rank."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .collective import meet_and_exchange, signature_digest
from .process import COMM_WORLD
from .text import name_ranks


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
    if comm.Get_size() == 1:
        return sendbuf.astype(out_dtype, copy=False)
    digests = meet_and_exchange(comm, [signature_digest((sendbuf.shape, sendbuf.dtype.str))], what)
    if np.any(digests[:, 0] != digests[0, 0]):
        shapes = comm.allgather(f"{sendbuf.shape} {out_dtype}")
        differ = [r for r in range(len(shapes)) if digests[r, 0] != digests[0, 0]]
        others = f" ({name_ranks(differ[1:])} differ from rank 0 too)" if len(differ) > 1 else ""
        raise ValueError(f"{what}: ranks passed different shapes or dtypes: rank 0 {shapes[0]}, rank {differ[0]} "
                         f"{shapes[differ[0]]}{others}; every rank must pass the same")
    recvbuf = np.empty_like(sendbuf)
    comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)  # every rank has arrived: blocking is short
    return recvbuf.astype(out_dtype, copy=False)


def all_sum(x: Any, comm: MPI.Comm | None = None) -> Any:
    """Sum of ``x`` over all ranks, on every rank. Every rank must call it.

    Args:
        x: a number or an array of any numeric dtype, the same shape on every rank.
        comm: the communicator; None for COMM_WORLD.

    Returns:
        A Python number for a scalar, an array of x's shape and dtype otherwise (bool sums to int64).

    Raises:
        TypeError: ``x`` is not numbers.
        ValueError: on every rank, when the ranks passed different shapes or dtypes.
    """
    comm = COMM_WORLD if comm is None else comm
    total = _allreduce_sum(x, comm, "all_sum")
    return total.item() if total.ndim == 0 else total


def all_mean(x: Any, comm: MPI.Comm | None = None) -> Any:
    """Mean of ``x`` over all ranks, on every rank. Every rank must call it.

    Args:
        x: a number or an array of any numeric dtype, the same shape on every rank.
        comm: the communicator; None for COMM_WORLD.

    Returns:
        A Python number for a scalar, an array of x's shape otherwise: float64 for integer or bool input, x's float
        dtype otherwise.

    Raises:
        TypeError: ``x`` is not numbers.
        ValueError: on every rank, when the ranks passed different shapes or dtypes.
    """
    comm = COMM_WORLD if comm is None else comm
    arr = np.asarray(x)
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)
    total = _allreduce_sum(arr, comm, "all_mean")
    mean = (total / comm.Get_size()).astype(total.dtype, copy=False)
    return mean.item() if mean.ndim == 0 else mean
