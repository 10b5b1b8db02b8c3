"""train.py's configuration: TrainConfig (what defines a run, saved as RUN_DIR/config.json), built from the command
line or, on --resume, from the run's config.json, and checked before any process starts.

Imports neither TensorFlow nor MPI: the launcher builds and checks the configuration before it starts the job.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

from algos.registry import ALGORITHMS
from algos.run_dir import RUN_DIR_VARIABLE, run_dir_name


@dataclass
class TrainConfig:
    """Everything that defines a run; saved as RUN_DIR/config.json."""

    env_id: str
    """Resolved gymnasium id, e.g. Walker2d-v5."""
    algo: str = "ppo"
    """The learning algorithm: a name in algos.registry.ALGORITHMS (ppo, trpo, ...)."""
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
    """Abort the job when a rank that has not reached a collective shows no progress (env steps, update epochs) for
    this long: "auto" (60 s, or 10x the longest pause seen once each collective is past its first two calls; 120 s
    before a rank's first step), a number of seconds, or 0 (never)."""
    stop_grace: float = 30.0
    """After a stop request (Ctrl-C, SIGTERM), seconds the ranks wait for each other before the job ends without a
    final checkpoint: a scheduler that preempts a job usually allows 30 s or more before it kills it."""
    config_version: int = 2
    """Layout of config.json: 1 before lr applied to TRPO (whose value function then always learned at 1e-3)."""



# What a resumed run may change; every other setting defines the run and comes from its config.json.
_RESUMABLE = ("nprocs", "gpu_pct", "total_steps", "num_episodes", "checkpoint_every", "check_sync", "batch_split",
              "stall_timeout", "stop_grace")


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
        config.lr = config.lr if config.lr is not None else ALGORITHMS[config.algo].default_lr
        if config.policy_lag and "batch_split" not in given:
            config.batch_split = "shared"  # with even shares rank 0 rolls out its own after the update: no gain
        # Only a name: rank 0 creates it (create_run_dir), which is what makes it unique.
        run_dir = Path(os.environ.get(RUN_DIR_VARIABLE)
                       or Path(args.logdir) / run_dir_name(config.env_id, config.algo, config.seed))
    check_config(config)
    return config, run_dir, bool(args.resume)



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
    if config.algo not in ALGORITHMS:
        raise ValueError(f"--algo {config.algo} is not one this train.py knows ({', '.join(ALGORITHMS)})")
    if not config.lr > 0:
        raise ValueError(f"--lr must be > 0, got {config.lr}")
    check_env_spaces(config.env_id)
