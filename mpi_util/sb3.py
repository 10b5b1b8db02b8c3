"""Stable-Baselines3's on-policy algorithms (PPO, A2C) on N MPI processes, SB3 itself unmodified.

A user's SB3 script gains these lines (run by every rank)::

    from mpi_util.sb3 import parallelize, rank_device
    if mpi_util.mpi_fork(nprocs) == "parent": sys.exit()      # or start it with mpiexec / srun
    model = parallelize(PPO("MlpPolicy", env, seed=0, device=rank_device(), ...))   # env: this rank's VecEnv
    model.learn(total_timesteps)                              # total over all ranks
    if mpi_util.rank == 0: model.save("ppo")

What ``parallelize`` changes, per iteration of SB3's own ``learn`` loop:

- every rank fills its own rollout buffer from its own envs (rank r > 0 re-seeded with ``rank_seed(seed, r)``; rank 0
  keeps ``seed``, so one process gives exactly plain SB3's results), with SB3's own ``collect_rollouts``, advantages
  included (they are per env, so computing them where the rows were collected is exact);
- rank 0 gathers every rank's rows into one buffer of n_steps x (all ranks' envs), in rank order, and runs SB3's
  own ``train()`` on it; the other ranks skip ``train()``;
- the policy's parameters and buffers (and a VecNormalize's statistics) are broadcast from rank 0, bit for bit;
- ``num_timesteps`` counts every rank's steps, so ``learn(total_timesteps)`` means steps over all ranks; rank 0's
  logs (ep_rew_mean, fps) cover every rank's episodes; the other ranks log nothing.

GPUs: ``rank_device()`` is SB3's ``device="auto"`` with each rank on its own GPU (``mpi_util.gpu_for_rank``: local
rank modulo the GPUs it sees), "cpu" without CUDA. A model built with "auto" or "cuda" (which mean GPU 0 to torch, on
every rank) is moved to the rank's GPU by ``parallelize``; it has touched GPU 0 by then, so build it with
``device=rank_device()``. An explicit device ("cuda:1", "cpu") is left alone.

VecNormalize: each rank updates its statistics from its own observations during its rollout, starting from the
statistics all ranks share; rank 0 then merges what every rank added (counts, means and spreads, as SB3's
RunningMeanStd combines them) and broadcasts the result.

Import this module before stable_baselines3. SB3's logger imports ``torch.utils.tensorboard``, and tensorboard then
imports TensorFlow when it is installed (as it is beside train.py). TensorFlow's libraries export their copy of LLVM's
command-line registry to the whole process, so when torch later loads triton (its own LLVM; torch imports it on the
first optimizer it builds) the process aborts: ``LLVM ERROR: inconsistency in registered CommandLine options``.
Importing this module first registers tensorboard's own "no TensorFlow" marker (``tensorboard.compat.notf``), so
tensorboard uses its TensorFlow-free stub: SB3's tensorboard logs are still written, and TensorFlow stays out of the
process (no abort; a PPO process peaks at 341 MB instead of 844 MB; no TensorFlow start-up lines). Imported after
SB3 with TensorFlow already loaded, it raises ImportError saying so.

This module imports nothing from SB3 or torch until ``parallelize`` is called; ``import mpi_util`` does not import it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from .bcast import bcast_object, rank0_bcast_wts
from .gather import gather_objects, rank0_accum_batches
from .gpu import gpu_for_rank
from .process import COMM_WORLD
from .reduce import all_sum
from .seeding import rank_seed

# The rollout buffer's per-step arrays, each (n_steps, n_envs, ...); observations may be a dict of such arrays.
_BUFFER_ARRAYS = (
    "observations", "actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages",
)

Model = TypeVar("Model")

if "tensorflow" in sys.modules and "stable_baselines3" in sys.modules:
    raise ImportError(
        "mpi_util.sb3: import it before stable_baselines3: SB3's tensorboard logger has loaded TensorFlow into this "
        "process, and a torch with triton then aborts it with 'LLVM ERROR: inconsistency in registered CommandLine "
        "options'"
    )
# tensorboard.compat.tf() uses its TensorFlow-free stub when this module exists (tensorboard's documented switch,
# which its pip wheel does not ship).
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class _RankState:
    """What the parallel model keeps besides SB3's own attributes (left out of ``save``)."""

    def __init__(self, comm: MPI.Comm, local_buffer: Any, total_envs: int) -> None:
        self.comm = comm
        self.local_buffer = local_buffer  # this rank's own rollout buffer: (n_steps, this rank's n_envs, ...)
        self.total_envs = total_envs  # envs over all ranks
        self.new_episodes: list[dict[str, Any]] = []  # Monitor's episode infos since the last gather
        self.new_successes: list[Any] = []
        self.shared_stats: list[tuple[np.ndarray, np.ndarray, float]] = []  # VecNormalize stats every rank holds


def _running_stats(model: Any) -> list[Any]:
    """The VecNormalize's RunningMeanStd objects in a fixed order (observation stats, then return stats); []."""
    vec_normalize = model.get_vec_normalize_env()
    if vec_normalize is None:
        return []
    obs_rms = vec_normalize.obs_rms
    stats = [obs_rms[key] for key in sorted(obs_rms)] if isinstance(obs_rms, dict) else [obs_rms]
    return stats + [vec_normalize.ret_rms]


def _snapshot(stats: list[Any]) -> list[tuple[np.ndarray, np.ndarray, float]]:
    return [(s.mean.copy(), s.var.copy(), float(s.count)) for s in stats]


def _merge(shared: tuple[np.ndarray, np.ndarray, float], per_rank: list[tuple[np.ndarray, np.ndarray, float]]
           ) -> tuple[np.ndarray, np.ndarray, float]:
    """One RunningMeanStd's statistics after every rank's additions since ``shared``, which every rank started from.

    shared, per_rank[r]: (mean (*shape) float64, var (*shape) float64, count). Rank r added count_r - count0 samples;
    their sum and sum of squares, taken about the shared mean to keep the subtraction well conditioned, are recovered
    from rank r's statistics and added up.
    """
    mean0, var0, count0 = shared
    total_count = count0
    deviation_sum = np.zeros_like(mean0)  # sum over all samples of (x - mean0); the shared ones contribute 0
    square_sum = count0 * var0  # sum over all samples of (x - mean0)^2
    for mean, var, count in per_rank:
        shift = mean - mean0
        total_count += count - count0
        deviation_sum += count * shift
        square_sum += count * (var + shift * shift) - count0 * var0
    mean_shift = deviation_sum / total_count
    return mean0 + mean_shift, np.maximum(square_sum / total_count - mean_shift * mean_shift, 0.0), total_count


def _buffer_rows(buffer: Any) -> dict[str, np.ndarray]:
    """The buffer's arrays with the env axis first, as rank0_accum_batches concatenates: {name: (n_envs, n_steps,
    ...)}; a dict observation space gives one entry per key, "observations/KEY"."""
    rows: dict[str, np.ndarray] = {}
    for name in _BUFFER_ARRAYS:
        value = getattr(buffer, name)
        parts = {f"{name}/{key}": value[key] for key in sorted(value)} if isinstance(value, dict) else {name: value}
        rows.update({key: np.ascontiguousarray(array.swapaxes(0, 1)) for key, array in parts.items()})
    return rows


def _fill_buffer(buffer: Any, rows: dict[str, np.ndarray]) -> None:
    """Put gathered rows {name: (all envs, n_steps, ...)} into ``buffer`` (n_steps x all envs), ready for ``get``."""
    buffer.reset()
    for name in _BUFFER_ARRAYS:
        current = getattr(buffer, name)
        if isinstance(current, dict):
            for key in current:
                current[key] = np.ascontiguousarray(rows[f"{name}/{key}"].swapaxes(0, 1))
        else:
            setattr(buffer, name, np.ascontiguousarray(rows[name].swapaxes(0, 1)))
    buffer.pos = buffer.buffer_size
    buffer.full = True


def _parallel_class(sb3_class: type) -> type:
    """A subclass of ``sb3_class`` (PPO, A2C, ...): rollouts on every rank, ``train`` on rank 0, weights to all.
    It adds no instance layout, so an existing model's ``__class__`` can be switched to it."""

    class RankZeroLearns(sb3_class):  # type: ignore[valid-type, misc]
        _mpi: _RankState

        def _excluded_save_params(self) -> list[str]:
            return [*super()._excluded_save_params(), "_mpi"]

        def _update_info_buffer(self, infos: list[dict[str, Any]], dones: np.ndarray | None = None) -> None:
            super()._update_info_buffer(infos, dones)
            for index, info in enumerate(infos):
                if info.get("episode") is not None:
                    self._mpi.new_episodes.append(info["episode"])
                if info.get("is_success") is not None and (dones is None or dones[index]):
                    self._mpi.new_successes.append(info["is_success"])

        def collect_rollouts(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
            """SB3's own rollout into this rank's buffer, then every rank's rows into rank 0's ``rollout_buffer``.
            Returns False on every rank when a callback stopped the rollout on any rank."""
            state = self._mpi
            completed = super().collect_rollouts(env, callback, state.local_buffer, n_rollout_steps)
            if all_sum(0 if completed else 1, state.comm) > 0:
                return False
            self.num_timesteps += n_rollout_steps * (state.total_envs - env.num_envs)  # the other ranks' steps
            rows = rank0_accum_batches(_buffer_rows(state.local_buffer), state.comm)
            stats = _running_stats(self)
            gathered = gather_objects((state.new_episodes, state.new_successes, _snapshot(stats)), state.comm)
            state.new_episodes, state.new_successes = [], []
            if gathered is not None:  # rank 0
                _fill_buffer(self.rollout_buffer, rows)
                for episodes, successes, _ in gathered[1:]:
                    self.ep_info_buffer.extend(episodes)
                    self.ep_success_buffer.extend(successes)
                if state.comm.Get_size() > 1:  # with one rank its statistics already are the result
                    for i, stat in enumerate(stats):
                        stat.mean, stat.var, stat.count = _merge(state.shared_stats[i], [g[2][i] for g in gathered])
            return True

        def train(self) -> None:
            """Rank 0: SB3's own update on every rank's rows. Then every rank: rank 0's weights and statistics."""
            if self._mpi.comm.Get_rank() == 0:
                super().train()
            _broadcast_from_rank0(self)

    RankZeroLearns.__name__ = RankZeroLearns.__qualname__ = sb3_class.__name__
    RankZeroLearns.__module__ = sb3_class.__module__
    return RankZeroLearns


def _broadcast_from_rank0(model: Any) -> None:
    """Rank 0's policy (parameters and buffers) and VecNormalize statistics on every rank, bit for bit."""
    state: _RankState = model._mpi
    stats = _running_stats(model)
    arrays = []
    for stat in stats:
        arrays += [np.array(stat.mean, dtype=np.float64), np.array(stat.var, dtype=np.float64),
                   np.array([stat.count], dtype=np.float64)]
    rank0_bcast_wts([model.policy, *arrays], state.comm)
    for i, stat in enumerate(stats):
        stat.mean, stat.var, stat.count = arrays[3 * i], arrays[3 * i + 1], float(arrays[3 * i + 2][0])
    state.shared_stats = _snapshot(stats)


def rank_device(requested: Any = "auto", cuda_device_count: int | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """The torch device for this rank's SB3 model: "auto" or "cuda" become ``cuda:<gpu_for_rank>``, "cpu" when
    CUDA is not available; any other device ("cuda:1", "cpu", a torch.device) is returned as given, as a string.

    cuda_device_count: None asks torch (0 when ``torch.cuda.is_available()`` is False). environ: as for
    ``gpu_for_rank`` (None: this process).
    """
    if str(requested) not in ("auto", "cuda"):
        return str(requested)
    if cuda_device_count is None:
        import torch

        cuda_device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = gpu_for_rank(cuda_device_count, environ)
    return "cpu" if index is None else f"cuda:{index}"


def _move_to_rank_gpu(model: Any) -> None:
    """A model on SB3's "auto"/"cuda" device (GPU 0 on every rank) onto this rank's own GPU."""
    import torch

    device = torch.device(rank_device("cuda"))
    torch.cuda.set_device(device)  # tensors later made on "cuda" land there too
    model.policy.to(device)  # in place: the optimizer keeps its parameters
    model.device = device
    model.rollout_buffer.device = device


_PARALLEL_CLASSES: dict[type, type] = {}


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0])


def _prepare_rank(model: Any, rank: int) -> int:
    """Check ``model`` and, on ranks r > 0, re-seed it and silence its logger; returns its number of envs."""
    if not (hasattr(model, "collect_rollouts") and hasattr(model, "rollout_buffer") and hasattr(model, "n_steps")):
        raise TypeError(
            f"parallelize: expected a Stable-Baselines3 on-policy model such as PPO or A2C, got "
            f"{type(model).__name__}; off-policy algorithms (SAC, TD3, DQN) learn between steps, not in batches"
        )
    if hasattr(model, "_mpi"):
        raise ValueError("parallelize: this model is already parallel; call parallelize once per model")
    if model.env is None:
        raise ValueError("parallelize: the model has no env; pass this rank's env when building it")
    if model.device.type == "cuda" and model.device.index is None:
        _move_to_rank_gpu(model)
    if rank > 0:
        # The model's seed (or, without one, fresh entropy) re-seeds this rank's torch, numpy, action space and envs,
        # which every rank would otherwise step from the same seed.
        seed = model.seed
        model.set_random_seed(rank_seed(seed if seed is not None else _fresh_seed(), rank))
        from stable_baselines3.common.logger import Logger  # SB3 is installed: the model is one of its classes

        model.set_logger(Logger(folder=None, output_formats=[]))
        model.verbose = 0
    return int(model.rollout_buffer.n_envs)


def _agree(comm: MPI.Comm, failure: Exception | None, value: int) -> list[int]:
    """Every rank's ``value`` (rank order), once every rank has said whether its step succeeded; when one failed,
    raise on every rank: the failing rank's own exception there, a RuntimeError naming it (and its error) elsewhere.
    Collective over ``comm``: two small object collectives."""
    outcome = value if failure is None else f"{type(failure).__name__}: {failure}"
    outcomes = bcast_object(gather_objects(outcome, comm), comm)
    failed = [(r, text) for r, text in enumerate(outcomes) if isinstance(text, str)]
    if failure is not None:
        raise failure
    if failed:
        raise RuntimeError("parallelize failed on " + "; ".join(f"rank {r}: {text}" for r, text in failed)
                           + "; every rank stops here")
    return outcomes


def parallelize(model: Model, comm: MPI.Comm | None = None) -> Model:
    """Make an SB3 on-policy model (PPO, A2C, or a subclass of OnPolicyAlgorithm) learn on every rank of ``comm``.

    Call it on every rank, after building the model with this rank's VecEnv (any number of envs per rank) and
    before ``learn``. It re-seeds ranks r > 0 (their torch, numpy, action space and envs) with
    ``rank_seed(seed, r)``, or from fresh entropy when the model has no seed; broadcasts rank 0's initial policy (and
    VecNormalize statistics) to every rank; silences the logger of ranks r > 0; moves a model on "auto"/"cuda" to
    this rank's GPU (see ``rank_device``); and returns the same object, whose
    class is now a subclass of its own (``isinstance(model, PPO)`` holds; ``save`` and ``PPO.load`` work as before).
    Save from rank 0. Every rank must then call ``learn`` with the same arguments.
    """
    comm = COMM_WORLD if comm is None else comm
    # What can fail here can fail on one rank alone (a model built differently, an env missing): each rank prepares,
    # then all agree before any collective of SB3's own, so that a failure is an error on every rank instead of the
    # other ranks waiting in a collective for a rank that has left.
    try:
        n_envs = _prepare_rank(model, comm.Get_rank())
        failure = None
    except Exception as error:
        n_envs, failure = 0, error
    total_envs = sum(_agree(comm, failure, n_envs))
    local_buffer = model.rollout_buffer  # type: ignore[attr-defined]
    try:
        cls = type(model)
        if cls not in _PARALLEL_CLASSES:
            _PARALLEL_CLASSES[cls] = _parallel_class(cls)
        if comm.Get_rank() == 0:
            model.rollout_buffer = local_buffer.__class__(  # type: ignore[attr-defined]
                local_buffer.buffer_size, local_buffer.observation_space, local_buffer.action_space,
                device=local_buffer.device, gamma=local_buffer.gamma, gae_lambda=local_buffer.gae_lambda,
                n_envs=total_envs, **model.rollout_buffer_kwargs,  # type: ignore[attr-defined]
            )
        failure = None
    except Exception as error:
        failure = error
    _agree(comm, failure, 0)
    model.__class__ = _PARALLEL_CLASSES[cls]
    model._mpi = _RankState(comm, local_buffer, total_envs)  # type: ignore[attr-defined]
    _broadcast_from_rank0(model)
    return model
