"""What each rank is given: its share of the batch, its rollout worker and seeds, and the job's CPUs."""

from __future__ import annotations

import math
import os
import platform
from typing import TYPE_CHECKING

import numpy as np

import mpi_util

if TYPE_CHECKING:
    from algos.rollout import RolloutWorker
    from trainer.config import TrainConfig
    from trainer.learner import Learner


def steps_of_rank(batch_size: int, nprocs: int, rank: int) -> int:
    """This rank's share of the batch: equal shares, the remainder one step each to the first ranks."""
    return batch_size // nprocs + (1 if rank < batch_size % nprocs else 0)


def share_of_batch(config: TrainConfig, rank: int, nprocs: int) -> tuple[int, mpi_util.SharedBudget | None]:
    """The most steps this rank runs per iteration, and the budget it draws them from under --batch_split shared
    (None: its even share, steps_of_rank). Collective under --batch_split shared."""
    if config.batch_split != "shared" or nprocs == 1:
        return steps_of_rank(config.batch_size, nprocs, rank), None
    try:
        budget = mpi_util.SharedBudget(config.batch_size)
    except ValueError as error:
        mpi_util.abort(f"train.py: error: --batch_split shared: {error}")
    return config.batch_size, budget  # a rank may draw the whole batch


def actor_state_to_receive(learner: Learner | None, worker: RolloutWorker, hidden: tuple[int, ...],
                           shared_torso: bool) -> list:
    """The actor-critic's variables and normalizers as rank 0 broadcasts them: rank 0's own (TensorFlow's), read
    for the broadcast; every other rank's, numpy arrays of the same shapes that receive them (the layout of an
    actor-critic with ``hidden`` layers and, for images, ``shared_torso``: algos.registry.shares_torso)."""
    from algos.numpy_actor import actor_critic_state_like

    if learner:
        return learner.ac.broadcast_state()
    return actor_critic_state_like(worker.obs, worker.action, hidden, shared_torso)


def job_resources() -> dict:
    """What the job was given, for config.json: each host's CPUs (the union of its ranks' affinity, capped by the
    largest cgroup CPU quota among them) and their sum, the processes on rank 0's host (rank 0 included), and the
    BLAS / OpenMP threads of each kind of rank.
    Collective: every rank calls it; the result is complete on rank 0 only."""
    from mpi_util.cpus import cgroup_cpu_quota

    mine = (platform.node(), sorted(os.sched_getaffinity(0)), cgroup_cpu_quota(), os.environ.get("OMP_NUM_THREADS"))
    ranks = mpi_util.gather_objects(mine) if mpi_util.nworkers > 1 else [mine]
    if mpi_util.rank != 0:
        return {}
    cpus_per_host: dict[str, int] = {}
    for host in dict.fromkeys(r[0] for r in ranks):
        on_host = [r for r in ranks if r[0] == host]
        allowed = len(set().union(*(set(r[1]) for r in on_host)))
        quotas = [r[2] for r in on_host if r[2] is not None]
        cpus_per_host[host] = max(1, min(allowed, math.ceil(max(quotas)))) if quotas else allowed
    return {"job_cpus": sum(cpus_per_host.values()), "job_cpus_per_host": cpus_per_host,
            "rank0_host_ranks": sum(r[0] == ranks[0][0] for r in ranks),
            "rank0_omp_threads": ranks[0][3], "worker_omp_threads": ranks[1][3] if len(ranks) > 1 else None}


def make_rollout_worker(config: TrainConfig, rank: int, seed_path: tuple[int, ...]) -> tuple:
    """This rank's RolloutWorker (its envs, seeded from the base seed) and its action RNG. seed_path () gives the
    run's first worker; (2, iteration) a fresh one for a resume with another --nprocs."""
    from algos.rollout import RolloutWorker
    from envs.atari import is_atari
    from envs.make import make_env

    envs = [make_env(config.env_id) for _ in range(config.envs_per_rank)]
    if seed_path:
        seed = int(np.random.SeedSequence(config.seed, spawn_key=(rank, *seed_path)).generate_state(1)[0])
    else:
        seed = mpi_util.rank_seed(config.seed, rank)
    worker = RolloutWorker(envs, seed=seed, gamma=config.gamma, lam=config.lam, atari=is_atari(config.env_id))
    action_rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(rank, 1)))
    return worker, action_rng
