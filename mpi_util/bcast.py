"""``rank0_bcast_wts``: give every rank rank 0's weights, bit for bit.

The framework side stays thin: variables are read as numpy arrays and written back with ``assign`` (TF,
Keras), ``copy_`` (torch) or slice assignment (numpy). Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .comm import COMM_WORLD, bcast_on_host, exchange_int64, move_data, signature_digest

# Variables smaller than this are packed per dtype into one buffer; larger ones are broadcast in place.
_PACK_BELOW_BYTES = 256 * 1024


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
    After one small exchange in which ranks check they hold the same shapes (and wait for each other without
    spinning), variables under 256 KiB travel packed in one buffer per dtype, larger ones each from its own memory:
    when every rank is on one host (the doorbell in use) and the total is at most 16 MiB, rank 0 copies them into a
    shared-memory window and goes on while the others copy them out (comm.bcast_on_host); else one Ibcast each.
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

    # Every rank learns every other rank's verdict before data moves, so a bad rank fails the call everywhere
    # instead of leaving the others blocked in the broadcast.
    exchanged = exchange_int64(comm, [signature_digest(signature), int(bool(local_problem))], "rank0_bcast_wts")
    if np.any(exchanged[1:, 1]):
        problems = comm.allgather(local_problem)
        bad_rank = next(r for r in range(1, comm.Get_size()) if problems[r])
        raise WeightMismatchError(f"rank0_bcast_wts: rank {bad_rank}: {problems[bad_rank]}")
    if np.any(exchanged[:, 0] != exchanged[0, 0]):
        raise WeightMismatchError(_describe_mismatch(comm.allgather(signature)))

    # Small variables (biases, log-stds, normalizer statistics) travel packed in one flat buffer per dtype: one
    # message instead of dozens of latency-bound ones. Large ones go one Bcast each, straight from and into
    # their own memory: packing them would only add copies (measured in benchmarks/collectives.py). All are posted
    # at once and completed without spinning until every rank has posted (comm.move_data).
    if not is_root:
        values = [v if v is leaf else np.empty_like(v) for v, leaf in zip(values, leaves, strict=True)]
    small = [i for i, v in enumerate(values) if 0 < v.nbytes < _PACK_BELOW_BYTES]
    packed: list[tuple[list[int], np.ndarray]] = []  # (indices into values, flat buffer) per dtype
    for dtype in dict.fromkeys(values[i].dtype for i in small):  # dtypes in order of first appearance
        members = [i for i in small if values[i].dtype == dtype]
        if is_root:
            flat = np.concatenate([values[i].reshape(-1) for i in members])
        else:
            flat = np.empty(sum(values[i].size for i in members), dtype=dtype)
        packed.append((members, flat))
    buffers = [flat for _, flat in packed] + [v for v in values if v.nbytes >= _PACK_BELOW_BYTES]
    if not bcast_on_host(comm, buffers, "rank0_bcast_wts"):
        move_data(comm, lambda: [comm.Ibcast([b.reshape(-1).view(np.uint8), MPI.BYTE], root=0) for b in buffers],
                  "rank0_bcast_wts")
    if not is_root:
        for members, flat in packed:
            offset = 0
            for i in members:
                values[i][...] = flat[offset : offset + values[i].size].reshape(values[i].shape)
                offset += values[i].size
        for leaf, value in zip(leaves, values, strict=True):
            if value is not leaf:
                _writer(leaf)(value)
