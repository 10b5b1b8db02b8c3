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
import json
import math
import os
import platform
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from algos.kernels import pin_numeric_kernels

pin_numeric_kernels()  # before numpy loads OpenBLAS: the same kernels and threads on every machine and rank

import numpy as np  # noqa: E402

try:
    import mpi_util
except ImportError as error:  # no MPI library: say so in one line, not a traceback
    print(f"train.py: error: {error}", file=sys.stderr)
    sys.exit(2)
from algos.run_dir import RunDirInUseError, RunDirLock, create_run_dir, lock_run_dir, run_dir_name  # noqa: E402
from algos.versions import stack_versions, version_changes  # noqa: E402
from mpi_util.supervise import check_process_room  # noqa: E402

_RUN_DIR_VARIABLE = "MPI_BATCH_RL_RUN_DIR"  # the new run's directory for rank 0 (set by mpi_fork's parent)
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
    """Fraction of a GPU's memory rank 0 (the only process that runs TensorFlow) may take (0: grow as needed)."""
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
    policy_lag: int = 0
    """0: every rank waits for rank 0's update before it rolls out again. 1: the ranks roll out the next batch with
    the weights they have while rank 0 learns from the last one, each batch learned from one update late and
    importance-weighted for it (decoupled PPO); faster where the update would leave the others waiting, with the
    shared batch split (its default then)."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.95
    """GAE lambda."""
    kl_targ: float | None = None
    """TRPO: the KL trust region (default 0.01); PPO: early-stop epochs beyond 1.5x this KL (default 0.02)."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the policy and value MLPs."""
    lr: float | None = None
    """PPO: Adam learning rate (3e-4 when not given). TRPO: the value function's Adam learning rate (1e-3 when not
    given). config.json records the value used."""
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
    stall_timeout: float | str = "auto"
    """Abort the job when a rank waits this long for the others in a collective: "auto" (the first two calls of each
    collective may wait 10 minutes, later ones 10x the slowest wait seen so far, at least 60 s), a number of seconds,
    or 0 (never)."""
    stop_grace: float = 30.0
    """After a stop request (Ctrl-C, SIGTERM), seconds the ranks wait for each other before the job ends without a
    final checkpoint: a scheduler that preempts a job usually allows 30 s or more before it kills it."""
    config_version: int = 2
    """Layout of config.json: 1 before lr applied to TRPO (whose value function then always learned at 1e-3)."""


_DEFAULT_LR = {"ppo": 3e-4, "trpo": 1e-3}
# What a resumed run may change; every other setting defines the run and comes from its config.json.
_RESUMABLE = ("nprocs", "gpu_pct", "total_steps", "num_episodes", "checkpoint_every", "check_sync", "batch_split",
              "stall_timeout", "stop_grace")


def _default(name: str) -> str:
    """TrainConfig's default for ``name`` as --help shows it."""
    value = next(f.default for f in fields(TrainConfig) if f.name == name)
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; an option not given is None, so that --resume can tell what the user asked to change."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Outputs go to LOGDIR/<env>_<algo>_s<seed>_<time>/: config.json, progress.csv, tb/ (TensorBoard), "
               "checkpoints/, learning_curve.png.",
    )
    parser.add_argument("env_name", nargs="?", help="gymnasium env id; without a version the newest one "
                        "(Walker2d -> Walker2d-v5). Box observations, Box or Discrete actions.")
    parser.add_argument("--algo", choices=["trpo", "ppo"],
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
    they lack; ValueError with a one-line reason when it is not a run's configuration."""
    path = run_dir / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--resume {run_dir}: cannot read {path}: {error}") from None
    missing = [name for name in ("env_id", "algo", "hidden") if not isinstance(saved, dict) or name not in saved]
    if missing:
        raise ValueError(f"--resume {run_dir}: {path} is not a train.py run's configuration (no "
                         f"{', '.join(missing)}); pass the directory of a run that train.py started")
    # config.json also records the job (CPUs, threads): only TrainConfig's fields define the run.
    saved = {name: value for name, value in saved.items() if name in {f.name for f in fields(TrainConfig)}}
    saved["hidden"] = tuple(saved["hidden"])
    saved.setdefault("lr_schedule", "constant")  # runs from before the schedule existed had a constant lr
    saved.setdefault("envs_per_rank", 1)
    saved.setdefault("batch_split", "even")
    saved.setdefault("policy_lag", 0)
    if saved.get("config_version", 1) < 2:
        if saved["algo"] == "trpo":
            saved["lr"] = 1e-3  # what TRPO's value function used, whatever lr said
        saved["config_version"] = 2
    return saved


def explicit_settings(args: argparse.Namespace) -> dict:
    """The TrainConfig fields the user set on the command line, parsed; ValueError with a one-line reason if bad."""
    names = {f.name for f in fields(TrainConfig)}
    given = {name: value for name, value in vars(args).items() if name in names and value is not None}
    if "nprocs" in given:
        if not re.fullmatch(r"\d+", given["nprocs"]) or int(given["nprocs"]) < 1:
            raise ValueError(f"--nprocs must be an integer >= 1, got '{given['nprocs']}'")
        given["nprocs"] = int(given["nprocs"])
    if "hidden" in given:
        try:
            given["hidden"] = tuple(int(h) for h in given["hidden"].split(","))
        except ValueError:
            raise ValueError(f"--hidden must be comma-separated layer sizes like 64,64, got '{args.hidden}'") from None
        if min(given["hidden"]) < 1:
            raise ValueError(f"--hidden sizes must be positive, got '{args.hidden}'")
    if "stall_timeout" in given and given["stall_timeout"] != "auto":
        try:
            given["stall_timeout"] = float(given["stall_timeout"])
        except ValueError:
            raise ValueError(f"--stall_timeout must be 'auto' or a number of seconds, got '{args.stall_timeout}'") \
                from None
    return given


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


def restart_from_newest_checkpoint(run_dir: Path) -> Callable[[mpi_util.JobFailure], list[str]]:
    """mpi_fork's on_failure for --max_restarts: this command again, resuming RUN_DIR from its newest checkpoint
    (or from the start when it has none yet; the run directory stays the same), said in one line."""
    def restart(failure: mpi_util.JobFailure) -> list[str]:
        from algos.checkpoint import list_checkpoints

        kept = list_checkpoints(run_dir / "checkpoints")
        print(f"train.py: {failure.cause}; restarting "
              + (f"from checkpoint {kept[-1].stem}" if kept else "from the start (no checkpoint yet)")
              + f" (restart {failure.restart} of {failure.max_restarts})", file=sys.stderr, flush=True)
        return [*sys.argv[1:], "--resume", str(run_dir)] if kept else sys.argv[1:]

    return restart


def build_config(args: argparse.Namespace) -> tuple[TrainConfig, Path, bool]:
    """The run's config, its directory, and whether it resumes; ValueError with a one-line reason if bad."""
    from algos.checkpoint import CheckpointError, load_latest_checkpoint

    given = explicit_settings(args)
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.json").is_file():
            raise ValueError(f"--resume {run_dir}: not a run directory (no config.json)")
        saved = load_saved_config(run_dir)
        if args.env_name and resolve_env_id(args.env_name) != saved["env_id"]:
            raise ValueError(f"--resume {run_dir} is a {saved['env_id']} run, not {resolve_env_id(args.env_name)}")
        if given.get("algo", saved["algo"]) != saved["algo"]:
            raise ValueError(f"--resume {run_dir} is a {saved['algo']} run, not {given['algo']}")
        for name, value in given.items():
            if name not in _RESUMABLE and value != saved[name]:
                raise ValueError(f"--resume {run_dir}: --{name} is {saved[name]} in this run and cannot be changed "
                                 f"when resuming (drop --{name}, or start a new run)")
        try:  # the same read restore() does, so that a run with nothing to continue from is one line now
            load_latest_checkpoint(run_dir / "checkpoints")
        except CheckpointError as error:
            raise ValueError(f"--resume {run_dir}: {error}; there is nothing to continue from: start a new run") \
                from None
        # The resumed run keeps its settings, its number of processes included (the same count continues exactly);
        # what may change is the budget and how the job runs.
        config = TrainConfig(**{**saved, **given})
    else:
        if not args.env_name:
            raise ValueError("name an environment, e.g. `python train.py Walker2d`, or pass --resume/--play RUN_DIR")
        config = TrainConfig(env_id=resolve_env_id(args.env_name), **given)
        config.lr = config.lr if config.lr is not None else _DEFAULT_LR[config.algo]
        if config.policy_lag and "batch_split" not in given:
            config.batch_split = "shared"  # with even shares rank 0 rolls out its own after the update: no gain
        # Only a name: rank 0 creates it (create_run_dir), which is what makes it unique.
        run_dir = Path(os.environ.get(_RUN_DIR_VARIABLE)
                       or Path(args.logdir) / run_dir_name(config.env_id, config.algo, config.seed))
    check_config(config)
    return config, run_dir, bool(args.resume)


def prepare_run_dir(run_dir: Path, logdir: str, new: bool) -> Path:
    """Create RUN_DIR (``new``: as a new run's directory, which create_run_dir makes unique) and write, then remove, a
    file at the longest path the run will write (its TensorBoard file), so that a directory the run cannot use fails
    now, in one line, not after start-up. What this call made is removed again on failure: a stub left behind would
    pass for a run. Returns the directory created."""
    import errno
    import shutil

    existing = next((p for p in [run_dir, *run_dir.parents] if p.exists()), None)
    longest = run_dir / "tb" / f"events.out.tfevents.{int(time.time())}.{platform.node()}.{'0' * 10}"
    try:
        if new:
            run_dir = create_run_dir(run_dir)
            longest = run_dir / "tb" / longest.name
        new_tb = not longest.parent.exists()
        longest.parent.mkdir(parents=True, exist_ok=True)
        longest.write_text("ok")
        longest.unlink()
        if new_tb:
            longest.parent.rmdir()
    except OSError as error:
        if existing is not None and existing != run_dir:  # from the first directory this call made, down
            shutil.rmtree(next(p for p in [run_dir, *run_dir.parents] if p.parent == existing), ignore_errors=True)
        if error.errno == errno.ENAMETOOLONG:
            raise ValueError(f"--logdir {logdir}: the run's files would have paths too long for this system "
                             f"({len(str(longest.resolve()))} characters, such as {longest.name}); "
                             "choose a shorter --logdir") from None
        raise
    return run_dir


def check_config(config: TrainConfig) -> None:
    """ValueError with a one-line reason for a setting train.py cannot run with."""
    for name in ("gpu_pct", "gamma", "lam", "kl_targ", "lr", "stall_timeout", "stop_grace"):
        value = getattr(config, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{name} must be a finite number, got {value}")
    if config.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {config.seed}")
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
    if config.stall_timeout != "auto" and not config.stall_timeout >= 0:
        raise ValueError(f"--stall_timeout must be 'auto' or >= 0 seconds (0: never), got {config.stall_timeout}")
    if not config.stop_grace > 0:
        raise ValueError(f"--stop_grace must be > 0 seconds, got {config.stop_grace}")
    if not 0.0 <= config.gpu_pct <= 1.0:
        raise ValueError(f"--gpu_pct must be in [0, 1] (fraction of GPU memory per process), got {config.gpu_pct}")
    if not config.lr > 0:
        raise ValueError(f"--lr must be > 0, got {config.lr}")
    check_env_spaces(config.env_id)


def as_numpy(value: object) -> np.ndarray:
    """A numpy copy of a tf.Variable or numpy array."""
    return value.numpy() if hasattr(value, "numpy") else np.array(value, copy=True)


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
        return main_in_rank(args)
    missing = missing_modules(_WORKER_MODULES if args.play else _RL_MODULES)
    if missing:
        print(f"train.py: error: {missing_modules_message(missing)}", file=sys.stderr)
        return 2
    if args.play:
        from algos.play import play

        return play(Path(args.play), args.episodes, args.video)
    try:
        config, run_dir, resuming = build_config(args)
        launch = launch_settings(args, config.nprocs)
        if config.nprocs > 1 and "hostfile" not in launch:
            check_process_room(config.nprocs)  # before the run directory exists: a refused job leaves nothing
        run_dir = prepare_run_dir(run_dir, args.logdir, new=not resuming and _RUN_DIR_VARIABLE not in os.environ)
        lock_run_dir(run_dir).release()  # in use by another job: RunDirInUseError; rank 0 locks it for the run
    except (ValueError, OSError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2

    os.environ[_RUN_DIR_VARIABLE] = str(run_dir)
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
            run_dir = prepare_run_dir(run_dir, args.logdir, new=not resuming and _RUN_DIR_VARIABLE not in os.environ)
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
    """Ctrl-C or SIGTERM (mpiexec passes them on to every rank): finish the iteration, checkpoint, exit cleanly.

    Rank 0's request decides, through the broadcast counters, so every rank stops after the same iteration. From the
    request on, every rank waits at most ``grace_s`` (--stop_grace) for the others (mpi_util.stall_deadline): a rank
    that hangs ends the job then, named, instead of holding it for the whole stall timeout. A second signal stops at
    once.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signum: int | None = None
        self.announced = False
        signal.signal(signal.SIGINT, self._request)
        signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum: int, _frame: object) -> None:
        # No I/O here: the signal may land while this rank writes to the same stream (its line, the progress bar),
        # and a write from the handler then fails with a reentrant-call RuntimeError. announce() prints it.
        if self.signum is not None:
            raise KeyboardInterrupt  # a second signal: stop now, without a checkpoint
        self.signum = signum
        mpi_util.stall_deadline(self.grace_s, f"{self.grace_s:g} s after the stop request (signal {signum})")

    def announce(self) -> None:
        """Say once, from the loop, that a stop was requested."""
        if self.signum is not None and not self.announced:
            self.announced = True
            mpi_util.print0(f"received signal {self.signum}: stopping after this iteration with a checkpoint "
                            "(send it again to stop at once)")

    @staticmethod
    def ignore_from_now_on() -> None:
        """Training is over and checkpointed: a late Ctrl-C / SIGTERM must not kill a rank while MPI shuts down
        (Python restores the default handlers at exit, before MPI_Finalize), which would fail a clean job."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def train(config: TrainConfig, run_dir: Path, resuming: bool) -> int:
    """The loop every rank runs: roll out, gather to rank 0, rank 0 updates, broadcast.

    Only rank 0 imports TensorFlow: it holds the actor-critic and the PPO / TRPO update. The other ranks act with
    numpy copies of rank 0's weights and normalizers, received into arrays of the same shapes.
    """
    import gymnasium

    from algos.numpy_actor import NumpyActor, actor_critic_state_like

    rank, nprocs = mpi_util.rank, mpi_util.nworkers
    mpi_util.set_global_seeds(config.seed)
    mpi_util.set_stall_timeout(config.stall_timeout)  # 0: never, as MPI_UTIL_STALL_TIMEOUT=0
    stop = StopRequest(config.stop_grace)
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
        worker, action_rng, elapsed_before = restore(config, run_dir, learner, counters, worker, action_rng)
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
                stop.announce()
                if not config.policy_lag:
                    stats, episodes = learner.update(counters)
                counters.stop = counters.stop or stop.signum is not None
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
        if stop.signum is None:
            raise
        from algos.checkpoint import list_checkpoints

        kept = list_checkpoints(run_dir / "checkpoints")
        mpi_util.abort(f"train.py: {error}. The job ends without a final checkpoint; the last good one, "
                       f"{kept[-1].name if kept else 'none'}, is kept: continue with "
                       f"python train.py --resume {run_dir}")

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
    """Rank 0's side: the TensorFlow actor-critic, the PPO or TRPO update, and the run directory's logs."""

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

        from algos import PPO, TRPO, ActorCritic, PPOConfig, TRPOConfig

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
        if config.algo == "ppo":
            self.algo = PPO(self.ac, PPOConfig(lr=config.lr, epochs=config.epochs,
                                               minibatch_size=config.minibatch_size,
                                               target_kl=config.kl_targ or 0.02), seed=config.seed)
        else:
            self.algo = TRPO(self.ac, TRPOConfig(max_kl=config.kl_targ or 0.01, vf_lr=config.lr,
                                                 vf_minibatch_size=config.minibatch_size), seed=config.seed)
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
            record = {**asdict(self.config), **job, "rank0_cpus": self.cpus, **self.threads, "versions": self.versions}
            (self.run_dir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
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
        """One PPO / TRPO update on the batch held; advances the counters and sets counters.stop when the budget is
        spent. Returns the update's statistics and the episodes of the batch it learned from."""
        config = self.config
        batch, episodes, behavior_logp = self.pending
        self.pending = None
        if config.algo == "ppo" and config.lr_schedule == "linear":
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


def restore(config: TrainConfig, run_dir: Path, learner: Learner | None, counters: Counters, worker: object,
            action_rng: np.random.Generator) -> tuple:
    """Continue from the newest good checkpoint: rank 0 loads the learner (weights, optimizer, RNG, counters); every
    rank gets its own environments, episode state and action RNG back, or, when --nprocs changed, fresh episodes.
    Returns (worker, action_rng, training seconds before this run)."""
    from algos.checkpoint import load_latest_checkpoint
    from algos.env_state import restore_env

    rank, nprocs = mpi_util.rank, mpi_util.nworkers
    per_rank_state, elapsed_before = None, 0.0
    if learner:
        path, state, warnings = load_latest_checkpoint(run_dir / "checkpoints")
        for warning in warnings:
            mpi_util.print0(f"train.py: warning: {warning}")
        changes = version_changes(state.get("versions", {}), learner.versions)
        if changes:
            mpi_util.print0(f"train.py: warning: {path.name} was written with other versions ({', '.join(changes)}); "
                            "the run continues, but not bit for bit as it would have")
        for var, value in zip(learner.ac.broadcast_state(), state["ac_state"], strict=True):
            if isinstance(var, np.ndarray):
                var[...] = value
            else:
                var.assign(value)
        learner.algo.set_optimizer_state(state["optimizer"])
        learner.algo.set_rng_state(state["learner_rng"])
        counters.array[:3] = state["counters"][:3]
        if state.get("pending") is not None:  # --policy_lag 1: the batch gathered before the stop, not learned yet
            learner.hold(*state["pending"], counters)
        elapsed_before = state["elapsed_s"]
        same_layout = state["nprocs"] == nprocs
        per_rank_state = state["ranks"] if same_layout else None
        mpi_util.print0(f"resuming {run_dir} from {path.name}: iteration {counters.iteration}, step "
                        f"{counters.total_steps}" + ("" if same_layout else
                                                     f" (was {state['nprocs']} processes: fresh episodes)"))
    # Every rank's state travels to all (a few tens of kB each); each keeps its own.
    per_rank_state, iteration = mpi_util.bcast_object((per_rank_state, counters.iteration))
    if per_rank_state is None:
        worker, _ = make_rollout_worker(config, rank, seed_path=(2, iteration))
        return worker, action_rng, elapsed_before
    mine = per_rank_state[rank]
    # Checkpoints from before several envs per rank hold one env under "env".
    worker.envs = [restore_env(blob) for blob in mine.get("envs", [mine.get("env")])]
    worker.restore_episode(mine["episode"])
    action_rng.bit_generator.state = mine["action_rng"]
    return worker, action_rng, elapsed_before


def checkpoint(run_dir: Path, learner: Learner | None, counters: Counters, worker: object,
               action_rng: np.random.Generator, nprocs: int, elapsed_s: float) -> None:
    """Every rank's episode state and RNG go to rank 0 (small pickles), which writes one file with the learner."""
    from algos.checkpoint import list_checkpoints, save_checkpoint
    from algos.env_state import snapshot_env

    mine = {"envs": [snapshot_env(env) for env in worker.envs], "episode": worker.episode_state(),
            "action_rng": action_rng.bit_generator.state}
    ranks_state = mpi_util.gather_objects(mine)
    if not learner:
        return
    try:
        save_checkpoint(run_dir / "checkpoints", counters.iteration, {
            "config": asdict(learner.config), "nprocs": nprocs, "counters": counters.array.copy(),
            "elapsed_s": elapsed_s, "ac_state": [as_numpy(v) for v in learner.ac.broadcast_state()],
            "optimizer": learner.algo.optimizer_state(), "learner_rng": learner.algo.rng_state(),
            "ranks": ranks_state, "versions": learner.versions, "pending": learner.pending,
        })
    except OSError as error:
        kept = list_checkpoints(run_dir / "checkpoints")
        mpi_util.abort(f"train.py: error: cannot write the checkpoint of iteration {counters.iteration} in "
                       f"{run_dir / 'checkpoints'}: {error.strerror or error}; the last good checkpoint, "
                       f"{kept[-1].name if kept else 'none'}, is untouched")


def check_sync(learner_state: list, counters: Counters) -> float:
    """1.0 when every rank holds bit-identical learner state after the broadcast; raises otherwise."""
    out_of_sync = mpi_util.ranks_out_of_sync(learner_state)
    if out_of_sync:
        raise RuntimeError(f"ranks hold different learner state after iteration {counters.iteration}: "
                           f"rank(s) {out_of_sync}")
    return 1.0


if __name__ == "__main__":
    sys.exit(main())
