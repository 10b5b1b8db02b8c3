"""Play a policy file that ``train.py --export`` wrote, with numpy and gymnasium alone: no TensorFlow, no pickle.

    python train.py --export runs/Walker2d-v5_ppo_s0_20261122-101500 walker2d.npz
    python examples/play_policy_file.py walker2d.npz

Run it from the repository root (or with the checkout on PYTHONPATH), which holds algos/.
"""

import sys

import gymnasium
import numpy as np

from algos.numpy_actor import NumpyActor
from envs.make import make_env

actor, spec = NumpyActor.load(sys.argv[1])  # spec: the env id, spaces, network and normalizers, as JSON data
env = make_env(spec["env_id"])  # an ALE game comes preprocessed as train.py trained it
observation, _ = env.reset(seed=0)
episode_return, done = 0.0, False
while not done:
    action = actor.act(np.asarray(observation)[None], np.random.default_rng(), deterministic=True)[0]
    if isinstance(env.action_space, gymnasium.spaces.Box):
        action = np.clip(action, env.action_space.low, env.action_space.high)
    observation, reward, terminated, truncated, _ = env.step(action)
    episode_return += float(reward)
    done = terminated or truncated
print(f"{spec['env_id']}: return {episode_return:.1f} with the policy of {spec['total_steps']} steps")
