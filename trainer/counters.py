"""The counters rank 0 keeps and broadcasts with the weights, so that every rank agrees on when to stop."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trainer.config import TrainConfig


def _counter(index: int, doc: str) -> property:
    def get(self: Counters) -> int:
        return int(self.array[index])

    def set_(self: Counters, value: int) -> None:
        self.array[index] = value

    return property(get, set_, doc=doc)


class Counters:
    """What rank 0 counts; broadcast with the weights as one int64 array (5,), so every rank agrees on when to stop."""

    iteration = _counter(0, "updates done")
    total_steps = _counter(1, "environment steps learned from, all ranks together")
    total_episodes = _counter(2, "episodes finished in the batches learned from, all ranks together")
    stop = _counter(3, "1 once rank 0 has decided that the iteration just done is the last")
    collect_done = _counter(4, "1 once the batches gathered cover the budget (--policy_lag 1: one update is left)")

    def __init__(self) -> None:
        self.array = np.zeros(5, dtype=np.int64)

    def budget_spent(self, config: TrainConfig, steps: int = 0, episodes: int = 0) -> bool:
        """Whether the budget is spent once ``steps`` and ``episodes`` more are learned from."""
        return (self.total_steps + steps >= config.total_steps
                or (config.num_episodes is not None and self.total_episodes + episodes >= config.num_episodes))
