"""What train.py needs from a learning algorithm (``Algorithm``) and the algorithms it runs (``ALGORITHMS``).

Adding an algorithm is one new module in algos/ and one line in ALGORITHMS: the module holds a class that satisfies
``Algorithm`` and a function ``f(ac: ActorCritic, config: TrainConfig) -> Algorithm`` that builds it; the line names
that function and gives the defaults of the train.py options the algorithm reads (--lr, --kl_targ, ...). train.py's
--algo choices, those options' defaults and their --help, and rank 0's learner all come from ALGORITHMS; the
algorithm's own configuration class takes its defaults from here too, so that each is written once.

This module imports neither TensorFlow nor the algorithms: an algorithm's module is imported by name when rank 0
builds its learner, so that the launcher, the rollout workers and --play stay numpy only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from algos.policy import ActorCritic
    from trainer.config import TrainConfig


@runtime_checkable
class Algorithm(Protocol):
    """What train.py calls on rank 0's algorithm, which updates the ActorCritic it was built with, in place.

    N below is the batch's rows: --batch_size steps, all ranks together.
    """

    def update(self, obs: np.ndarray, act: np.ndarray, adv: np.ndarray, ret: np.ndarray,
               behavior_logp: np.ndarray | None = None) -> dict[str, float]:
        """One update on a gathered batch: obs (N, obs_dim) float32 raw observations (the algorithm merges them into
        ac.obs_rms after its update); act (N, act_dim) float32 or (N,) int64; adv (N,) GAE advantages, not
        normalized; ret (N,) value targets in return units; behavior_logp (N,) float64, under --policy_lag 1 only:
        the log-probabilities of the (one update older) policy that acted, else None. Returns the update's
        statistics by name, each a float (a column of progress.csv)."""

    def set_learning_rate(self, lr: float) -> None:
        """The learning rate of the next updates: train.py calls it before each update when the algorithm reads
        "lr_schedule" (in AlgorithmSpec.defaults) and --lr_schedule is linear."""

    def optimizer_state(self) -> list[np.ndarray]:
        """Copies of the optimizer's arrays in a fixed order, for the checkpoint ([] when there is none)."""

    def set_optimizer_state(self, arrays: list[np.ndarray]) -> None:
        """Restore what optimizer_state() returned (on --resume, before the first update)."""

    def rng_state(self) -> Any:
        """The state of the algorithm's own random generator (picklable), for the checkpoint."""

    def set_rng_state(self, state: Any) -> None:
        """Restore what rng_state() returned."""


@dataclass(frozen=True)
class AlgorithmSpec:
    """How train.py builds one algorithm, and what of its configuration it reads."""

    builder: str
    """"module:function", imported on rank 0 only: function(ac: ActorCritic, config: TrainConfig) -> Algorithm."""
    defaults: dict[str, Any]
    """The TrainConfig fields the algorithm reads besides seed, with their defaults (what --help shows and
    config.json records when an option is not given). With "lr_schedule", train.py sets the learning rate before
    every update (set_learning_rate) as --lr_schedule says. An option the algorithm does not read is refused."""

    def build(self, ac: ActorCritic, config: TrainConfig) -> Algorithm:
        """The algorithm for ``ac`` and ``config`` (imports its module, and TensorFlow with it)."""
        module, _, function = self.builder.partition(":")
        return getattr(importlib.import_module(module), function)(ac, config)


ALGORITHMS: dict[str, AlgorithmSpec] = {
    "ppo": AlgorithmSpec("algos.ppo:from_config", {"lr": 3e-4, "lr_schedule": "linear", "epochs": 10,
                                                   "minibatch_size": 64, "kl_targ": 0.02}),
    "trpo": AlgorithmSpec("algos.trpo:from_config", {"lr": 1e-3, "minibatch_size": 64, "kl_targ": 0.01}),
}
"""train.py's --algo NAME -> how to build that algorithm."""
