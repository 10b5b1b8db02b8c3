"""What train.py needs from a learning algorithm (``Algorithm``) and the algorithms it runs (``ALGORITHMS``).

Adding an algorithm is one new module in algos/ and one line in ALGORITHMS: the module holds a class that satisfies
``Algorithm`` and a function ``f(ac: ActorCritic, settings: Mapping[str, Any]) -> Algorithm`` that builds it from
the values of its settings (the names of its defaults, and "seed"); the line names
that function and gives the defaults of the train.py options the algorithm reads (--lr, --kl_targ, ...), and, per
family of envs (envs.make.env_family: Atari), the defaults that replace them there, with the batch's layout for
that family. train.py's --algo choices, those options' defaults and their --help, and rank 0's learner all come from
ALGORITHMS; the algorithm's own configuration class takes its defaults from here too, so that each is written once.

This module imports neither TensorFlow nor the algorithms: an algorithm's module is imported by name when rank 0
builds its learner, so that the launcher, the rollout workers and --play stay numpy only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from envs.make import env_family

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np

    from algos.policy import ActorCritic


@runtime_checkable
class Algorithm(Protocol):
    """What train.py calls on rank 0's algorithm, which updates the ActorCritic it was built with, in place.

    N below is the batch's rows: --batch_size steps, all ranks together.
    """

    def update(self, obs: np.ndarray, act: np.ndarray, adv: np.ndarray, ret: np.ndarray,
               behavior_logp: np.ndarray | None = None, old_logp: np.ndarray | None = None) -> dict[str, float]:
        """One update on a gathered batch: obs (N, obs_dim) float32 raw observations (the algorithm merges them into
        ac.obs_rms after its update); act (N, act_dim) float32 or (N,) int64; adv (N,) GAE advantages, not
        normalized; ret (N,) value targets in return units; behavior_logp (N,) float64, under --policy_lag 1 only:
        the log-probabilities of the (one update older) policy that acted, else None; old_logp (N,) float64,
        otherwise: the log-probabilities of act under the policy being updated, as the workers found them while
        acting with it (an algorithm may use them instead of a pass of its own, or ignore them). Returns the update's
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
    """"module:function", imported on rank 0 only: function(ac: ActorCritic, settings: Mapping[str, Any]) ->
    Algorithm, ``settings`` holding the value of each setting of ``defaults`` and "seed"."""
    defaults: dict[str, Any]
    """The TrainConfig fields the algorithm reads besides seed, with their defaults (what --help shows and
    config.json records when an option is not given). With "lr_schedule", train.py sets the learning rate before
    every update (set_learning_rate) as --lr_schedule says; with "clip_schedule" the algorithm also has
    set_clip_ratio(clip_ratio: float), which train.py calls before every update as --clip_schedule says. An option the
    algorithm does not read is refused."""
    families: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per family of envs (envs.make.env_family's names), the defaults that replace ``defaults`` there, and
    TrainConfig's batch_size and ENVS_IN_ALL (the envs of all processes together, which sets --envs_per_rank) for
    that family. A setting the user gives wins over both."""
    shares_image_torso: tuple[str, ...] = ()
    """The families of envs (envs.make.env_family's names) whose image policies have one CNN torso under the policy
    and value heads; every other image env gets two CNNs."""

    def defaults_for(self, family: str | None) -> dict[str, Any]:
        """The defaults of an env of ``family`` (None: no family): ``defaults`` with the family's replacing them."""
        return {**self.defaults, **self.families.get(family or "", {})}

    def build(self, ac: ActorCritic, settings: Mapping[str, Any]) -> Algorithm:
        """The algorithm for ``ac`` with ``settings`` ({name: value} of every setting of ``defaults`` and "seed"; the
        run's configuration holds them under the same names); imports its module, and TensorFlow with it."""
        missing = sorted({*self.defaults, "seed"} - set(settings))
        if missing:
            raise KeyError(f"the settings of {self.builder} lack {', '.join(missing)}")
        module, _, function = self.builder.partition(":")
        return getattr(importlib.import_module(module), function)(ac, settings)


ENVS_IN_ALL = "envs_in_all"
"""A family's key for its envs over all processes: --envs_per_rank defaults to max(1, that // --nprocs), so that
--batch_size / (--nprocs x --envs_per_rank) steps per env and iteration (the horizon GAE sees) stays the family's
whatever the process count divides it into (8 envs of 128 steps: 4 per process at --nprocs 2, 1 at 8)."""

# The Atari work of the PPO paper (Schulman et al. 2017, table 5) as rl-baselines3-zoo's hyperparams/ppo.yml gives it
# for every ALE game: 8 envs x 128 steps, 4 epochs of 256 rows, lr 2.5e-4 and clip 0.1 both decayed linearly to 0,
# entropy 0.01, value coefficient 0.5, no KL early stop (kl_targ 0). CleanRL's ppo_atari.py is the same but keeps
# the clip constant.
_ATARI_BATCH = {"batch_size": 1024, ENVS_IN_ALL: 8}

VALUE_TARGETS = ("normalized", "raw")
"""What PPO's value function may learn (its value_targets): the returns scaled by running statistics, or as they are."""
VALUE_LOSSES = ("mse", "clipped")
"""PPO's value loss (its value_loss): the mean squared error, or the larger of it and the clipped value's."""
ADVANTAGE_NORMALIZATIONS = ("batch", "minibatch")
"""Over which rows PPO normalizes the advantages (its adv_norm)."""

ALGORITHMS: dict[str, AlgorithmSpec] = {
    "ppo": AlgorithmSpec(
        "algos.ppo:from_config",
        {"lr": 3e-4, "lr_schedule": "linear", "epochs": 10, "minibatch_size": 64, "kl_targ": 0.02,
         "clip_ratio": 0.2, "clip_schedule": "constant", "ent_coef": 0.0, "vf_coef": 0.5, "value_loss": "mse",
         "adv_norm": "batch", "value_targets": "normalized"},
        # Atari's value targets are the returns as they are, as rl-baselines3-zoo's, the PPO paper's, baselines' and
        # CleanRL's Atari runs learn them (rewards clipped to their sign keep them small). Breakout after 2M frames,
        # seeds 0-4: raw mean 9.2 (6.8-10.3) against normalized 8.4 (6.1-11.8), within the seeds' spread
        # (benchmarks/README.md, section Pixels).
        # Atari's loss is baselines' ppo2's and CleanRL's ppo_atari.py's: the value loss clipped around the workers'
        # values and weighed 0.25 (their 0.5 x half the squared error), the advantages normalized per minibatch; the
        # update then applies CleanRL's gradient to 1.5e-5 (benchmarks/update_match.py). Breakout after 2M frames,
        # seeds 0-10, scored a mean 9.0 with it (6.6-10.7; seeds 3 and 6 in a copy that also took torch's form of
        # Adam's epsilon) against CleanRL's 8.8 (3.7-10.9), and on seeds 0-6 8.2 with the loss before (0.5 x the mean
        # squared error, advantages over the batch; 5.6-10.3) (benchmarks/README.md, section Pixels).
        # MinAtar keeps the generic settings: its Breakout scored 11.6 with them against 4.9 at the Atari settings
        # (--nprocs 2, 500k steps, seeds 0-2; benchmarks/README.md, section Pixels).
        families={"atari": {**_ATARI_BATCH, "lr": 2.5e-4, "epochs": 4, "minibatch_size": 256, "kl_targ": 0.0,
                            "clip_ratio": 0.1, "clip_schedule": "linear", "ent_coef": 0.01, "vf_coef": 0.25,
                            "value_loss": "clipped", "adv_norm": "minibatch", "value_targets": "raw"}},
        # On Atari one torso, as the PPO paper's Atari networks, baselines, SB3 and CleanRL have it with the Atari
        # settings: half the update's arithmetic and half the workers' forward passes of two CNNs. Not on other image
        # envs at the generic settings: MinAtar Breakout at --nprocs 2 ended at 7.1 with one torso against 13.1 with
        # two CNNs, every one of seeds 0-2 lower (benchmarks/README.md, section Pixels).
        shares_image_torso=("atari",)),
    # TRPO keeps two networks: its natural-gradient step is a trust region over the policy's parameters alone, and a
    # torso shared with the value function would move the policy outside it (baselines' trpo_mpi copies the network
    # for its value function too). On Atari it takes the family's batch, its own settings otherwise.
    "trpo": AlgorithmSpec("algos.trpo:from_config", {"lr": 1e-3, "minibatch_size": 64, "kl_targ": 0.01},
                          families={"atari": dict(_ATARI_BATCH)}),
}
"""train.py's --algo NAME -> how to build that algorithm."""


def shares_torso(algo: str, env_id: str, is_image: bool) -> bool:
    """Whether the actor-critic of ``algo`` (an ALGORITHMS key) on ``env_id``, with image (``is_image``) or vector
    observations, has one CNN torso under both heads: the layout rank 0 builds, the workers receive into, and --play
    reads."""
    return is_image and env_family(env_id) in ALGORITHMS[algo].shares_image_torso
