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
import json
import math
import os
import platform
import signal
import sys
import threading
import time
import typing
from dataclasses import asdict, fields
from pathlib import Path

from algos.kernels import pin_numeric_kernels

# Stop requests that come before the training loop's handlers are in place (a scheduler's cancel at start-up) are
# noted here and acted on by StopRequest, instead of Python's defaults: SIGTERM and SIGHUP would end the process without
# a checkpoint, SIGINT raise KeyboardInterrupt wherever it lands. SIGUSR1 and SIGUSR2 stand for SIGINT and SIGTERM
# (mpi_util.launch.STAND_IN_SIGNALS) until mpi_fork installs their translation.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_EARLY_MEANING = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGHUP,
                  signal.SIGUSR1: signal.SIGINT, signal.SIGUSR2: signal.SIGTERM}
_early_stop_signals: list[int] = []
if __name__ == "__main__":
    for _signum in _EARLY_MEANING:
        signal.signal(_signum, lambda signum, _frame: _early_stop_signals.append(_EARLY_MEANING[signum]))

pin_numeric_kernels()  # before numpy loads OpenBLAS: the same kernels and threads on every machine and rank

import numpy as np  # noqa: E402

try:
    import mpi_util
except ImportError as error:  # no MPI library: say so in one line, not a traceback
    print(f"train.py: error: {error}", file=sys.stderr)
    sys.exit(2)
from algos.checkpoint import remove_temporary_files, write_atomic  # noqa: E402
from algos.config import TrainConfig, build_config, check_config  # noqa: E402
from algos.registry import ALGORITHMS, Algorithm  # noqa: E402
from algos.resume import as_numpy, checkpoint, restart_from_newest_checkpoint, restore  # noqa: E402
from algos.run_dir import RUN_DIR_VARIABLE, RunDirInUseError, RunDirLock, lock_run_dir, prepare_run_dir  # noqa: E402
from algos.versions import stack_versions  # noqa: E402
from mpi_util.supervise import check_process_room  # noqa: E402

RANK0_REPORT_S = 30.0  # how long a rank that saw another stall leaves rank 0 to end the job, saying why
_PLAY_EPISODES = 5  # --play's episodes when --episodes is not given
_TTY_VARIABLE = "MPI_BATCH_RL_TTY"  # ranks' stdout is a pipe to mpiexec; the parent says if the user has a terminal


def _default(name: str) -> str:
    """TrainConfig's default for ``name`` as --help shows it."""
    value = next(f.default for f in fields(TrainConfig) if f.name == name)
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


class _OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, as train.py's own are, instead of the usage block."""

    def error(self, message: str) -> typing.NoReturn:
        # Under an outside launcher every rank parses the same line: rank 0 alone says it.
        mpi_util.print0(f"{self.prog}: error: {message}; see --help", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; an option not given is None, so that --resume can tell what the user asked to change."""
    parser = _OneLineParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Outputs go to LOGDIR/<env>_<algo>_s<seed>_<time>/: config.json, progress.csv, tb/ (TensorBoard), "
               "checkpoints/, learning_curve.png.",
    )
    parser.add_argument("env_name", nargs="?", help="gymnasium env id; without a version the newest one "
                        "(Walker2d -> Walker2d-v5). Box observations, Box or Discrete actions.")
    parser.add_argument("--algo", choices=list(ALGORITHMS),
                        help=f"learning algorithm (default: {_default('algo')})")
    parser.add_argument("--nprocs", type=str,
                        help="number of MPI processes; more than the cores is fine; under mpiexec, mpirun or srun "
                             f"the launcher's count is used (default: {_default('nprocs')})")
    parser.add_argument("--hostfile", type=str, metavar="FILE", default=None,
                        help="run the --nprocs processes on the hosts FILE lists, in your MPI's format (MPICH: "
                             "'host:slots' lines; Open MPI: 'host slots=N' lines); ignored under a launcher")
    parser.add_argument("--mpiexec_args", type=str, metavar="ARGS", default=None,
                        help="extra arguments for the mpiexec that --nprocs starts, as one quoted string after '=', "
                             "e.g. --mpiexec_args='--bind-to none'; ignored under a launcher")
    parser.add_argument("--max_restarts", type=int, metavar="K", default=0,
                        help="when a process dies (killed, out of memory, a lost host), run the job again from the "
                             "newest checkpoint, at most K times; ignored under a launcher (default: %(default)s)")
    parser.add_argument("--gpu_pct", type=float,
                        help="fraction of GPU memory for rank 0, the one process that runs TensorFlow, in [0, 1]; "
                             f"0 grows as needed; ignored without a GPU (default: {_default('gpu_pct')})")
    parser.add_argument("--total_steps", type=int,
                        help=f"budget in environment steps over all ranks (default: {_default('total_steps')})")
    parser.add_argument("-n", "--num_episodes", type=int,
                        help="also stop after this many finished episodes (default: no episode limit)")
    parser.add_argument("-b", "--batch_size", type=int,
                        help="environment steps per iteration over all ranks, split across ranks by steps "
                             f"(default: {_default('batch_size')})")
    parser.add_argument("--envs_per_rank", type=int,
                        help="environments each process steps in lockstep with one batched policy call; more "
                             f"spreads the policy's per-call cost (default: {_default('envs_per_rank')})")
    parser.add_argument("--batch_split", choices=["even", "shared"],
                        help="'even': every process runs batch_size / nprocs steps (the same seed gives the same "
                             "results); 'shared': processes draw steps from one shared budget until the batch is "
                             "full, so none waits for a slowed-down one (faster when processes share cores or the "
                             "machine is busy; not reproducible bit for bit; one host only) "
                             f"(default: {_default('batch_split')})")
    parser.add_argument("--policy_lag", type=int, choices=[0, 1],
                        help="1: the processes roll out the next batch with the current weights while rank 0 learns "
                             "from the last one (one update of policy lag, importance-weighted); faster when the "
                             "update would leave them waiting; --batch_split then defaults to 'shared' "
                             f"(default: {_default('policy_lag')})")
    parser.add_argument("-g", "--gamma", type=float,
                        help=f"discount factor, in (0, 1] (default: {_default('gamma')})")
    parser.add_argument("-l", "--lam", type=float, help=f"GAE lambda, in (0, 1] (default: {_default('lam')})")
    parser.add_argument("-k", "--kl_targ", type=float,
                        help="TRPO: KL trust region (default 0.01); PPO: stop an update's epochs when KL "
                             "exceeds 1.5x this (default 0.02)")
    parser.add_argument("--hidden", type=str,
                        help=f"hidden layer sizes of the policy and value MLPs (default: {_default('hidden')})")
    parser.add_argument("--lr", type=float,
                        help="PPO: Adam learning rate (default 3e-4); TRPO: the value function's Adam learning "
                             "rate (default 1e-3)")
    parser.add_argument("--lr_schedule", choices=["linear", "constant"],
                        help="PPO: 'linear' decays the learning rate to 0 over --total_steps (a --resume with "
                             "a new --total_steps follows the new budget), 'constant' keeps it (default: "
                             f"{_default('lr_schedule')})")
    parser.add_argument("--epochs", type=int, help=f"PPO epochs per batch (default: {_default('epochs')})")
    parser.add_argument("--minibatch_size", type=int,
                        help="PPO minibatch / TRPO value-function minibatch rows "
                             f"(default: {_default('minibatch_size')})")
    parser.add_argument("--seed", type=int, help=f"base seed (default: {_default('seed')})")
    parser.add_argument("--checkpoint_every", type=int,
                        help=f"iterations between checkpoints (default: {_default('checkpoint_every')})")
    parser.add_argument("--check_sync", action="store_true", default=None,
                        help="after every broadcast verify that all ranks hold bit-identical weights and normalizer "
                             "statistics (one small extra exchange per iteration; logged as sync_ok)")
    parser.add_argument("--stall_timeout", type=str,
                        help="seconds a process that has not reached a gather or broadcast may go without progress "
                             "(env steps, update epochs) before the job is aborted, naming it; 'auto': 60 s, or 10x "
                             "the longest pause seen once past the first two calls, and 120 s before a process's first "
                             "step (MPI_UTIL_STALL_STARTUP sets this allowance); 0 waits forever (default: "
                             f"{_default('stall_timeout')})")
    parser.add_argument("--stop_grace", type=float,
                        help="after Ctrl-C or SIGTERM, seconds the processes wait for each other to finish the "
                             "iteration and checkpoint before the job ends without one, naming a process that did not "
                             f"arrive; match your scheduler's warning time (default: {_default('stop_grace')})")
    parser.add_argument("--logdir", type=str, default="runs",
                        help="directory that holds the run directories (default: %(default)s)")
    parser.add_argument("--resume", type=str, metavar="RUN_DIR", default=None,
                        help="continue the run in RUN_DIR from its newest good checkpoint; --nprocs, --gpu_pct, the "
                             "budget (--total_steps, --num_episodes), --checkpoint_every, --check_sync, --batch_split, "
                             "--stall_timeout and --stop_grace may be changed, the other settings may not")
    parser.add_argument("--play", type=str, metavar="RUN_DIR", default=None,
                        help="run RUN_DIR's saved policy (deterministic) and print episode returns")
    parser.add_argument("--episodes", type=int, default=None,
                        help=f"episodes for --play (default: {_PLAY_EPISODES})")
    parser.add_argument("--video", type=str, metavar="FILE", default=None,
                        help="with --play, record the episodes: FILE.mp4 (needs imageio-ffmpeg) or FILE.gif, or "
                             "FILE.png for a strip of 8 frames of the first episode (MuJoCo renders offscreen; "
                             "MUJOCO_GL=egl is used when there is no display)")
    args = parser.parse_args(argv)
    # Options of --play alone would otherwise be dropped silently from a training run.
    if args.play is None and args.video is not None:
        parser.error("--video needs --play RUN_DIR (it records the episodes --play runs)")
    if args.play is None and args.episodes is not None:
        parser.error("--episodes needs --play RUN_DIR (the episodes --play runs): to end training after N episodes, "
                     "use --num_episodes N")
    if args.episodes is None:
        args.episodes = _PLAY_EPISODES
    return args


def launch_settings(args: argparse.Namespace, nprocs: int) -> dict:
    """mpi_fork's hostfile and mpiexec_args from --hostfile and --mpiexec_args; ValueError with a one-line reason."""
    import shlex

    settings: dict = {}
    if args.mpiexec_args is not None:
        try:
            settings["mpiexec_args"] = shlex.split(args.mpiexec_args)
        except ValueError as error:
            raise ValueError(f"--mpiexec_args '{args.mpiexec_args}': {error}") from None
    if args.hostfile is not None:
        if not os.path.isfile(args.hostfile):
            raise ValueError(f"--hostfile {args.hostfile}: no such file")
        if nprocs < 2 and not mpi_util.under_mpi_launcher():
            raise ValueError("--hostfile needs --nprocs N with N >= 2 (the processes to spread over the hosts)")
        settings["hostfile"] = args.hostfile
    if args.max_restarts < 0:
        raise ValueError(f"--max_restarts must be at least 0, got {args.max_restarts}")
    settings["max_restarts"] = args.max_restarts
    return settings


def steps_of_rank(batch_size: int, nprocs: int, rank: int) -> int:
    """This rank's share of the batch: equal shares, the remainder one step each to the first ranks."""
    return batch_size // nprocs + (1 if rank < batch_size % nprocs else 0)


# What train.py needs beyond mpi_util (the rl extra); --play and the workers, which roll out, need only the first two.
_RL_MODULES = ("gymnasium", "mujoco", "tensorflow", "tensorboard", "matplotlib", "tqdm")
_WORKER_MODULES = _RL_MODULES[:2]


def missing_modules(names: tuple[str, ...]) -> list[str]:
    import importlib.util

    return [name for name in names if importlib.util.find_spec(name) is None]


def main() -> int:
    args = parse_args()
    if mpi_util.under_mpi_launcher():
        if args.max_restarts and RUN_DIR_VARIABLE not in os.environ:  # not set: no train.py launched this job
            mpi_util.print0("train.py: note: --max_restarts is ignored under a launcher (mpiexec, mpirun or srun); "
                            "train.py restarts only a job it launched itself (python train.py ... --nprocs N)",
                            file=sys.stderr)
        return main_in_rank(args)
    missing = missing_modules(_WORKER_MODULES if args.play else _RL_MODULES)
    if missing:
        print(f"train.py: error: {missing_modules_message(missing)}", file=sys.stderr)
        return 2
    if args.play:
        from algos.play import play

        _restore_default_signal_handlers()
        return play(Path(args.play), args.episodes, args.video)
    try:
        config, run_dir, resuming = build_config(args)
        launch = launch_settings(args, config.nprocs)
        if args.max_restarts and config.nprocs == 1:
            raise ValueError(f"--max_restarts {args.max_restarts} needs --nprocs 2 or more: restarts are made by the "
                             "process that launches the ranks, and a 1-process run has none (--resume RUN_DIR "
                             "continues it after a failure)")
        if config.nprocs > 1 and "hostfile" not in launch:
            check_process_room(config.nprocs)  # before the run directory exists: a refused job leaves nothing
        run_dir = prepare_run_dir(run_dir, args.logdir, new=not resuming and RUN_DIR_VARIABLE not in os.environ)
        lock_run_dir(run_dir).release()  # in use by another job: RunDirInUseError; rank 0 locks it for the run
    except (ValueError, OSError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2

    if _early_stop_signals:  # stopped before the job started: nothing to keep
        print(f"train.py: stopped by signal {_early_stop_signals[0]} before training started", file=sys.stderr)
        return 0
    os.environ[RUN_DIR_VARIABLE] = str(run_dir)
    os.environ[_TTY_VARIABLE] = "1" if mpi_util.stdout_is_terminal() else "0"
    try:
        fork = mpi_util.mpi_fork(config.nprocs, config.gpu_pct, on_failure=restart_from_newest_checkpoint(run_dir),
                                 **launch)
    except ValueError as error:  # more processes than this host allows
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    if fork == "parent":
        return fork.returncode
    return train(config, run_dir, resuming)  # one process: this is the only rank


def resume_note(run_dir: Path) -> str:
    """What is kept of a run that ends early, and how to go on from it."""
    from algos.checkpoint import list_checkpoints

    kept = list_checkpoints(run_dir / "checkpoints")
    if not kept:
        return (f"no checkpoint was written yet: the run starts again from the beginning (in a new run directory; "
                f"{run_dir} can be removed)")
    return f"the last good checkpoint, {kept[-1].name}, is kept: continue with python train.py --resume {run_dir}"


def _restore_default_signal_handlers() -> None:
    """Python's own handling of the stop signals, for --play: Ctrl-C ends it at once."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)


def main_in_rank(args: argparse.Namespace) -> int:
    """A rank started by mpiexec, mpirun or srun (mpi_fork's, or the user's): rank 0 alone reads and checks the
    configuration and the run directory, and hands them to the others, so that hosts that share no filesystem with
    rank 0 need nothing from it; a problem seen on any rank ends the whole job at once, naming the rank and host."""
    mpi_util.mpi_fork(mpi_util.nworkers)  # no relaunch: an uncaught exception on any rank now aborts the job
    rank = mpi_util.rank
    missing = missing_modules(_RL_MODULES if rank == 0 and not args.play else _WORKER_MODULES)
    if missing:
        where = f" on rank {rank} (host {platform.node()})" if mpi_util.nworkers > 1 else ""
        mpi_util.abort(f"train.py: error{where}: {missing_modules_message(missing)}", code=2)
    if args.play:
        _restore_default_signal_handlers()
        if rank == 0:
            from algos.play import play

            return play(Path(args.play), args.episodes, args.video)
        return 0
    setup: tuple | str | None = None
    if rank == 0:
        try:
            config, run_dir, resuming = build_config(args)
            if config.nprocs != mpi_util.nworkers:  # the launcher's count wins
                config.nprocs = mpi_util.nworkers
                check_config(config)
            # Under mpi_fork its parent made the directory; under an outside launcher rank 0 makes it here.
            run_dir = prepare_run_dir(run_dir, args.logdir, new=not resuming and RUN_DIR_VARIABLE not in os.environ)
            setup = (config, run_dir, resuming)
        except (ValueError, OSError) as error:
            setup = f"train.py: error: {error}"
            print(setup, file=sys.stderr, flush=True)
    setup = mpi_util.bcast_object(setup)
    if isinstance(setup, str):
        return 2
    config, run_dir, resuming = setup
    os.environ.setdefault(_TTY_VARIABLE, "1" if mpi_util.stdout_is_terminal() else "0")
    return train(config, run_dir, resuming)


def missing_modules_message(missing: list[str]) -> str:
    return (f"{', '.join(missing)} not installed; train.py needs the rl extra: pip install -e '.[rl]' in this "
            "checkout (mpi_util alone needs only mpi4py, mpich and numpy)")


def _counter(index: int, doc: str) -> property:
    def get(self: Counters) -> int:
        return int(self.array[index])

    def set_(self: Counters, value: int) -> None:
        self.array[index] = value

    return property(get, set_, doc=doc)


class Counters:
    """What rank 0 counts; broadcast with the weights as one int64 array (5,), so every rank agrees on when to stop."""

    iteration = _counter(0, "updates done")
    total_steps = _counter(1, "environment steps learned from, all ranks together")
    total_episodes = _counter(2, "episodes finished in the batches learned from, all ranks together")
    stop = _counter(3, "1 once rank 0 has decided that the iteration just done is the last")
    collect_done = _counter(4, "1 once the batches gathered cover the budget (--policy_lag 1: one update is left)")

    def __init__(self) -> None:
        self.array = np.zeros(5, dtype=np.int64)

    def budget_spent(self, config: TrainConfig, steps: int = 0, episodes: int = 0) -> bool:
        """Whether the budget is spent once ``steps`` and ``episodes`` more are learned from."""
        return (self.total_steps + steps >= config.total_steps
                or (config.num_episodes is not None and self.total_episodes + episodes >= config.num_episodes))


class StopRequest:
    """A stop request (Ctrl-C, SIGTERM, SIGHUP): finish the iteration, checkpoint, exit cleanly.

    Rank 0's request decides, through the broadcast counters, so every rank stops after the same iteration, and rank 0
    says so at once, whatever the phase the signal lands in. From the request on, every rank waits at most ``grace_s``
    (--stop_grace) for the others (mpi_util.stall_deadline): a rank that hangs ends the job then, named, instead of
    holding it for the whole stall timeout.

    One request per job, however many copies of the signal arrive: a scheduler's cancel reaches each rank directly,
    through mpiexec and through mpi_fork's launching process. Only a Ctrl-C that comes after rank 0 announced the
    stop, and more than REPEAT_S after the first request, stops at once (rank 0 ends the job, without a checkpoint).
    """

    REPEAT_S = 1.0  # copies of one request arrive within milliseconds; a person's second Ctrl-C comes later

    def __init__(self, grace_s: float, run_dir: Path) -> None:
        self.grace_s, self.run_dir = grace_s, run_dir
        self.signum: int | None = None
        self.requested_at = 0.0
        self.announced = False
        self._requested = threading.Event()
        # The notice comes from a thread of its own: the handler may not print (the signal may land while this rank
        # writes to the same stream, and the write would fail with a reentrant-call RuntimeError), and the loop may
        # be in a long rollout or update.
        self._notifier: threading.Thread | None = None
        if mpi_util.rank == 0:
            self._notifier = threading.Thread(target=self._announce, name="train-stop-notice", daemon=True)
            self._notifier.start()
        for signum in _STOP_SIGNALS:
            signal.signal(signum, self._request)
        for signum in _early_stop_signals:  # what arrived before these handlers were in place
            self._request(signum, None)

    def _request(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum, self.requested_at = signum, time.monotonic()
            mpi_util.stall_deadline(self.grace_s, f"{self.grace_s:g} s after the stop request (signal {signum})")
            self._requested.set()
        elif signum == signal.SIGINT and self.announced and time.monotonic() - self.requested_at > self.REPEAT_S:
            self._stop_now()

    def _announce(self) -> None:
        self._requested.wait()
        ended = mpi_util.supervise.launcher_ended
        cause = "the launching process has ended" if ended else f"received signal {self.signum}"
        # One write, so that the line stays whole beside the loop's own output.
        sys.stdout.write(f"{cause}: stopping after this iteration with a checkpoint (a second Ctrl-C stops at once, "
                         "without one)\n")
        sys.stdout.flush()
        self.announced = True

    def _stop_now(self) -> None:
        message = ("train.py: stopped at once by a second Ctrl-C, without a final checkpoint; "
                   + resume_note(self.run_dir))
        try:
            mpi_util.abort(message)
        except RuntimeError:  # the signal landed in a write to stdout or stderr: say it without them
            os.write(2, (message + "\n").encode())
            os._exit(1)

    def take(self) -> bool:
        """Whether a stop was requested; on rank 0, once its notice is out (it comes before the stop it asks for)."""
        if self.signum is None:
            return False
        if self._notifier is not None:
            self._notifier.join(timeout=10)
        return True

    @staticmethod
    def ignore_from_now_on() -> None:
        """Training is over and checkpointed: a late stop signal must not kill a rank while MPI shuts down (Python
        restores the default handlers at exit, before MPI_Finalize), which would fail a clean job."""
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def train(config: TrainConfig, run_dir: Path, resuming: bool) -> int:
    """The loop every rank runs: roll out, gather to rank 0, rank 0 updates, broadcast.

    Only rank 0 imports TensorFlow: it holds the actor-critic and the algorithm's update. The other ranks act with
    numpy copies of rank 0's weights and normalizers, received into arrays of the same shapes.
    """
    import gymnasium

    from algos.numpy_actor import NumpyActor, actor_critic_state_like

    rank, nprocs = mpi_util.rank, mpi_util.nworkers
    mpi_util.set_global_seeds(config.seed)
    mpi_util.set_stall_timeout(config.stall_timeout)  # 0: never, as MPI_UTIL_STALL_TIMEOUT=0
    stop = StopRequest(config.stop_grace, run_dir)
    worker, action_rng = make_rollout_worker(config, rank, seed_path=())
    obs_dim, action_space = worker.envs[0].observation_space.shape[0], worker.envs[0].action_space
    discrete = isinstance(action_space, gymnasium.spaces.Discrete)
    act_dim = int(action_space.n) if discrete else int(action_space.shape[0])
    counters = Counters()
    job = job_resources()
    learner = Learner(config, run_dir, obs_dim, action_space, resuming) if rank == 0 else None
    # What rank 0 broadcasts each iteration: the actor-critic's variables and normalizers (rank 0's own, read from
    # TensorFlow; everyone else's, numpy arrays of the same shapes), then the counters.
    actor_state = learner.ac.broadcast_state() if learner else actor_critic_state_like(obs_dim, act_dim,
                                                                                        config.hidden, discrete)
    learner_state = [*actor_state, counters.array]

    elapsed_before = 0.0
    if resuming:
        worker, action_rng, elapsed_before = restore(run_dir, learner, counters, worker, action_rng,
                                                     functools.partial(make_rollout_worker, config, rank))
    if learner:
        learner.open_logs(resuming, counters.iteration, job)
        counters.stop = counters.budget_spent(config)
        mpi_util.print0(f"{config.algo.upper()} on {config.env_id}: {nprocs} processes, batch {config.batch_size} "
                        f"steps, budget {config.total_steps} steps; run directory {run_dir}")
        if config.total_steps < config.batch_size:
            mpi_util.print0(f"train.py: note: the budget is spent in whole batches: --total_steps "
                            f"{config.total_steps} runs one iteration of --batch_size {config.batch_size} steps")
    mpi_util.rank0_bcast_wts(learner_state)  # every rank starts from rank 0's weights and counters

    my_steps = steps_of_rank(config.batch_size, nprocs, rank)
    budget = None
    if config.batch_split == "shared" and nprocs > 1:
        try:
            budget = mpi_util.SharedBudget(config.batch_size)
        except ValueError as error:
            mpi_util.abort(f"train.py: error: --batch_split shared: {error}")
        my_steps = config.batch_size  # the most one rank may draw
    started = time.monotonic()
    checkpointed = counters.iteration  # the iteration of the newest checkpoint (a resumed run's, or none yet)
    try:
        while not counters.stop:
            t0 = time.monotonic()
            actor = NumpyActor.from_ac_state([as_numpy(v) for v in actor_state], config.hidden, discrete)
            stats, episodes = {}, None  # rank 0: this iteration's update and the episodes of the batch it learned
            if learner and config.policy_lag and learner.pending:
                # Rank 0 learns from the batch of the last iteration while the other ranks roll out the next one.
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
                    behavior_logp = actor.log_prob(batch["obs"], batch["act"]) if config.policy_lag else None
                    learner.hold(batch, new_episodes, behavior_logp, counters)
            t3 = time.monotonic()
            if learner:
                if not config.policy_lag:
                    stats, episodes = learner.update(counters)
                counters.stop = stop.take() or counters.stop
            t4 = time.monotonic()
            mpi_util.rank0_bcast_wts(learner_state)
            t5 = time.monotonic()
            sync_ok = check_sync(learner_state, counters) if config.check_sync else math.nan
            if episodes is not None:
                learner.log(counters, episodes, stats, sync_ok, wall_s=elapsed_before + t5 - started, timings={
                    "t_rollout": t2 - t1, "t_gather": t3 - t2, "t_update": (t1 - t0) + (t4 - t3),
                    "t_bcast": t5 - t4, "t_iteration": t5 - t0})
            due = counters.iteration % config.checkpoint_every == 0 and counters.iteration != checkpointed
            if due or counters.stop:
                checkpoint(run_dir, learner, counters, worker, action_rng, nprocs,
                           elapsed_s=elapsed_before + time.monotonic() - started)
                checkpointed = counters.iteration
    except mpi_util.CollectiveStallError as error:
        # Every rank waiting for the late one sees the stall: rank 0 says it, once, unless it is late itself. The
        # others give it RANK0_REPORT_S to do so (rank 0 waits in every collective, so it sees the stall too).
        if rank != 0 and 0 not in error.late_ranks:
            waited_since = time.monotonic()
            while time.monotonic() - waited_since < RANK0_REPORT_S:
                time.sleep(0.5)
        mpi_util.abort(f"train.py: error: {error}. The job ends without a final checkpoint; {resume_note(run_dir)}",
                       late_ranks=error.late_ranks)

    stop.ignore_from_now_on()
    if learner:
        learner.close()
        if stop.signum is not None:
            mpi_util.print0(f"stopped by signal {stop.signum} after iteration {counters.iteration}; checkpoint "
                            f"written; continue with: python train.py --resume {run_dir}")
        mpi_util.print0(f"done: {counters.total_steps} steps, {counters.total_episodes} episodes in "
                        f"{elapsed_before + time.monotonic() - started:.0f} s; run directory {run_dir}")
    return 0


def job_resources() -> dict:
    """What the job was given, for config.json: each host's CPUs (the union of its ranks' affinity, capped by the
    largest cgroup CPU quota among them) and their sum, and the BLAS / OpenMP threads of each kind of rank.
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
            "rank0_omp_threads": ranks[0][3], "worker_omp_threads": ranks[1][3] if len(ranks) > 1 else None}


def make_rollout_worker(config: TrainConfig, rank: int, seed_path: tuple[int, ...]) -> tuple:
    """This rank's RolloutWorker (its envs, seeded from the base seed) and its action RNG. seed_path () gives the
    run's first worker; (2, iteration) a fresh one for a resume with another --nprocs."""
    import gymnasium

    from algos.rollout import RolloutWorker

    envs = [gymnasium.make(config.env_id) for _ in range(config.envs_per_rank)]
    if seed_path:
        seed = int(np.random.SeedSequence(config.seed, spawn_key=(rank, *seed_path)).generate_state(1)[0])
    else:
        seed = mpi_util.rank_seed(config.seed, rank)
    worker = RolloutWorker(envs, seed=seed, gamma=config.gamma, lam=config.lam)
    action_rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(rank, 1)))
    return worker, action_rng


class Learner:
    """Rank 0's side: the TensorFlow actor-critic, the algorithm that updates it (--algo, built as algos.registry's
    ALGORITHMS says), and the run directory's logs."""

    def __init__(self, config: TrainConfig, run_dir: Path, obs_dim: int, action_space: object, resuming: bool) -> None:
        # oneDNN's kernels cost more than they save on 64x64 networks (benchmarks/update.py): TensorFlow's own
        # kernels run instead. A value the user set is kept (config.json records it).
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
        # TensorFlow imports JAX when it is installed (for TFLite, unused here): 0.5 s and 110 MB more on rank 0.
        # Hidden during TensorFlow's import only; an env that imports JAX later still can.
        jax_hidden = "jax" not in sys.modules
        if jax_hidden:
            sys.modules["jax"] = None  # type: ignore[assignment]
        try:
            mpi_util.setup_gpu(config.gpu_pct)  # imports TensorFlow, without its start-up log lines
        finally:
            if jax_hidden:
                del sys.modules["jax"]
        import tensorflow as tf

        from algos.policy import ActorCritic

        # Rank 0 alone runs the update while the workers wait without spinning. One thread per op: on networks of
        # this size splitting an op across threads (Adam's fused kernel above all) costs more than it saves;
        # two ops at a time where the CPUs it was given (affinity, cgroup quota) allow (benchmarks/update.py).
        self.cpus = mpi_util.cpus_available()
        self.threads = {"tf_intra_op_threads": 1, "tf_inter_op_threads": min(2, self.cpus),
                        "tf_enable_onednn_opts": os.environ["TF_ENABLE_ONEDNN_OPTS"]}
        tf.config.threading.set_intra_op_parallelism_threads(self.threads["tf_intra_op_threads"])
        tf.config.threading.set_inter_op_parallelism_threads(self.threads["tf_inter_op_threads"])
        tf.config.experimental.enable_op_determinism()  # same seed and nprocs, same results
        mpi_util.set_global_seeds(config.seed)  # now that TensorFlow is imported, seed it too (as rank 0)
        self.config, self.run_dir = config, run_dir
        self.versions = stack_versions()  # into config.json and every checkpoint; --resume compares
        self.ac = ActorCritic(obs_dim, action_space, hidden=config.hidden)
        self.spec = ALGORITHMS[config.algo]
        self.algo: Algorithm = self.spec.build(self.ac, config)
        self.pending: tuple | None = None  # (batch, episodes, behavior_logp) gathered, not yet learned from
        self.logger = None
        self._lock: RunDirLock | None = None  # the run directory's lock, held while this process lives

    def open_logs(self, resuming: bool, iteration: int, job: dict) -> None:
        """Lock the run directory (for as long as this process lives), write config.json (the run's settings and
        ``job``, what the job was given: see job_resources), open the logs."""
        from algos.logger import RunLogger

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                self._lock = lock_run_dir(self.run_dir)
            except RunDirInUseError as error:
                mpi_util.abort(f"train.py: error: {error}")
            # What a process killed part-way through a write left (no write is under way: the lock is ours).
            for directory in (self.run_dir, self.run_dir / "checkpoints"):
                remove_temporary_files(directory)
            record = {**asdict(self.config), **job, "rank0_cpus": self.cpus, **self.threads, "versions": self.versions}
            write_atomic(self.run_dir / "config.json", (json.dumps(record, indent=2) + "\n").encode())
            self.logger = RunLogger(self.run_dir, self.config.total_steps,
                                    progress_bar=os.environ.get(_TTY_VARIABLE) == "1", resume=resuming)
            if resuming:
                self.logger.truncate_after(iteration)
        except OSError as error:
            mpi_util.abort(f"train.py: error: cannot write the run directory {self.run_dir}: {error}")

    def hold(self, batch: dict, episodes: dict, behavior_logp: np.ndarray | None, counters: Counters) -> None:
        """Keep a gathered batch for the next update: batch and episodes as RolloutWorker.collect returns them, all
        ranks' rows; behavior_logp (N,) the acting policy's log-probabilities under --policy_lag 1, else None. Sets
        counters.collect_done when the budget is spent once this batch is learned from."""
        if len(batch["adv"]) != self.config.batch_size:
            raise RuntimeError(f"gathered {len(batch['adv'])} steps, expected --batch_size {self.config.batch_size}")
        self.pending = (batch, episodes, behavior_logp)
        counters.collect_done = counters.budget_spent(self.config, len(batch["adv"]), len(episodes["ep_return"]))

    def update(self, counters: Counters) -> tuple[dict[str, float], dict]:
        """The algorithm's update on the batch held; advances the counters and sets counters.stop when the budget is
        spent. Returns the update's statistics and the episodes of the batch it learned from."""
        config = self.config
        batch, episodes, behavior_logp = self.pending
        self.pending = None
        if "lr_schedule" in self.spec.settings and config.lr_schedule == "linear":
            # The fraction of the step budget still ahead, counting this batch: the first update uses lr, the last
            # about lr / iterations (a resume with a smaller budget floors it at 0).
            self.algo.set_learning_rate(config.lr * max(0.0, 1.0 - counters.total_steps / config.total_steps))
        stats = self.algo.update(batch["obs"], batch["act"], batch["adv"], batch["ret"], behavior_logp)
        if not all(np.isfinite(as_numpy(v)).all() for v in self.ac.broadcast_state()):
            # Stopped before the broadcast and the next checkpoint, so the last good checkpoint stays the newest.
            mpi_util.abort(f"train.py: error: the update of iteration {counters.iteration + 1} made the weights "
                           f"non-finite (inf or NaN); the job stops. {self._kept_checkpoint_note()}. Rewards too "
                           "large to fit, or a learning rate too high for this problem: check the environment's "
                           "rewards, or start a new run with a smaller --lr")
        counters.iteration += 1
        counters.total_steps += config.batch_size
        counters.total_episodes += len(episodes["ep_return"])
        counters.stop = counters.budget_spent(config)
        return stats, episodes

    def log(self, counters: Counters, episodes: dict, stats: dict[str, float], sync_ok: float,
            timings: dict[str, float], wall_s: float) -> None:
        """One row of progress.csv and TensorBoard, and the console line; timings: seconds of t_rollout, t_gather,
        t_update, t_bcast and the whole t_iteration."""
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
            **{key: timings[key] for key in ("t_rollout", "t_gather", "t_update", "t_bcast")},
            "wall_s": wall_s, "sync_ok": sync_ok,
        }
        try:
            self.logger.log(row)
        except OSError as error:
            mpi_util.abort(f"train.py: error: cannot write the logs in {self.run_dir}: {error}. "
                           f"{self._kept_checkpoint_note()}: make the directory writable (or free space), then "
                           f"continue with python train.py --resume {self.run_dir}")

    def _kept_checkpoint_note(self) -> str:
        from algos.checkpoint import list_checkpoints

        kept = list_checkpoints(self.run_dir / "checkpoints")
        return (f"The last good checkpoint, {kept[-1]}, is kept" if kept
                else "No checkpoint was written yet (the run must start again)")

    def close(self) -> None:
        from algos.plot import plot_runs

        self.logger.close()
        plot_runs([self.run_dir], self.run_dir / "learning_curve.png")


def check_sync(learner_state: list, counters: Counters) -> float:
    """1.0 when every rank holds bit-identical learner state after the broadcast; raises otherwise."""
    out_of_sync = mpi_util.ranks_out_of_sync(learner_state)
    if out_of_sync:
        raise RuntimeError(f"ranks hold different learner state after iteration {counters.iteration}: "
                           f"rank(s) {out_of_sync}")
    return 1.0


if __name__ == "__main__":
    sys.exit(main())
