"""``rank0_bcast_wts``: give every rank rank 0's weights, bit for bit, in one ``Bcast`` per dtype.

The framework side stays thin: variables are read as numpy arrays and written back with ``assign`` (TF,
Keras), ``copy_`` (torch) or slice assignment (numpy). Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .comm import COMM_WORLD, meet


class WeightMismatchError(ValueError):
    """Ranks hold variables of different shapes or dtypes; raised with the same message on every rank."""


def _is_variable(obj: Any) -> bool:
    """A TF / Keras variable: it has ``assign`` and ``numpy``."""
    return hasattr(obj, "assign") and hasattr(obj, "numpy")


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "copy_") and hasattr(obj, "detach")


def _flatten(x: Any) -> list[Any]:
    """The leaves of x in a fixed order: numpy arrays, TF/Keras variables or torch tensors."""
    if isinstance(x, np.ndarray) or _is_variable(x) or _is_torch_tensor(x):
        return [x]
    if hasattr(x, "state_dict") and hasattr(x, "parameters"):  # torch.nn.Module: parameters and buffers
        return list(x.state_dict(keep_vars=True).values())
    if hasattr(x, "get_weights") and hasattr(x, "weights"):  # Keras model or layer
        return list(x.weights)
    if hasattr(x, "variables") and not isinstance(x, (list, tuple)):  # tf.Module
        return list(x.variables)
    if isinstance(x, (list, tuple)):
        leaves: list[Any] = []
        for item in x:
            leaves.extend(_flatten(item))
        return leaves
    raise TypeError(
        f"rank0_bcast_wts: cannot broadcast a {type(x).__name__}; pass a Keras model, a tf.Module, a torch module, "
        "or a list of tf.Variables / numpy arrays"
    )


def _read(leaf: Any) -> np.ndarray:
    if isinstance(leaf, np.ndarray):
        return np.ascontiguousarray(leaf)
    if _is_torch_tensor(leaf):
        return np.ascontiguousarray(leaf.detach().cpu().numpy())
    return np.ascontiguousarray(leaf.numpy())


def _writer(leaf: Any) -> Callable[[np.ndarray], None]:
    if isinstance(leaf, np.ndarray):

        def write_numpy(value: np.ndarray) -> None:
            leaf[...] = value

        return write_numpy
    if _is_torch_tensor(leaf):

        def write_torch(value: np.ndarray) -> None:
            import torch  # only reached when the caller passed torch tensors

            with torch.no_grad():
                leaf.copy_(torch.from_numpy(value))

        return write_torch
    return leaf.assign


def _signature(values: list[np.ndarray]) -> list[tuple[tuple[int, ...], str]]:
    return [(v.shape, v.dtype.str) for v in values]


def _describe_mismatch(signatures: list[list[tuple[tuple[int, ...], str]]]) -> str:
    reference = signatures[0]
    for r, sig in enumerate(signatures[1:], start=1):
        if len(sig) != len(reference):
            return (
                f"rank0_bcast_wts: rank {r} has {len(sig)} variables but rank 0 has {len(reference)}; "
                "build the same model on every rank"
            )
        for i, ((shape, dtype), (ref_shape, ref_dtype)) in enumerate(zip(sig, reference, strict=True)):
            if shape != ref_shape or dtype != ref_dtype:
                return (
                    f"rank0_bcast_wts: rank {r} variable {i} is {np.dtype(dtype)}{list(shape)} but rank 0 has "
                    f"{np.dtype(ref_dtype)}{list(ref_shape)}; build the same model on every rank"
                )
    return "rank0_bcast_wts: ranks disagree on the variables' shapes"


def rank0_bcast_wts(x: Any, comm: MPI.Comm | None = None) -> None:
    """Overwrite the variables in ``x`` on every rank with rank 0's values, bit for bit.

    x: a Keras model or layer, a tf.Module, a torch.nn.Module (parameters and buffers), a tf.Variable, a numpy
    array, or a (nested) list of these; numpy arrays are updated in place. The same structure (count, shapes,
    dtypes) is needed on every rank, else WeightMismatchError on every rank naming the rank and variable.
    Variables of one dtype travel in a single flat buffer, so one Bcast per dtype whatever the count.
    """
    comm = COMM_WORLD if comm is None else comm
    leaves = _flatten(x)
    values = [_read(leaf) for leaf in leaves]
    if comm.Get_size() == 1:
        return
    is_root = comm.Get_rank() == 0
    read_only = [i for i, leaf in enumerate(leaves) if isinstance(leaf, np.ndarray) and not leaf.flags.writeable]
    local_problem = f"variable {read_only[0]} is a read-only numpy array; pass writeable arrays" if read_only else ""
    signature = _signature(values)
    digest = hashlib.sha1(repr(signature).encode()).digest()

    # Every rank learns every other rank's verdict before data moves, so a bad rank fails the call everywhere
    # instead of leaving the others blocked in Bcast.
    meet(comm, "rank0_bcast_wts")
    verdicts = comm.allgather((digest, "" if is_root else local_problem))
    for r, (_, problem) in enumerate(verdicts):
        if problem:
            raise WeightMismatchError(f"rank0_bcast_wts: rank {r}: {problem}")
    if any(d != verdicts[0][0] for d, _ in verdicts):
        raise WeightMismatchError(_describe_mismatch(comm.allgather(signature)))

    writers = None if is_root else [_writer(leaf) for leaf in leaves]
    for dtype in dict.fromkeys(v.dtype for v in values):  # dtypes in order of first appearance
        indices = [i for i, v in enumerate(values) if v.dtype == dtype]
        if is_root:
            flat = np.concatenate([values[i].reshape(-1) for i in indices])
        else:
            flat = np.empty(sum(values[i].size for i in indices), dtype=dtype)
        comm.Bcast([flat.view(np.uint8), MPI.BYTE], root=0)
        if writers is not None:
            offset = 0
            for i in indices:
                size = values[i].size
                writers[i](flat[offset : offset + size].reshape(values[i].shape))
                offset += size
