"""A plain Stable-Baselines3 PPO script, one process: VecNormalize over a few envs, PPO's MuJoCo settings.

    python examples/sb3_ppo.py --env Walker2d-v5 --total_steps 200000
"""

import argparse

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
args = parser.parse_args()

env = VecNormalize(make_vec_env(args.env, n_envs=args.n_envs, seed=args.seed))
if args.algo == "ppo":
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=64, seed=args.seed, device="cpu", verbose=0)
else:
    model = A2C("MlpPolicy", env, n_steps=args.n_steps, seed=args.seed, device="cpu", verbose=0)
model.learn(args.total_steps)
episodes = list(model.ep_info_buffer)
print(f"{model.num_timesteps} steps, mean return of the last {len(episodes)} episodes "
      f"{sum(e['r'] for e in episodes) / max(len(episodes), 1):.1f}")
if args.save:
    model.save(args.save)
    # the observation statistics the policy learnt with: evaluation needs them too (examples/sb3_evaluate.py)
    model.get_vec_normalize_env().save(f"{args.save}_vecnormalize.pkl")
