"""An environment gymnasium does not know until this module is imported: how train.py trains an env of your own
(docs/training.md, "Your own environment"; tests/test_custom_env.py runs it):

    PYTHONPATH=tests python train.py corridor_env:Corridor-v0 --nprocs 2 --total_steps 4096

"corridor_env:" makes gymnasium import this module, in every process and again on --resume and --play; importing
it registers "Corridor-v0" with the class below as its entry point.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

LENGTH = 8  # cells from the start to the goal


class Corridor(gymnasium.Env):
    """Walk a corridor of LENGTH cells to its right end: 1 for reaching it (which ends the episode), -0.01 a step.

    Observation (2,) float32: the position as a fraction of the length, and a constant 1. Actions: 0 left, 1 right.
    It draws nothing; ``render_mode`` is taken because gymnasium.make passes it (train.py's --play does).
    """

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.position = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position = 0
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position = max(0, self.position + (1 if action == 1 else -1))
        at_goal = self.position == LENGTH
        return self._observation(), 1.0 if at_goal else -0.01, at_goal, False, {}

    def _observation(self) -> np.ndarray:
        return np.array([self.position / LENGTH, 1.0], dtype=np.float32)


gymnasium.register("Corridor-v0", entry_point=Corridor, max_episode_steps=50)
