"""examples/sb3_atari.py on N MPI processes: the lines marked "# mpi_util" are all that changed.

Every rank plays its own games with its own seed and sends its uint8 frame stacks to rank 0, which runs SB3's
update on all of them; the CNN's weights reach every rank. ``--total_steps`` counts the steps of all ranks.

    python examples/sb3_atari_mpi.py --env ALE/Breakout-v5 --total_steps 100000 --nprocs 2
"""

import argparse
import sys

import mpi_util  # mpi_util: before anything that imports mpi4py's MPI
from mpi_util.sb3 import parallelize  # mpi_util: import it before stable_baselines3 (see its docstring)

# isort: split
import ale_py
import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

gym.register_envs(ale_py)  # the ALE/ ids

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--env", default="ALE/Breakout-v5", help="Atari id (default: %(default)s)")
parser.add_argument("--total_steps", type=int, default=100_000, help="agent steps, 4 frames each (default: "
                    "%(default)s)")
parser.add_argument("--n_envs", type=int, default=4, help="envs in the VecEnv (default: %(default)s)")
parser.add_argument("--n_steps", type=int, default=128, help="steps per env per rollout (default: %(default)s)")
parser.add_argument("--batch_size", type=int, default=256, help="minibatch rows (default: %(default)s)")
parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
parser.add_argument("--nprocs", type=int, default=2, help="MPI processes (default: %(default)s)")  # mpi_util
args = parser.parse_args()
fork = mpi_util.mpi_fork(args.nprocs)  # mpi_util: relaunch this script as nprocs ranks
if fork == "parent":  # mpi_util
    sys.exit(fork.returncode)  # mpi_util: the job has ended

# frameskip=1: the v5 ids skip 4 frames themselves, and SB3's preprocessing skips 4 more
env = VecFrameStack(make_atari_env(args.env, n_envs=args.n_envs, seed=args.seed, env_kwargs={"frameskip": 1}),
                    n_stack=4)
model = PPO("CnnPolicy", env, n_steps=args.n_steps, n_epochs=4, batch_size=args.batch_size, learning_rate=2.5e-4,
            clip_range=0.1, ent_coef=0.01, vf_coef=0.5, seed=args.seed, device="cpu", verbose=0)
model = parallelize(model)  # mpi_util: rank 0 learns from every rank's rollout; weights reach every rank
model.learn(args.total_steps)
episodes = list(model.ep_info_buffer)  # whole games, their raw score (SB3's Monitor sits below the preprocessing)
if mpi_util.rank == 0:  # mpi_util
    print(f"{model.num_timesteps} steps, mean score of the last {len(episodes)} games "
          f"{sum(e['r'] for e in episodes) / max(len(episodes), 1):.1f}")
out_of_sync = mpi_util.ranks_out_of_sync(model.policy)  # mpi_util: every rank holds rank 0's weights
mpi_util.print0(f"ranks whose weights differ from rank 0's: {out_of_sync}")  # mpi_util
