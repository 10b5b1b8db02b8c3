"""examples/sb3_ppo.py on N MPI processes: the lines marked "# mpi_util" are all that changed.

Every rank steps its own envs with its own seed; rank 0 trains on every rank's rollout with SB3's own update; the
policy and the VecNormalize statistics are broadcast back to every rank, bit for bit. ``--total_steps`` counts the
steps of all ranks, and rank 0's ep_info_buffer holds every rank's episodes.

    python examples/sb3_ppo_mpi.py --env Walker2d-v5 --total_steps 200000 --nprocs 8
"""

import argparse
import sys

import mpi_util  # mpi_util
from mpi_util.sb3 import parallelize  # mpi_util: import it before stable_baselines3 (see its docstring)

# isort: split
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecNormalize

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default: %(default)s)")
parser.add_argument("--algo", choices=["ppo", "a2c"], default="ppo", help="SB3 algorithm (default: %(default)s)")
parser.add_argument("--total_steps", type=int, default=50_000, help="environment steps (default: %(default)s)")
parser.add_argument("--n_envs", type=int, default=1, help="envs in the VecEnv (default: %(default)s)")
parser.add_argument("--n_steps", type=int, default=1024, help="steps per env per rollout (default: %(default)s)")
parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
parser.add_argument("--save", default="", metavar="PATH",
                    help="at the end save the model (PATH.zip) and its VecNormalize (PATH_vecnormalize.pkl)")
parser.add_argument("--nprocs", type=int, default=2, help="MPI processes (default: %(default)s)")  # mpi_util
args = parser.parse_args()
fork = mpi_util.mpi_fork(args.nprocs)  # mpi_util: relaunch this script as nprocs ranks
if fork == "parent":  # mpi_util
    sys.exit(fork.returncode)  # mpi_util: the job has ended

env = VecNormalize(make_vec_env(args.env, n_envs=args.n_envs, seed=args.seed))
if args.algo == "ppo":
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=64, seed=args.seed, device="cpu", verbose=0)
else:
    model = A2C("MlpPolicy", env, n_steps=args.n_steps, seed=args.seed, device="cpu", verbose=0)
model = parallelize(model)  # mpi_util: rank 0 learns from every rank's rollout; weights reach every rank
model.learn(args.total_steps)
episodes = list(model.ep_info_buffer)
if mpi_util.rank == 0:  # mpi_util
    print(f"{model.num_timesteps} steps, mean return of the last {len(episodes)} episodes "
          f"{sum(e['r'] for e in episodes) / max(len(episodes), 1):.1f}")
out_of_sync = mpi_util.ranks_out_of_sync(model.policy)  # mpi_util: every rank holds rank 0's weights
mpi_util.print0(f"ranks whose weights differ from rank 0's: {out_of_sync}")  # mpi_util
if args.save and mpi_util.rank == 0:  # mpi_util: rank 0 saves
    model.save(args.save)
    # the observation statistics the policy learnt with: evaluation needs them too (examples/sb3_evaluate.py)
    model.get_vec_normalize_env().save(f"{args.save}_vecnormalize.pkl")
