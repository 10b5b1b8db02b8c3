"""TRPO, PPO and what they share: GAE, observation/return normalizers, networks, policy and rollout.

The names below are imported on first use (PEP 562), so that ``import algos.rollout`` or ``algos.numpy_actor``
does not pull in TensorFlow: ``--play`` and the rollout workers need numpy only.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "PPO": "algos.ppo",
    "PPOConfig": "algos.ppo",
    "TRPO": "algos.trpo",
    "TRPOConfig": "algos.trpo",
    "ActorCritic": "algos.policy",
    "NumpyActor": "algos.numpy_actor",
    "RolloutWorker": "algos.rollout",
    "RunningMeanStd": "algos.normalizer",
    "build_mlp": "algos.networks",
    "gae_advantages": "algos.gae",
    "numpy_mlp_forward": "algos.numpy_actor",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'algos' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
