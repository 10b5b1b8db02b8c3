"""Checkpoints and --resume for train.py: what every rank saves and gets back, and the restart after a failure.

A checkpoint is one file rank 0 writes (trainer.checkpoint): the actor-critic's weights and normalizers, the
algorithm's optimizer and RNG state (algos.registry.Algorithm), the counters, and each rank's environments, episode
state and action RNG. The environments' snapshots are pickles: rank 0 signs them with the user's key when it saves,
and sends them to the ranks on --resume only when every signature checks (otherwise the ranks start fresh episodes).
TensorFlow is never imported here: rank 0's learner has it already.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

import mpi_util
from trainer.checkpoint import (
    SignedPickle,
    key_path,
    list_checkpoints,
    load_latest_checkpoint,
    save_checkpoint,
    user_key,
)

if TYPE_CHECKING:
    from algos.rollout import RolloutWorker
    from trainer.counters import Counters


class Learner(Protocol):
    """What a checkpoint needs of rank 0's learner (trainer.learner.Learner, which imports this module)."""

    def checkpoint_state(self) -> dict:
        """The learner's part of a checkpoint: arrays and plain data."""

    def restore_state(self, state: dict, name: str, counters: Counters) -> None:
        """Take back what checkpoint_state() kept, from the checkpoint file ``name``."""

    def checkpoint_key(self) -> bytes | None:
        """The user's key that signs the environments' snapshots, or None."""


def processes(n: int) -> str:
    """A job's size as train.py prints it: '1 process', '3 processes'."""
    return f"{n} process" if n == 1 else f"{n} processes"


def restore(run_dir: Path, learner: Learner | None, counters: Counters, worker: RolloutWorker,
            action_rng: np.random.Generator, fresh_worker: Callable[[tuple[int, ...]], tuple]) -> tuple:
    """Continue from the newest good checkpoint: rank 0 loads the learner (weights, the algorithm's optimizer and RNG,
    counters); every rank gets its own environments, episode state and action RNG back, or, when --nprocs changed or
    the environments' snapshots are not signed with this user's key, fresh episodes from fresh_worker(seed_path),
    which returns (worker, action_rng) as make_rollout_worker does. Returns (worker, action_rng, training seconds
    before this run)."""
    from envs.snapshot import restore_env

    rank, nprocs = mpi_util.rank, mpi_util.nworkers
    per_rank_state, elapsed_before = None, 0.0
    if learner:
        path, state, warnings = load_latest_checkpoint(run_dir / "checkpoints")
        for warning in warnings:
            mpi_util.print0(f"train.py: warning: {warning}")
        learner.restore_state(state, path.name, counters)
        elapsed_before = state["elapsed_s"]
        same_layout = state["nprocs"] == nprocs
        mpi_util.print0(f"resuming {run_dir} from {path.name}: iteration {counters.iteration}, step "
                        f"{counters.total_steps}" + ("" if same_layout else
                                                     f" (was {processes(state['nprocs'])}: fresh episodes)"))
        if same_layout:
            per_rank_state = signed_by_user(state["ranks"], path.name, user_key(create=False))
    # Every rank's state travels to all (a few tens of kB each); each keeps its own.
    per_rank_state, iteration = mpi_util.bcast_object((per_rank_state, counters.iteration))
    if per_rank_state is None:
        worker, _ = fresh_worker((2, iteration))
        return worker, action_rng, elapsed_before
    mine = per_rank_state[rank]
    worker.envs = [restore_env(blob) for blob in mine["envs"]]
    worker.restore_episode(mine["episode"])
    action_rng.bit_generator.state = mine["action_rng"]
    return worker, action_rng, elapsed_before


def signed_by_user(ranks_state: list[dict], name: str, key_and_reason: tuple[bytes | None, str]) -> list[dict] | None:
    """Each rank's state of checkpoint ``name`` with its environments' snapshots as bytes to unpickle, when every
    snapshot's HMAC checks under the user's key (user_key's ``key_and_reason``); None, said in one line, otherwise:
    a snapshot someone else made, or changed, could run code when unpickled."""
    key, reason = key_and_reason
    if all(blob.verified(key) for state in ranks_state for blob in state["envs"]):
        return [dict(state, envs=[blob.data for blob in state["envs"]]) for state in ranks_state]
    why = reason or f"not signed with the key {key_path()}"
    mpi_util.print0(f"train.py: warning: the environments' snapshots in {name} are not loaded ({why}; a run made by "
                    "another user, on a host with another key, or changed since): resuming with fresh episodes")
    return None


def checkpoint(run_dir: Path, learner: Learner | None, counters: Counters, worker: RolloutWorker,
               action_rng: np.random.Generator, nprocs: int, elapsed_s: float) -> None:
    """Every rank's episode state and RNG go to rank 0 (small pickles), which signs the environments' snapshots and
    writes one file with the learner."""
    from envs.snapshot import snapshot_env

    mine = {"envs": [snapshot_env(env) for env in worker.envs], "episode": worker.episode_state(),
            "action_rng": action_rng.bit_generator.state}
    ranks_state = mpi_util.gather_objects(mine)
    if not learner:
        return
    key = learner.checkpoint_key()
    ranks_state = [dict(state, envs=[SignedPickle.sign(blob, key) for blob in state["envs"]]) for state in ranks_state]
    try:
        save_checkpoint(run_dir / "checkpoints", counters.iteration, {
            **learner.checkpoint_state(), "nprocs": nprocs, "counters": counters.array.copy(),
            "elapsed_s": elapsed_s, "ranks": ranks_state,
        })
    except OSError as error:
        mpi_util.abort(f"train.py: error: cannot write the checkpoint of iteration {counters.iteration} in "
                       f"{run_dir / 'checkpoints'}: {error.strerror or error}; {kept_checkpoint_note(run_dir)}: free "
                       f"space (or make it writable), then continue with python train.py --resume {run_dir}")


def restart_from_newest_checkpoint(run_dir: Path, args: list[str]) -> Callable[[mpi_util.JobFailure], list[str]]:
    """mpi_fork's on_failure for --max_restarts: the ranks' arguments ``args`` again, resuming RUN_DIR from its
    newest checkpoint (or from the start when it has none yet; ``args`` name the same run directory), said in one
    line."""
    def restart(failure: mpi_util.JobFailure) -> list[str]:
        kept = list_checkpoints(run_dir / "checkpoints")
        print(f"train.py: {failure.cause}; restarting "
              + (f"from checkpoint {kept[-1].stem}" if kept else "from the start (no checkpoint yet)")
              + f" (restart {failure.restart} of {failure.max_restarts})", file=sys.stderr, flush=True)
        return [*args, "--resume", str(run_dir)] if kept else args

    return restart


def as_numpy(value: object) -> np.ndarray:
    """A numpy copy of a tf.Variable or numpy array."""
    return value.numpy() if hasattr(value, "numpy") else np.array(value, copy=True)


def kept_checkpoint_note(run_dir: Path) -> str:
    """What a run that ends early keeps: its newest checkpoint (by name), or none."""
    return _kept_wording(list_checkpoints(run_dir / "checkpoints"))


def _kept_wording(kept: list[Path]) -> str:
    """The one wording of the checkpoints ``kept`` (oldest first)."""
    return f"the last good checkpoint, {kept[-1].name}, is kept" if kept else "no checkpoint was written yet"


def resume_note(run_dir: Path) -> str:
    """What is kept of a run that ends early, and how to go on from it."""
    kept = list_checkpoints(run_dir / "checkpoints")
    then = (f"continue with python train.py --resume {run_dir}" if kept else
            f"the run starts again from the beginning (in a new run directory; {run_dir} can be removed)")
    return f"{_kept_wording(kept)}: {then}"
