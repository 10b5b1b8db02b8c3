"""``rank0_bcast_wts``: give every rank rank 0's weights, bit for bit; ``rank0_bcast_tree``, its functional form for
JAX pytrees (returns rank 0's values instead of writing in place); ``bcast_object`` for a small picklable object;
``ranks_out_of_sync`` to check that every rank holds the same weights.

The framework side stays thin: variables are read as numpy arrays and written back with ``assign`` (TF,
Keras), ``copy_`` (torch) or slice assignment (numpy). Nothing here imports TensorFlow or torch.
"""

from __future__ import annotations

import copy
import hashlib
import pickle
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
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
    if isinstance(x, (np.generic, bool, int, float, complex)):
        raise TypeError(
            f"rank0_bcast_wts: a {type(x).__name__} scalar cannot be overwritten in place; hold it in a 0-d array "
            "(np.array(value), updated in place) or use x = rank0_bcast_tree(x), which returns rank 0's values"
        )
    if hasattr(x, "__array__"):  # a JAX array, for one: immutable
        raise TypeError(
            f"rank0_bcast_wts: {type(x).__module__}.{type(x).__name__} cannot be overwritten in place; use "
            "x = rank0_bcast_tree(x), which returns rank 0's values"
        )
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
        "or a list of tf.Variables / numpy arrays (for a dict or a JAX pytree, use x = rank0_bcast_tree(x))"
    )


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` itself when C-contiguous, else a C-contiguous copy; unlike np.ascontiguousarray, a 0-d array stays 0-d
    (and is written in place)."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _read(leaf: Any) -> np.ndarray:
    if isinstance(leaf, np.ndarray):
        return _contiguous(leaf)
    if _is_torch_tensor(leaf):
        return _contiguous(np.asarray(leaf.detach().cpu().numpy()))
    return _contiguous(np.asarray(leaf.numpy()))


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
    """Overwrite the variables in ``x`` on every rank with rank 0's values, bit for bit. Every rank must call it.

    After one small exchange in which ranks check they hold the same shapes (and wait for each other without
    spinning), variables under 256 KiB travel packed in one buffer per dtype, larger ones each from its own memory:
    when every rank is on one host (the doorbell in use) and the total is at most 16 MiB, rank 0 copies them into a
    shared-memory window and goes on while the others copy them out (``HostTransport.bcast`` in host.py); else one
    Ibcast each.

    Args:
        x: a Keras model or layer, a tf.Module, a torch.nn.Module (parameters and buffers), a tf.Variable, a numpy
            array (any shape, 0-d included), or a (nested) list of these; numpy arrays are updated in place. The
            same structure (count, shapes, dtypes) is needed on every rank.
        comm: the communicator; None for COMM_WORLD.

    Raises:
        TypeError: ``x`` holds numbers, numpy scalars or JAX arrays, which cannot be written in place (the message
            points at rank0_bcast_tree), or anything else it cannot read.
        WeightMismatchError: on every rank, naming the rank and variable, when the ranks' structures differ (or a
            rank passed a read-only numpy array).
    """
    comm = COMM_WORLD if comm is None else comm
    leaves = _flatten(x)
    values = [_read(leaf) for leaf in leaves]
    if comm.Get_size() == 1:
        return
    read_only = [i for i, leaf in enumerate(leaves) if isinstance(leaf, np.ndarray) and not leaf.flags.writeable]
    local_problem = f"variable {read_only[0]} is a read-only numpy array; pass writeable arrays" if read_only else ""
    signature = _signature(values)
    if comm.Get_rank() != 0:  # arrays that are not the variable's own memory need somewhere to receive into
        values = [v if v is leaf else np.empty_like(v) for v, leaf in zip(values, leaves, strict=True)]
    _bcast_checked(comm, values, signature, _describe_mismatch, local_problem, "rank0_bcast_wts")
    if comm.Get_rank() != 0:
        for leaf, value in zip(leaves, values, strict=True):
            if value is not leaf:
                _writer(leaf)(value)


def _bcast_checked(comm: MPI.Comm, values: list[np.ndarray], signature: Any,
                   describe: Callable[[list[Any]], str], local_problem: str, what: str) -> None:
    """Rank 0's ``values`` written into every other rank's (C-contiguous, written in place), once every rank's
    ``signature`` (a small description of the arrays) is known to be the same.

    Every rank learns every other rank's verdict before data moves, so a bad rank fails the call everywhere instead
    of leaving the others blocked in the broadcast: a non-empty ``local_problem`` on a rank other than 0 (which is
    only read) raises WeightMismatchError naming that rank; different signatures raise
    WeightMismatchError(describe(every rank's signature)).
    """
    exchanged = meet_and_exchange(comm, [signature_digest(signature), int(bool(local_problem))], what)
    if np.any(exchanged[1:, 1]):
        problems = comm.allgather(local_problem)
        bad_rank = next(r for r in range(1, comm.Get_size()) if problems[r])
        raise WeightMismatchError(f"{what}: rank {bad_rank}: {problems[bad_rank]}")
    if np.any(exchanged[:, 0] != exchanged[0, 0]):
        raise WeightMismatchError(describe(comm.allgather(signature)))

    # Small variables (biases, log-stds, normalizer statistics) travel packed in one flat buffer per dtype: one
    # message instead of dozens of latency-bound ones. Large ones go one Bcast each, straight from and into their own
    # memory: packing them would only add copies (measured with benchmarks/collectives.py, in git at 46cbf68). All
    # are posted at once and completed without spinning until every rank has posted (collective.move_data).
    is_root = comm.Get_rank() == 0
    small = [i for i, v in enumerate(values) if 0 < v.nbytes < _PACK_BELOW_BYTES]
    packed: list[tuple[list[int], np.ndarray]] = []  # (indices into values, flat buffer) per dtype
    for dtype in dict.fromkeys(values[i].dtype for i in small):  # dtypes in order of first appearance
        members = [i for i in small if values[i].dtype == dtype]
        if is_root:
            flat = np.concatenate([values[i].reshape(-1) for i in members])
        else:
            flat = np.empty(sum(values[i].size for i in members), dtype=dtype)
        packed.append((members, flat))
    _bcast_buffers(comm, [flat for _, flat in packed] + [v for v in values if v.nbytes >= _PACK_BELOW_BYTES], what)
    if not is_root:
        for members, flat in packed:
            offset = 0
            for i in members:
                values[i][...] = flat[offset : offset + values[i].size].reshape(values[i].shape)
                offset += values[i].size


def _bcast_buffers(comm: MPI.Comm, buffers: list[np.ndarray], what: str) -> None:
    """Rank 0's C-contiguous ``buffers`` into every rank's (same sizes on every rank), after an exchange in which
    every rank arrived: through the host transport's shared window, else one Ibcast each."""
    host = transport(comm)
    if host is None or not host.bcast(buffers, what, watch.sequence):
        move_data(comm, lambda: [comm.Ibcast([b.reshape(-1).view(np.uint8), MPI.BYTE], root=0) for b in buffers], what)


# A leaf of a tree as rank0_bcast_tree reads it: (path, leaf), the path as a JAX user would index it (tree['w'][0]).
_Leaf = tuple[str, Any]
# Rebuilds one node of a tree from the broadcast values of its leaves, taken in order from the iterator.
_Rebuild = Callable[[Iterator[np.ndarray]], Any]
_NUMBERS = (bool, int, float, complex)


def _mapping_keys(node: Mapping) -> list[Any]:
    """A mapping's keys in the order its leaves travel: sorted where they can be (as jax.tree_util orders dicts), so
    ranks that built the same dict in different insertion orders agree; else in insertion order."""
    try:
        return sorted(node)
    except TypeError:
        return list(node)


def _registered_children(node: Any) -> tuple[list[tuple[str, Any]], Any] | None:
    """The children of a node of a pytree type registered with JAX (jax.tree_util.register_dataclass, a flax.struct
    dataclass) as (key path, child), and the treedef that rebuilds the node from new children; None
    when JAX is not imported or holds ``node`` for a leaf. JAX is never imported here: a caller holding such a node
    has imported it already."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    keyed, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda child: child is not node)
    if len(keyed) == 1 and keyed[0][1] is node:
        return None
    return [(jax.tree_util.keystr(key), child) for key, child in keyed], treedef


def _walk_tree(node: Any, path: str, leaves: list[_Leaf], nodes: list[str]) -> _Rebuild:
    """Append ``node``'s leaves to ``leaves`` and a description of each container on the way (kind and path) to
    ``nodes``, in a fixed order; return what rebuilds ``node`` from new leaf values in that order."""
    if node is None:  # an empty subtree, as in JAX: travels as nothing, comes back None
        nodes.append(f"{path}: None")
        return lambda values: None
    if isinstance(node, Mapping):
        nodes.append(f"{path}: {type(node).__qualname__}")
        keys = _mapping_keys(node)
        children = [_walk_tree(node[key], f"{path}[{key!r}]", leaves, nodes) for key in keys]

        def rebuild_mapping(values: Iterator[np.ndarray]) -> Any:
            rebuilt = {key: child(values) for key, child in zip(keys, children, strict=True)}
            ordered = {key: rebuilt[key] for key in node}  # each rank keeps its own insertion order
            if type(node) is dict:
                return ordered
            if isinstance(node, MutableMapping):  # OrderedDict, defaultdict: a copy keeps the default factory
                mapping = copy.copy(node)
                mapping.update(ordered)
                return mapping
            return type(node)(ordered)  # an immutable mapping (flax's FrozenDict) built from a dict

        return rebuild_mapping
    if isinstance(node, tuple) and hasattr(type(node), "_fields"):  # a namedtuple (optax's states)
        nodes.append(f"{path}: {type(node).__qualname__}")
        fields = [_walk_tree(item, f"{path}.{name}", leaves, nodes)
                  for name, item in zip(node._fields, node, strict=True)]
        return lambda values: type(node)(*(field(values) for field in fields))
    if isinstance(node, (list, tuple)):
        nodes.append(f"{path}: {type(node).__qualname__}")
        items = [_walk_tree(item, f"{path}[{i}]", leaves, nodes) for i, item in enumerate(node)]
        return lambda values: type(node)(item(values) for item in items)
    if isinstance(node, (np.ndarray, np.generic, *_NUMBERS)) or hasattr(node, "__array__"):
        leaves.append((path, node))
        if isinstance(node, _NUMBERS):
            return lambda values: next(values).item()  # the Python number of the array's dtype
        if isinstance(node, np.generic):
            return lambda values: next(values)[()]  # a numpy scalar of the same dtype
        return lambda values: next(values)
    registered = _registered_children(node)
    if registered is not None:
        keyed, treedef = registered
        nodes.append(f"{path}: {type(node).__qualname__}")
        children = [_walk_tree(child, f"{path}{key}", leaves, nodes) for key, child in keyed]
        return lambda values: treedef.unflatten([child(values) for child in children])
    raise TypeError(
        f"rank0_bcast_tree: {path} is a {type(node).__name__}; leaves must be arrays or numbers, containers dicts, "
        "lists, tuples, namedtuples or JAX pytree nodes (broadcast other state with bcast_object)"
    )


def _tree_signature(nodes: list[str], leaves: list[_Leaf], values: list[np.ndarray]) -> tuple[list[str], list[tuple]]:
    return nodes, [(path, v.shape, v.dtype.str) for (path, _), v in zip(leaves, values, strict=True)]


def _describe_tree_mismatch(signatures: list[tuple[list[str], list[tuple]]]) -> str:
    """The first difference between a rank's tree and rank 0's, in one line."""
    fix = "build the same tree on every rank"
    ref_nodes, reference = signatures[0]
    for r, (nodes, leaves) in enumerate(signatures[1:], start=1):
        for (path, shape, dtype), (ref_path, ref_shape, ref_dtype) in zip(leaves, reference, strict=False):
            if path != ref_path:
                return f"rank0_bcast_tree: rank {r} has leaf {path} where rank 0 has {ref_path}; {fix}"
            if shape != ref_shape or dtype != ref_dtype:
                return (
                    f"rank0_bcast_tree: rank {r} leaf {path} is {np.dtype(dtype)}{list(shape)} but rank 0 has "
                    f"{np.dtype(ref_dtype)}{list(ref_shape)}; {fix}"
                )
        if len(leaves) > len(reference):
            return (f"rank0_bcast_tree: rank {r} has leaf {leaves[len(reference)][0]}, which rank 0 has not "
                    f"({len(leaves)} leaves against {len(reference)}); {fix}")
        if len(leaves) < len(reference):
            return (f"rank0_bcast_tree: rank 0 has leaf {reference[len(leaves)][0]}, which rank {r} has not "
                    f"({len(reference)} leaves against {len(leaves)}); {fix}")
        for node, ref_node in zip(nodes, ref_nodes, strict=False):
            if node != ref_node:
                return f"rank0_bcast_tree: rank {r} has {node} where rank 0 has {ref_node}; {fix}"
        if len(nodes) != len(ref_nodes):
            return f"rank0_bcast_tree: rank {r} has {len(nodes)} containers but rank 0 has {len(ref_nodes)}; {fix}"
    return "rank0_bcast_tree: ranks disagree on the tree's structure"


def rank0_bcast_tree(tree: Any, comm: MPI.Comm | None = None) -> Any:
    """Rank 0's values of ``tree``, returned on every rank in the same structure: the functional form of
    rank0_bcast_wts, for values that cannot be written in place (JAX arrays, numbers) and for dicts. Every rank must
    call it.

    The input is never modified. The arrays travel as rank0_bcast_wts's do: packed per dtype below 256 KiB, through
    shared memory on one host.

    Args:
        tree: a pytree as JAX sees one: nested dicts (flax parameters; any Mapping), lists, tuples and namedtuples
            (optax states), None (an empty subtree, kept), and, when JAX is imported, nodes of types registered with
            its pytree registry; leaves are arrays of any shape (0-d included) and numeric or bool dtype (numpy,
            JAX, anything with __array__), numpy scalars and Python numbers. Every rank passes the same structure,
            leaf shapes and dtypes.
        comm: the communicator; None for COMM_WORLD.

    Returns:
        A new tree of the same containers on every rank (rank 0 included): each array leaf a new numpy array
        holding rank 0's values bit for bit, with the leaf's dtype and shape (jax.numpy.asarray or a jitted function
        takes it as is), each numpy scalar a numpy scalar of its dtype, each Python number a Python number.

    Raises:
        TypeError: a leaf is not numeric or bool (a string, a function); send those with bcast_object.
        WeightMismatchError: on every rank, naming the rank and the first leaf path (tree['w'].mu) or container
            that differs, when the ranks' structures, leaf shapes or dtypes differ.
    """
    comm = COMM_WORLD if comm is None else comm
    leaves: list[_Leaf] = []
    nodes: list[str] = []
    rebuild = _walk_tree(tree, "tree", leaves, nodes)
    values = []
    for path, leaf in leaves:
        value = np.array(leaf, order="C")  # a copy: the result never shares memory with the input
        if value.dtype.kind not in "biufc":
            raise TypeError(
                f"rank0_bcast_tree: leaf {path} has dtype {value.dtype}; leaves must be numeric or bool (broadcast "
                "other state with bcast_object)"
            )
        values.append(value)
    if comm.Get_size() > 1:
        _bcast_checked(comm, values, _tree_signature(nodes, leaves, values), _describe_tree_mismatch, "",
                       "rank0_bcast_tree")
    return rebuild(iter(values))


def bcast_object(obj: Any, comm: MPI.Comm | None = None) -> Any:
    """Rank 0's picklable ``obj`` on every rank (the other ranks' ``obj`` is ignored; pass None there).

    For small state that is not an array (a config, a resumed run's per-rank state): pickled on rank 0 and moved as
    rank0_bcast_wts moves weights, so ranks wait for each other without spinning and within the stall limit. Every
    rank must call it.

    Args:
        obj: on rank 0, anything ``pickle`` takes; ignored on the other ranks.
        comm: the communicator; None for COMM_WORLD.

    Returns:
        A copy of rank 0's ``obj`` on every rank (rank 0 included, also with one rank).
    """
    comm = COMM_WORLD if comm is None else comm
    if comm.Get_size() == 1:
        return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))  # a copy, as other ranks get
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if comm.Get_rank() == 0 else b""
    size = int(meet_and_exchange(comm, [len(payload)], "bcast_object")[0, 0])
    buffer = np.frombuffer(payload, dtype=np.uint8).copy() if comm.Get_rank() == 0 else np.empty(size, np.uint8)
    _bcast_buffers(comm, [buffer], "bcast_object")
    return pickle.loads(buffer.tobytes())


def _read_all(x: Any) -> list[np.ndarray]:
    """Every value in ``x``, to read: what rank0_bcast_wts takes, else (a dict, JAX arrays, numbers: nothing is
    written here) a tree as rank0_bcast_tree takes it."""
    try:
        return [_read(leaf) for leaf in _flatten(x)]
    except TypeError:
        leaves: list[_Leaf] = []
        _walk_tree(x, "tree", leaves, [])
        return [np.asarray(leaf) for _, leaf in leaves]


def ranks_out_of_sync(x: Any, comm: MPI.Comm | None = None) -> list[int]:
    """The ranks whose values of ``x`` differ from rank 0's in any bit (shapes and dtypes included), on every rank.

    One small exchange of a 63-bit digest per rank, no data moved. Every rank must call it.

    Args:
        x: anything rank0_bcast_wts or rank0_bcast_tree takes.
        comm: the communicator; None for COMM_WORLD.

    Returns:
        The differing ranks in increasing order, the same list on every rank; [] when every rank holds the same.
    """
    comm = COMM_WORLD if comm is None else comm
    digest = hashlib.blake2b(digest_size=8)
    for value in _read_all(x):
        digest.update(repr((value.shape, value.dtype.str)).encode())
        digest.update(value.tobytes())
    mine = int.from_bytes(digest.digest(), "little") >> 1
    if comm.Get_size() == 1:
        return []
    everyone = meet_and_exchange(comm, [mine], "ranks_out_of_sync")[:, 0]
    return [r for r in range(comm.Get_size()) if everyone[r] != everyone[0]]
