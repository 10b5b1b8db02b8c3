"""A third algorithm in one file, as algos/registry.py describes, for tests/test_algos_registry.py.

``ObsNormOnly`` is numpy only: it leaves the policy's weights as they are and merges each batch's observations into
the actor-critic's normalizer, as PPO and TRPO do after their update. It keeps an update count as its optimizer state
and samples one return per batch with its own generator, so that a checkpoint has both to carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Mapping

    from algos.policy import ActorCritic


class ObsNormOnly:
    """algos.registry.Algorithm with a trivial update."""

    def __init__(self, ac: ActorCritic, lr: float, seed: int) -> None:
        self.ac, self.lr = ac, lr
        self.rng = np.random.default_rng(seed)
        self.updates = np.zeros(1)  # (1,) updates done

    def update(self, obs: np.ndarray, act: np.ndarray, adv: np.ndarray, ret: np.ndarray,
               behavior_logp: np.ndarray | None = None, old_logp: np.ndarray | None = None) -> dict[str, float]:
        """obs (N, obs_dim) into obs_rms (the log-probabilities are not used); returns the mean of adv (N,), one
        sampled ret (N,), lr and updates."""
        self.ac.obs_rms.update(obs)
        self.updates += 1
        return {"adv_mean": float(adv.mean()), "ret_sample": float(ret[self.rng.integers(len(ret))]),
                "lr": self.lr, "updates": float(self.updates[0])}

    def set_learning_rate(self, lr: float) -> None:
        self.lr = lr

    def optimizer_state(self) -> list[np.ndarray]:
        return [self.updates.copy()]

    def set_optimizer_state(self, arrays: list[np.ndarray]) -> None:
        self.updates[...] = arrays[0]

    def rng_state(self) -> Any:
        return self.rng.bit_generator.state

    def set_rng_state(self, state: Any) -> None:
        self.rng.bit_generator.state = state


def from_config(ac: ActorCritic, settings: Mapping[str, Any]) -> ObsNormOnly:
    """The builder the registry line names: reads --lr and --seed."""
    return ObsNormOnly(ac, settings["lr"], settings["seed"])
