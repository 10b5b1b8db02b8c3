"""Collecting a rank's share of the batch from one gymnasium environment."""

import math

import gymnasium
import numpy as np

from algos.gae import gae_advantages
from algos.numpy_actor import NumpyActor


class RolloutWorker:
    """One gymnasium env on one rank. Episodes continue across collect() calls (the batch is split across
    ranks by steps, so a rank's share may end mid-episode).

    The first reset uses reset(seed=seed) and the action space is seeded with seed; later resets are unseeded
    so the env's own RNG carries on. gamma and lam are the GAE discount and trace parameters.
    """

    def __init__(self, env: gymnasium.Env, seed: int, gamma: float, lam: float) -> None:
        if len(env.observation_space.shape) != 1:
            raise ValueError(f"need a flat observation space, got shape {env.observation_space.shape}")
        self.env = env
        self.gamma = gamma
        self.lam = lam
        self.is_discrete = isinstance(env.action_space, gymnasium.spaces.Discrete)
        self.obs_dim = env.observation_space.shape[0]
        self.act_shape = () if self.is_discrete else env.action_space.shape
        env.action_space.seed(seed)
        self._obs = self._reset(seed)
        self._ep_return = 0.0
        self._ep_length = 0

    def collect(
        self, n_steps: int, actor: NumpyActor, rng: np.random.Generator
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Step the env n_steps times with actor, sampling actions from rng.

        Returns (batch, episodes):
            batch: {"obs": (n, obs_dim) float32 RAW observations, "act": (n, act_dim) float32 unclipped or
                (n,) int64, "adv": (n,) float32 GAE advantages (not normalized), "ret": (n,) float32 value
                targets}.
            episodes: {"ep_return": (E,) float64, "ep_length": (E,) int64} of the episodes that FINISHED
                (terminated or truncated) during this call, counting their steps from earlier calls too.

        Actions are clipped to the Box bounds only when passed to env.step. A terminated step has next
        value 0; a truncated one bootstraps from the value of the final observation step() returned (before
        the reset); the last step of the call, when its episode goes on, bootstraps from the value of the
        next observation.
        Raises ValueError naming the step when an observation or a reward is NaN or infinite.
        """
        obs = np.empty((n_steps, self.obs_dim), dtype=np.float32)
        act = np.empty((n_steps, *self.act_shape), dtype=np.int64 if self.is_discrete else np.float32)
        rewards = np.empty(n_steps, dtype=np.float64)
        episode_ends = np.zeros(n_steps, dtype=bool)
        truncated_steps: list[int] = []
        truncated_obs: list[np.ndarray] = []
        ep_returns: list[float] = []
        ep_lengths: list[int] = []
        space = self.env.action_space
        # np.minimum(np.maximum(...)) is np.clip bit for bit, without np.clip's Python-level dispatch, which
        # costs as much as the policy's forward pass at one row per step.
        low, high = (None, None) if self.is_discrete else (space.low, space.high)

        for t in range(n_steps):
            obs[t] = self._obs
            action = actor.act(obs[t : t + 1], rng)[0]
            act[t] = action
            env_action = int(action) if self.is_discrete else np.minimum(np.maximum(action, low), high)
            next_obs, reward, terminated, truncated, _ = self.env.step(env_action)
            next_obs = np.asarray(next_obs, dtype=np.float32)
            if not (np.isfinite(next_obs).all() and math.isfinite(reward)):
                raise ValueError(
                    f"non-finite observation or reward at step {t} of this collect "
                    f"(step {self._ep_length + 1} of its episode): reward={reward}, observation={next_obs}"
                )
            rewards[t] = reward
            self._ep_return += float(reward)
            self._ep_length += 1
            if terminated or truncated:
                episode_ends[t] = True
                ep_returns.append(self._ep_return)
                ep_lengths.append(self._ep_length)
                self._ep_return = 0.0
                self._ep_length = 0
                if not terminated:
                    truncated_steps.append(t)
                    truncated_obs.append(next_obs)
                next_obs = self._reset(None)
            self._obs = next_obs

        cut_by_batch = n_steps > 0 and not episode_ends[-1]
        if cut_by_batch:
            episode_ends[-1] = True
        # One batched value call for the whole collect: per-step calls would dominate the step loop.
        value_inputs = [obs] + [o[None] for o in truncated_obs] + ([self._obs[None]] if cut_by_batch else [])
        all_values = actor.value(np.concatenate(value_inputs, axis=0))
        values = all_values[:n_steps]
        # Inside an episode the next value is the next step's; at an episode's end it is 0 (terminated) unless
        # overwritten just below by a bootstrap (truncated, or cut by the end of this collect).
        next_values = np.zeros(n_steps, dtype=np.float64)
        next_values[:-1] = np.where(episode_ends[:-1], 0.0, values[1:])
        next_values[truncated_steps] = all_values[n_steps : n_steps + len(truncated_steps)]
        if cut_by_batch:
            next_values[-1] = all_values[-1]
        adv, ret = gae_advantages(rewards, values, next_values, episode_ends, self.gamma, self.lam)
        batch = {"obs": obs, "act": act, "adv": adv, "ret": ret}
        episodes = {
            "ep_return": np.asarray(ep_returns, dtype=np.float64),
            "ep_length": np.asarray(ep_lengths, dtype=np.int64),
        }
        return batch, episodes

    def episode_state(self) -> dict:
        """The episode in progress, for a checkpoint: {"obs": (obs_dim,) float32 current observation,
        "ep_return": float, "ep_length": int so far}. The env's own state is saved separately."""
        return {"obs": self._obs.copy(), "ep_return": self._ep_return, "ep_length": self._ep_length}

    def restore_episode(self, state: dict) -> None:
        """Continue the episode episode_state() saved (after self.env was restored to the same moment)."""
        self._obs = np.array(state["obs"], dtype=np.float32)
        self._ep_return = float(state["ep_return"])
        self._ep_length = int(state["ep_length"])

    def _reset(self, seed: int | None) -> np.ndarray:
        """Reset the env; the first observation as float32 (obs_dim,), ValueError if NaN or infinite."""
        obs, _ = self.env.reset(seed=seed)
        obs = np.asarray(obs, dtype=np.float32)
        if not np.all(np.isfinite(obs)):
            raise ValueError(f"non-finite observation from env.reset(): {obs}")
        return obs
