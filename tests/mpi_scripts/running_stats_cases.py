"""SharedRunningStats on every rank with gymnasium's vector NormalizeObservation / NormalizeReward and SB3's
RunningMeanStd; writes argv[1]/stats_{rank}.pkl: every batch each statistic was fed, per round, and the statistics
after each merge (in the types the objects held), plus the errors of two bad calls.

Rank r runs r + 1 envs and a different number of steps per round, so ranks add different numbers of samples.
"""

import pickle
import sys
from pathlib import Path

import mpi_util.sb3  # noqa: F401  (before stable_baselines3: keeps TensorFlow out of the process)

# isort: split
import gymnasium as gym
import numpy as np
from gymnasium.wrappers.utils import RunningMeanStd
from stable_baselines3.common.running_mean_std import RunningMeanStd as Sb3RunningMeanStd

import mpi_util

out_dir = Path(sys.argv[1])
rank, size = mpi_util.rank, mpi_util.nworkers
ROUNDS = 3


class Recorded(RunningMeanStd):
    """gymnasium's RunningMeanStd that keeps a copy of every batch it is fed (the reference is computed from them)."""

    def __init__(self, like: RunningMeanStd) -> None:
        super().__init__(shape=like.mean.shape, dtype=like.mean.dtype)
        self.fed: list[np.ndarray] = []

    def update(self, x: np.ndarray) -> None:
        self.fed.append(np.array(x))
        super().update(x)


def normalized_envs(env_id: str) -> tuple[gym.vector.VectorEnv, list[Recorded]]:
    """rank + 1 envs of env_id under gymnasium's vector NormalizeObservation and NormalizeReward."""
    envs = gym.make_vec(env_id, num_envs=rank + 1, vectorization_mode="sync")
    envs = obs_norm = gym.wrappers.vector.NormalizeObservation(envs)
    envs = gym.wrappers.vector.NormalizeReward(envs, gamma=0.99)
    obs_norm.obs_rms, envs.return_rms = Recorded(obs_norm.obs_rms), Recorded(envs.return_rms)
    envs.action_space.seed(mpi_util.rank_seed(1, rank))
    return envs, [obs_norm.obs_rms, envs.return_rms]


def state(stat: object) -> tuple:
    return stat.mean, stat.var, stat.count


# InvertedPendulum's observations are float64, Pendulum's float32; the return statistics are float64 scalars.
mujoco_envs, mujoco_stats = normalized_envs("InvertedPendulum-v5")
pendulum_envs, pendulum_stats = normalized_envs("Pendulum-v1")
sb3_stats = Sb3RunningMeanStd(shape=(2, 3))
stats = [*mujoco_stats, *pendulum_stats, sb3_stats]
shared = mpi_util.SharedRunningStats(stats)  # before the resets, which update the observation statistics
mujoco_envs.reset(seed=mpi_util.rank_seed(2, rank))
pendulum_envs.reset(seed=mpi_util.rank_seed(3, rank))
rng = np.random.default_rng(mpi_util.rank_seed(4, rank))
sb3_fed = []
rounds = []
for round_ in range(ROUNDS):
    for _ in range(10 + 7 * rank + round_):
        mujoco_envs.step(mujoco_envs.action_space.sample())
        pendulum_envs.step(pendulum_envs.action_space.sample())
    sb3_fed.append(rng.normal(rank, 1.0 + rank, size=(5 + 3 * rank, 2, 3)))
    sb3_stats.update(sb3_fed[-1])
    shared.merge()
    rounds.append({"fed": [s.fed for s in stats[:4]] + [[sb3_fed[-1]]], "after": [state(s) for s in stats]})
    for stat in stats[:4]:
        stat.fed = []
in_sync = mpi_util.ranks_out_of_sync([np.asarray(x) for s in stats for x in state(s)])

errors = {}
try:  # the last rank's statistic has another shape
    mpi_util.SharedRunningStats(RunningMeanStd(shape=(2,) if rank == size - 1 else (3,)))
except ValueError as error:
    errors["shape"] = str(error)
before = [state(s) for s in stats]
if rank == size - 1:
    sb3_stats.count = 1e-4  # as if it had been reset
try:
    shared.merge()
except ValueError as error:
    errors["count"] = str(error)
unchanged = all(np.array_equal(x, y) for s, old in zip(stats[:4], before[:4], strict=True)
                for x, y in zip(state(s), old, strict=True))
(out_dir / f"stats_{rank}.pkl").write_bytes(pickle.dumps(
    {"rounds": rounds, "in_sync": in_sync, "errors": errors, "unchanged": unchanged}))
