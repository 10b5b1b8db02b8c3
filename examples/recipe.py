"""The README's recipe, end to end: fork, seed, roll out, gather to rank 0, update on rank 0, broadcast.

The "algorithm" is a small batch regression (a stand-in for any batch learner you did not write): every rank
samples noisy data from its own seed, rank 0 fits a Keras model on everyone's rows, and every rank gets the
new weights. At the end rank 0 prints every rank's checksum of its weights; they are bit-identical.

    python examples/recipe.py --nprocs 3
"""

import argparse
import hashlib
import sys

import numpy as np

import mpi_util

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--nprocs", type=int, default=2, help="number of MPI processes (default: %(default)s)")
parser.add_argument("--iterations", type=int, default=5, help="gather/update/broadcast rounds (default: %(default)s)")
parser.add_argument("--seed", type=int, default=0, help="base seed; each rank derives its own (default: %(default)s)")
args = parser.parse_args()

fork = mpi_util.mpi_fork(args.nprocs)  # relaunches this script under mpiexec
if fork == "parent":
    sys.exit(fork.returncode)

import keras  # noqa: E402  (after the fork: the parent process never needs TensorFlow)

mpi_util.set_global_seeds(args.seed)
rng = np.random.default_rng(mpi_util.rank_seed(args.seed, mpi_util.rank))
true_w = np.arange(1, 5, dtype=np.float32)  # what the learner should find

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
mpi_util.rank0_bcast_wts(model)  # start from rank 0's initial weights

for iteration in range(args.iterations):
    x = rng.standard_normal((256, 4)).astype(np.float32)  # this rank's "rollout"
    y = x @ true_w + 0.01 * rng.standard_normal(256).astype(np.float32)
    batch = mpi_util.rank0_accum_batches({"x": x, "y": y[:, None]})
    if mpi_util.rank == 0:
        loss = model.fit(batch["x"], batch["y"], batch_size=64, epochs=2, verbose=0).history["loss"][-1]
        rows = len(batch["x"])
        print(f"iteration {iteration}: {rows} rows from {mpi_util.nworkers} ranks, loss {loss:.5f}", flush=True)
    mpi_util.rank0_bcast_wts(model)

# Each rank hashes its own weights; rank 0 prints all hashes (lines printed by several ranks at once can
# interleave in mpiexec's output).
digest = hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights)).digest()
digests = mpi_util.rank0_accum_batches({"sha256": np.frombuffer(digest, np.uint8)[None, :]})["sha256"]
for r, rank_digest in enumerate(digests if mpi_util.rank == 0 else []):
    print(f"rank {r}: weights sha256 {rank_digest.tobytes().hex()[:16]}", flush=True)
