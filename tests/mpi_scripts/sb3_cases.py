"""Stable-Baselines3 through mpi_util.sb3.parallelize: one process against plain SB3, and what rank 0 trains on.

    python sb3_cases.py one_process OUT        # plain SB3 and parallelize(...) at one process, PPO and A2C
    mpiexec -n 2 python sb3_cases.py two_ranks OUT     # also split_n_steps
    mpiexec -n 2 python sb3_cases.py callbacks OUT   # callbacks given on every rank; a stop from rank 0
    mpiexec -n 2 python sb3_cases.py vec_envs OUT    # DummyVecEnv, then SubprocVecEnv by each start method

Writes OUT/<case>_<algo>_rank<r>.npz and prints one line per check.
"""

import json
import sys
import time
from pathlib import Path

import mpi_util
from mpi_util.sb3 import parallelize

# isort: split
import gymnasium as gym
import numpy as np
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

ALGOS = {"ppo": (PPO, {"n_steps": 64, "batch_size": 32, "n_epochs": 2}), "a2c": (A2C, {"n_steps": 16})}


def build(algo: str, n_envs: int, seed: int):
    cls, kwargs = ALGOS[algo]
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=n_envs, seed=seed))
    return cls("MlpPolicy", env, seed=seed, device="cpu", **kwargs)


def state(model) -> dict[str, np.ndarray]:
    """The policy's parameters and buffers and any VecNormalize statistics, as numpy arrays."""
    arrays = {f"policy/{k}": v.detach().numpy().copy() for k, v in model.policy.state_dict().items()}
    vec_normalize = model.get_vec_normalize_env()
    if vec_normalize is not None:
        for name in ("obs_rms", "ret_rms"):
            rms = getattr(vec_normalize, name)
            arrays[f"{name}/mean"], arrays[f"{name}/var"] = rms.mean.copy(), rms.var.copy()
            arrays[f"{name}/count"] = np.array(rms.count)
    return arrays


def one_process(out: Path) -> None:
    for algo, (_, kwargs) in ALGOS.items():
        steps = 5 * 2 * kwargs["n_steps"]  # 5 iterations of 2 envs
        plain = build(algo, 2, seed=7)
        plain.learn(steps)
        parallel = parallelize(build(algo, 2, seed=7))
        parallel.learn(steps)
        expected, got = state(plain), state(parallel)
        differ = [k for k in expected if not np.array_equal(expected[k], got[k])]
        print(f"{algo}: {len(expected)} arrays, differ from plain SB3: {differ}; steps {plain.num_timesteps} "
              f"{parallel.num_timesteps}", flush=True)


def rank0_fails(out: Path) -> None:
    """Rank 0 hands parallelize a model with no env (its set-up failed), rank 1 a good one; no stall limit, so only
    parallelize's agreement can end rank 1's wait. Each rank prints what it raised."""
    mpi_util.set_stall_timeout(None)
    model = build("ppo", 1, seed=3)
    if mpi_util.rank == 0:
        model.env = None
    try:
        parallelize(model)
    except Exception as error:
        print(f"rank {mpi_util.rank} raised {type(error).__name__}: {error}", flush=True)
        raise


def two_ranks(out: Path) -> None:
    rank = mpi_util.rank
    for algo, (_, kwargs) in ALGOS.items():
        n_envs = 2 if rank == 0 else 1  # ranks may step different numbers of envs
        model = parallelize(build(algo, n_envs, seed=11))
        model.learn(2 * 3 * kwargs["n_steps"])  # two iterations of 3 envs in all
        local = model._mpi.local_buffer  # this rank's rows of the last iteration: (n_steps, n_envs, ...)
        arrays = {f"local/{name}": getattr(local, name) for name in ("observations", "actions", "rewards",
                                                                       "returns", "advantages", "log_probs")}
        if rank == 0:  # the buffer train() used, flattened by SB3's get(): (n_steps * 3, ...) env by env
            arrays.update({f"trained/{name}": getattr(model.rollout_buffer, name) for name in
                           ("observations", "actions", "rewards", "returns", "advantages", "log_probs")})
        arrays.update(state(model))
        arrays["num_timesteps"] = np.array(model.num_timesteps)
        arrays["episodes"] = np.array(len(model.ep_info_buffer))
        np.savez(out / f"two_ranks_{algo}_rank{rank}.npz", **arrays)
        out_of_sync = mpi_util.ranks_out_of_sync([model.policy, *[v for k, v in state(model).items()
                                                                  if not k.startswith("policy/")]])
        mpi_util.print0(f"{algo}: ranks out of sync: {out_of_sync}")
    # A tuned config's batch kept: n_steps 64 of one env per rank split over the 2 ranks.
    model = parallelize(PPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=rank), n_steps=64, batch_size=32,
                            n_epochs=1, seed=11, device="cpu"), split_n_steps=True)
    model.learn(64)
    mpi_util.print0(f"split: n_steps {model.n_steps}, rank 0's buffer {model.rollout_buffer.observations.shape}, "
                    f"steps {model.num_timesteps}")
    try:
        parallelize(PPO("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1), n_steps=63, batch_size=63, device="cpu"),
                    split_n_steps=True)
    except ValueError as error:
        mpi_util.print0(f"refused: {error}")


class Record(BaseCallback):
    """Records what it is called with: num_timesteps at each step, and the start and end of training; writes
    OUT/record_rank<r>.json at the end of training, r being the rank it ran on."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out, self.calls = out, {"start": 0, "steps": [], "end": 0}

    def _on_training_start(self) -> None:
        self.calls["start"] += 1

    def _on_step(self) -> bool:
        self.calls["steps"].append(self.num_timesteps)
        return True

    def _on_training_end(self) -> None:
        self.calls["end"] += 1
        (self.out / f"record_rank{mpi_util.rank}.json").write_text(json.dumps(self.calls))


class StopAt(BaseCallback):
    """Asks to stop at the ``n``-th step it sees."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def _on_step(self) -> bool:
        return self.n_calls < self.n


def callbacks(out: Path) -> None:
    """PPO, rank 0 with 2 envs and rank 1 with 1, 32 steps per iteration: 96 steps over all ranks. Every rank passes
    the same callbacks (their files named by the rank they run on): three iterations, then a learn that rank 0's
    callback stops at its 40th step (iteration 2, step 8)."""
    rank = mpi_util.rank
    model = parallelize(PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2 if rank == 0 else 1, seed=3),
                            n_steps=32, batch_size=32, n_epochs=1, seed=3, device="cpu"))
    checkpoints = CheckpointCallback(save_freq=32, save_path=str(out / "checkpoints"), name_prefix=f"rank{rank}")
    evaluations = EvalCallback(Monitor(gym.make("CartPole-v1")), eval_freq=64, n_eval_episodes=2,
                               log_path=str(out / f"eval_rank{rank}"), verbose=0)
    model.learn(3 * 96, callback=[Record(out), checkpoints, evaluations])
    started = time.monotonic()
    model.learn(10**6, callback=StopAt(40))
    # Monitor counts the steps this rank's first env took in both learns: 96 + 32 + 8 on rank 0, which stopped at step
    # 8 of iteration 2; 96 + 32 + 32 on rank 1, which finished that rollout, learnt of the stop and stopped too.
    print(f"rank {rank}: stopped after {time.monotonic() - started:.1f} s at num_timesteps {model.num_timesteps}, "
          f"env 0 stepped {model.env.envs[0].get_total_steps()} times", flush=True)


def vec_envs(out: Path) -> None:
    """PPO on CartPole, 2 envs per rank, 32 steps per env per iteration, two iterations: with a DummyVecEnv, then
    with a SubprocVecEnv started by fork, forkserver and spawn (whose envs import this script again: above all,
    ``import mpi_util``). Writes OUT/vec_envs_<kind>_rank<r>.npz: the state and num_timesteps after learn."""
    rank = mpi_util.rank
    kinds = {"dummy": (DummyVecEnv, {}), **{method: (SubprocVecEnv, {"start_method": method})
                                            for method in ("fork", "forkserver", "spawn")}}
    for kind, (vec_env_cls, vec_env_kwargs) in kinds.items():
        env = make_vec_env("CartPole-v1", n_envs=2, seed=5, vec_env_cls=vec_env_cls, vec_env_kwargs=vec_env_kwargs)
        model = parallelize(PPO("MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=2, seed=5, device="cpu"))
        model.learn(2 * 2 * 2 * 32)
        np.savez(out / f"vec_envs_{kind}_rank{rank}.npz", num_timesteps=np.array(model.num_timesteps),
                 **state(model))
        mpi_util.print0(f"{kind}: ranks out of sync: {mpi_util.ranks_out_of_sync(model.policy)}")
        env.close()


if __name__ == "__main__":
    cases = {"one_process": one_process, "two_ranks": two_ranks, "rank0_fails": rank0_fails, "callbacks": callbacks,
             "vec_envs": vec_envs}
    cases[sys.argv[1]](Path(sys.argv[2]))
