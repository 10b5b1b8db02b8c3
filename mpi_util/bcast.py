"""``rank0_bcast_wts``: give every rank rank 0's weights, bit for bit; ``bcast_object`` for a small picklable object;
``ranks_out_of_sync`` to check that every rank holds the same weights.

The framework side stays thin: variables are read as numpy arrays and written back with ``assign`` (TF,
Keras), ``copy_`` (torch) or slice assignment (numpy). Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .collective import meet_and_exchange, move_data, signature_digest
from .host import transport
from .process import COMM_WORLD
from .stall import watch

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
    exchanged = meet_and_exchange(comm, [signature_digest(signature), int(bool(local_problem))], "rank0_bcast_wts")
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
    _bcast_buffers(comm, [flat for _, flat in packed] + [v for v in values if v.nbytes >= _PACK_BELOW_BYTES],
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


def _bcast_buffers(comm: MPI.Comm, buffers: list[np.ndarray], what: str) -> None:
    """Rank 0's C-contiguous ``buffers`` into every rank's (same sizes on every rank), after an exchange in which
    every rank arrived: through the host transport's shared window, else one Ibcast each."""
    host = transport(comm)
    if host is None or not host.bcast(buffers, what, watch.sequence):
        move_data(comm, lambda: [comm.Ibcast([b.reshape(-1).view(np.uint8), MPI.BYTE], root=0) for b in buffers], what)


def bcast_object(obj: Any, comm: MPI.Comm | None = None) -> Any:
    """Rank 0's picklable ``obj`` on every rank (the other ranks' ``obj`` is ignored; pass None there).

    For small state that is not an array (a config, a resumed run's per-rank state): pickled on rank 0 and moved as
    rank0_bcast_wts moves weights, so ranks wait for each other without spinning and within the stall limit. Every
    rank must call it.
    """
    comm = COMM_WORLD if comm is None else comm
    if comm.Get_size() == 1:
        return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))  # a copy, as other ranks get
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if comm.Get_rank() == 0 else b""
    size = int(meet_and_exchange(comm, [len(payload)], "bcast_object")[0, 0])
    buffer = np.frombuffer(payload, dtype=np.uint8).copy() if comm.Get_rank() == 0 else np.empty(size, np.uint8)
    _bcast_buffers(comm, [buffer], "bcast_object")
    return pickle.loads(buffer.tobytes())


def ranks_out_of_sync(x: Any, comm: MPI.Comm | None = None) -> list[int]:
    """The ranks whose values of ``x`` differ from rank 0's in any bit (shapes and dtypes included), on every rank;
    [] when every rank holds the same. x: anything rank0_bcast_wts takes. One small exchange of a 63-bit digest per
    rank, no data moved. Every rank must call it."""
    comm = COMM_WORLD if comm is None else comm
    digest = hashlib.blake2b(digest_size=8)
    for value in (_read(leaf) for leaf in _flatten(x)):
        digest.update(repr((value.shape, value.dtype.str)).encode())
        digest.update(value.tobytes())
    mine = int.from_bytes(digest.digest(), "little") >> 1
    if comm.Get_size() == 1:
        return []
    everyone = meet_and_exchange(comm, [mine], "ranks_out_of_sync")[:, 0]
    return [r for r in range(comm.Get_size()) if everyone[r] != everyone[0]]
