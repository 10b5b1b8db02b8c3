"""For each env id in argv[2:]: every rank collects its share with its own seeds and the batch is gathered to rank 0,
which then replays each rank's rollout one after the other in a single process and saves both into
argv[1]/rollouts_<env>.npz. The env ids share one job: TensorFlow is imported once per rank."""

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import gymnasium  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import mpi_util  # noqa: E402
from algos import ActorCritic, RolloutWorker  # noqa: E402

out_dir, env_ids, seed, steps = Path(sys.argv[1]), sys.argv[2:], 3, 300


def rollout_of(env_id: str, rank: int, actor) -> dict[str, np.ndarray]:
    """What rank ``rank`` collects: its env seeded with rank_seed, its own action RNG stream."""
    worker = RolloutWorker(gymnasium.make(env_id), seed=mpi_util.rank_seed(seed, rank), gamma=0.99, lam=0.95)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(rank, 1)))
    batches = [worker.collect(steps, actor, rng)[0] for _ in range(2)]  # episodes continue across calls
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}


keras.utils.set_random_seed(mpi_util.rank)  # different initial weights per rank: the broadcast must fix that
for env_id in env_ids:
    env = gymnasium.make(env_id)
    ac = ActorCritic(env.observation_space.shape[0], env.action_space, hidden=(64, 64))
    mpi_util.rank0_bcast_wts(ac.broadcast_state())
    gathered = mpi_util.rank0_accum_batches(rollout_of(env_id, mpi_util.rank, ac.numpy_actor()))
    if mpi_util.rank == 0:
        sequential = [rollout_of(env_id, r, ac.numpy_actor()) for r in range(mpi_util.nworkers)]
        expected = {key: np.concatenate([s[key] for s in sequential]) for key in gathered}
        np.savez(out_dir / f"rollouts_{env_id}.npz", **{f"gathered_{k}": v for k, v in gathered.items()},
                 **{f"sequential_{k}": v for k, v in expected.items()})
