"""sb3-contrib's ARS through mpi_util.sb3.parallelize, sb3-contrib unmodified.

    python ars_cases.py one_process OUT        # plain ARS and parallelize(ARS) at one process, same seed
    mpiexec -n 2 python ars_cases.py two_ranks OUT

two_ranks runs four cases and writes OUT/<case>_rank<r>.json for three: "shares" (Pendulum behind VecNormalize, a
linear policy, 2 updates of 6 candidates: what each rank stepped and counted), "as_in_one_process" (prints only),
"learns" (CartPole, a linear policy: the final policy's mean return over 10 episodes in a plain env) and "async_eval"
(each rank's share evaluated by its own AsyncEval). Prints one line per check.
"""

import json
import sys
from pathlib import Path

import mpi_util
from mpi_util.sb3 import parallelize

# isort: split
import gymnasium as gym
import numpy as np
import torch
from sb3_cases import state  # the policy's parameters and buffers and the VecNormalize statistics
from sb3_contrib import ARS
from sb3_contrib.common.vec_env import AsyncEval
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize


class CountSteps(gym.Wrapper):
    """Counts the steps its env takes (``steps``)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        return super().step(action)


class CountCalls(BaseCallback):
    """Counts the steps it is called at (``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _on_step(self) -> bool:
        self.calls += 1
        return True


def pendulum_env() -> VecNormalize:
    return VecNormalize(make_vec_env("Pendulum-v1", n_envs=1))


def pendulum(n_envs: int, seed: int, n_delta: int) -> ARS:
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=n_envs, seed=seed, wrapper_class=CountSteps))
    return ARS("LinearPolicy", env, n_delta=n_delta, n_top=2, seed=seed, device="cpu")


def cartpole_mlp(seed: int) -> ARS:
    # an MLP that starts from its random weights (zero_policy False), two episodes per candidate
    return ARS("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=seed), n_delta=4, n_top=3, zero_policy=False,
               n_eval_episodes=2, policy_kwargs={"net_arch": [8]}, seed=seed, device="cpu")


def ars_state(model: ARS) -> dict[str, np.ndarray]:
    arrays = state(model)
    arrays["weights"] = model.weights.numpy().copy()
    arrays["returns"] = np.array([episode["r"] for episode in model.ep_info_buffer])
    return arrays


def learn_with_async_eval(model: ARS, steps: int, seed: int) -> None:
    async_eval = AsyncEval([pendulum_env] * 2, model.policy, start_method="fork")
    async_eval.seed(seed)
    model.learn(steps, async_eval=async_eval)


def one_process(out: Path) -> None:
    # (name, model, how it learns, steps: 2 updates or more, each from what the one before changed)
    cases = (("linear", lambda: pendulum(2, seed=7, n_delta=4), ARS.learn, 6000),
             ("mlp", lambda: cartpole_mlp(seed=7), ARS.learn, 1500),
             ("async_eval", lambda: ARS("LinearPolicy", pendulum_env(), n_delta=4, n_top=2, seed=7, device="cpu"),
              lambda model, steps: learn_with_async_eval(model, steps, seed=7), 3000))
    for name, build, learn, steps in cases:
        plain = build()
        learn(plain, steps)
        parallel = parallelize(build())
        learn(parallel, steps)
        expected, got = ars_state(plain), ars_state(parallel)
        differ = [k for k in expected if not np.array_equal(expected[k], got[k])]
        print(f"{name}: {len(expected)} arrays, differ from plain ARS: {differ}; steps {plain.num_timesteps} "
              f"{parallel.num_timesteps}; updates {plain._n_updates} {parallel._n_updates}", flush=True)
    try:
        parallelize(pendulum(1, seed=7, n_delta=4), env_axes={"costs": 1})
    except ValueError as error:
        print(f"env_axes refused: {error}", flush=True)


def shares(out: Path) -> None:
    """2 updates of 6 candidates (n_delta 3), one 200-step Pendulum episode each: 2,400 steps over both ranks."""
    rank = mpi_util.rank
    model = parallelize(pendulum(1, seed=11, n_delta=3))
    calls = CountCalls()
    model.learn(2000, callback=calls)  # one update is 1,200 steps: two updates
    arrays = ars_state(model)
    record = {"num_timesteps": model.num_timesteps, "env_steps": model.get_vec_normalize_env().venv.envs[0].steps,
              "callback_calls": calls.calls, "episodes": len(model.ep_info_buffer), "updates": model._n_updates,
              "obs_count": float(model.get_vec_normalize_env().obs_rms.count),
              "ret_count": float(model.get_vec_normalize_env().ret_rms.count)}
    (out / f"shares_rank{rank}.json").write_text(json.dumps(record))
    out_of_sync = mpi_util.ranks_out_of_sync([model.policy, *[v for k, v in arrays.items() if k != "returns"]])
    mpi_util.print0(f"shares: ranks out of sync: {out_of_sync}")


def learns(out: Path) -> None:
    """CartPole with a linear policy (all zeros at first: it always pushes left, about 9 steps), 4 directions."""
    rank = mpi_util.rank
    model = parallelize(ARS("LinearPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=5), n_delta=4, n_top=2,
                            seed=5, device="cpu"))
    model.learn(12_000)
    rewards, _ = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=100), n_eval_episodes=10,
                                 return_episode_rewards=True)
    record = {"num_timesteps": model.num_timesteps, "mean_return": float(np.mean(rewards))}
    (out / f"learns_rank{rank}.json").write_text(json.dumps(record))
    out_of_sync = mpi_util.ranks_out_of_sync([model.policy, model.weights])
    mpi_util.print0(f"learns: ranks out of sync: {out_of_sync}")


class SameStart(gym.Wrapper):
    """Every episode starts from the same state (reset with seed 0): a candidate's return depends on its weights
    alone, not on which rank's env, or which of its episodes, evaluates it."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=0, options=options)


def same_start_cartpole(seed: int) -> ARS:
    return ARS("LinearPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=seed, wrapper_class=SameStart), n_delta=3,
               n_top=2, seed=seed, device="cpu")


def as_in_one_process(out: Path) -> None:
    """With every candidate's return a function of its weights, ARS on 2 ranks must take the steps it takes in one
    process: the same candidates (rank 0's draws), the same returns in the same order, the same weights. Rank 0 then
    runs plain ARS, as one process does, and compares."""
    model = parallelize(same_start_cartpole(seed=17))
    model.learn(3000)
    if mpi_util.rank == 0:
        plain = same_start_cartpole(seed=17)
        plain.learn(3000)
        expected, got = ars_state(plain), ars_state(model)
        differ = [k for k in expected if not np.array_equal(expected[k], got[k])]
        print(f"as_in_one_process: {len(expected)} arrays, differ from plain ARS in one process: {differ}; steps "
              f"{plain.num_timesteps} {model.num_timesteps}; updates {plain._n_updates} {model._n_updates}", flush=True)


def with_async_eval(out: Path) -> None:
    """Each rank's share evaluated by its own AsyncEval (2 worker processes, forked, each behind its own VecNormalize):
    2 updates of 8 candidates, 4 on each rank, 2 on each worker."""
    rank = mpi_util.rank
    model = parallelize(ARS("LinearPolicy", pendulum_env(), n_delta=4, n_top=2, seed=13, device="cpu"))
    async_eval = AsyncEval([pendulum_env] * 2, model.policy, start_method="fork")
    async_eval.seed(mpi_util.rank_seed(13, rank))  # parallelize re-seeds model.env, not the workers' envs
    model.learn(2000, async_eval=async_eval)  # one update is 1,600 steps: two updates
    record = {"num_timesteps": model.num_timesteps, "episodes": len(model.ep_info_buffer),
              "obs_count": float(model.get_vec_normalize_env().obs_rms.count)}
    (out / f"async_eval_rank{rank}.json").write_text(json.dumps(record))
    arrays = ars_state(model)
    out_of_sync = mpi_util.ranks_out_of_sync([model.policy, *[v for k, v in arrays.items() if k != "returns"]])
    mpi_util.print0(f"async_eval: ranks out of sync: {out_of_sync}")


def two_ranks(out: Path) -> None:
    shares(out)
    as_in_one_process(out)
    learns(out)
    with_async_eval(out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"one_process": one_process, "two_ranks": two_ranks}[sys.argv[1]](Path(sys.argv[2]))
