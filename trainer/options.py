"""train.py's command line, built from TrainConfig's fields (each option's name, type, default and help are written
once, on the field) and the options that only say how to launch, resume or play a run."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shlex
import sys
import typing
from dataclasses import Field

import mpi_util
from algos.registry import ALGORITHMS, ENVS_IN_ALL
from trainer.config import TrainConfig, option_fields

PLAY_EPISODES = 5  # --play's episodes when --episodes is not given
# What train.py needs beyond mpi_util (the rl extra); --play and the workers, which roll out, need only the first two.
RL_MODULES = ("gymnasium", "mujoco", "tensorflow", "tensorboard", "matplotlib", "tqdm")
WORKER_MODULES = RL_MODULES[:2]

_EPILOG = ("Outputs go to LOGDIR/ENV_ALGO_sSEED_TIME/: config.json, progress.csv, tb/ (TensorBoard), checkpoints/, "
           "learning_curve.png.")


class _OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, as train.py's own are, instead of the usage block."""

    def error(self, message: str) -> typing.NoReturn:
        # Under an outside launcher every rank parses the same line: rank 0 alone says it.
        mpi_util.print0(f"{self.prog}: error: {message}; see --help", file=sys.stderr)
        sys.exit(2)


def _shown(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def family_defaults_text(defaults: dict[str, dict], generic: object, name: str) -> str:
    """', Atari X' for each family (envs.make.FAMILY_NAMES) whose defaults (family -> settings, as
    AlgorithmSpec.families holds them) give setting ``name`` a value other than ``generic``."""
    from envs.make import FAMILY_NAMES

    shown = []
    for family, settings in defaults.items():
        if name == "envs_per_rank" and ENVS_IN_ALL in settings:
            shown.append(f"{FAMILY_NAMES[family]} {settings[ENVS_IN_ALL]} over all processes")
        elif name in settings and settings[name] != generic:
            shown.append(f"{FAMILY_NAMES[family]} {_shown(settings[name])}")
    return "".join(f", {text}" for text in dict.fromkeys(shown))


def _default_text(option: Field) -> str:
    """' (default: X)' for --help: the field's default, or each algorithm's own for the settings algorithms own, each
    followed by the families' own (algos.registry)."""
    readers = {algo: spec for algo, spec in ALGORITHMS.items() if option.name in spec.defaults}
    if readers:
        return " (default: " + "; ".join(
            f"{algo} {_shown(spec.defaults[option.name])}"
            + family_defaults_text(spec.families, spec.defaults[option.name], option.name)
            for algo, spec in readers.items()) + ")"
    families = "".join(family_defaults_text(spec.families, option.default, option.name)
                       for spec in ALGORITHMS.values())
    families = "".join(f", {text}" for text in dict.fromkeys(families.split(", ")[1:]))
    if option.default is None or option.default is False:
        return ""  # no value: the help says what happens then
    return f" (default: {_shown(option.default)}{families})"


def _add_config_option(parser: argparse.ArgumentParser, option: Field, value_type: type) -> None:
    meta = option.metadata
    flags = [meta["short"], f"--{option.name}"] if meta["short"] else [f"--{option.name}"]
    help_text = meta["help"] + _default_text(option)
    if value_type is bool:
        # default None: an option not given is None, so that --resume can tell what the user asked to change
        parser.add_argument(*flags, action="store_true", default=None, help=help_text)
        return
    choices = meta["choices"]() if callable(meta["choices"]) else meta["choices"]
    parser.add_argument(*flags, type=str if meta["text"] else value_type, choices=choices,
                        metavar=meta["metavar"], help=help_text)


def _value_type(annotation: object) -> type:
    """int for ``int`` and ``int | None``, and so on: the type argparse converts an option's text to."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return annotation if not args else args[0]


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """Command-line options (``argv``, default sys.argv[1:]); an option not given is None, so that --resume can tell
    what the user asked to change. ``description`` opens --help (train.py's usage examples)."""
    parser = _OneLineParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=_EPILOG)
    parser.add_argument("env_name", nargs="?", help="gymnasium env id; without a version the newest one "
                        "(Walker2d -> Walker2d-v5); 'package.module:EnvId' imports the module that registers it, "
                        "and with --resume or --play a run whose env is such an id is continued or played only when "
                        "you name that id here too (a run directory is data: it imports nothing by itself). "
                        "Vector or image (H x W x C, uint8) observations, Dict and Tuple flattened; Box, Discrete, "
                        "MultiDiscrete or MultiBinary actions.")
    types = typing.get_type_hints(TrainConfig)
    for option in option_fields():
        _add_config_option(parser, option, _value_type(types[option.name]))
    launch = parser.add_argument_group("launching, resuming and playing")
    launch.add_argument("--hostfile", type=str, metavar="FILE",
                        help="run the --nprocs processes on the hosts FILE lists, in your MPI's format (MPICH: "
                             "'host:slots' lines; Open MPI: 'host slots=N' lines); ignored under a launcher")
    launch.add_argument("--mpiexec_args", type=str, metavar="ARGS",
                        help="extra arguments for the mpiexec that --nprocs starts, as one quoted string after '=', "
                             "e.g. --mpiexec_args='--bind-to none'; ignored under a launcher")
    launch.add_argument("--max_restarts", type=int, metavar="K", default=0,
                        help="when a process dies (killed, out of memory, a lost host), run the job again from the "
                             "newest checkpoint, at most K times; ignored under a launcher (default: %(default)s)")
    launch.add_argument("--logdir", type=str, default="runs",
                        help="directory that holds the run directories (default: %(default)s)")
    launch.add_argument("--run_dir", type=str, metavar="DIR",
                        help="the run's directory, instead of a new one under --logdir: it is made if missing, and "
                             "one that holds checkpoints is refused (continue it with --resume DIR); a job that "
                             "restarts or requeues itself names the same DIR each time")
    launch.add_argument("--resume", type=str, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its newest good checkpoint; --nprocs, --gpu_pct, the "
                             "budget (--total_steps, --num_episodes), --checkpoint_every, --check_sync, "
                             "--batch_split, --stall_timeout, --stop_grace and the tracking (--track, --wandb_*) may "
                             "be changed, the other settings may not")
    launch.add_argument("--play", type=str, metavar="RUN_DIR",
                        help="run RUN_DIR's saved policy (deterministic), or a policy file of --export, and print "
                             "episode returns")
    launch.add_argument("--episodes", type=int, help=f"episodes for --play (default: {PLAY_EPISODES})")
    launch.add_argument("--export", nargs=2, metavar=("RUN_DIR", "FILE"),
                        help="write RUN_DIR's newest good policy to FILE, one file of arrays and a JSON spec that "
                             "--play FILE and algos.numpy_actor.NumpyActor.load read without TensorFlow or pickle")
    launch.add_argument("--video", type=str, metavar="FILE",
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
        args.episodes = PLAY_EPISODES
    return args


def launch_settings(args: argparse.Namespace, nprocs: int) -> dict:
    """mpi_fork's hostfile, mpiexec_args and max_restarts from the options; ValueError with a one-line reason."""
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
    if args.max_restarts and nprocs == 1:
        raise ValueError(f"--max_restarts {args.max_restarts} needs --nprocs 2 or more: restarts are made by the "
                         "process that launches the ranks, and a 1-process run has none (--resume RUN_DIR continues "
                         "it after a failure)")
    settings["max_restarts"] = args.max_restarts
    return settings


def missing_modules(names: tuple[str, ...]) -> str | None:
    """None when every module in ``names`` is installed, TensorFlow by one distribution; else a one-line reason that
    says what to install."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        return (f"{', '.join(missing)} not installed; train.py needs the rl extra: pip install -e '.[rl]' in this "
                "checkout (mpi_util alone needs only mpi4py, mpich and numpy)")
    if "tensorflow" in names and all(_installed(name) for name in ("tensorflow", "tensorflow-cpu")):
        return ("tensorflow and tensorflow-cpu are both installed, and each overwrote the other's files: pip uninstall "
                "-y tensorflow tensorflow-cpu, then pip install -e '.[rl]' (or '.[gpu]' on a machine with an NVIDIA "
                "GPU) in this checkout")
    return None


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
