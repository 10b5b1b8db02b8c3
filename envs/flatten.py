"""A Dict or Tuple observation as one vector, in a wrapper a checkpoint can pickle."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np


class FlattenedObservation(gymnasium.ObservationWrapper):
    """env's observations as gymnasium.spaces.flatten makes them: one vector, each part's values in order.
    gymnasium's own FlattenObservation holds a lambda, which the pickle of a checkpoint cannot take."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.observation_space = gymnasium.spaces.flatten_space(env.observation_space)

    def observation(self, observation: Any) -> np.ndarray:
        """The observation (a dict or tuple of arrays) as one (obs_dim,) vector."""
        return gymnasium.spaces.flatten(self.env.observation_space, observation)
