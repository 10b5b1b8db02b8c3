"""Stable-Baselines3's on-policy algorithms (PPO, A2C; sb3-contrib's TRPO, MaskablePPO, RecurrentPPO) and sb3-contrib's
ARS on N MPI processes, SB3 itself unmodified.

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
  logs (ep_rew_mean, fps) cover every rank's episodes; the other ranks log nothing;
- the callbacks given to ``learn`` run on rank 0 alone (on the other ranks they are never called), where
  ``num_timesteps`` grows by every rank's envs at each step; a stop from one ends ``learn`` on every rank in the same
  iteration.

Rank 0's buffer holds each array of the ranks' buffers joined along its env axis in rank order: SB3's, MaskablePPO's
action masks, RecurrentPPO's LSTM states (n_steps, n_layers, n_envs, hidden_size). A buffer with any other array is
refused unless ``parallelize``'s ``env_axes`` names it.

GPUs: ``rank_device()`` is SB3's ``device="auto"`` with each rank on its own GPU (``mpi_util.gpu_for_rank``: local
rank modulo the GPUs it sees), "cpu" without CUDA. A model built with "auto" or "cuda" (which mean GPU 0 to torch, on
every rank) is moved to the rank's GPU by ``parallelize``; it has touched GPU 0 by then, so build it with
``device=rank_device()``. An explicit device ("cuda:1", "cpu") is left alone.

VecNormalize: each rank updates its statistics from its own observations during its rollout, starting from the
statistics all ranks share; rank 0 then merges what every rank added (counts, means and spreads, as SB3's
RunningMeanStd combines them) and broadcasts the result.

ARS (Augmented Random Search) has no rollout buffer: each update evaluates 2 * n_delta candidate policies (the weights
plus and minus n_delta random directions). ``parallelize`` gives each rank a contiguous share of the candidates (rank 0
draws them; sizes differ by at most one), rank 0 gathers every candidate's return (with the ranks' steps, episodes and
VecNormalize statistics) and takes ARS's own step, and its weights go to every rank. ARS's policies keep no observation
statistics of their own; a VecNormalize's are merged as above. See ``_ars_parallel_class``.

Import this module before stable_baselines3. SB3's logger imports ``torch.utils.tensorboard``, and tensorboard then
imports TensorFlow when it is installed (as it is beside train.py). TensorFlow's libraries export their copy of LLVM's
command-line registry to the whole process, so when torch later loads triton (its own LLVM; torch imports it on the
first optimizer it builds) the process aborts: ``LLVM ERROR: inconsistency in registered CommandLine options``.
Importing this module first registers tensorboard's own "no TensorFlow" marker (``tensorboard.compat.notf``), so
tensorboard uses its TensorFlow-free stub: SB3's tensorboard logs are still written, and TensorFlow stays out of the
process (no abort, less memory, no TensorFlow start-up lines). Imported after
SB3 with TensorFlow already loaded, it raises ImportError saying so.

This module imports nothing from SB3 or torch until ``parallelize`` is called; ``import mpi_util`` does not import it.
"""

from __future__ import annotations

import copy
import sys
import time
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
from .running_stats import Moments, merge_moments, read_moments, write_moments
from .seeding import rank_seed
from .text import few

# The per-step arrays of SB3's and sb3-contrib's on-policy rollout buffers, each with the axis that indexes envs:
# (n_steps, n_envs, ...) except the recurrent buffer's LSTM states, (n_steps, n_layers, n_envs, hidden_size).
# Observations may be a dict of such arrays.
_ENV_AXES: dict[str, int] = {
    **dict.fromkeys(("observations", "actions", "rewards", "returns", "episode_starts", "values", "log_probs",
                     "advantages"), 1),
    "action_masks": 1,  # sb3-contrib's MaskableRolloutBuffer: (n_steps, n_envs, mask_dims)
    **dict.fromkeys(("hidden_states_pi", "cell_states_pi", "hidden_states_vf", "cell_states_vf"), 2),  # RecurrentPPO
}

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


# The parts of a parallel ARS update, in order: rank 0's candidates to every rank; this rank's evaluation of its share;
# the gather of every rank's returns to rank 0 (waiting for the slowest rank included) and merging them there; ARS's own
# step (drawing the directions, the best n_top, the step; a zero step on ranks r > 0); rank 0's weights, count and
# statistics to every rank.
_ARS_PHASES = ("candidates", "evaluate", "gather", "update", "broadcast")


class _SharedState:
    """What every parallel model keeps besides SB3's own attributes (left out of ``save``)."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.shared_stats: list[Moments] = []  # VecNormalize stats every rank holds


class _RankState(_SharedState):
    """What a parallel on-policy model keeps."""

    def __init__(self, comm: MPI.Comm, local_buffer: Any, total_envs: int, env_axes: dict[str, int]) -> None:
        super().__init__(comm)
        self.local_buffer = local_buffer  # this rank's own rollout buffer: (n_steps, this rank's n_envs, ...)
        self.total_envs = total_envs  # envs over all ranks
        self.env_axes = env_axes  # the buffer's arrays and the axis of each that indexes envs
        self.new_episodes: list[dict[str, Any]] = []  # Monitor's episode infos since the last gather
        self.new_successes: list[Any] = []


class _ArsState(_SharedState):
    """What a parallel ARS model keeps: besides the communicator, this rank's seconds in each part of its updates
    (_ARS_PHASES), summed over updates: where an update's time goes (benchmarks/ars_mpi.py reports rank 0's)."""

    def __init__(self, comm: MPI.Comm) -> None:
        super().__init__(comm)
        self.seconds = dict.fromkeys(_ARS_PHASES, 0.0)


def _running_stats(model: Any) -> list[Any]:
    """The VecNormalize's RunningMeanStd objects in a fixed order (observation stats, then return stats); []."""
    vec_normalize = model.get_vec_normalize_env()
    if vec_normalize is None:
        return []
    obs_rms = vec_normalize.obs_rms
    stats = [obs_rms[key] for key in sorted(obs_rms)] if isinstance(obs_rms, dict) else [obs_rms]
    return stats + [vec_normalize.ret_rms]


def _is_array_entry(value: Any) -> bool:
    """Whether a buffer attribute holds per-step data: an array, or a dict of arrays (a dict observation space)."""
    return isinstance(value, np.ndarray) or (
        isinstance(value, dict) and bool(value) and all(isinstance(v, np.ndarray) for v in value.values()))


def _buffer_env_axes(buffer: Any, extra: Mapping[str, int]) -> dict[str, int]:
    """{name: env axis} of every array ``buffer`` holds. Raises ValueError naming the arrays neither the known buffers
    nor ``extra`` account for: a buffer gathered without them would train on rank 0's rows of those arrays alone."""
    known = {**_ENV_AXES, **extra}
    held = [name for name, value in vars(buffer).items() if _is_array_entry(value)]
    unknown = [name for name in held if name not in known]
    if unknown:
        raise ValueError(
            f"parallelize: the rollout buffer {type(buffer).__name__} holds arrays mpi_util.sb3 does not know how to "
            f"gather: {', '.join(unknown)}; name the axis that indexes envs of each, for example "
            f"parallelize(model, env_axes={{{unknown[0]!r}: 1}})"
        )
    return {name: known[name] for name in held}


def _buffer_rows(buffer: Any, env_axes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The buffer's arrays with the env axis first, as rank0_accum_batches concatenates: {name: (n_envs, n_steps,
    ...)}; a dict observation space gives one entry per key, "observations/KEY"."""
    rows: dict[str, np.ndarray] = {}
    for name, axis in env_axes.items():
        value = getattr(buffer, name)
        parts = {f"{name}/{key}": value[key] for key in sorted(value)} if isinstance(value, dict) else {name: value}
        rows.update({key: np.ascontiguousarray(np.moveaxis(array, axis, 0)) for key, array in parts.items()})
    return rows


def _fill_buffer(buffer: Any, rows: dict[str, np.ndarray], env_axes: Mapping[str, int]) -> None:
    """Put gathered rows {name: (all envs, n_steps, ...)} into ``buffer`` (n_steps x all envs), ready for ``get``."""
    buffer.reset()
    for name, axis in env_axes.items():
        current = getattr(buffer, name)
        if isinstance(current, dict):
            for key in current:
                current[key] = np.ascontiguousarray(np.moveaxis(rows[f"{name}/{key}"], 0, axis))
        else:
            setattr(buffer, name, np.ascontiguousarray(np.moveaxis(rows[name], 0, axis)))
    buffer.pos = buffer.buffer_size
    buffer.full = True


def _resized_buffer(buffer: Any, n_steps: int, n_envs: int) -> Any:
    """An empty buffer like ``buffer`` for ``n_steps`` steps of ``n_envs`` envs: a copy (whatever its constructor
    takes) with buffer_size, n_envs and a recurrent buffer's LSTM state shape (n_steps, n_layers, n_envs, hidden_size)
    set to them. Rank 0's buffer holds every rank's envs; split_n_steps gives each rank fewer steps."""
    resized = copy.copy(buffer)
    resized.buffer_size, resized.n_envs = n_steps, n_envs
    if hasattr(resized, "hidden_state_shape"):
        _, n_layers, _, hidden_size = resized.hidden_state_shape
        resized.hidden_state_shape = (n_steps, n_layers, n_envs, hidden_size)
    resized.reset()  # new arrays of the new size, none shared with ``buffer``
    return resized


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

        def _init_callback(self, callback: Any, progress_bar: bool = False) -> Any:
            """The user's callbacks (and progress bar) on rank 0 only, inside one that, on every rank, adds the
            other ranks' steps to ``num_timesteps`` at each step before they see it."""
            on_rank0 = self._mpi.comm.Get_rank() == 0
            children = [super()._init_callback(callback if on_rank0 else None)]  # None: SB3's no-op callback
            if progress_bar and on_rank0:
                children.append(super()._init_callback(_sb3_callbacks().progress_bar()))
            counting = _sb3_callbacks().global_steps(children, self._mpi.total_envs - self.n_envs)
            counting.init_callback(self)
            return counting

        def collect_rollouts(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int, *args: Any,
                             **kwargs: Any) -> bool:
            """SB3's own rollout into this rank's buffer, then every rank's rows into rank 0's ``rollout_buffer``.
            Returns False on every rank when a callback stopped the rollout on any rank; every rank's num_timesteps
            is then rank 0's. ``args``, ``kwargs``: what the algorithm adds (MaskablePPO's use_masking)."""
            state = self._mpi
            completed = super().collect_rollouts(env, callback, state.local_buffer, n_rollout_steps, *args, **kwargs)
            if all_sum(0 if completed else 1, state.comm) > 0:
                self.num_timesteps = bcast_object(self.num_timesteps, state.comm)
                return False
            rows = rank0_accum_batches(_buffer_rows(state.local_buffer, state.env_axes), state.comm)
            stats = _running_stats(self)
            moments = [read_moments(stat) for stat in stats]
            gathered = gather_objects((state.new_episodes, state.new_successes, moments), state.comm)
            state.new_episodes, state.new_successes = [], []
            if gathered is not None:  # rank 0
                _fill_buffer(self.rollout_buffer, rows, state.env_axes)
                for episodes, successes, _ in gathered[1:]:
                    self.ep_info_buffer.extend(episodes)
                    self.ep_success_buffer.extend(successes)
                for i, stat in enumerate(stats):
                    write_moments(stat, merge_moments(state.shared_stats[i], [g[2][i] for g in gathered]))
            return True

        def train(self) -> None:
            """Rank 0: SB3's own update on every rank's rows. Then every rank: rank 0's weights and statistics."""
            if self._mpi.comm.Get_rank() == 0:
                super().train()
            _broadcast_from_rank0(self)

    RankZeroLearns.__name__ = RankZeroLearns.__qualname__ = sb3_class.__name__
    RankZeroLearns.__module__ = sb3_class.__module__
    return RankZeroLearns


class _Clock:
    """Adds the seconds since the previous lap (or since it was made) to one entry of ``seconds``."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] += now - self.last
        self.last = now


def _evaluation_seconds(seconds: Mapping[str, float]) -> float:
    return seconds["candidates"] + seconds["evaluate"] + seconds["gather"]


def _broadcast_ars(model: Any) -> None:
    """Rank 0's ARS policy, its flat weights ``model.weights`` (n_params,), ``num_timesteps`` and VecNormalize
    statistics on every rank, bit for bit."""
    count = np.array([model.num_timesteps], dtype=np.int64)
    _broadcast_from_rank0(model, [model.weights, count])
    model.num_timesteps = int(count[0])


def _candidate_share(pop_size: int, size: int, rank: int) -> slice:
    """The candidates ``rank`` of ``size`` evaluates: a contiguous run of indices into the pop_size candidates; the
    runs follow each other in rank order and their lengths differ by at most one."""
    return slice(pop_size * rank // size, pop_size * (rank + 1) // size)


def _merge_ars_evaluations(model: Any, gathered: list[Any], steps_before: int) -> np.ndarray:
    """Rank 0: every rank's evaluation of its share, (returns, steps, episodes, statistics) in rank order, folded into
    ``model``: ``num_timesteps`` counts every rank's steps, ``ep_info_buffer`` holds every rank's episodes and the
    VecNormalize statistics every rank's additions. Returns every candidate's return, (pop_size,) in candidate
    order."""
    model.num_timesteps = steps_before + sum(steps for _, steps, _, _ in gathered)
    model.ep_info_buffer = [episode for _, _, episodes, _ in gathered for episode in episodes]
    for i, stat in enumerate(_running_stats(model)):
        write_moments(stat, merge_moments(model._mpi.shared_stats[i], [g[3][i] for g in gathered]))
    return np.concatenate([g[0] for g in gathered])


def _resync_async_eval(model: Any, async_eval: Any) -> None:
    """After an ARS update's broadcast: ``async_eval``'s workers (if any) take the merged VecNormalize statistics."""
    vec_normalize = model._vec_normalize_env
    if async_eval is not None and vec_normalize is not None:
        # ARS synced its workers to this rank's statistics before the merge; they start the next update from the
        # merged ones, which ARS's bookkeeping (old_count) must then count from.
        async_eval.sync_obs_rms(vec_normalize.obs_rms.copy())
        model.old_count = vec_normalize.obs_rms.count


def _ars_parallel_class(ars_class: type) -> type:
    """A subclass of ``ars_class`` (sb3-contrib's ARS or a subclass) whose updates spread the candidates over ranks.

    ARS's own ``learn`` and ``_do_one_update`` run on every rank, unchanged; what they call is overridden:

    - ``evaluate_candidates``, because it is the one place that sees every candidate and returns their returns: every
      rank takes rank 0's candidates (rank 0 drew the directions; the other ranks' torch RNGs were re-seeded with their
      envs and draw others), evaluates its share with ARS's own ``evaluate_candidates`` (its loop, or this rank's
      AsyncEval workers) and sends the returns, its steps, its episodes and its VecNormalize statistics to rank 0. Rank
      0 returns every candidate's return in candidate order, so ``_do_one_update`` takes ARS's own step on them (top
      n_top directions, the returns' std, the learning rate); the other ranks return zeros, so their step is zero.
    - ``_do_one_update``, to follow ARS's step with rank 0's weights, ``num_timesteps`` (every rank's steps) and
      VecNormalize statistics on every rank, and to time each part (``_mpi.seconds``).
    - ``_init_callback``: the callbacks given to ``learn`` run on rank 0 alone.

    It adds no instance layout, so an existing model's ``__class__`` can be switched to it.
    """

    class RankSharesCandidates(ars_class):  # type: ignore[valid-type, misc]
        _mpi: _ArsState

        def _excluded_save_params(self) -> list[str]:
            return [*super()._excluded_save_params(), "_mpi"]

        def _init_callback(self, callback: Any, progress_bar: bool = False) -> Any:
            """Rank 0: the user's callbacks and progress bar (counting every rank's steps); other ranks: SB3's no-op.
            Rank 0's callbacks step with its own evaluations: ``num_timesteps`` is every rank's steps before the
            update plus rank 0's since, and every rank's once the update's returns are gathered."""
            if self._mpi.comm.Get_rank() != 0:
                return super()._init_callback(None)
            callbacks = callback if isinstance(callback, list) else [] if callback is None else [callback]
            if progress_bar:
                callbacks = [*callbacks, _sb3_callbacks().progress_bar()]
            return super()._init_callback(callbacks)

        def evaluate_candidates(self, candidate_weights: Any, callback: Any, async_eval: Any) -> Any:
            """candidate_weights: (pop_size, n_params) torch tensor, rank 0's used. Returns (pop_size,): on rank 0
            each candidate's return, on the other ranks zeros. Collective over the model's communicator."""
            import torch

            state = self._mpi
            comm, clock = state.comm, _Clock(state.seconds)
            candidates = np.ascontiguousarray(candidate_weights.detach().cpu().numpy())
            rank0_bcast_wts(candidates, comm)
            clock.lap("candidates")
            share = _candidate_share(self.pop_size, comm.Get_size(), comm.Get_rank())
            pop_size, steps_before = self.pop_size, self.num_timesteps
            self.pop_size = share.stop - share.start  # ARS's loop (or AsyncEval's jobs) covers pop_size candidates
            try:
                returns = super().evaluate_candidates(torch.as_tensor(candidates[share], device=self.device),
                                                      callback, async_eval)
            finally:
                self.pop_size = pop_size
            clock.lap("evaluate")
            stats = _running_stats(self)
            mine = (returns.cpu().numpy(), self.num_timesteps - steps_before, list(self.ep_info_buffer),
                    [read_moments(stat) for stat in stats])
            gathered = gather_objects(mine, comm)
            if gathered is None:  # ranks r > 0: a zero step, replaced by rank 0's weights after it
                clock.lap("gather")
                return torch.zeros(pop_size, dtype=returns.dtype, device=self.device)
            all_returns = torch.as_tensor(_merge_ars_evaluations(self, gathered, steps_before), device=self.device)
            clock.lap("gather")
            return all_returns

        def _do_one_update(self, callback: Any, async_eval: Any) -> None:
            """ARS's own update (its evaluation through ``evaluate_candidates`` above), then rank 0's result on every
            rank. Collective over the model's communicator."""
            seconds = self._mpi.seconds
            clock, evaluation_before = _Clock(seconds), _evaluation_seconds(seconds)
            super()._do_one_update(callback, async_eval)
            clock.lap("update")
            seconds["update"] -= _evaluation_seconds(seconds) - evaluation_before  # counted by evaluate_candidates
            _broadcast_ars(self)
            _resync_async_eval(self, async_eval)
            clock.lap("broadcast")

    RankSharesCandidates.__name__ = RankSharesCandidates.__qualname__ = ars_class.__name__
    RankSharesCandidates.__module__ = ars_class.__module__
    return RankSharesCandidates


class _Callbacks:
    """The two SB3 callback classes the parallel model uses (made on first use: they subclass SB3's)."""

    def __init__(self) -> None:
        from stable_baselines3.common.callbacks import BaseCallback, ProgressBarCallback

        class GlobalSteps(BaseCallback):
            """Every rank: adds ``other_envs`` (the other ranks' envs) to the model's num_timesteps at each step,
            then calls ``children`` (on rank 0 the user's callbacks, on the others SB3's no-op), which are
            initialised already. The ranks step in lockstep (n_steps per iteration each), so the count is every
            rank's steps at this step, exactly at the end of each rollout."""

            def __init__(self, children: list[BaseCallback], other_envs: int) -> None:
                super().__init__()
                self.children = children
                self.other_envs = other_envs

            def _on_training_start(self) -> None:
                for child in self.children:
                    child.on_training_start(self.locals, self.globals)

            def _on_rollout_start(self) -> None:
                for child in self.children:
                    child.on_rollout_start()

            def _on_step(self) -> bool:
                self.model.num_timesteps += self.other_envs
                return all([child.on_step() for child in self.children])  # a list: every child steps

            def _on_rollout_end(self) -> None:
                for child in self.children:
                    child.on_rollout_end()

            def _on_training_end(self) -> None:
                for child in self.children:
                    child.on_training_end()

            def update_child_locals(self, locals_: dict[str, Any]) -> None:
                for child in self.children:
                    child.update_locals(locals_)

        class GlobalProgressBar(ProgressBarCallback):
            """SB3's progress bar advanced by num_timesteps (every rank's steps), not by rank 0's envs."""

            def _on_training_start(self) -> None:
                super()._on_training_start()
                self.counted = self.model.num_timesteps

            def _on_step(self) -> bool:
                self.pbar.update(self.model.num_timesteps - self.counted)
                self.counted = self.model.num_timesteps
                return True

        self.global_steps = GlobalSteps
        self.progress_bar = GlobalProgressBar


_CALLBACKS: list[_Callbacks] = []


def _sb3_callbacks() -> _Callbacks:
    if not _CALLBACKS:
        _CALLBACKS.append(_Callbacks())
    return _CALLBACKS[0]


def _broadcast_from_rank0(model: Any, extra: list[Any] | None = None) -> None:
    """Rank 0's policy (parameters and buffers), VecNormalize statistics and ``extra`` (numpy arrays or torch tensors,
    written in place) on every rank, bit for bit."""
    state: _SharedState = model._mpi
    stats = _running_stats(model)
    arrays = []
    for stat in stats:
        arrays += [np.array(stat.mean, dtype=np.float64), np.array(stat.var, dtype=np.float64),
                   np.array([stat.count], dtype=np.float64)]
    rank0_bcast_wts([model.policy, *(extra or []), *arrays], state.comm)
    for i, stat in enumerate(stats):
        stat.mean, stat.var, stat.count = arrays[3 * i], arrays[3 * i + 1], float(arrays[3 * i + 2][0])
    state.shared_stats = [read_moments(stat) for stat in stats]


def rank_device(requested: Any = "auto", cuda_device_count: int | None = None,
                environ: Mapping[str, str] | None = None) -> str:
    """The torch device for this rank's SB3 model, to pass as ``device=`` when building it. Not a collective.

    Args:
        requested: the device asked for: "auto" or "cuda" become this rank's GPU (``gpu_for_rank``); any other
            device ("cuda:1", "cpu", a torch.device) is returned as given.
        cuda_device_count: the GPUs CUDA sees; None asks torch (0 when ``torch.cuda.is_available()`` is False).
        environ: as for ``gpu_for_rank`` (None: this process).

    Returns:
        The device as a string: ``cuda:INDEX`` with INDEX this rank's GPU, "cpu" when CUDA is not available, or
        ``requested`` as given.
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
    if hasattr(model, "rollout_buffer"):
        model.rollout_buffer.device = device
    if isinstance(getattr(model, "weights", None), torch.Tensor):  # ARS's flat copy of the policy's weights
        model.weights = model.weights.to(device)
    lstm_states = getattr(model, "_last_lstm_states", None)  # RecurrentPPO's LSTM states between rollouts
    if lstm_states is not None:
        model._last_lstm_states = type(lstm_states)(*(tuple(t.to(device) for t in pair) for pair in lstm_states))


_PARALLEL_CLASSES: dict[type, type] = {}


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().generate_state(1)[0])


def _is_ars(model: Any) -> bool:
    """Whether ``model`` is sb3-contrib's ARS (or a subclass); sb3-contrib is imported wherever one exists."""
    ars = sys.modules.get("sb3_contrib.ars.ars")
    return ars is not None and isinstance(model, ars.ARS)


def _refusal(model: Any) -> str:
    """Why ``parallelize`` does not take ``model``, naming what it is."""
    name = type(model).__name__
    off_policy = sys.modules.get("stable_baselines3.common.off_policy_algorithm")
    if off_policy is not None and isinstance(model, off_policy.OffPolicyAlgorithm):  # SAC, TD3, DQN, QR-DQN, TQC, ...
        return (f"parallelize: {name} is an off-policy algorithm: it learns between steps from a replay buffer, not "
                "from batches of rollouts; parallelize takes on-policy algorithms (PPO, A2C, TRPO, MaskablePPO, "
                "RecurrentPPO) and ARS")
    return (f"parallelize: {name} is not an on-policy or ARS algorithm; parallelize takes Stable-Baselines3's and "
            "sb3-contrib's on-policy algorithms (PPO, A2C, TRPO, MaskablePPO, RecurrentPPO, other subclasses of "
            "OnPolicyAlgorithm) and ARS")


def _split_n_steps(model: Any, nranks: int) -> None:
    """Give ``model`` n_steps / nranks steps per env and rollout, and a rollout buffer of that size, so that the
    ranks together gather the batch it was built for; ValueError when n_steps does not split evenly."""
    if model.n_steps % nranks:
        raise ValueError(f"parallelize: split_n_steps: n_steps {model.n_steps} does not split evenly over {nranks} "
                         f"ranks; build the model with an n_steps that is a multiple of {nranks}, or leave "
                         "split_n_steps off")
    model.n_steps //= nranks
    model.rollout_buffer = _resized_buffer(model.rollout_buffer, model.n_steps, model.rollout_buffer.n_envs)


def _prepare_rank(model: Any, rank: int, env_axes: Mapping[str, int], split_over: int) -> tuple[int, dict[str, int]]:
    """Check ``model``; with ``split_over`` ranks (0: no split) divide its n_steps among them; on ranks r > 0,
    re-seed it and silence its logger. Returns its number of envs and its buffer's arrays with their env axes (see
    ``_buffer_env_axes``; none for ARS). A check that fails leaves the model as it was."""
    ars = _is_ars(model)
    on_policy = hasattr(model, "collect_rollouts") and hasattr(model, "rollout_buffer") and hasattr(model, "n_steps")
    if not (ars or on_policy):
        raise TypeError(_refusal(model))
    if hasattr(model, "_mpi"):
        raise ValueError("parallelize: this model is already parallel; call parallelize once per model")
    if model.env is None:
        raise ValueError("parallelize: the model has no env; pass this rank's env when building it")
    if ars and (env_axes or split_over):
        raise ValueError("parallelize: env_axes and split_n_steps concern a rollout buffer, and ARS has none; leave "
                         "them out")
    axes = {} if ars else _buffer_env_axes(model.rollout_buffer, env_axes)
    if split_over:
        _split_n_steps(model, split_over)
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
    return int(model.env.num_envs if ars else model.rollout_buffer.n_envs), axes


def _batch_line(name: str, n_steps: int, n_steps_built: int, total_envs: int, rank0_envs: int, nranks: int) -> str:
    """What each update of a parallel model learns from, in one line (rank 0's envs stand for one rank's)."""
    line = (f"mpi_util.sb3: {name} on {nranks} ranks learns from {n_steps} steps x {total_envs} envs = "
            f"{n_steps * total_envs:,} steps per update")
    if n_steps != n_steps_built:
        return line + f" (n_steps {n_steps_built} split over the ranks: the batch the model was built for)"
    if nranks > 1:
        return line + (f", {total_envs / rank0_envs:g}x one process's {n_steps * rank0_envs:,}; "
                       "parallelize(model, split_n_steps=True) keeps the model's batch instead")
    return line


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
        raise RuntimeError("parallelize failed on " + few((f"rank {r}: {text}" for r, text in failed), "and", "; ")
                           + "; every rank stops here")
    return outcomes


def parallelize(model: Model, comm: MPI.Comm | None = None, env_axes: Mapping[str, int] | None = None,
                split_n_steps: bool = False) -> Model:
    """Make an SB3 on-policy model learn on every rank of ``comm``: PPO, A2C, sb3-contrib's TRPO, MaskablePPO and
    RecurrentPPO, or another subclass of OnPolicyAlgorithm whose rollout buffer holds arrays it knows; or
    sb3-contrib's ARS, whose candidates each update the ranks share (see ``_ars_parallel_class``).

    Call it on every rank, after building the model with this rank's VecEnv (any number of envs per rank) and
    before ``learn``. It re-seeds ranks r > 0 (their torch, numpy, action space and envs) with
    ``rank_seed(seed, r)``, or from fresh entropy when the model has no seed; broadcasts rank 0's initial policy (and
    VecNormalize statistics) to every rank; silences the logger of ranks r > 0; moves a model on "auto"/"cuda" to
    this rank's GPU (see ``rank_device``); and returns the same object, whose
    class is now a subclass of its own (``isinstance(model, PPO)`` holds; ``save`` and ``PPO.load`` work as before).
    Save from rank 0. Every rank must then call ``learn`` with the same arguments; the callbacks given to ``learn``
    run on rank 0 only and see every rank's steps in ``num_timesteps``. Off-policy models (SAC, TD3, DQN, ...) and
    anything else are refused with a TypeError that says what they are.

    Rank 0 learns from every rank's rows: by default each update's batch is n_steps x (all ranks' envs), N times a
    one-process run's with N ranks of the same envs, and so are PPO's minibatch steps per epoch. ``split_n_steps``
    keeps the batch the model was built with (a tuned config's): each rank rolls out n_steps / N steps per env.
    Rank 0 says in one line which batch each update learns from.

    Args:
        model: an SB3 or sb3-contrib model built with this rank's VecEnv, not yet parallel.
        comm: the communicator; None for COMM_WORLD.
        env_axes: arrays of a custom rollout buffer besides those of SB3's and sb3-contrib's, {attribute name: the
            axis that indexes envs}, for example {"costs": 1} for costs of shape (n_steps, n_envs).
        split_n_steps: divide the model's n_steps by the number of ranks (which must divide it), so that the ranks
            together gather the batch the model was built for.

    Returns:
        ``model`` itself, its class now the parallel subclass of its own.

    Raises:
        TypeError: ``model`` is off-policy or otherwise neither on-policy nor ARS (saying what it is).
        ValueError: the model is already parallel, has no env, is ARS with ``env_axes`` or ``split_n_steps``, has
            an n_steps the ranks do not divide (with ``split_n_steps``), or has a rollout buffer holding an array
            that is neither SB3's, sb3-contrib's nor in ``env_axes`` (on every rank).
        RuntimeError: on the other ranks, naming the rank and its error, when preparing the model failed on one.
    """
    comm = COMM_WORLD if comm is None else comm
    # What can fail here can fail on one rank alone (a model built differently, an env missing): each rank prepares,
    # then all agree before any collective of SB3's own, so that a failure is an error on every rank instead of the
    # other ranks waiting in a collective for a rank that has left.
    try:
        n_steps_built = getattr(model, "n_steps", 0)
        n_envs, axes = _prepare_rank(model, comm.Get_rank(), env_axes or {}, comm.Get_size() if split_n_steps else 0)
        failure = None
    except Exception as error:
        n_envs, axes, failure = 0, {}, error
    total_envs = sum(_agree(comm, failure, n_envs))
    ars = _is_ars(model)
    if comm.Get_rank() == 0 and not ars:
        print(_batch_line(type(model).__name__, model.n_steps, n_steps_built, total_envs, n_envs, comm.Get_size()),
              flush=True)
    local_buffer = None if ars else model.rollout_buffer  # type: ignore[attr-defined]
    try:
        cls = type(model)
        if cls not in _PARALLEL_CLASSES:
            _PARALLEL_CLASSES[cls] = _ars_parallel_class(cls) if ars else _parallel_class(cls)
        if comm.Get_rank() == 0 and not ars:
            model.rollout_buffer = _resized_buffer(  # type: ignore[attr-defined]
                local_buffer, local_buffer.buffer_size, total_envs)
        failure = None
    except Exception as error:
        failure = error
    # A second round: making the class and rank 0's larger buffer can fail after the first round agreed (memory, a
    # buffer class SB3 cannot rebuild), and the other ranks must not go on to the broadcasts without rank 0.
    _agree(comm, failure, 0)
    # The class is swapped, not wrapped: the user's object stays the one they hold, isinstance(model, PPO), save and
    # PPO.load keep working, and the subclass adds methods only (no __init__, no instance layout), so the swap leaves
    # every attribute as SB3 set it.
    model.__class__ = _PARALLEL_CLASSES[cls]
    if ars:
        model._mpi = _ArsState(comm)  # type: ignore[attr-defined]
        _broadcast_ars(model)
    else:
        model._mpi = _RankState(comm, local_buffer, total_envs, axes)  # type: ignore[attr-defined]
        _broadcast_from_rank0(model)
    return model
