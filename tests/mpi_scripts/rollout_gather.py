"""For each env id in argv[2:]: every rank collects its share with its own seeds and the batch is gathered to rank 0,
which then replays each rank's rollout one after the other in a single process and saves both into
argv[1]/rollouts_<env>.npz. The actor is the workers' numpy one (no TensorFlow), its weights random per rank until
rank 0's are broadcast."""

import sys
from pathlib import Path

import gymnasium
import numpy as np

import mpi_util
from algos import NumpyActor, RolloutWorker
from algos.numpy_actor import actor_critic_state_like
from algos.spaces import action_spec, obs_spec

out_dir, env_ids, seed, steps = Path(sys.argv[1]), sys.argv[2:], 3, 300
HIDDEN = (64, 64)
NORMALIZER_ARRAYS = 6  # obs_rms and ret_rms, [mean, var, count] each: left at their start values


def rollout_of(env_id: str, rank: int, actor: NumpyActor) -> dict[str, np.ndarray]:
    """What rank ``rank`` collects: its env seeded with rank_seed, its own action RNG stream."""
    worker = RolloutWorker(gymnasium.make(env_id), seed=mpi_util.rank_seed(seed, rank), gamma=0.99, lam=0.95)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(rank, 1)))
    batches = [worker.collect(steps, actor, rng)[0] for _ in range(2)]  # episodes continue across calls
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}


init_rng = np.random.default_rng(mpi_util.rank)  # different weights per rank: the broadcast must fix that
for env_id in env_ids:
    env = gymnasium.make(env_id)
    obs, action = obs_spec(env.observation_space), action_spec(env.action_space)
    state = actor_critic_state_like(obs, action, HIDDEN)
    for array in state[:-NORMALIZER_ARRAYS]:
        array[...] = 0.3 * init_rng.standard_normal(array.shape)
    mpi_util.rank0_bcast_wts(state)
    actor = NumpyActor.from_ac_state(state, HIDDEN, obs, action)
    gathered = mpi_util.rank0_accum_batches(rollout_of(env_id, mpi_util.rank, actor))
    if mpi_util.rank == 0:
        sequential = [rollout_of(env_id, r, actor) for r in range(mpi_util.nworkers)]
        expected = {key: np.concatenate([s[key] for s in sequential]) for key in gathered}
        np.savez(out_dir / f"rollouts_{env_id}.npz", **{f"gathered_{k}": v for k, v in gathered.items()},
                 **{f"sequential_{k}": v for k, v in expected.items()})
