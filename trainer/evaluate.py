"""Evaluation while training (--eval_every N, --eval_episodes K): every N iterations the deterministic policy plays
K episodes on env instances of its own, spread over the ranks, and rank 0 keeps the best policy so far as
RUN_DIR/best_policy.npz (train.py --export's format: arrays and JSON, no pickle).

Episode j is played by rank j % nprocs with seed ``seed + 10000 + j``, the seeds --play uses, so that
``train.py --play RUN_DIR/best_policy.npz --episodes K`` plays the episodes that scored it again. The normalizers are
the broadcast ones, frozen, and the policy's random generator is its own: evaluating changes nothing the training
reads, so a run continues bit for bit with or without it, and a resumed run evaluates as the whole run did.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import mpi_util

if TYPE_CHECKING:
    from algos.numpy_actor import NumpyActor
    from trainer.config import TrainConfig

BEST_POLICY = "best_policy.npz"
FIRST_SEED = 10_000  # added to the run's seed, as --play does


def run_episode(env: Any, actor: NumpyActor, seed: int, on_step: Any = None) -> tuple[float, int]:
    """One episode of ``actor``'s deterministic policy on ``env`` reset with ``seed``: (return, length).
    ``on_step(length)`` is called after the reset (length 0) and after every step: rendering, a heartbeat."""
    rng = np.random.default_rng(0)  # deterministic actions draw nothing; the argument is the actor's contract
    obs, _ = env.reset(seed=seed)
    done, total, length = False, 0.0, 0
    if on_step is not None:
        on_step(0)
    while not done:
        action = actor.act(np.asarray(obs, actor.obs.dtype)[None], rng, deterministic=True)[0]
        if not actor.action.discrete:
            action = np.clip(action, env.action_space.low, env.action_space.high)
        obs, reward, terminated, truncated, _ = env.step(action)
        total, length, done = total + float(reward), length + 1, terminated or truncated
        if on_step is not None:
            on_step(length)
    return total, length


class Evaluator:
    """This rank's part of the evaluation (rank 0's learner keeps the best policy)."""

    def __init__(self, config: TrainConfig, evaluated: int) -> None:
        self.config = config
        self.evaluated = evaluated  # the iteration last evaluated (a resumed run's checkpoint was, if due)
        self.env: Any = None  # made at the first evaluation: most iterations need none

    def after_broadcast(self, iteration: int, actor: Callable[[], NumpyActor]) -> tuple[Any, np.ndarray | None]:
        """Collective: when ``iteration`` is due (every --eval_every, once each), evaluate the policy ``actor()``
        builds from the weights just broadcast; (that policy, rank 0's returns (K,)), or (None, None) when not due
        or on the other ranks."""
        every = self.config.eval_every
        if not every or iteration % every or iteration == self.evaluated:
            return None, None
        self.evaluated = iteration
        policy = actor()
        return policy, self.evaluate(policy)

    def evaluate(self, actor: NumpyActor) -> np.ndarray | None:
        """Collective: every rank plays its episodes; rank 0 gets the K returns (K,) in episode order, the others
        None."""
        from envs.make import make_env

        if self.env is None:
            self.env = make_env(self.config.env_id)
        rank, nprocs = mpi_util.rank, mpi_util.nworkers
        mine = [(j, run_episode(self.env, actor, self.config.seed + FIRST_SEED + j, lambda _: mpi_util.heartbeat())[0])
                for j in range(rank, self.config.eval_episodes, nprocs)]
        gathered = mpi_util.gather_objects(mine)
        if rank != 0:
            return None
        return np.array([total for _, total in sorted(pair for part in gathered for pair in part)])


def write_policy_file(path: Path, actor: NumpyActor, about: dict[str, Any]) -> None:
    """Write ``actor`` as the policy file ``path`` (NumpyActor.save's arrays and JSON, ``about`` in its spec),
    atomically: --export's file and the best policy of the evaluations alike."""
    from trainer.checkpoint import write_atomic

    buffer = io.BytesIO()
    actor.save(buffer, about)
    write_atomic(path, buffer.getvalue())
