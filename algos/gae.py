"""Generalized advantage estimation (Schulman et al. 2016) over a batch that may hold several episodes."""

import numpy as np


def gae_advantages(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    episode_ends: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE(gamma, lam) advantages and the matching value targets.

    All inputs (T,). values[t] = V(s_t); next_values[t] = V(s_{t+1}) where the episode goes on or was
    truncated (time limit, or cut by the end of the batch), 0.0 where it terminated. episode_ends[t] (bool)
    is True when step t is the last step recorded of its episode for any reason (terminated, truncated,
    batch cut), which stops the backward recursion. Returns (advantages (T,) float32, returns (T,) float32)
    with returns = advantages + values. Computed in float64 internally.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    next_values = np.asarray(next_values, dtype=np.float64)
    episode_ends = np.asarray(episode_ends, dtype=bool)
    n = rewards.shape[0]
    for name, arr in (("values", values), ("next_values", next_values), ("episode_ends", episode_ends)):
        if arr.shape != (n,):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({n},) like rewards")

    deltas = rewards + gamma * next_values - values
    advantages = np.empty(n, dtype=np.float64)
    running = 0.0
    for t in range(n - 1, -1, -1):
        # At an episode's last step the next step belongs to another episode (or to no batch at all):
        # its bootstrap, if any, is already inside next_values[t].
        if episode_ends[t]:
            running = 0.0
        running = deltas[t] + gamma * lam * running
        advantages[t] = running
    returns = advantages + values
    return advantages.astype(np.float32), returns.astype(np.float32)
