"""sb3-contrib's TRPO, MaskablePPO and RecurrentPPO through mpi_util.sb3.parallelize, sb3-contrib unmodified.

    python sb3_contrib_cases.py one_process OUT     # plain sb3-contrib and parallelize(...) at one process
    mpiexec -n 2 python sb3_contrib_cases.py two_ranks OUT
    python sb3_contrib_cases.py unknown_array OUT   # (also under mpiexec) a buffer with an array nobody named

two_ranks learns each algorithm on a task it learns in seconds and writes OUT/<algo>_rank<r>.npz: this rank's rows of
the last rollout ("local/NAME", (n_steps, this rank's envs, ...) or, for LSTM states, (n_steps, n_layers, envs,
hidden)), on rank 0 the buffer its last train() used ("trained/NAME", as sb3-contrib's get() left it), the env axis of
each ("axis/NAME"), and the mean return of the last 100 episodes of every rank ("mean_return"). Prints one line per
check.
"""

import sys
from pathlib import Path

import mpi_util
from mpi_util.sb3 import parallelize

# isort: split
import gymnasium as gym
import numpy as np
from sb3_cases import state  # the same comparison as for SB3's own algorithms
from sb3_contrib import TRPO, MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize


class Recall(gym.Env):
    """A memory task: the first observation is a cue, +1 or -1, the later ones 0; the last of ``length`` steps pays 1
    for the action that names the cue (1 for +1, 0 for -1). Without memory the best return is 0.5, with it 1."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 3) -> None:
        self.length = length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(2))
        return np.array([2.0 * self.cue - 1.0], np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t == self.length
        return np.zeros(1, np.float32), float(done and int(action) == self.cue), done, False, {}


def masked_env(n_envs: int, seed: int):
    # 8 actions of which 4 are masked at each step: random play earns 20 / 4 = 5 per 20-step episode, learned play 20
    return make_vec_env(InvalidActionEnvDiscrete, n_envs=n_envs, seed=seed,
                        env_kwargs={"dim": 8, "n_invalid_actions": 4, "ep_length": 20})


def build(algo: str, n_envs: int, seed: int, task: str):
    """task "exact": a short run on Pendulum (VecNormalize) or the masked env; "learn": a task learnt in seconds."""
    if algo == "trpo":
        env = make_vec_env("CartPole-v1" if task == "learn" else "Pendulum-v1", n_envs=n_envs, seed=seed)
        return TRPO("MlpPolicy", env if task == "learn" else VecNormalize(env), n_steps=256 if task == "learn" else 32,
                    batch_size=64 if task == "learn" else 32, seed=seed, device="cpu")
    if algo == "mask":
        return MaskablePPO("MlpPolicy", masked_env(n_envs, seed), n_steps=128 if task == "learn" else 32,
                           batch_size=64, n_epochs=4, learning_rate=3e-3, seed=seed, device="cpu")
    env = make_vec_env(Recall, n_envs=n_envs, seed=seed) if task == "learn" else VecNormalize(
        make_vec_env("Pendulum-v1", n_envs=n_envs, seed=seed))
    return RecurrentPPO("MlpLstmPolicy", env, n_steps=128 if task == "learn" else 32, batch_size=128, n_epochs=4,
                        learning_rate=3e-3, seed=seed, device="cpu",
                        policy_kwargs={"lstm_hidden_size": 16, "net_arch": [16]})


def one_process(out: Path) -> None:
    for algo in ("trpo", "mask", "rec"):
        steps = 2 * 2 * 32  # 2 iterations of 2 envs: an update, then one from what it changed
        plain = build(algo, 2, seed=7, task="exact")
        plain.learn(steps)
        parallel = parallelize(build(algo, 2, seed=7, task="exact"))
        parallel.learn(steps)
        expected, got = state(plain), state(parallel)
        differ = [k for k in expected if not np.array_equal(expected[k], got[k])]
        print(f"{algo}: {len(expected)} arrays, differ from plain sb3-contrib: {differ}; steps {plain.num_timesteps} "
              f"{parallel.num_timesteps}", flush=True)


# Budgets (steps over all ranks, 3 envs) that reach the learn test's thresholds with room to spare.
LEARN_STEPS = {"trpo": 12_000, "mask": 6_000, "rec": 6_000}


def two_ranks(out: Path) -> None:
    rank = mpi_util.rank
    for algo, steps in LEARN_STEPS.items():
        model = parallelize(build(algo, 2 if rank == 0 else 1, seed=5, task="learn"))
        model.learn(steps)
        axes = model._mpi.env_axes
        arrays = {f"local/{name}": getattr(model._mpi.local_buffer, name) for name in axes}
        arrays.update({f"axis/{name}": np.array(axis) for name, axis in axes.items()})
        if rank == 0:
            arrays.update({f"trained/{name}": getattr(model.rollout_buffer, name) for name in axes})
            episodes = list(model.ep_info_buffer)
            arrays["mean_return"] = np.array(sum(e["r"] for e in episodes) / len(episodes))
        np.savez(out / f"{algo}_rank{rank}.npz", **arrays)
        out_of_sync = mpi_util.ranks_out_of_sync([model.policy])
        mpi_util.print0(f"{algo}: {model.num_timesteps} steps, ranks out of sync: {out_of_sync}")


class CostBuffer(RolloutBuffer):
    """A rollout buffer with one more array, (n_steps, n_envs), that parallelize has not been told about."""

    def reset(self) -> None:
        super().reset()
        self.costs = np.zeros((self.buffer_size, self.n_envs), dtype=np.float32)


def unknown_array(out: Path) -> None:
    model = TRPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1), n_steps=32, batch_size=32, device="cpu",
                 rollout_buffer_class=CostBuffer)
    try:
        parallelize(model)
    except ValueError as error:
        print(f"rank {mpi_util.rank} refused: {error}", flush=True)
    parallelize(model, env_axes={"costs": 1})
    model.learn(64 * mpi_util.nworkers)
    mpi_util.print0(f"with env_axes: trained rows {model.rollout_buffer.costs.size}")


if __name__ == "__main__":
    {"one_process": one_process, "two_ranks": two_ranks, "unknown_array": unknown_array}[sys.argv[1]](Path(sys.argv[2]))
