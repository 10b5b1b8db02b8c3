"""examples/sb3_subproc.py on N MPI processes: the lines marked "# mpi_util" are all that changed.

Every rank runs its own SubprocVecEnv, whose env processes (by any start method) import this script again, and with
it mpi_util: there mpi_util starts no MPI, and ``mpi_fork`` returns "child" and does nothing. ``--total_steps`` counts
the steps of all ranks.

    python examples/sb3_subproc_mpi.py --nprocs 2 --n_envs 2 --start_method forkserver
"""

import argparse
import sys

import mpi_util  # mpi_util: before anything that imports mpi4py's MPI
from mpi_util.sb3 import parallelize  # mpi_util: import it before stable_baselines3 (see its docstring)

# isort: split
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import SubprocVecEnv

# SubprocVecEnv's forkserver and spawn methods import this script again in the envs' processes: the work goes under
# the guard, so that only this process does it.
if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default: %(default)s)")
    parser.add_argument("--total_steps", type=int, default=50_000, help="environment steps (default: %(default)s)")
    parser.add_argument("--n_envs", type=int, default=2, help="env processes (default: %(default)s)")
    parser.add_argument("--start_method", choices=["fork", "forkserver", "spawn"], default="forkserver",
                        help="how the env processes start (default: %(default)s, SB3's on Linux)")
    parser.add_argument("--n_steps", type=int, default=1024, help="steps per env per rollout (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
    parser.add_argument("--nprocs", type=int, default=2, help="MPI processes (default: %(default)s)")  # mpi_util
    args = parser.parse_args()
    fork = mpi_util.mpi_fork(args.nprocs)  # mpi_util: relaunch this script as nprocs ranks
    if fork == "parent":  # mpi_util
        sys.exit(fork.returncode)  # mpi_util: the job has ended

    env = make_vec_env(args.env, n_envs=args.n_envs, seed=args.seed, vec_env_cls=SubprocVecEnv,
                       vec_env_kwargs={"start_method": args.start_method})
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=64, seed=args.seed, device="cpu", verbose=0)
    model = parallelize(model)  # mpi_util: rank 0 learns from every rank's rollout; weights reach every rank
    model.learn(args.total_steps)
    episodes = list(model.ep_info_buffer)
    if mpi_util.rank == 0:  # mpi_util
        print(f"{model.num_timesteps} steps, mean return of the last {len(episodes)} episodes "
              f"{sum(e['r'] for e in episodes) / max(len(episodes), 1):.1f}")
    out_of_sync = mpi_util.ranks_out_of_sync(model.policy)  # mpi_util: every rank holds rank 0's weights
    mpi_util.print0(f"ranks whose weights differ from rank 0's: {out_of_sync}")  # mpi_util
    env.close()
