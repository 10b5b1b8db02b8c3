"""A plain Stable-Baselines3 PPO script, one process, its envs in processes of their own (SubprocVecEnv).

    python examples/sb3_subproc.py --n_envs 4 --start_method forkserver
"""

import argparse

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
    args = parser.parse_args()

    env = make_vec_env(args.env, n_envs=args.n_envs, seed=args.seed, vec_env_cls=SubprocVecEnv,
                       vec_env_kwargs={"start_method": args.start_method})
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=64, seed=args.seed, device="cpu", verbose=0)
    model.learn(args.total_steps)
    episodes = list(model.ep_info_buffer)
    print(f"{model.num_timesteps} steps, mean return of the last {len(episodes)} episodes "
          f"{sum(e['r'] for e in episodes) / max(len(episodes), 1):.1f}")
    env.close()
