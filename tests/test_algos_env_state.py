"""Environment snapshots for checkpoints: a MuJoCo env continues bit for bit, compressed."""


import gymnasium
import numpy as np

from envs.snapshot import restore_env, snapshot_env


def run(env: gymnasium.Env, actions: np.ndarray) -> np.ndarray:
    """Observations and rewards of stepping ``actions``, resetting (unseeded) when an episode ends."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append(np.append(obs, reward))
        if terminated or truncated:
            out.append(env.reset()[0])
    return np.concatenate(out)


def test_walker_snapshot_is_small_and_continues_exactly():
    env = gymnasium.make("Walker2d-v5")
    env.reset(seed=0)
    actions = np.random.default_rng(0).uniform(-1, 1, size=(200, 6))
    run(env, actions[:30])
    blob = snapshot_env(env)
    assert len(blob) < 100_000  # the MjData arena, mostly zeros, compresses ~20x
    expected = run(env, actions[30:])  # long enough to end an episode and reset from the env's own RNG
    assert run(restore_env(blob), actions[30:]).tobytes() == expected.tobytes()
