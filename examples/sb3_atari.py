"""A plain Stable-Baselines3 PPO script from pixels: an Atari game with SB3's Atari preprocessing (noop reset, frame
skip 4, 84x84 grey, episodic life and clipped rewards for training), 4 stacked frames, the Nature CNN (CnnPolicy),
and the Atari settings of SB3's zoo. Needs the pixels extra (ale-py).

    python examples/sb3_atari.py --env ALE/Breakout-v5 --total_steps 100000
"""

import argparse

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
args = parser.parse_args()

# frameskip=1: the v5 ids skip 4 frames themselves, and SB3's preprocessing skips 4 more
env = VecFrameStack(make_atari_env(args.env, n_envs=args.n_envs, seed=args.seed, env_kwargs={"frameskip": 1}),
                    n_stack=4)
model = PPO("CnnPolicy", env, n_steps=args.n_steps, n_epochs=4, batch_size=args.batch_size, learning_rate=2.5e-4,
            clip_range=0.1, ent_coef=0.01, vf_coef=0.5, seed=args.seed, device="cpu", verbose=0)
model.learn(args.total_steps)
episodes = list(model.ep_info_buffer)  # whole games, their raw score (SB3's Monitor sits below the preprocessing)
print(f"{model.num_timesteps} steps, mean score of the last {len(episodes)} games "
      f"{sum(e['r'] for e in episodes) / max(len(episodes), 1):.1f}")
