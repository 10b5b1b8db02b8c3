"""Rank 0's side of training: the TensorFlow actor-critic, the algorithm that updates it, and the run's logs."""

from __future__ import annotations

import atexit
import gc
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

import mpi_util
from algos.numpy_actor import NumpyActor
from algos.registry import ALGORITHMS, Algorithm, shares_torso
from algos.spaces import ActionSpec, ObsSpec, network_kind
from trainer.checkpoint import remove_temporary_files, write_atomic
from trainer.config import TrainConfig
from trainer.counters import Counters
from trainer.evaluate import BEST_POLICY, write_policy_file
from trainer.kernels import rank0_tensorflow_kernels
from trainer.resume import as_numpy, kept_checkpoint_note, processes
from trainer.run_dir import RunDirLock, lock_run_dir
from trainer.versions import stack_versions, version_changes

# Modules TensorFlow and Keras import, where installed, for features rank 0 never uses: JAX (for TFLite), pandas
# (Keras's DataFrame inputs), OpenCV (Keras's drawing of bounding boxes). Hidden during TensorFlow's import only (an
# env that imports one later still can): the import takes about 0.45 CPU-s and 45 MB less than with JAX alone hidden,
# which saved 0.5 s and 110 MB itself (benchmarks/README.md, "Start-up and memory per rank").
UNUSED_BY_RANK0 = ("jax", "pandas", "cv2")


def import_tensorflow(gpu_pct: float) -> None:
    """Rank 0's import of TensorFlow, through mpi_util.setup_gpu (its GPU and memory cap, no start-up lines), with
    UNUSED_BY_RANK0 hidden and Python's garbage collector paused; then every object the process holds is frozen
    (gc.freeze). The import builds about 510,000 objects, none of them garbage; unfrozen, each full collection walks
    them all again, and tracing the update's graphs runs many. Walker2d's first iteration came in 0.68-0.88x the time
    and its job used a median 0.90x the CPU time (benchmarks/README.md, "Start-up and memory per rank"). Everything is
    unfrozen at exit for the interpreter's last collection: frozen, Atari's emulators, made before the import, were
    never freed and nanobind printed leak reports."""
    hidden = [name for name in UNUSED_BY_RANK0 if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))  # None: "import NAME" raises ImportError, which they expect
    collecting = gc.isenabled()
    gc.disable()
    try:
        mpi_util.setup_gpu(gpu_pct)
    finally:
        for name in hidden:
            del sys.modules[name]
        if collecting:
            gc.enable()
    gc.freeze()
    atexit.register(gc.unfreeze)


class Learner:
    """Rank 0's side: the TensorFlow actor-critic, the algorithm that updates it (--algo, built as algos.registry's
    ALGORITHMS says), and the run directory's logs."""

    def __init__(self, config: TrainConfig, run_dir: Path, obs: ObsSpec, action: ActionSpec, resuming: bool,
                 ranks_on_host: int) -> None:
        # Threads and kernels by kind of network (trainer.kernels); oneDNN's switch is read when TensorFlow loads.
        # ranks_on_host: the job's processes on this host, this one included.
        self.cpus = mpi_util.cpus_available()
        self.threads = rank0_tensorflow_kernels(network_kind(obs), self.cpus, config.policy_lag, ranks_on_host)
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = str(self.threads["tf_enable_onednn_opts"])
        os.environ["ONEDNN_MAX_CPU_ISA"] = str(self.threads["onednn_max_cpu_isa"])
        import_tensorflow(config.gpu_pct)
        import tensorflow as tf

        from algos.policy import ActorCritic

        tf.config.threading.set_intra_op_parallelism_threads(self.threads["tf_intra_op_threads"])
        tf.config.threading.set_inter_op_parallelism_threads(self.threads["tf_inter_op_threads"])
        tf.config.experimental.enable_op_determinism()  # same seed and nprocs, same results
        mpi_util.set_global_seeds(config.seed)  # now that TensorFlow is imported, seed it too (as rank 0)
        self.config, self.run_dir = config, run_dir
        # Into config.json and every checkpoint; --resume compares. A CNN's update rounds by its thread count too.
        self.versions = {**stack_versions(), **{name: str(value) for name, value in self.threads.items()}}
        self.ac = ActorCritic(obs, action, hidden=config.hidden,
                              shared_torso=shares_torso(config.algo, config.env_id, obs.is_image),
                              precision=config.precision)
        self.spec = ALGORITHMS[config.algo]
        self.algo: Algorithm = self.spec.build(self.ac, {name: getattr(config, name)
                                                         for name in (*self.spec.defaults, "seed")})
        self.pending: tuple | None = None  # (batch, episodes, behavior_logp) gathered, not yet learned from
        self.logger = None
        self._lock: RunDirLock | None = None  # the run directory's lock, held while this process lives
        self._key: tuple[bytes | None, str] | None = None  # the user's checkpoint key, read at the first checkpoint
        self.eval_best = -math.inf  # the best mean return of the evaluations so far (--eval_every)

    def start(self, resuming: bool, counters: Counters, job: dict) -> None:
        """Open the run's logs (open_logs) and say what the job runs; a resumed run whose budget is spent stops at
        once."""
        config = self.config
        self.open_logs(resuming, counters.iteration, job)
        counters.stop = counters.budget_spent(config)
        mpi_util.print0(f"{config.algo.upper()} on {config.env_id}: {processes(mpi_util.nworkers)}, batch "
                        f"{config.batch_size} steps, budget {config.total_steps} steps; run directory {self.run_dir}")
        if config.total_steps < config.batch_size:
            mpi_util.print0(f"train.py: note: the budget is spent in whole batches: --total_steps "
                            f"{config.total_steps} runs one iteration of --batch_size {config.batch_size} steps")

    def open_logs(self, resuming: bool, iteration: int, job: dict) -> None:
        """Lock the run directory (for as long as this process lives), write config.json (the run's settings and
        ``job``, what the job was given: see job_resources), open the logs."""
        from trainer.logger import RunLogger

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                self._lock = lock_run_dir(self.run_dir)
            except ValueError as error:  # in use by another job (RunDirInUseError), or a link planted as the lock
                mpi_util.abort(f"train.py: error: {error}")
            # What a process killed part-way through a write left (no write is under way: the lock is ours).
            for directory in (self.run_dir, self.run_dir / "checkpoints"):
                remove_temporary_files(directory)
            record = {**asdict(self.config), **job, "rank0_cpus": self.cpus, **self.threads, "versions": self.versions}
            write_atomic(self.run_dir / "config.json", (json.dumps(record, indent=2) + "\n").encode())
            self.logger = RunLogger(self.run_dir, self.config.total_steps,
                                    progress_bar=mpi_util.stdout_is_terminal(), resume=resuming,
                                    hparams=asdict(self.config), tracker=self._start_tracking(record),
                                    evaluates=self.config.eval_every > 0)
            if resuming:
                self.logger.truncate_after(iteration)
        except OSError as error:
            mpi_util.abort(f"train.py: error: cannot write the run directory {self.run_dir}: {error}")

    def checkpoint_state(self) -> dict:
        """What a checkpoint keeps of rank 0's side: the configuration, the actor-critic's weights and normalizers,
        the algorithm's optimizer and RNG, the versions, and under --policy_lag 1 the batch not yet learned from."""
        return {"config": asdict(self.config), "ac_state": [as_numpy(v) for v in self.ac.broadcast_state()],
                "optimizer": self.algo.optimizer_state(), "learner_rng": self.algo.rng_state(),
                "versions": self.versions, "pending": self.pending, "eval_best": self.eval_best}

    def restore_state(self, state: dict, name: str, counters: Counters) -> None:
        """Take back what checkpoint_state() kept (``state``, from the checkpoint file ``name``) and the counters;
        warns when the checkpoint was written with other versions."""
        changes = version_changes(state.get("versions", {}), self.versions)
        if changes:
            mpi_util.print0(f"train.py: warning: {name} was written with other versions ({', '.join(changes)}); "
                            "the run continues, but not bit for bit as it would have")
        for var, value in zip(self.ac.broadcast_state(), state["ac_state"], strict=True):
            if isinstance(var, np.ndarray):
                var[...] = value
            else:
                var.assign(value)
        self.algo.set_optimizer_state(state["optimizer"])
        self.algo.set_rng_state(state["learner_rng"])
        counters.array[:3] = state["counters"][:3]
        self.eval_best = state["eval_best"]
        if state.get("pending") is not None:  # --policy_lag 1: the batch gathered before the stop, not learned yet
            self.hold(*state["pending"], counters)

    def hold(self, batch: dict, episodes: dict, behavior_logp: np.ndarray | None, counters: Counters) -> None:
        """Keep a gathered batch for the next update: batch and episodes as RolloutWorker.collect returns them, all
        ranks' rows; behavior_logp (N,) the acting policy's log-probabilities under --policy_lag 1, else None. Sets
        counters.collect_done when the budget is spent once this batch is learned from."""
        if len(batch["adv"]) != self.config.batch_size:
            raise RuntimeError(f"gathered {len(batch['adv'])} steps, expected --batch_size {self.config.batch_size}")
        self.pending = (batch, episodes, behavior_logp)
        counters.collect_done = counters.budget_spent(self.config, len(batch["adv"]), len(episodes["ep_return"]))

    def behavior_logp(self, batch: dict) -> np.ndarray | None:
        """Under --policy_lag 1, (N,) log-probabilities of the batch's actions under the policy that acted (one update
        older than the one that learns from them), as the workers found them; None otherwise."""
        return batch["logp"] if self.config.policy_lag else None

    def update_due(self, before_rollout: bool) -> bool:
        """Whether the update comes at this point of the iteration: under --policy_lag 1 before the rollout, on the
        batch held from the last iteration (rank 0 learns while the other ranks roll out the next one); otherwise
        after the gather, on the batch just gathered."""
        return self.pending is not None and before_rollout == bool(self.config.policy_lag)

    def update(self, counters: Counters) -> tuple[dict[str, float], dict]:
        """The algorithm's update on the batch held; advances the counters and sets counters.stop when the budget is
        spent. Returns the update's statistics and the episodes of the batch it learned from."""
        config = self.config
        batch, episodes, behavior_logp = self.pending
        self.pending = None
        # The fraction of the step budget still ahead, counting this batch: the first update uses lr (clip_ratio),
        # the last about lr / iterations (a resume with a smaller budget floors it at 0).
        budget_left = max(0.0, 1.0 - counters.total_steps / config.total_steps)
        if "lr_schedule" in self.spec.defaults and config.lr_schedule == "linear":
            self.algo.set_learning_rate(config.lr * budget_left)
        if "clip_schedule" in self.spec.defaults and config.clip_schedule == "linear":
            self.algo.set_clip_ratio(config.clip_ratio * budget_left)
        # Without --policy_lag the workers acted with the policy about to learn: their log-probabilities are its.
        stats = self.algo.update(batch["obs"], batch["act"], batch["adv"], batch["ret"], behavior_logp,
                                 old_logp=batch["logp"] if behavior_logp is None else None)
        if not all(np.isfinite(as_numpy(v)).all() for v in self.ac.broadcast_state()):
            # Stopped before the broadcast and the next checkpoint, so the last good checkpoint stays the newest.
            mpi_util.abort(f"train.py: error: the update of iteration {counters.iteration + 1} made the weights "
                           f"non-finite (inf or NaN); the job stops, and {kept_checkpoint_note(self.run_dir)}. "
                           "Rewards too large to fit, or a learning rate too high for this problem: check the "
                           "environment's rewards, or start a new run with a smaller --lr")
        counters.iteration += 1
        counters.total_steps += config.batch_size
        counters.total_episodes += len(episodes["ep_return"])
        counters.stop = counters.budget_spent(config)
        return stats, episodes

    def evaluated(self, returns: np.ndarray | None, actor: NumpyActor, counters: Counters) -> dict[str, float]:
        """The evaluation columns of this iteration's row (none without --eval_every; NaN in the iterations between
        evaluations) from the K ``returns`` (K,) of ``actor`` (None: not evaluated now); keeps ``actor`` as
        RUN_DIR/best_policy.npz when its mean return beats every earlier one."""
        if not self.config.eval_every:
            return {}
        if returns is None:
            return {"eval_return_mean": math.nan, "eval_return_std": math.nan}
        mean = float(returns.mean())
        if mean > self.eval_best:
            self.eval_best = mean
            try:
                write_policy_file(self.run_dir / BEST_POLICY, actor, {
                    "env_id": self.config.env_id, "algo": self.config.algo, "seed": self.config.seed,
                    "total_steps": counters.total_steps, "iteration": counters.iteration,
                    "eval_return_mean": mean, "eval_episodes": len(returns)})
            except OSError as error:
                self._abort_unwritable(f"{self.run_dir / BEST_POLICY}: {error.strerror}")
        return {"eval_return_mean": mean, "eval_return_std": float(returns.std())}

    def log(self, counters: Counters, episodes: dict, stats: dict[str, float], sync_ok: float,
            timings: dict[str, float], wall_s: float, evaluation: dict[str, float]) -> None:
        """One row of progress.csv and TensorBoard, and the console line; timings: seconds of t_rollout, t_gather,
        t_update, t_bcast, t_eval (with --eval_every) and the whole t_iteration; ``evaluation``: evaluated()'s
        columns. train.py's t_update adds two spans of which one is empty: before the rollout under --policy_lag 1
        (the batch gathered an iteration earlier, learned while the other ranks roll out), after the gather without."""
        returns = episodes["ep_return"]
        row = {
            "iteration": counters.iteration, "total_steps": counters.total_steps,
            "total_episodes": counters.total_episodes,
            "ep_return_mean": float(returns.mean()) if len(returns) else math.nan,
            "ep_return_min": float(returns.min()) if len(returns) else math.nan,
            "ep_return_max": float(returns.max()) if len(returns) else math.nan,
            "ep_length_mean": float(episodes["ep_length"].mean()) if len(returns) else math.nan,
            "episodes": len(returns), "steps_per_s": self.config.batch_size / timings["t_iteration"],
            **{key: float(value) for key, value in stats.items()},
            **evaluation,
            **{key: value for key, value in timings.items() if key != "t_iteration"},
            "wall_s": wall_s, "sync_ok": sync_ok,
        }
        try:
            self.logger.log(row)
        except OSError as error:
            self._abort_unwritable(f"the logs in {self.run_dir}: {error}")

    def _abort_unwritable(self, what: str) -> None:
        """End the job because ``what`` (a file or the logs, with the error) cannot be written, naming the checkpoint
        to resume from."""
        mpi_util.abort(f"train.py: error: cannot write {what}; {kept_checkpoint_note(self.run_dir)}: make the "
                       f"directory writable (or free space), then continue with python train.py --resume "
                       f"{self.run_dir}")

    def _start_tracking(self, record: dict) -> Any:
        """With --track, the Weights & Biases run of this run directory (resumed by its id when it exists), its
        config ``record`` (config.json's); None otherwise. W&B's own start-up lines are held back: one line of ours
        says where the run goes."""
        if not self.config.track:
            return None
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run = wandb.init(project=self.config.wandb_project, entity=self.config.wandb_entity, name=self.run_dir.name,
                         id=self.run_dir.name.replace("/", "-"), resume="allow", dir=str(self.run_dir),
                         config=record)
        where = (f"offline in {run.dir.removesuffix('/files')} (wandb sync it later)" if run.settings.mode == "offline"
                 else run.url)
        mpi_util.print0(f"tracking with Weights & Biases: project {self.config.wandb_project}, run {run.id}, {where}")
        return run

    def checkpoint_key(self) -> bytes | None:
        """The user's key that signs the environments' snapshots (trainer.checkpoint.user_key), made if there is none;
        None, said once, when it cannot be used: checkpoints are still written, and resume with fresh episodes."""
        if self._key is None:
            from trainer.checkpoint import user_key

            self._key = user_key(create=True)
            if self._key[0] is None:
                mpi_util.print0(f"train.py: warning: {self._key[1]}; the environments' snapshots in this run's "
                                "checkpoints are not signed, and a resume of them starts fresh episodes")
        return self._key[0]

    def finish(self, counters: Counters, signum: int | None, elapsed_s: float) -> None:
        """Close the logs, plot the learning curve, and say how the run ended (``signum``: the stop signal, if any;
        ``elapsed_s``: training seconds, a resumed run's earlier ones included)."""
        from trainer.plot import plot_runs

        self.logger.close()
        plot_runs([self.run_dir], self.run_dir / "learning_curve.png")
        if signum is not None:
            mpi_util.print0(f"stopped by signal {signum} after iteration {counters.iteration}; checkpoint written; "
                            f"continue with: python train.py --resume {self.run_dir}")
        mpi_util.print0(f"done: {counters.total_steps} steps, {counters.total_episodes} episodes in {elapsed_s:.0f} s; "
                        f"run directory {self.run_dir}")


def check_sync(learner_state: list, counters: Counters) -> float:
    """1.0 when every rank holds bit-identical learner state after the broadcast; raises otherwise."""
    out_of_sync = mpi_util.ranks_out_of_sync(learner_state)
    if out_of_sync:
        raise RuntimeError(f"ranks hold different learner state after iteration {counters.iteration}: "
                           f"rank(s) {out_of_sync}")
    return 1.0
