"""Evaluate what examples/sb3_ppo.py or examples/sb3_ppo_mpi.py saved with --save PATH, in one plain process.

The model alone is not enough: its policy acts on observations normalized by the VecNormalize statistics it learnt
with, so they are loaded too, and frozen (training=False) so that evaluating does not change them; rewards are the
env's own (norm_reward=False).

    python examples/sb3_ppo_mpi.py --nprocs 2 --save ppo_cartpole
    python examples/sb3_evaluate.py ppo_cartpole
"""

import argparse

# Before stable_baselines3, as docs/sb3.md asks: SB3's logger would otherwise load TensorFlow (when installed) through
# tensorboard, and a torch with triton then aborts the process. Nothing here runs on more than one process.
import mpi_util.sb3  # noqa: F401

# isort: split
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("path", help="what --save was given: PATH.zip and PATH_vecnormalize.pkl are loaded")
parser.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default: %(default)s)")
parser.add_argument("--algo", choices=["ppo", "a2c"], default="ppo", help="SB3 algorithm (default: %(default)s)")
parser.add_argument("--episodes", type=int, default=10, help="episodes to play (default: %(default)s)")
parser.add_argument("--seed", type=int, default=1000, help="seed of the evaluation env (default: %(default)s)")
args = parser.parse_args()

env = VecNormalize.load(f"{args.path}_vecnormalize.pkl", make_vec_env(args.env, n_envs=1, seed=args.seed))
env.training = False  # keep the statistics as they were saved
env.norm_reward = False  # report the env's own returns
model = {"ppo": PPO, "a2c": A2C}[args.algo].load(args.path, env=env, device="cpu")
mean, std = evaluate_policy(model, env, n_eval_episodes=args.episodes, deterministic=True)
print(f"mean return over {args.episodes} episodes {mean:.1f} (std {std:.1f})")
