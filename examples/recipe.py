"""The README's recipe, end to end: fork, seed, roll out, gather to rank 0, update on rank 0, broadcast.

The "algorithm" is a small batch regression (a stand-in for any batch learner you did not write): every rank
samples noisy data from its own seed, rank 0 fits a Keras model on everyone's rows, and every rank gets the
new weights. The loop below is the recipe the README and docs/mpi_util.md show, line for line (a test checks
that). At the end rank 0 prints every rank's checksum of its weights; they are bit-identical.

    python examples/recipe.py --nprocs 2
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
nprocs, n_iterations, seed = args.nprocs, args.iterations, args.seed

fork = mpi_util.mpi_fork(nprocs)           # relaunch this script as nprocs ranks under mpiexec
if fork == "parent":
    sys.exit(fork.returncode)              # the launcher: the job is over, nonzero if any rank failed

mpi_util.setup_gpu()  # before TensorFlow loads: one GPU per rank where there are GPUs, and no start-up noise
import keras  # noqa: E402  (after the fork: the parent process never needs TensorFlow)


class NoisyLinearSource:
    """The "environment": rows x (256, 4) and targets y = x @ w + noise (256, 1), from this rank's own stream."""

    def __init__(self, rank_seed: int) -> None:
        self.rng = np.random.default_rng(rank_seed)
        self.true_w = np.arange(1, 5, dtype=np.float32)  # what the learner should find

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        x = self.rng.standard_normal((256, 4)).astype(np.float32)
        y = x @ self.true_w + 0.01 * self.rng.standard_normal(256).astype(np.float32)
        return x, y[:, None]


def collect_batch(env: NoisyLinearSource, policy: keras.Model) -> dict[str, np.ndarray]:
    """This rank's "rollout": {"x": (256, 4), "y": (256, 1), "error": (256, 1)}, where error is what the current
    policy gets wrong on these rows (an RL rollout would act with the policy; a regression only scores it)."""
    x, y = env.sample()
    return {"x": x, "y": y, "error": policy(x).numpy() - y}


class Regression:
    """The batch algorithm: two epochs of SGD on the gathered rows."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model

    def update(self, batch: dict[str, np.ndarray]) -> None:
        loss = self.model.fit(batch["x"], batch["y"], batch_size=64, epochs=2, verbose=0).history["loss"][-1]
        rows, error = len(batch["x"]), float(np.mean(batch["error"] ** 2))
        print(f"{rows} rows from {mpi_util.nworkers} ranks, error before {error:.5f}, loss {loss:.5f}", flush=True)


mpi_util.set_global_seeds(seed)            # one base seed; each rank gets its own independent stream
env = NoisyLinearSource(mpi_util.rank_seed(seed, mpi_util.rank))
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
policy, algorithm = model, Regression(model)
mpi_util.rank0_bcast_wts(model)            # every rank starts from rank 0's initial weights, else iteration 0
                                           # is collected by N different random policies
for iteration in range(n_iterations):
    batch = collect_batch(env, policy)     # every rank: a dict of numpy arrays, equal row counts per key
    batch = mpi_util.rank0_accum_batches(batch)   # rank 0: all ranks' rows, concatenated in rank order
    if mpi_util.rank == 0:
        algorithm.update(batch)            # rank 0 alone learns
    mpi_util.rank0_bcast_wts(model)        # every rank: rank 0's weights, bit for bit
    mpi_util.print0(f"iteration {iteration} done")

# Each rank hashes its own weights; rank 0 prints all hashes (lines printed by several ranks at once can
# interleave in mpiexec's output).
digest = hashlib.sha256(b"".join(w.numpy().tobytes() for w in model.weights)).digest()
digests = mpi_util.rank0_accum_batches({"sha256": np.frombuffer(digest, np.uint8)[None, :]})["sha256"]
for r, rank_digest in enumerate(digests if mpi_util.rank == 0 else []):
    print(f"rank {r}: weights sha256 {rank_digest.tobytes().hex()[:16]}", flush=True)
