"""TRPO, PPO and what they share: GAE, observation/return normalizers, networks, policy and rollout."""

from algos.gae import gae_advantages
from algos.networks import build_mlp, numpy_mlp_forward
from algos.normalizer import RunningMeanStd
from algos.policy import ActorCritic, NumpyActor
from algos.ppo import PPO, PPOConfig
from algos.rollout import RolloutWorker
from algos.trpo import TRPO, TRPOConfig

__all__ = [
    "PPO",
    "TRPO",
    "ActorCritic",
    "NumpyActor",
    "PPOConfig",
    "RolloutWorker",
    "TRPOConfig",
    "RunningMeanStd",
    "build_mlp",
    "gae_advantages",
    "numpy_mlp_forward",
]
