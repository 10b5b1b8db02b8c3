"""Train a policy with TRPO or PPO on N MPI processes: every rank rolls out, rank 0 gathers and learns, rank 0
broadcasts the new weights.

    python train.py Walker2d --nprocs 8 --gpu_pct 0.08
    python train.py CartPole-v1 --algo trpo --nprocs 2 --total_steps 100000
    python train.py --resume runs/Walker2d-v5_ppo_s0_20261122-101500
    python train.py --play runs/Walker2d-v5_ppo_s0_20261122-101500 --video walker.mp4
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import platform
import sys
import time
from pathlib import Path

from trainer.kernels import pin_numeric_kernels
from trainer.signals import catch_early_stop_signals, early_stop_signals, restore_default_signal_handlers

if __name__ == "__main__":
    catch_early_stop_signals()  # a scheduler's cancel during start-up still stops with a clean exit
pin_numeric_kernels()  # before numpy loads OpenBLAS: the same kernels and threads on every machine and rank

try:
    import mpi_util
except ImportError as error:  # no MPI library: say so in one line, not a traceback
    print(f"train.py: error: {error}", file=sys.stderr)
    sys.exit(2)
from mpi_util.supervise import JOB_DIR_VARIABLE, check_process_room  # noqa: E402
from trainer.config import TrainConfig, build_config  # noqa: E402
from trainer.counters import Counters  # noqa: E402
from trainer.evaluate import Evaluator  # noqa: E402
from trainer.job import actor_state_to_receive, job_resources, make_rollout_worker, share_of_batch  # noqa: E402
from trainer.learner import Learner, check_sync  # noqa: E402
from trainer.options import RL_MODULES, WORKER_MODULES, launch_settings, missing_modules  # noqa: E402
from trainer.options import parse_args as parse_options  # noqa: E402
from trainer.resume import as_numpy, checkpoint, restart_from_newest_checkpoint, restore, resume_note  # noqa: E402
from trainer.run_dir import lock_run_dir, prepare_run_dir  # noqa: E402
from trainer.stop import StopRequest  # noqa: E402

RANK0_REPORT_S = 30.0  # how long a rank that saw another stall leaves rank 0 to end the job, saying why


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """train.py's options (trainer.options), with this docstring's examples at the top of --help."""
    return parse_options(argv, description=__doc__)


def main() -> int:
    args = parse_args()
    if mpi_util.under_mpi_launcher():
        if args.max_restarts and JOB_DIR_VARIABLE not in os.environ:  # mpi_fork sets it: not train.py's own job
            mpi_util.print0("train.py: note: --max_restarts is ignored under a launcher (mpiexec, mpirun or srun); "
                            "train.py restarts only a job it launched itself (python train.py ... --nprocs N)",
                            file=sys.stderr)
        return main_in_rank(args)
    missing = missing_modules(WORKER_MODULES if args.play or args.export else RL_MODULES)
    if missing:
        print(f"train.py: error: {missing}", file=sys.stderr)
        return 2
    if args.play:
        from trainer.play import play

        restore_default_signal_handlers()
        return play(Path(args.play), args.episodes, args.video, args.env_name)
    if args.export:
        from trainer.play import export

        return export(Path(args.export[0]), Path(args.export[1]), args.env_name)
    try:
        config, run_dir, resuming = build_config(args)
        launch = launch_settings(args, config.nprocs)
        if config.nprocs > 1 and "hostfile" not in launch:
            check_process_room(config.nprocs)  # before the run directory exists: a refused job leaves nothing
        run_dir = prepare_run_dir(run_dir, args.logdir, new=not resuming and args.run_dir is None)
        lock_run_dir(run_dir).release()  # in use by another job: RunDirInUseError; rank 0 locks it for the run
    except (ValueError, OSError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2

    if early_stop_signals:  # stopped before the job started: nothing to keep
        print(f"train.py: stopped by signal {early_stop_signals[0]} before training started", file=sys.stderr)
        return 0
    ranks_args = [*sys.argv[1:], "--run_dir", str(run_dir)]  # the ranks write the directory made here
    try:
        fork = mpi_util.mpi_fork(config.nprocs, on_failure=restart_from_newest_checkpoint(run_dir, ranks_args),
                                 args=ranks_args, **launch)
    except ValueError as error:  # more processes than this host allows
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    if fork == "parent":
        return fork.returncode
    return train(config, run_dir, resuming)  # one process: this is the only rank


def main_in_rank(args: argparse.Namespace) -> int:
    """A rank started by mpiexec, mpirun or srun (mpi_fork's, or the user's): rank 0 alone reads and checks the
    configuration and the run directory, and hands them to the others, so that hosts that share no filesystem with
    rank 0 need nothing from it; a problem seen on any rank ends the whole job at once, naming the rank and host."""
    mpi_util.init()  # an uncaught exception on any rank now ends the job, naming the rank
    rank = mpi_util.rank
    missing = missing_modules(RL_MODULES if rank == 0 and not (args.play or args.export) else WORKER_MODULES)
    if missing:
        where = f" on rank {rank} (host {platform.node()})" if mpi_util.nworkers > 1 else ""
        mpi_util.abort(f"train.py: error{where}: {missing}", code=2)
    if args.play or args.export:
        restore_default_signal_handlers()
        if rank == 0:
            from trainer.play import export, play

            if args.export:
                return export(Path(args.export[0]), Path(args.export[1]), args.env_name)
            return play(Path(args.play), args.episodes, args.video, args.env_name)
        return 0
    setup: tuple | str | None = None
    if rank == 0:
        try:
            args.nprocs = str(mpi_util.nworkers)  # the launcher's count wins (and sets a family's envs per process)
            config, run_dir, resuming = build_config(args)
            # Under mpi_fork its launching process made the directory (--run_dir); else rank 0 makes it here.
            run_dir = prepare_run_dir(run_dir, args.logdir, new=not resuming and args.run_dir is None)
            setup = (config, run_dir, resuming)
        except (ValueError, OSError) as error:
            setup = f"train.py: error: {error}"
            print(setup, file=sys.stderr, flush=True)
    setup = mpi_util.bcast_object(setup)
    if isinstance(setup, str):
        return 2
    config, run_dir, resuming = setup
    return train(config, run_dir, resuming)


def train(config: TrainConfig, run_dir: Path, resuming: bool) -> int:
    """The loop every rank runs: roll out, gather to rank 0, rank 0 updates, broadcast.

    Only rank 0 imports TensorFlow: it holds the actor-critic and the algorithm's update. The other ranks act with
    numpy copies of rank 0's weights and normalizers, received into arrays of the same shapes.
    """
    from algos.numpy_actor import NumpyActor
    from algos.registry import shares_torso

    rank, nprocs = mpi_util.rank, mpi_util.nworkers
    mpi_util.set_global_seeds(config.seed)
    mpi_util.set_stall_timeout(config.stall_timeout)  # 0: never, as MPI_UTIL_STALL_TIMEOUT=0
    stop = StopRequest(config.stop_grace, run_dir)
    worker, action_rng = make_rollout_worker(config, rank, seed_path=())
    counters = Counters()
    job = job_resources()
    learner = (Learner(config, run_dir, worker.obs, worker.action, resuming, job["rank0_host_ranks"]) if rank == 0
               else None)
    # What rank 0 broadcasts each iteration: the actor-critic's variables and normalizers, then the counters.
    shared_torso = shares_torso(config.algo, config.env_id, worker.obs.is_image)
    actor_state = actor_state_to_receive(learner, worker, config.hidden, shared_torso)
    learner_state = [*actor_state, counters.array]
    elapsed_before = 0.0
    if resuming:
        worker, action_rng, elapsed_before = restore(run_dir, learner, counters, worker, action_rng,
                                                     functools.partial(make_rollout_worker, config, rank))
    if learner:
        learner.start(resuming, counters, job)
    mpi_util.rank0_bcast_wts(learner_state)  # every rank starts from rank 0's weights and counters
    my_steps, budget = share_of_batch(config, rank, nprocs)
    started = time.monotonic()
    checkpointed = counters.iteration  # the iteration of the newest checkpoint (a resumed run's, or none yet)
    evaluator = Evaluator(config, evaluated=counters.iteration)  # a checkpoint's iteration was evaluated before it
    try:
        while not counters.stop:
            t0 = time.monotonic()
            actor = NumpyActor.from_ac_state([as_numpy(v) for v in actor_state], config.hidden, worker.obs,
                                             worker.action, shared_torso)
            stats, episodes = {}, None  # rank 0: this iteration's update and the episodes of the batch it learned
            if learner and learner.update_due(before_rollout=True):  # --policy_lag 1: while the others roll out
                stats, episodes = learner.update(counters)
            t1 = t2 = time.monotonic()
            if not counters.collect_done:
                batch, new_episodes = worker.collect(my_steps, actor, action_rng, budget.take if budget else None)
                t2 = time.monotonic()
                batch = mpi_util.rank0_accum_batches(batch)
                new_episodes = mpi_util.rank0_accum_batches(new_episodes)
                if budget is not None and rank == 0:
                    budget.refill()  # every rank has stopped drawing (past the gather); none starts before the bcast
                if learner:
                    learner.hold(batch, new_episodes, learner.behavior_logp(batch), counters)
            t3 = time.monotonic()
            if learner:
                if learner.update_due(before_rollout=False):
                    stats, episodes = learner.update(counters)
                counters.stop = stop.take() or counters.stop
            t4 = time.monotonic()
            mpi_util.rank0_bcast_wts(learner_state)
            t5 = time.monotonic()
            sync_ok = check_sync(learner_state, counters) if config.check_sync else math.nan
            eval_actor, eval_returns = evaluator.after_broadcast(counters.iteration, lambda: NumpyActor.from_ac_state(
                [as_numpy(v) for v in actor_state], config.hidden, worker.obs, worker.action, shared_torso))
            t6 = time.monotonic()
            if episodes is not None:
                timings = {"t_rollout": t2 - t1, "t_gather": t3 - t2, "t_update": (t1 - t0) + (t4 - t3),
                           "t_bcast": t5 - t4, **({"t_eval": t6 - t5} if config.eval_every else {}),
                           "t_iteration": t6 - t0}
                learner.log(counters, episodes, stats, sync_ok, timings, elapsed_before + t6 - started,
                            learner.evaluated(eval_returns, eval_actor, counters))
            due = counters.iteration % config.checkpoint_every == 0 and counters.iteration != checkpointed
            if due or counters.stop:
                checkpoint(run_dir, learner, counters, worker, action_rng, nprocs,
                           elapsed_s=elapsed_before + time.monotonic() - started)
                checkpointed = counters.iteration
    except mpi_util.CollectiveStallError as error:
        end_after_stall(error, run_dir)
    stop.ignore_from_now_on()
    if learner:
        learner.finish(counters, stop.signum, elapsed_s=elapsed_before + time.monotonic() - started)
    return 0


def end_after_stall(error: mpi_util.CollectiveStallError, run_dir: Path) -> None:
    """End the job after a stall, said once: every rank waiting for the late one sees it, and rank 0 says it unless it
    is late itself; the others give it RANK0_REPORT_S to do so (rank 0 waits in every collective, so it sees it too)."""
    if mpi_util.rank != 0 and 0 not in error.late_ranks:
        waited_since = time.monotonic()
        while time.monotonic() - waited_since < RANK0_REPORT_S:
            time.sleep(0.5)
    mpi_util.abort(f"train.py: error: {error}. The job ends without a final checkpoint; {resume_note(run_dir)}",
                   late_ranks=error.late_ranks)

if __name__ == "__main__":
    sys.exit(main())
