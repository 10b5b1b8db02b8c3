"""Small envs of the spaces train.py flattens or acts in besides Box and Discrete, registered on import (as
"spaces_env:ID"): Dict observations with MultiDiscrete actions, Tuple observations with MultiBinary actions, and an
observation space no policy reads."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces


class Steer(gymnasium.Env):
    """A point on a line pushed by several levers: the reward is minus its distance from 0, so a policy learns to
    push back. ``kind``: "dict" (Dict observations, MultiDiscrete([3, 3]) levers: -1, 0, +1 each) or "tuple" (Tuple
    observations, MultiBinary(2): the first lever pushes up, the second down)."""

    def __init__(self, kind: str = "dict", render_mode: str | None = None) -> None:
        self.kind, self.render_mode = kind, render_mode
        position = spaces.Box(-10.0, 10.0, (1,), np.float32)
        velocity = spaces.Box(-1.0, 1.0, (1,), np.float32)
        if kind == "dict":
            self.observation_space = spaces.Dict({"position": position, "velocity": velocity})
            self.action_space = spaces.MultiDiscrete([3, 3])
        else:
            self.observation_space = spaces.Tuple((position, velocity))
            self.action_space = spaces.MultiBinary(2)
        self._position = np.zeros(1, np.float32)

    def _obs(self, velocity: float) -> Any:
        parts = (self._position.copy(), np.array([velocity], np.float32))
        return dict(zip(("position", "velocity"), parts, strict=True)) if self.kind == "dict" else parts

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._position = self.np_random.uniform(-5.0, 5.0, 1).astype(np.float32)
        return self._obs(0.0), {}

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict]:
        action = np.asarray(action)
        push = float((action - 1).sum()) if self.kind == "dict" else float(action[0]) - float(action[1])
        velocity = 0.25 * push
        self._position = np.clip(self._position + velocity, -10.0, 10.0).astype(np.float32)
        return self._obs(velocity), -float(abs(self._position[0])), False, False, {}


class Plane(gymnasium.Env):
    """Observations a policy cannot read: a 2-D float Box (neither a vector nor an image)."""

    observation_space = spaces.Box(-1.0, 1.0, (4, 4), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros((4, 4), np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros((4, 4), np.float32), 0.0, True, False, {}


gymnasium.register("SteerDict-v0", entry_point=Steer, kwargs={"kind": "dict"}, max_episode_steps=50)
gymnasium.register("SteerTuple-v0", entry_point=Steer, kwargs={"kind": "tuple"}, max_episode_steps=50)
gymnasium.register("Plane-v0", entry_point=Plane, max_episode_steps=10)
