"""rank0_bcast_tree on trees whose values differ per rank, then trees that differ in structure, shape or container on
the last rank; 0-d arrays through rank0_bcast_wts. argv[2] == "jax" adds a JAX parameter dict with its optax Adam
state and a pytree dataclass registered with JAX. Each rank writes argv[1]/tree_{rank}.json: every tree described
(leaf path, type, dtype, shape, bytes) before and after, and the one-line message of each mismatch."""

import dataclasses
import json
import sys
from collections import OrderedDict, namedtuple
from pathlib import Path
from typing import Any

import numpy as np

import mpi_util

out_dir, with_jax = Path(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "jax"
rank, last = mpi_util.rank, mpi_util.nworkers - 1
rng = np.random.default_rng(rank)
AdamState = namedtuple("AdamState", "count mu nu")


def describe(node: Any, path: str = "") -> list:
    """[path, type, dtype, shape, hex bytes] per leaf and [path, container type] per container, written here without
    mpi_util so the test does not check the function with itself."""
    if isinstance(node, dict | OrderedDict):
        return [[path, type(node).__name__]] + [x for k in node for x in describe(node[k], f"{path}[{k!r}]")]
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return [[path, type(node).__name__]] + [x for f in node._fields for x in describe(getattr(node, f),
                                                                                           f"{path}.{f}")]
    if isinstance(node, list | tuple):
        return [[path, type(node).__name__]] + [x for i, v in enumerate(node) for x in describe(v, f"{path}[{i}]")]
    if node is None:
        return [[path, "None"]]
    value = np.asarray(node)
    return [[path, type(node).__name__, value.dtype.str, list(value.shape), value.tobytes().hex()]]


def numpy_tree() -> dict:
    """Arrays of several dtypes and shapes (0-d, empty), numpy scalars and Python numbers, in a dict built in a
    rank-dependent insertion order (the broadcast orders keys itself)."""
    items = {
        "params": {"w": rng.standard_normal((5, 3)).astype(np.float32), "b": rng.standard_normal(3)},
        "opt": AdamState(np.array(rank, np.int32), [rng.standard_normal(2)], (rng.integers(0, 9, (2, 2)), None)),
        "scalars": [np.float32(rank + 0.5), np.int64(-rank), float(rank) / 3, rank, rank % 2 == 0],
        "zero_d": np.array(rank * 1.25, np.float16),
        "empty": np.zeros((0, 4), np.float32),
        "order": OrderedDict(z=np.full(2, rank, np.uint8), a=rng.random(3) < 0.5),
        "big": rng.standard_normal(100_000).astype(np.float32),  # 400 kB: travels on its own, not packed
    }
    keys = list(items) if rank % 2 == 0 else list(reversed(items))
    return {key: items[key] for key in keys}


def collect(tree: Any, describe_tree=describe) -> dict:
    before = describe_tree(tree)
    after = mpi_util.rank0_bcast_tree(tree)
    return {"before": before, "after": describe_tree(after), "input_after": describe_tree(tree)}


result = {"numpy": collect(numpy_tree())}

# rank0_bcast_wts writes 0-d arrays in place.
zero_d = [np.array(rank + 0.25), np.array(rank, np.int32)]
mpi_util.rank0_bcast_wts(zero_d)
result["zero_d_in_place"] = [v.item() for v in zero_d]

if with_jax:
    import jax
    import jax.numpy as jnp
    import optax

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class TrainState:
        params: dict
        step: jax.Array

    def describe_jax(tree: Any) -> list:
        keyed, treedef = jax.tree_util.tree_flatten_with_path(tree)
        leaves = [[jax.tree_util.keystr(k), type(v).__name__, np.asarray(v).dtype.str, list(np.shape(v)),
                   np.asarray(v).tobytes().hex()] for k, v in keyed]
        return [str(treedef), *leaves]

    params = {"dense": {"kernel": jnp.asarray(rng.standard_normal((4, 2)), jnp.float32), "bias": jnp.zeros(2)}}
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, rank + 1.0), params)
    _, opt_state = optimizer.update(grads, opt_state, params)  # count 1 and moments that differ per rank
    result["jax"] = collect((params, opt_state, TrainState(params, jnp.array(rank))), describe_jax)

if last > 0:
    mismatches = {
        "key": {"w": np.zeros(3), ("b" if rank == last else "a"): np.zeros(2)},
        "shape": {"opt": AdamState(np.int32(0), [np.zeros((2, 3) if rank == last else (3, 2))], ())},
        "container": {"layers": (np.zeros(2),) if rank == last else [np.zeros(2)]},
        "count": [np.zeros(2)] * (3 if rank == last else 2),
    }
    result["errors"] = {}
    for case, tree in mismatches.items():
        try:
            mpi_util.rank0_bcast_tree(tree)
            result["errors"][case] = "no error"
        except mpi_util.WeightMismatchError as error:
            result["errors"][case] = f"{type(error).__name__}: {error}"
# The communicator must still work after a refused broadcast: one more collective proves no rank is stuck.
result["alive"] = int(mpi_util.all_sum(1))
(out_dir / f"tree_{rank}.json").write_text(json.dumps(result))
