"""Running mean/variance statistics (observation and return normalizers) kept the same on every rank.

Each rank updates its own normalizer from its own rollout, starting from the statistics every rank shares; then
``SharedRunningStats.merge`` combines what every rank added (counts, means and spreads, as a RunningMeanStd combines
two batches) and gives the result to every rank, bit for bit::

    envs = gym.wrappers.vector.NormalizeObservation(envs)
    obs_norm = envs
    envs = gym.wrappers.vector.NormalizeReward(envs, gamma=0.99)
    normalizers = SharedRunningStats([obs_norm.obs_rms, envs.return_rms])   # every rank: rank 0's statistics
    for iteration in ...:
        ...rollout: each rank's wrappers update their statistics...
        normalizers.merge()                                                   # every rank: all ranks' samples

The statistics are objects with ``.mean``, ``.var`` and ``.count`` attributes: gymnasium's RunningMeanStd
(``gymnasium.wrappers.utils``, inside gymnasium's NormalizeObservation / NormalizeReward wrappers, vector or not) and
Stable-Baselines3's (``stable_baselines3.common.running_mean_std``, inside VecNormalize). Both replace their arrays on
every update (``self.mean, self.var, self.count = ...``), so the attributes are read afresh at every call and written
back by assignment, in the types they had: mean and var arrays of their dtype (a numpy scalar stays a numpy scalar,
a 0-d array a 0-d array), count a float.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from .bcast import bcast_object
from .gather import gather_objects
from .process import COMM_WORLD


class Moments(NamedTuple):
    """One RunningMeanStd's statistics as plain values: mean and var (*shape) float64 arrays, count a float."""

    mean: np.ndarray
    """The mean, (*shape) float64."""
    var: np.ndarray
    """The variance, (*shape) float64."""
    count: float
    """The number of samples behind them."""


def read_moments(stats: Any) -> Moments:
    """float64 copies of ``stats.mean``, ``stats.var`` (*shape) and ``stats.count``, read now; not a collective.

    Args:
        stats: an object with ``.mean``, ``.var`` and ``.count`` (gymnasium's or SB3's RunningMeanStd).

    Returns:
        Moments(mean (*shape) float64, var (*shape) float64, count float).

    Raises:
        TypeError: ``stats`` lacks one of the attributes or holds something that is not numbers.
        ValueError: mean and var differ in shape, or count is not one number.
    """
    values = []
    for name in ("mean", "var", "count"):
        if not hasattr(stats, name):
            raise TypeError(f"a {type(stats).__name__} has no .{name}; pass objects with .mean, .var and .count, "
                            "such as gymnasium's or Stable-Baselines3's RunningMeanStd")
        value = np.asarray(getattr(stats, name))
        if value.dtype.kind not in "biuf":
            raise TypeError(f"a {type(stats).__name__}'s .{name} holds {value.dtype}, not real numbers")
        values.append(value)
    mean, var, count = values
    if mean.shape != var.shape:
        raise ValueError(f"a {type(stats).__name__}'s .mean has shape {mean.shape} but its .var {var.shape}")
    if count.ndim != 0:
        raise ValueError(f"a {type(stats).__name__}'s .count has shape {count.shape}; it must be one number")
    return Moments(mean.astype(np.float64), var.astype(np.float64), float(count))


def _like(original: Any, value: np.ndarray | float) -> Any:
    """``value`` in the type of ``original``: an array of its dtype and shape, a numpy scalar of its type, or a Python
    float / int."""
    if isinstance(original, np.ndarray):
        return np.asarray(value).astype(original.dtype).reshape(original.shape)
    if isinstance(original, np.generic):
        return original.dtype.type(value)
    if isinstance(original, int) and not isinstance(original, bool):
        return int(round(float(value)))
    return float(value)


def write_moments(stats: Any, moments: Moments) -> None:
    """Assign ``moments`` to ``stats.mean``, ``stats.var`` and ``stats.count``, each in the type and dtype the attribute
    holds now (new objects: arrays a caller took from ``stats`` earlier are left as they were); not a collective.

    Args:
        stats: an object with ``.mean``, ``.var`` (*shape) and ``.count``, written in place.
        moments: the values to write: mean and var (*shape), count.
    """
    stats.mean = _like(stats.mean, moments.mean)
    stats.var = _like(stats.var, moments.var)
    stats.count = _like(stats.count, moments.count)


def merge_moments(shared: Moments | tuple, per_rank: Sequence[Moments | tuple]) -> Moments:
    """The statistics of every sample behind ``shared`` and every rank's additions since; not a collective.

    Each rank's sum and sum of squares of its new samples, taken about the shared mean to keep the subtraction well
    conditioned, are recovered from its statistics and added up.

    Args:
        shared: (mean (*shape), var (*shape), count) that every rank started from.
        per_rank: per_rank[r] is rank r's statistics now, the same shape; rank r added count_r - count_shared
            samples.

    Returns:
        Moments(mean (*shape), var (*shape), count), float64; with one rank, its own statistics unchanged (as
        float64).
    """
    if len(per_rank) == 1:  # its statistics are the result; the arithmetic below would round them
        mean, var, count = per_rank[0]
        return Moments(np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64), float(count))
    mean0, var0 = np.asarray(shared[0], dtype=np.float64), np.asarray(shared[1], dtype=np.float64)
    count0 = float(shared[2])
    total_count = count0
    deviation_sum = np.zeros_like(mean0)  # sum over all samples of (x - mean0); the shared ones contribute 0
    square_sum = count0 * var0  # sum over all samples of (x - mean0)^2
    for mean, var, count in per_rank:
        shift = np.asarray(mean, dtype=np.float64) - mean0
        total_count += float(count) - count0
        deviation_sum = deviation_sum + float(count) * shift
        square_sum = square_sum + float(count) * (np.asarray(var, dtype=np.float64) + shift * shift) - count0 * var0
    if total_count <= 0:
        return Moments(mean0, var0, count0)
    mean_shift = deviation_sum / total_count
    return Moments(mean0 + mean_shift, np.maximum(square_sum / total_count - mean_shift * mean_shift, 0.0),
                   total_count)


# What one rank tells rank 0: its statistics' (moments, dtype of mean) in order, or why they cannot be read as
# (exception name, message).
_Report = list[tuple[Moments, str]] | tuple[str, str]
_ERRORS = {"TypeError": TypeError, "ValueError": ValueError}


class SharedRunningStats:
    """Running statistics that every rank of ``comm`` holds the same after each ``merge``.

    The objects are kept; their attributes are read at every call. Building it is a collective: every rank takes rank
    0's statistics (bit for bit), which become the shared starting point. Build it before the envs' first reset,
    whose observations already update an observation normalizer (after it, the other ranks' reset observations are
    replaced by rank 0's).

    Args:
        stats: one object with ``.mean``, ``.var`` (*shape) and ``.count`` (gymnasium's or SB3's RunningMeanStd) or
            a list of them, the same shapes and dtypes in the same order on every rank.
        comm: the communicator; None for COMM_WORLD.

    Raises:
        TypeError: on every rank, when a rank's statistics cannot be read (naming the rank).
        ValueError: on every rank, when the ranks' statistics differ in number, shape or dtype (naming the rank).
    """

    def __init__(self, stats: Any | Sequence[Any], comm: MPI.Comm | None = None) -> None:
        self.comm = COMM_WORLD if comm is None else comm
        self.stats: list[Any] = list(stats) if isinstance(stats, (list, tuple)) else [stats]
        self.shared: list[Moments] = []  # what every rank held after the last collective, float64
        self._exchange("SharedRunningStats", merging=False)

    def merge(self) -> None:
        """Every rank's statistics become those of all samples: the shared ones and every rank's additions since the
        last merge (or since this object was built), computed on rank 0 and the same on every rank, bit for bit.

        Collective: one gather and one broadcast of the statistics, pickled. A rank whose statistics cannot be read,
        differ in number, shape or dtype from rank 0's, or count fewer samples than the shared ones (reset or replaced
        since) raises TypeError or ValueError on every rank, naming it; nothing is changed then.

        Raises:
            TypeError: on every rank, when a rank's statistics cannot be read.
            ValueError: on every rank, when a rank's statistics differ in number, shape or dtype from rank 0's, or
                count fewer samples than the shared ones.
        """
        self._exchange("SharedRunningStats.merge", merging=True)

    def _report(self) -> _Report:
        report = []
        for i, stat in enumerate(self.stats):
            try:
                report.append((read_moments(stat), np.asarray(stat.mean).dtype.str))
            except (TypeError, ValueError) as error:
                return type(error).__name__, f"statistic {i}: {error}"
        return report

    def _exchange(self, what: str, merging: bool) -> None:
        reports = gather_objects(self._report(), self.comm)
        outcome: list[Moments] | tuple[str, str] | None = None
        if reports is not None:  # rank 0
            outcome = self._check(reports, merging)
            if outcome is None:
                per_rank = [[moments for moments, _ in report] for report in reports]
                if merging:
                    outcome = [merge_moments(shared, [mine[i] for mine in per_rank])
                               for i, shared in enumerate(self.shared)]
                else:
                    outcome = per_rank[0]
        outcome = bcast_object(outcome, self.comm)
        if isinstance(outcome, tuple):
            kind, message = outcome
            raise _ERRORS[kind](f"{what}: {message}")
        for stat, moments in zip(self.stats, outcome, strict=True):
            write_moments(stat, moments)
        # What was written, read back: a float32 normalizer shares its float32 values, not rank 0's float64 result.
        self.shared = [read_moments(stat) for stat in self.stats]

    def _check(self, reports: list[_Report], merging: bool) -> tuple[str, str] | None:
        """Rank 0: the first problem among every rank's reports, as (exception name, message); None when all fit."""
        for r, report in enumerate(reports):
            if isinstance(report, tuple):
                return report[0], f"rank {r}: {report[1]}"
        reference = reports[0]
        for r, report in enumerate(reports):
            if len(report) != len(reference):
                return "ValueError", (f"rank {r} passed {len(report)} statistics but rank 0 passed {len(reference)}; "
                                      "pass the same ones on every rank")
            for i, ((moments, dtype), (ref_moments, ref_dtype)) in enumerate(zip(report, reference, strict=True)):
                if moments.mean.shape != ref_moments.mean.shape or dtype != ref_dtype:
                    return "ValueError", (
                        f"rank {r} statistic {i} has mean {np.dtype(dtype)}{list(moments.mean.shape)} but rank 0 "
                        f"{np.dtype(ref_dtype)}{list(ref_moments.mean.shape)}; build the same normalizers on every "
                        "rank")
                if merging and moments.count < self.shared[i].count:
                    return "ValueError", (
                        f"rank {r} statistic {i} counts {moments.count:g} samples, fewer than the "
                        f"{self.shared[i].count:g} every rank shared at the last merge: it was reset or replaced "
                        "since; build a new SharedRunningStats after replacing statistics")
        return None
