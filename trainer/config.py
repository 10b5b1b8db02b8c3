"""train.py's configuration: TrainConfig (what defines a run, saved as RUN_DIR/config.json), built from the command
line or, on --resume, from the run's config.json, and checked before any process starts.

Imports neither TensorFlow nor MPI: the launcher builds and checks the configuration before it starts the job.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import math
import re
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

import mpi_util
from algos.registry import ADVANTAGE_NORMALIZATIONS, ALGORITHMS, ENVS_IN_ALL, VALUE_LOSSES, VALUE_TARGETS
from algos.spaces import PRECISIONS
from trainer.run_dir import run_dir_name
from trainer.versions import cpu_model_and_flags

ALGORITHM_DEFAULT = None
"""The default of a setting the algorithm owns (algos.registry.AlgorithmSpec.defaults): filled in by build_config."""


def setting(default: Any, help: str, *, short: str | None = None,
            choices: tuple | Callable[[], tuple] | None = None, metavar: str | None = None, text: bool = False) -> Any:
    """A TrainConfig field that is also a train.py option: its default and its --help text, written once here.
    ``choices``: the values allowed, or a function that lists them when the command line is parsed. ``text``: the
    option is parsed from its text by explicit_settings (a number or a word, a comma list)."""
    return field(default=default, metadata={"help": help, "short": short, "choices": choices, "metavar": metavar,
                                            "text": text})


@dataclass
class TrainConfig:
    """Everything that defines a run; saved as RUN_DIR/config.json. Each field but env_id and config_version is the
    train.py option of the same name (trainer.options builds the command line from these fields)."""

    env_id: str
    """Resolved gymnasium id, e.g. Walker2d-v5."""
    algo: str = setting("ppo", "learning algorithm", choices=lambda: tuple(ALGORITHMS))
    nprocs: int = setting(1, "number of MPI processes; more than the cores is fine; under mpiexec, mpirun or srun the "
                             "launcher's count is used", text=True)
    gpu_pct: float = setting(0.0, "fraction of GPU memory for rank 0, the one process that runs TensorFlow, in [0, 1]; "
                                  "0 grows as needed; ignored without a GPU")
    total_steps: int = setting(1_000_000, "budget in environment steps over all ranks")
    num_episodes: int | None = setting(None, "also stop after this many finished episodes (default: no episode "
                                             "limit)", short="-n")
    batch_size: int = setting(2048, "environment steps per iteration over all ranks, split across ranks by steps",
                              short="-b")
    envs_per_rank: int = setting(1, "environments each process steps in lockstep with one batched policy call; more "
                                    "spreads the policy's per-call cost")
    batch_split: str = setting(
        "even", "'even': every process runs batch_size / nprocs steps (the same seed gives the same results); "
                "'shared': processes draw steps from one shared budget until the batch is full, so none waits for a "
                "slowed-down one (faster when processes share cores or the machine is busy; not reproducible bit "
                "for bit; one host only)", choices=("even", "shared"))
    policy_lag: int = setting(
        0, "1: the processes roll out the next batch with the current weights while rank 0 learns from the last one "
           "(one update of policy lag, importance-weighted); faster when the update leaves cores idle (an MLP's), "
           "slower when it uses every core (an image network's on a small host); --batch_split then defaults to "
           "'shared'", choices=(0, 1))
    gamma: float = setting(0.99, "discount factor, in (0, 1]", short="-g")
    lam: float = setting(0.95, "GAE lambda, in (0, 1]", short="-l")
    kl_targ: float | None = setting(ALGORITHM_DEFAULT, "TRPO: KL trust region; PPO: stop an update's epochs when KL "
                                                       "exceeds 1.5x this, 0 never", short="-k")
    hidden: tuple[int, ...] = setting((64, 64), "hidden layer sizes of the policy and value MLPs, comma-separated",
                                      text=True)
    precision: str = setting(
        PRECISIONS[0], "image envs: what rank 0's update computes the CNN layers in; 'bfloat16' (CPUs with "
                       "AVX512_BF16 or AMX) took 0.55-0.77x float32's update time on Atari's CNN, but Breakout scored "
                       "1.1 less with it over 9 seeds; weights, optimizer and heads stay float32; its numbers depend "
                       "on the CPU's instructions", choices=PRECISIONS)
    lr: float | None = setting(ALGORITHM_DEFAULT, "PPO: Adam learning rate; TRPO: the value function's Adam learning "
                                                  "rate")
    lr_schedule: str | None = setting(
        ALGORITHM_DEFAULT, "PPO: 'linear' decays the learning rate to 0 over --total_steps (a --resume with a new "
                           "--total_steps follows the new budget), 'constant' keeps it", choices=("linear", "constant"))
    epochs: int | None = setting(ALGORITHM_DEFAULT, "PPO: epochs per batch")
    minibatch_size: int | None = setting(ALGORITHM_DEFAULT, "PPO: minibatch rows; TRPO: value-function minibatch rows")
    clip_ratio: float | None = setting(ALGORITHM_DEFAULT, "PPO: the probability ratio is clipped to [1 - this, 1 + "
                                                          "this] in the surrogate")
    clip_schedule: str | None = setting(
        ALGORITHM_DEFAULT, "PPO: 'linear' decays --clip_ratio to 0 over --total_steps as --lr_schedule does the "
                           "learning rate, 'constant' keeps it", choices=("linear", "constant"))
    ent_coef: float | None = setting(ALGORITHM_DEFAULT, "PPO: weight of the entropy bonus in the loss")
    vf_coef: float | None = setting(ALGORITHM_DEFAULT, "PPO: weight of the value loss (--value_loss) in the loss")
    value_loss: str | None = setting(
        ALGORITHM_DEFAULT, "PPO: 'mse', the mean squared error of the values; 'clipped', the larger of that squared "
                           "error and the one of the workers' value moved at most --clip_ratio toward the new value "
                           "(baselines' ppo2, CleanRL)", choices=VALUE_LOSSES)
    adv_norm: str | None = setting(
        ALGORITHM_DEFAULT, "PPO: the advantages are normalized to mean 0 and standard deviation 1 over the whole "
                           "'batch', or over each 'minibatch' (baselines' ppo2, SB3, CleanRL)",
        choices=ADVANTAGE_NORMALIZATIONS)
    value_targets: str | None = setting(
        ALGORITHM_DEFAULT, "PPO: what the value function learns: 'normalized', the returns scaled by their running "
                           "mean and standard deviation; 'raw', the returns as they are", choices=VALUE_TARGETS)
    seed: int = setting(0, "base seed; rank r uses SeedSequence(seed, spawn_key=(r,))")
    checkpoint_every: int = setting(10, "iterations between checkpoints (and one at the end)")
    eval_every: int = setting(0, "every N iterations the deterministic policy plays --eval_episodes episodes on envs "
                                 "of its own, spread over the processes (eval_return_mean and _std in progress.csv "
                                 "and TensorBoard), and the best policy so far is kept as RUN_DIR/best_policy.npz; 0 "
                                 "never")
    eval_episodes: int = setting(10, "episodes of each evaluation (--eval_every), with the seeds --play uses")
    check_sync: bool = setting(False, "after every broadcast verify that all ranks hold bit-identical weights and "
                                      "normalizer statistics (one small extra exchange per iteration; logged as "
                                      "sync_ok)")
    stall_timeout: float | str = setting(
        "auto", "seconds a process that has not reached a gather or broadcast may go without progress (env steps, "
                "update epochs) before the job is aborted, naming it; 'auto': 60 s, or 10x the longest pause seen "
                "once past the first two calls, and 120 s before a process's first step (MPI_UTIL_STALL_STARTUP sets "
                "this allowance); 0 waits forever", text=True)
    stop_grace: float = setting(30.0, "after Ctrl-C or SIGTERM, seconds the processes wait for each other to finish "
                                      "the iteration and checkpoint before the job ends without one, naming a process "
                                      "that did not arrive; match your scheduler's warning time")
    track: bool = setting(False, "also log every iteration's values and the run's settings to Weights & Biases, from "
                                 "rank 0 (pip install -c constraints.txt -e '.[track]'); WANDB_MODE=offline keeps the "
                                 "run in RUN_DIR/wandb, for wandb sync later")
    wandb_project: str = setting("mpi-batch-rl", "with --track: the W&B project")
    wandb_entity: str | None = setting(None, "with --track: the W&B entity (user or team); W&B's own default when "
                                             "not given")
    config_version: int = 3
    """Layout of config.json: 3 since version 0.2, whose checkpoints are arrays and JSON (runs of earlier layouts
    hold only pickled checkpoints, which --resume and --play do not read)."""


def option_fields() -> list[Field]:
    """TrainConfig's fields that are train.py options, in --help's order."""
    return [f for f in fields(TrainConfig) if "help" in f.metadata]


# What a resumed run may change; every other setting defines the run and comes from its config.json.
_RESUMABLE = ("nprocs", "gpu_pct", "total_steps", "num_episodes", "checkpoint_every", "check_sync", "batch_split",
              "stall_timeout", "stop_grace", "track", "wandb_project", "wandb_entity")


def resolve_env_id(name: str) -> str:
    """Registered gymnasium id for ``name``: exact ids as they are, bare names to their newest version (never to one
    of ale-py's older Atari ids; ValueError naming the ALE and MinAtar ids a bare game name may mean).

    "package.module:EnvId" imports the module (which registers the env) and keeps the prefix, so that
    gymnasium.make imports it again in every process, on --resume and on --play.
    """
    import importlib

    import gymnasium

    from envs.atari import is_older_ale_id
    from envs.make import newest_version, register_namespace

    register_namespace(name)
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
    # A bare name never picks one of ale-py's older ids (Breakout -> Breakout-v4, another protocol than ALE's v5),
    # whether or not ale-py's envs are registered yet in this process: the error below names the ALE id instead.
    newest = newest_version(env_name, skip=is_older_ale_id)
    if newest is not None:
        return prefix + newest
    raise ValueError(f"unknown environment '{env_name}'{_unknown_env_hint(env_name, bare=not module)}")


def _unknown_env_hint(env_name: str, bare: bool) -> str:
    """What resolve_env_id's error adds for a name that matched no id: the ids it may have meant (a bare game name's
    ALE and MinAtar ids; an id or name that differs only in case), else the closest registered ids, else nothing."""
    import gymnasium

    from envs.atari import is_older_ale_id
    from envs.make import ids_in_namespaces, newest_version, registered_spelling

    def meant(name: str) -> list[str]:
        if name in gymnasium.envs.registry:
            return [name]
        newest = newest_version(name, skip=is_older_ale_id)
        return [newest] if newest else ids_in_namespaces(name) if bare and "/" not in name else []

    games = ids_in_namespaces(env_name) if bare and "/" not in env_name else []
    spelled = registered_spelling(env_name) if not games else None
    games = games or (meant(spelled) if spelled else [])
    if games:
        return f"; did you mean {' or '.join(games)}?"
    close = difflib.get_close_matches(env_name, list(gymnasium.envs.registry), n=3, cutoff=0.5)
    return f"; closest registered: {', '.join(close)}" if close else ""


def check_named_module(saved_env_id: str, named: str | None, option: str, run_dir: Path) -> None:
    """ValueError with a one-line reason when a run's config.json names an env id that imports a module
    (``module:Id``) and the user did not name that id on the command line (``named``, train.py's env argument):
    a run directory someone hands you is data, and importing a module it names would run its code."""
    module = saved_env_id.rpartition(":")[0]
    if not module or (named is not None and (named == saved_env_id or resolve_env_id(named) == saved_env_id)):
        return
    raise ValueError(f"{option} {run_dir}: its config.json names the env {saved_env_id}, which would import the module "
                     f"{module}; train.py imports a module a run names only when you name it as well: python "
                     f"train.py {saved_env_id} {option} {run_dir}")


def check_env_spaces(env_id: str) -> bool:
    """Whether the env's observations are images; ValueError with a one-line reason when train.py's policies cannot
    read them or produce its actions (algos.spaces says what they can)."""
    from algos.spaces import action_spec, obs_spec
    from envs.make import make_env

    try:
        env = make_env(env_id)  # flattens a Dict or Tuple of Boxes, refuses one of other spaces
        try:
            action_spec(env.action_space)
            return obs_spec(env.observation_space).is_image
        finally:
            env.close()
    except ValueError as error:
        raise ValueError(f"{env_id}: {error}") from None


# CPU instructions TensorFlow's oneDNN kernels compute bfloat16 with (every CPU with AMX has AVX512_BF16 too).
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_tile")


def check_precision(precision: str, env_id: str, is_image: bool, cpu: tuple[str, str] | None = None) -> None:
    """ValueError with a one-line reason when --precision bfloat16 cannot run as its help says: an env without images
    (an MLP has no CNN layers), or a CPU without bfloat16 instructions. ``cpu``: (model, flags space-separated), read
    from this machine (trainer.versions.cpu_model_and_flags) only for a precision other than the default."""
    if precision == PRECISIONS[0]:
        return
    if not is_image:
        raise ValueError(f"--precision {precision} is for image observations (a CNN's layers); {env_id} has vectors: "
                         "drop --precision")
    cpu_model, cpu_flags = cpu or cpu_model_and_flags()
    if not set(cpu_flags.split()) & set(BFLOAT16_CPU_FLAGS):
        raise ValueError(f"--precision {precision} needs a CPU with AVX512_BF16 or AMX instructions, and this one "
                         f"({cpu_model}) has neither: drop --precision")


def load_saved_config(run_dir: Path) -> dict:
    """RUN_DIR/config.json as TrainConfig's keyword arguments (a field it lacks, one added since the run began,
    takes TrainConfig's default); ValueError with a one-line reason when it is not a run's configuration."""
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
    if saved["algo"] == "ppo":  # a PPO run begun before an option existed ran as its generic default, Atari's too
        for name in ("value_targets", "value_loss", "adv_norm"):
            saved.setdefault(name, ALGORITHMS["ppo"].defaults[name])
    return saved



def check_holds_a_run(run_dir: Path, option: str) -> None:
    """ValueError with a one-line reason, before anything in it is touched, when ``run_dir`` exists and is not a run of
    this project. A run of this project is a directory whose config.json load_saved_config accepts, or one that holds
    nothing but the lock files trainer.run_dir makes: what the launching process has just made for its ranks."""
    from trainer.run_dir import LOCK_FILE, OWNER_FILE

    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise ValueError(f"{option} {run_dir} is a file, not a directory: name a new directory or a run's")
    names = {path.name for path in run_dir.iterdir()}
    if names <= {LOCK_FILE, OWNER_FILE}:
        return
    try:
        load_saved_config(run_dir)
    except ValueError:
        shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
        raise ValueError(f"{option} {run_dir} holds files of something other than a train.py run ({shown}) and "
                         "no run's config.json: name a new directory or a run's; nothing in it was touched") from None


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
    if "stall_timeout" in given:  # in mpi_util's words, which MPI_UTIL_STALL_TIMEOUT uses too; None (never) is 0
        given["stall_timeout"] = mpi_util.parse_stall_timeout(str(given["stall_timeout"]), "--stall_timeout") or 0.0
    return given



def build_config(args: argparse.Namespace) -> tuple[TrainConfig, Path, bool]:
    """The run's config, its directory, and whether it resumes; ValueError with a one-line reason if bad."""
    from trainer.checkpoint import CheckpointError, list_checkpoints, load_latest_checkpoint

    given = explicit_settings(args)
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.json").is_file():
            raise ValueError(f"--resume {run_dir}: not a run directory (no config.json)")
        saved = load_saved_config(run_dir)
        check_named_module(saved["env_id"], args.env_name, "--resume", run_dir)
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
        fill_algorithm_defaults(config, given)
        if config.policy_lag and "batch_split" not in given:
            config.batch_split = "shared"  # with even shares rank 0 rolls out its own after the update: no gain
        if args.run_dir:
            run_dir = Path(args.run_dir)
            check_holds_a_run(run_dir, "--run_dir")
            if list_checkpoints(run_dir / "checkpoints"):
                raise ValueError(f"--run_dir {run_dir} holds a run's checkpoints: continue it with --resume "
                                 f"{run_dir}, or name another directory")
        else:  # only a name: creating it (create_run_dir) is what makes it unique
            run_dir = Path(args.logdir) / run_dir_name(config.env_id, config.algo, config.seed)
    check_config(config)
    return config, run_dir, bool(args.resume)



def fill_algorithm_defaults(config: TrainConfig, given: dict) -> None:
    """The defaults of the algorithm for the env's family (algos.registry) of the settings the user did not give: the
    settings the algorithm reads, and the family's batch size and envs per process (from its envs in all and
    config.nprocs); ValueError with a one-line reason for a given setting that only other algorithms read."""
    from envs.make import env_family

    if config.algo not in ALGORITHMS:
        return  # check_config says so
    spec = ALGORITHMS[config.algo]
    owned = spec.defaults
    for name in given:
        readers = [algo for algo, spec in ALGORITHMS.items() if name in spec.defaults]
        if readers and name not in owned:
            raise ValueError(f"--{name} is not a setting of {config.algo} (only of {', '.join(readers)}); "
                             f"{config.algo} reads {', '.join('--' + setting for setting in owned)}")
    for name, default in spec.defaults_for(env_family(config.env_id)).items():
        if name == ENVS_IN_ALL:
            if "envs_per_rank" not in given:
                config.envs_per_rank = max(1, default // config.nprocs)
        elif name not in given:
            setattr(config, name, default)


def check_config(config: TrainConfig) -> None:
    """ValueError with a one-line reason for a setting train.py cannot run with."""
    for name in ("gamma", "lam", "kl_targ", "lr", "clip_ratio", "ent_coef", "vf_coef", "stop_grace"):
        value = getattr(config, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{name} must be a finite number, got {value}")
    if config.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {config.seed}")
    if config.eval_every < 0:
        raise ValueError(f"--eval_every must be >= 0 iterations (0: never), got {config.eval_every}")
    for name in ("total_steps", "batch_size", "envs_per_rank", "epochs", "minibatch_size", "checkpoint_every",
                 "eval_episodes"):
        if getattr(config, name) is not None and getattr(config, name) < 1:  # None: not a setting of this algorithm
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
    if config.kl_targ is not None and not (config.kl_targ > 0 or (config.kl_targ == 0 and config.algo == "ppo")):
        never = " (PPO: 0 never stops early)" if config.algo == "ppo" else ""
        raise ValueError(f"--kl_targ must be > 0{never}, got {config.kl_targ}")
    if config.clip_ratio is not None and not 0 < config.clip_ratio < 1:
        raise ValueError(f"--clip_ratio must be in (0, 1), got {config.clip_ratio}")
    for name in ("ent_coef", "vf_coef"):
        if getattr(config, name) is not None and not getattr(config, name) >= 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(config, name)}")
    mpi_util.parse_stall_timeout(str(config.stall_timeout), "--stall_timeout")  # as config.json holds it, too
    if not config.stop_grace > 0:
        raise ValueError(f"--stop_grace must be > 0 seconds, got {config.stop_grace}")
    mpi_util.check_gpu_pct(config.gpu_pct, "--gpu_pct")
    if config.algo not in ALGORITHMS:
        raise ValueError(f"--algo {config.algo} is not one this train.py knows ({', '.join(ALGORITHMS)})")
    if config.lr is not None and not config.lr > 0:
        raise ValueError(f"--lr must be > 0, got {config.lr}")
    if config.track and importlib.util.find_spec("wandb") is None:
        raise ValueError("--track needs wandb: pip install -c constraints.txt -e '.[track]'")
    check_precision(config.precision, config.env_id, check_env_spaces(config.env_id))
