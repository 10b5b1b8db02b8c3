"""Seeds: one base seed, an independent stream per rank."""

from __future__ import annotations

import random
import sys

import numpy as np

from .process import COMM_WORLD


def rank_seed(seed: int, rank: int) -> int:
    """The 32-bit seed of ``rank`` derived from the run's base ``seed``.

    It is ``numpy.random.SeedSequence(seed, spawn_key=(rank,))`` (the same as
    ``SeedSequence(seed).spawn(n)[rank]`` for any n > rank), so streams are statistically independent across
    ranks and a rank keeps its seed when the number of ranks changes. Not a collective.

    Args:
        seed: the run's base seed, an integer >= 0.
        rank: the rank whose seed to derive.

    Returns:
        An integer in [0, 2**32).

    Raises:
        ValueError: ``seed`` is negative.
    """
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    return int(np.random.SeedSequence(seed, spawn_key=(rank,)).generate_state(1)[0])


def set_global_seeds(seed: int, rank: int | None = None) -> int:
    """Seed Python's ``random``, numpy's global RNG, and TensorFlow and torch when they are imported.

    Each rank gets ``rank_seed(seed, rank)``. Import TensorFlow (or torch) before calling this to have it seeded;
    mpi_util never imports them itself. Not a collective.

    Args:
        seed: the run's base seed, the same on every rank.
        rank: the rank whose seed to use; None for this rank.

    Returns:
        The seed used, ``rank_seed(seed, rank)``.

    Raises:
        ValueError: ``seed`` is negative.
    """
    per_rank = rank_seed(seed, COMM_WORLD.Get_rank() if rank is None else rank)
    random.seed(per_rank)
    np.random.seed(per_rank)
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].random.set_seed(per_rank)
    if "keras" in sys.modules and hasattr(sys.modules["keras"].utils, "set_random_seed"):
        sys.modules["keras"].utils.set_random_seed(per_rank)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(per_rank)
    return per_rank
