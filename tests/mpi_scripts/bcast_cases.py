"""Every rank builds differently initialised models and arrays, then rank0_bcast_wts; each rank saves its values
before and after into argv[1]. argv[2] == "tf" adds Keras, tf.Module and tf.Variable cases (slow to import), after
mpi_util.setup_gpu(0.08) on every rank, which prints what it did and the GPUs TensorFlow sees (rank 0's line),
argv[2] == "torch" a torch module whose BatchNorm holds a 0-d buffer (num_batches_tracked).

With BCAST_FILE_LIMIT=N in the environment, files larger than N bytes cannot be written during the broadcasts
(RLIMIT_FSIZE, as a small /dev/shm refuses them): the shared-memory window a broadcast on one host goes through
cannot grow past N, and rank0_bcast_wts must fall back to MPI broadcasts. Every rank saves whether it did."""

import json
import os
import resource
import sys
from pathlib import Path

import numpy as np

import mpi_util
from mpi_util.host import transport
from mpi_util.process import COMM_WORLD

out_dir, framework = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else ""
rank = mpi_util.rank
rng = np.random.default_rng(rank)

numpy_list = [
    rng.standard_normal((64, 17)).astype(np.float32),
    rng.standard_normal(64).astype(np.float64),
    rng.standard_normal((3, 3)).astype(np.float16),
    rng.integers(0, 100, 5).astype(np.int32),
    rng.random(4) < 0.5,
    np.zeros((0, 3), np.float32),
    np.array(rank + 0.5),  # 0-d: written in place
]
# After numpy_list, each larger than any before: variables of 256 KiB and more travel on their own, and on one host
# the shared-memory window the broadcast goes through must grow (from 64 KiB to 1.2 MB, then to 8 MB).
cases = {
    "numpy_list": numpy_list,
    "large": [rng.standard_normal(300_000).astype(np.float32), rng.standard_normal(10)],
    "larger": [rng.standard_normal((1000, 2000)).astype(np.float32), rng.integers(0, 9, 3)],
}
if framework == "tf":
    gpu_setup = mpi_util.setup_gpu(0.08)
    import keras
    import tensorflow as tf

    mpi_util.print0(f"GPU_COUNT {len(tf.config.list_physical_devices('GPU'))}")
    print(f"SETUP {gpu_setup}", flush=True)

    mpi_util.set_global_seeds(7)  # a different seed per rank: the models start different
    model = keras.Sequential([keras.Input((17,)), keras.layers.Dense(64, activation="tanh"), keras.layers.Dense(6)])

    class Affine(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.random.normal((5, 2)))
            self.b = tf.Variable(tf.random.normal((2,), dtype=tf.float64))

    cases["keras_model"] = model
    cases["tf_module"] = Affine()
    cases["tf_variables"] = [tf.Variable(tf.random.normal((7,))), tf.Variable(tf.random.uniform((2, 2), maxval=9,
                                                                                                dtype=tf.int32)),
                             tf.Variable(tf.random.normal(()))]
    cases["mixed_list"] = [tf.Variable(tf.random.normal((3,))), rng.standard_normal(3)]
if framework == "torch":
    import torch

    torch.manual_seed(rank)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    module[1].num_batches_tracked.fill_(rank + 5)  # 0-d int64; a (1,) copy of it cannot be written back
    cases["torch_module"] = module


def values(x) -> list[np.ndarray]:
    if hasattr(x, "state_dict"):
        return [v.detach().numpy().copy() for v in x.state_dict().values()]
    if isinstance(x, list):
        return [v if isinstance(v, np.ndarray) else v.numpy() for v in x]
    if hasattr(x, "get_weights"):
        return [v.numpy() for v in x.weights]
    return [v.numpy() for v in x.variables]


file_limit = int(os.environ.get("BCAST_FILE_LIMIT", "0"))
unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)
for name, x in cases.items():
    np.savez(out_dir / f"{name}_before_{rank}.npz", *[v.copy() for v in values(x)])
    if file_limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, unlimited[1]))
    mpi_util.rank0_bcast_wts(x)
    resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)
    np.savez(out_dir / f"{name}_after_{rank}.npz", *values(x))
host = transport(COMM_WORLD)  # None at one rank, or without the host transport
(out_dir / f"host_bcast_{rank}.json").write_text(json.dumps({"fell_back": bool(host and host.bcast_refused)}))
