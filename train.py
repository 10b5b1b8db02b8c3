"""Train a policy with TRPO or PPO on N MPI processes: every rank rolls out, rank 0 gathers and learns, rank 0
broadcasts the new weights.

    python train.py Walker2d --nprocs 8 --gpu_pct 0.08
    python train.py CartPole-v1 --algo trpo --nprocs 2 --total_steps 100000
    python train.py --resume runs/Walker2d-v5_ppo_s0_20261122-101500
    python train.py --play runs/Walker2d-v5_ppo_s0_20261122-101500 --video walker.mp4
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

import mpi_util

_RUN_DIR_VARIABLE = "MPI_BATCH_RL_RUN_DIR"  # the parent picks the run directory; its ranks use the same one
_TTY_VARIABLE = "MPI_BATCH_RL_TTY"  # ranks' stdout is a pipe to mpiexec; the parent says if the user has a terminal


@dataclass
class TrainConfig:
    """Everything that defines a run; saved as RUN_DIR/config.json."""

    env_id: str
    """Resolved gymnasium id, e.g. Walker2d-v5."""
    algo: str = "ppo"
    """trpo or ppo."""
    nprocs: int = 1
    """MPI processes; each rolls out batch_size / nprocs steps per iteration."""
    gpu_pct: float = 0.0
    """Fraction of a GPU's memory each process may take (0: grow as needed)."""
    total_steps: int = 1_000_000
    """Stop after this many environment steps (all ranks together)."""
    num_episodes: int | None = None
    """Also stop after this many finished episodes (None: no episode limit)."""
    batch_size: int = 2048
    """Environment steps per iteration, all ranks together."""
    envs_per_rank: int = 1
    """Environments each rank steps in lockstep, acting on all of them with one batched forward pass."""
    batch_split: str = "even"
    """How ranks share the batch: "even" (batch_size / nprocs steps each; same seed, same results) or "shared"
    (ranks draw steps from one budget until the batch is full, so a rank the machine slows down does fewer; faster
    on busy or oversubscribed machines, not reproducible bit for bit; every rank on one host)."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.95
    """GAE lambda."""
    kl_targ: float | None = None
    """TRPO: the KL trust region (default 0.01); PPO: early-stop epochs beyond 1.5x this KL (default 0.02)."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the policy and value MLPs."""
    lr: float = 3e-4
    """PPO: Adam learning rate. TRPO: value-function learning rate is 1e-3 unless this is changed."""
    lr_schedule: str = "linear"
    """PPO: "linear" decays lr to 0 over total_steps (OpenAI baselines' MuJoCo setting); "constant" keeps it."""
    epochs: int = 10
    """PPO: passes over each batch."""
    minibatch_size: int = 64
    """PPO: rows per gradient step; TRPO: rows per value-function step."""
    seed: int = 0
    """Base seed; rank r uses SeedSequence(seed, spawn_key=(r,))."""
    checkpoint_every: int = 10
    """Write a checkpoint every this many iterations (and at the end)."""
    check_sync: bool = False
    """Verify after every broadcast that all ranks hold bit-identical learner state."""
    stall_timeout: float = 600.0
    """Abort the job when a rank waits this many seconds for the others in a collective (0: never)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.name != "env_id"}
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Outputs go to LOGDIR/<env>_<algo>_s<seed>_<time>/: config.json, progress.csv, tb/ (TensorBoard), "
               "checkpoints/, learning_curve.png.",
    )
    parser.add_argument("env_name", nargs="?", help="gymnasium env id; without a version the newest one "
                        "(Walker2d -> Walker2d-v5). Box observations, Box or Discrete actions.")
    parser.add_argument("--algo", choices=["trpo", "ppo"], default=defaults["algo"],
                        help="learning algorithm (default: %(default)s)")
    parser.add_argument("--nprocs", type=str, default=str(defaults["nprocs"]),
                        help="number of MPI processes; more than the cores is fine (default: %(default)s)")
    parser.add_argument("--gpu_pct", type=float, default=defaults["gpu_pct"],
                        help="fraction of GPU memory per process, in [0, 1]; 0 grows as needed; "
                             "ignored without a GPU (default: %(default)s)")
    parser.add_argument("--total_steps", type=int, default=defaults["total_steps"],
                        help="budget in environment steps over all ranks (default: %(default)s)")
    parser.add_argument("-n", "--num_episodes", type=int, default=None,
                        help="also stop after this many finished episodes (default: no episode limit)")
    parser.add_argument("-b", "--batch_size", type=int, default=defaults["batch_size"],
                        help="environment steps per iteration over all ranks, split across ranks by steps "
                             "(default: %(default)s)")
    parser.add_argument("--envs_per_rank", type=int, default=defaults["envs_per_rank"],
                        help="environments each process steps in lockstep with one batched policy call; more "
                             "spreads the policy's per-call cost (default: %(default)s)")
    parser.add_argument("--batch_split", choices=["even", "shared"], default=defaults["batch_split"],
                        help="'even': every process runs batch_size / nprocs steps (the same seed gives the same "
                             "results); 'shared': processes draw steps from one shared budget until the batch is "
                             "full, so none waits for a slowed-down one (faster when processes share cores or the "
                             "machine is busy; not reproducible bit for bit; one host only) (default: %(default)s)")
    parser.add_argument("-g", "--gamma", type=float, default=defaults["gamma"],
                        help="discount factor, in (0, 1] (default: %(default)s)")
    parser.add_argument("-l", "--lam", type=float, default=defaults["lam"],
                        help="GAE lambda, in (0, 1] (default: %(default)s)")
    parser.add_argument("-k", "--kl_targ", type=float, default=None,
                        help="TRPO: KL trust region (default 0.01); PPO: stop an update's epochs when KL "
                             "exceeds 1.5x this (default 0.02)")
    parser.add_argument("--hidden", type=str, default="64,64",
                        help="hidden layer sizes of the policy and value MLPs (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=defaults["lr"],
                        help="PPO Adam learning rate (default: %(default)s)")
    parser.add_argument("--lr_schedule", choices=["linear", "constant"], default=defaults["lr_schedule"],
                        help="PPO: 'linear' decays the learning rate to 0 over --total_steps (a --resume with "
                             "a new --total_steps follows the new budget), 'constant' keeps it (default: "
                             "%(default)s)")
    parser.add_argument("--epochs", type=int, default=defaults["epochs"],
                        help="PPO epochs per batch (default: %(default)s)")
    parser.add_argument("--minibatch_size", type=int, default=defaults["minibatch_size"],
                        help="PPO minibatch / TRPO value-function minibatch rows (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults["seed"], help="base seed (default: %(default)s)")
    parser.add_argument("--checkpoint_every", type=int, default=defaults["checkpoint_every"],
                        help="iterations between checkpoints (default: %(default)s)")
    parser.add_argument("--check_sync", action="store_true",
                        help="after every broadcast verify that all ranks hold bit-identical weights and normalizer "
                             "statistics (one small extra gather per iteration; logged as sync_ok)")
    parser.add_argument("--stall_timeout", type=float, default=TrainConfig.stall_timeout,
                        help="seconds a process may wait for the others at a gather or broadcast before the job "
                             "is aborted, naming the process that did not arrive; 0 waits forever "
                             "(default: %(default)s)")
    parser.add_argument("--logdir", type=str, default="runs",
                        help="directory that holds the run directories (default: %(default)s)")
    parser.add_argument("--resume", type=str, metavar="RUN_DIR", default=None,
                        help="continue the run in RUN_DIR from its newest good checkpoint; --nprocs and the "
                             "budget may be changed, the env and algorithm may not")
    parser.add_argument("--play", type=str, metavar="RUN_DIR", default=None,
                        help="run RUN_DIR's saved policy (deterministic) and print episode returns")
    parser.add_argument("--episodes", type=int, default=5, help="episodes for --play (default: %(default)s)")
    parser.add_argument("--video", type=str, metavar="FILE", default=None,
                        help="with --play, record the episodes: FILE.mp4 (needs imageio-ffmpeg) or FILE.gif, or "
                             "FILE.png for a strip of 8 frames of the first episode (MuJoCo renders offscreen; "
                             "MUJOCO_GL=egl is used when there is no display)")
    return parser.parse_args(argv)


def resolve_env_id(name: str) -> str:
    """Registered gymnasium id for ``name``: exact ids as they are, bare names to their newest version.

    "package.module:EnvId" imports the module (which registers the env) and keeps the prefix, so that
    gymnasium.make imports it again in every process, on --resume and on --play.
    """
    import importlib

    import gymnasium

    module, _, env_name = name.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(f"cannot import '{module}' to register environment '{env_name}': {error}") from None
    registry = gymnasium.envs.registry
    prefix = f"{module}:" if module else ""
    if env_name in registry:
        return prefix + env_name
    versions = [(int(m.group(1)), env_id) for env_id in registry
                if (m := re.fullmatch(re.escape(env_name) + r"-v(\d+)", env_id))]
    if versions:
        return prefix + max(versions)[1]
    close = difflib.get_close_matches(env_name, list(registry), n=3, cutoff=0.5)
    hint = f"; closest registered: {', '.join(close)}" if close else ""
    raise ValueError(f"unknown environment '{env_name}'{hint}")


def check_env_spaces(env_id: str) -> None:
    import gymnasium

    env = gymnasium.make(env_id)
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not (isinstance(obs_space, gymnasium.spaces.Box) and len(obs_space.shape) == 1):
        raise ValueError(f"{env_id} has observation space {obs_space}; only flat Box observations are supported")
    if not (isinstance(act_space, gymnasium.spaces.Discrete)
            or (isinstance(act_space, gymnasium.spaces.Box) and len(act_space.shape) == 1)):
        raise ValueError(f"{env_id} has action space {act_space}; only Discrete or flat Box actions are supported")


def load_saved_config(run_dir: Path) -> dict:
    """RUN_DIR/config.json as TrainConfig's keyword arguments, with the values older runs implied for fields
    they lack."""
    saved = json.loads((run_dir / "config.json").read_text())
    saved["hidden"] = tuple(saved["hidden"])
    saved.setdefault("lr_schedule", "constant")  # runs from before the schedule existed had a constant lr
    saved.setdefault("envs_per_rank", 1)
    saved.setdefault("batch_split", "even")
    return saved


def build_config(args: argparse.Namespace) -> tuple[TrainConfig, Path, bool]:
    """The run's config, its directory, and whether it resumes; ValueError with a one-line reason if bad."""
    nprocs_text = args.nprocs
    if not re.fullmatch(r"\d+", str(nprocs_text)) or int(nprocs_text) < 1:
        raise ValueError(f"--nprocs must be an integer >= 1, got '{nprocs_text}'")
    nprocs = int(nprocs_text)
    if not 0.0 <= args.gpu_pct <= 1.0:
        raise ValueError(f"--gpu_pct must be in [0, 1] (fraction of GPU memory per process), got {args.gpu_pct}")
    try:
        hidden = tuple(int(h) for h in args.hidden.split(","))
    except ValueError:
        raise ValueError(f"--hidden must be comma-separated layer sizes like 64,64, got '{args.hidden}'") from None
    if not hidden or min(hidden) < 1:
        raise ValueError(f"--hidden sizes must be positive, got '{args.hidden}'")

    if args.resume:
        run_dir = Path(args.resume)
        config_path = run_dir / "config.json"
        if not config_path.is_file():
            raise ValueError(f"--resume {run_dir}: not a run directory (no config.json)")
        saved = load_saved_config(run_dir)
        if args.env_name and resolve_env_id(args.env_name) != saved["env_id"]:
            raise ValueError(f"--resume {run_dir} is a {saved['env_id']} run, not {resolve_env_id(args.env_name)}")
        if "--algo" in sys.argv and args.algo != saved["algo"]:
            raise ValueError(f"--resume {run_dir} is a {saved['algo']} run, not {args.algo}")
        config = TrainConfig(**saved)
        config.nprocs, config.gpu_pct = nprocs, args.gpu_pct
        # A resumed run may get a new budget; the learning hyperparameters stay those of the run.
        config.total_steps = args.total_steps if "--total_steps" in sys.argv else config.total_steps
        config.num_episodes = args.num_episodes if args.num_episodes is not None else config.num_episodes
        config.check_sync = args.check_sync or config.check_sync
        config.batch_split = args.batch_split if "--batch_split" in sys.argv else config.batch_split
        config.stall_timeout = args.stall_timeout
    else:
        if not args.env_name:
            raise ValueError("name an environment, e.g. `python train.py Walker2d`, or pass --resume/--play RUN_DIR")
        config = TrainConfig(
            env_id=resolve_env_id(args.env_name), algo=args.algo, nprocs=nprocs, gpu_pct=args.gpu_pct,
            total_steps=args.total_steps, num_episodes=args.num_episodes, batch_size=args.batch_size,
            envs_per_rank=args.envs_per_rank, batch_split=args.batch_split,
            gamma=args.gamma, lam=args.lam, kl_targ=args.kl_targ, hidden=hidden, lr=args.lr,
            lr_schedule=args.lr_schedule, epochs=args.epochs,
            minibatch_size=args.minibatch_size, seed=args.seed, checkpoint_every=args.checkpoint_every,
            check_sync=args.check_sync, stall_timeout=args.stall_timeout,
        )
        run_dir = Path(os.environ.get(_RUN_DIR_VARIABLE) or unused_run_dir(
            Path(args.logdir) / f"{config.env_id}_{config.algo}_s{config.seed}_{time.strftime('%Y%m%d-%H%M%S')}"))
    check_config(config)
    return config, run_dir, bool(args.resume)


def lock_run_dir(run_dir: Path) -> object | None:
    """An exclusive lock on RUN_DIR/.lock (the open file holding it), or None when another job holds it.

    Two jobs writing one run directory (a --resume started while the old job still finishes) would interleave
    checkpoints and logs.
    """
    import fcntl

    handle = open(run_dir / ".lock", "a")  # noqa: SIM115  (kept open: closing it releases the lock)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def unused_run_dir(path: Path) -> Path:
    """``path``, or path-2, path-3, ... when runs started within the same second."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def check_config(config: TrainConfig) -> None:
    for name in ("total_steps", "batch_size", "envs_per_rank", "epochs", "minibatch_size", "checkpoint_every"):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name} must be at least 1, got {getattr(config, name)}")
    if config.num_episodes is not None and config.num_episodes < 1:
        raise ValueError(f"--num_episodes must be at least 1, got {config.num_episodes}")
    if config.batch_size < config.nprocs:
        raise ValueError(f"--batch_size {config.batch_size} is smaller than --nprocs {config.nprocs}; "
                         "every process needs at least one step per iteration")
    if config.batch_size < config.nprocs * config.envs_per_rank:
        raise ValueError(f"--batch_size {config.batch_size} is smaller than --nprocs x --envs_per_rank "
                         f"({config.nprocs} x {config.envs_per_rank}); every env needs at least one step per iteration")
    for name in ("gamma", "lam"):
        if not 0.0 < getattr(config, name) <= 1.0:
            raise ValueError(f"--{name} must be in (0, 1], got {getattr(config, name)}")
    if config.kl_targ is not None and not config.kl_targ > 0:
        raise ValueError(f"--kl_targ must be > 0, got {config.kl_targ}")
    if config.stall_timeout < 0:
        raise ValueError(f"--stall_timeout must be >= 0 seconds (0: never), got {config.stall_timeout}")
    if not config.lr > 0:
        raise ValueError(f"--lr must be > 0, got {config.lr}")
    check_env_spaces(config.env_id)


def as_numpy(value: object) -> np.ndarray:
    """A numpy copy of a tf.Variable or numpy array."""
    return value.numpy() if hasattr(value, "numpy") else np.array(value, copy=True)


def steps_of_rank(batch_size: int, nprocs: int, rank: int) -> int:
    """This rank's share of the batch: equal shares, the remainder one step each to the first ranks."""
    return batch_size // nprocs + (1 if rank < batch_size % nprocs else 0)


def main() -> int:
    args = parse_args()
    if args.play:
        from algos.play import play

        return play(Path(args.play), args.episodes, args.video)
    try:
        config, run_dir, resuming = build_config(args)
        if mpi_util.rank == 0 and not mpi_util.under_mpi_launcher():
            run_dir.mkdir(parents=True, exist_ok=True)
            probe = run_dir / ".write_test"
            probe.write_text("ok")
            probe.unlink()
            lock = lock_run_dir(run_dir)
            if lock is None:
                raise ValueError(f"{run_dir} is in use by another training job; wait for it to end")
            lock.close()  # rank 0 takes it again for the whole run
    except (ValueError, OSError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2

    os.environ[_RUN_DIR_VARIABLE] = str(run_dir)
    os.environ.setdefault(_TTY_VARIABLE, "1" if sys.stdout.isatty() else "0")
    fork = mpi_util.mpi_fork(config.nprocs, config.gpu_pct)
    if fork == "parent":
        return fork.returncode
    if mpi_util.nworkers != config.nprocs:  # started by an outside mpiexec: its size wins
        config.nprocs = mpi_util.nworkers
        check_config(config)
    return train(config, run_dir, resuming)


def train(config: TrainConfig, run_dir: Path, resuming: bool) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    rank, nprocs = mpi_util.rank, mpi_util.nworkers
    mpi_util.setup_gpu(config.gpu_pct)
    import gymnasium
    import tensorflow as tf

    from algos import PPO, TRPO, ActorCritic, PPOConfig, RolloutWorker, TRPOConfig
    from algos.checkpoint import list_checkpoints, load_latest_checkpoint, save_checkpoint
    from algos.env_state import restore_env, snapshot_env
    from algos.logger import RunLogger

    # Rank 0 alone runs the update: it gets every core while the workers wait (without spinning).
    tf.config.threading.set_intra_op_parallelism_threads((os.cpu_count() or 1) if rank == 0 else 1)
    tf.config.threading.set_inter_op_parallelism_threads(2 if rank == 0 else 1)
    tf.config.experimental.enable_op_determinism()  # same seed and nprocs, same results
    mpi_util.set_global_seeds(config.seed)
    mpi_util.set_stall_timeout(config.stall_timeout or None)

    # Ctrl-C or SIGTERM (mpiexec passes them on to every rank): finish the iteration, checkpoint, exit cleanly.
    # Rank 0's flag decides, through the broadcast counters, so every rank stops at the same iteration.
    stop_signals: list[int] = []

    def request_stop(signum: int, _frame: object) -> None:
        if stop_signals:
            raise KeyboardInterrupt  # a second signal: stop now, without a checkpoint
        stop_signals.append(signum)
        mpi_util.print0(f"received signal {signum}: stopping after this iteration with a checkpoint "
                        "(send it again to stop at once)")

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    envs = [gymnasium.make(config.env_id) for _ in range(config.envs_per_rank)]
    worker = RolloutWorker(envs, seed=mpi_util.rank_seed(config.seed, rank), gamma=config.gamma, lam=config.lam)
    action_rng = np.random.default_rng(np.random.SeedSequence(config.seed, spawn_key=(rank, 1)))
    ac = ActorCritic(envs[0].observation_space.shape[0], envs[0].action_space, hidden=config.hidden)
    learner: PPO | TRPO | None = None
    if rank == 0:
        if config.algo == "ppo":
            learner = PPO(ac, PPOConfig(lr=config.lr, epochs=config.epochs, minibatch_size=config.minibatch_size,
                                        target_kl=config.kl_targ or 0.02), seed=config.seed)
        else:
            learner = TRPO(ac, TRPOConfig(max_kl=config.kl_targ or 0.01, vf_minibatch_size=config.minibatch_size),
                           seed=config.seed)

    # counters: [iteration, total_steps, total_episodes, stop]; rank 0 owns them and broadcasts them
    # with the weights, so every rank agrees on when to stop.
    counters = np.zeros(4, dtype=np.int64)
    elapsed_before = 0.0
    if resuming:
        per_rank_state = None
        if rank == 0:
            path, state, warnings = load_latest_checkpoint(run_dir / "checkpoints")
            for warning in warnings:
                mpi_util.print0(f"train.py: warning: {warning}")
            for var, value in zip(ac.broadcast_state(), state["ac_state"], strict=True):
                if isinstance(var, np.ndarray):
                    var[...] = value
                else:
                    var.assign(value)
            learner.set_optimizer_state(state["optimizer"])
            learner.set_rng_state(state["learner_rng"])
            counters[:3] = state["counters"][:3]
            elapsed_before = state["elapsed_s"]
            same_layout = state["nprocs"] == nprocs
            per_rank_state = state["ranks"] if same_layout else [None] * nprocs
            mpi_util.print0(f"resuming {run_dir} from {path.name}: iteration {counters[0]}, step {counters[1]}"
                            + ("" if same_layout else f" (was {state['nprocs']} processes: fresh episodes)"))
        mine = mpi_util.COMM_WORLD.scatter(per_rank_state, root=0)
        if mine is not None:
            # Checkpoints from before several envs per rank hold one env under "env".
            worker.envs = [restore_env(blob) for blob in mine.get("envs", [mine.get("env")])]
            worker.restore_episode(mine["episode"])
            action_rng.bit_generator.state = mine["action_rng"]
        else:
            fresh_seed = np.random.SeedSequence(config.seed, spawn_key=(rank, 2, int(counters[0]))).generate_state(1)
            worker = RolloutWorker([gymnasium.make(config.env_id) for _ in range(config.envs_per_rank)],
                                   seed=int(fresh_seed[0]), gamma=config.gamma, lam=config.lam)

    def budget_spent() -> bool:
        return bool(counters[1] >= config.total_steps
                    or (config.num_episodes is not None and counters[2] >= config.num_episodes))

    logger = None
    if rank == 0:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            run_lock = lock_run_dir(run_dir)  # held until this process exits
            if run_lock is None:
                mpi_util.abort(f"train.py: error: {run_dir} is in use by another training job; wait for it to end")
            (run_dir / "config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
            logger = RunLogger(run_dir, config.total_steps, progress_bar=os.environ.get(_TTY_VARIABLE) == "1",
                               resume=resuming)
            if resuming:
                logger.truncate_after(int(counters[0]))
        except OSError as error:
            mpi_util.abort(f"train.py: error: cannot write the run directory {run_dir}: {error}")
        counters[3] = budget_spent()
        mpi_util.print0(f"{config.algo.upper()} on {config.env_id}: {nprocs} processes, batch {config.batch_size} "
                        f"steps, budget {config.total_steps} steps; run directory {run_dir}")

    broadcast_state = [*ac.broadcast_state(), counters]
    mpi_util.rank0_bcast_wts(broadcast_state)  # every rank starts from rank 0's weights and counters
    my_steps = steps_of_rank(config.batch_size, nprocs, rank)
    budget = None
    if config.batch_split == "shared" and nprocs > 1:
        try:
            budget = mpi_util.SharedBudget(config.batch_size)
        except ValueError as error:
            mpi_util.abort(f"train.py: error: --batch_split shared: {error}")
        my_steps = config.batch_size  # the most one rank may draw
    started = time.monotonic()

    def checkpoint() -> None:
        # Every rank's episode state and RNG goes to rank 0 (small pickles), which writes one file.
        mine = {"envs": [snapshot_env(env) for env in worker.envs], "episode": worker.episode_state(),
                "action_rng": action_rng.bit_generator.state}
        ranks_state = mpi_util.COMM_WORLD.gather(mine, root=0)
        if rank == 0:
            try:
                save_checkpoint(run_dir / "checkpoints", int(counters[0]), {
                    "config": asdict(config), "nprocs": nprocs, "counters": counters.copy(),
                    "elapsed_s": elapsed_before + time.monotonic() - started,
                    "ac_state": [as_numpy(v) for v in ac.broadcast_state()],
                    "optimizer": learner.optimizer_state(), "learner_rng": learner.rng_state(),
                    "ranks": ranks_state,
                })
            except OSError as error:
                kept = list_checkpoints(run_dir / "checkpoints")
                mpi_util.abort(f"train.py: error: cannot write the checkpoint of iteration {counters[0]} in "
                               f"{run_dir / 'checkpoints'}: {error.strerror or error}; the last good checkpoint, "
                               f"{kept[-1].name if kept else 'none'}, is untouched")

    while not counters[3]:
        t0 = time.monotonic()
        batch, episodes = worker.collect(my_steps, ac.numpy_actor(), action_rng, budget.take if budget else None)
        t1 = time.monotonic()
        batch = mpi_util.rank0_accum_batches(batch)
        episodes = mpi_util.rank0_accum_batches(episodes)
        t2 = time.monotonic()
        if budget is not None and rank == 0:
            budget.refill()  # every rank has stopped drawing (it is past the gather); none starts before the bcast
        if rank == 0 and len(batch["adv"]) != config.batch_size:
            raise RuntimeError(f"gathered {len(batch['adv'])} steps, expected --batch_size {config.batch_size}")
        stats: dict[str, float] = {}
        if rank == 0:
            if config.algo == "ppo" and config.lr_schedule == "linear":
                # The fraction of the step budget still ahead, counting this batch: the first update uses lr,
                # the last about lr / iterations (a resume with a smaller budget floors it at 0).
                learner.set_learning_rate(config.lr * max(0.0, 1.0 - counters[1] / config.total_steps))
            stats = learner.update(batch["obs"], batch["act"], batch["adv"], batch["ret"])
            counters[0] += 1
            counters[1] += config.batch_size
            counters[2] += len(episodes["ep_return"])
            counters[3] = budget_spent() or bool(stop_signals)
        t3 = time.monotonic()
        mpi_util.rank0_bcast_wts(broadcast_state)
        t4 = time.monotonic()
        sync_ok = math.nan
        if config.check_sync:
            digest = hashlib.sha256(b"".join(as_numpy(v).tobytes() for v in broadcast_state)).digest()
            digests = mpi_util.rank0_accum_batches({"sha256": np.frombuffer(digest, np.uint8)[None]})["sha256"]
            if rank == 0:
                sync_ok = float(bool(np.all(digests == digests[0])))
                if not sync_ok:
                    raise RuntimeError(f"ranks hold different learner state after iteration {counters[0]}: "
                                       f"rank(s) {np.nonzero(np.any(digests != digests[0], axis=1))[0].tolist()}")
        if rank == 0:
            returns = episodes["ep_return"]
            row = {
                "iteration": int(counters[0]), "total_steps": int(counters[1]), "total_episodes": int(counters[2]),
                "ep_return_mean": float(returns.mean()) if len(returns) else math.nan,
                "ep_return_min": float(returns.min()) if len(returns) else math.nan,
                "ep_return_max": float(returns.max()) if len(returns) else math.nan,
                "ep_length_mean": float(episodes["ep_length"].mean()) if len(returns) else math.nan,
                "episodes": len(returns), "steps_per_s": config.batch_size / (t4 - t0),
                **{key: float(value) for key, value in stats.items()},
                "t_rollout": t1 - t0, "t_gather": t2 - t1, "t_update": t3 - t2, "t_bcast": t4 - t3,
                "wall_s": elapsed_before + t4 - started, "sync_ok": sync_ok,
            }
            try:
                logger.log(row)
            except OSError as error:
                mpi_util.abort(f"train.py: error: cannot write the logs in {run_dir}: {error}")
        if counters[0] % config.checkpoint_every == 0 or counters[3]:
            checkpoint()

    # Training is over and checkpointed: a late Ctrl-C / SIGTERM must not kill a rank while MPI shuts down
    # (Python restores the default handlers at exit, before MPI_Finalize), which would turn a clean end into a
    # failed job.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if rank == 0:
        logger.close()
        from algos.plot import plot_runs

        plot_runs([run_dir], run_dir / "learning_curve.png")
        if stop_signals:
            mpi_util.print0(f"stopped by signal {stop_signals[0]} after iteration {int(counters[0])}; checkpoint "
                            f"written; continue with: python train.py --resume {run_dir}")
        mpi_util.print0(f"done: {int(counters[1])} steps, {int(counters[2])} episodes in "
                        f"{elapsed_before + time.monotonic() - started:.0f} s; run directory {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
