"""train.py from Python: ``trainer.run("Walker2d", nprocs=8, total_steps=1_000_000)`` trains as
``python train.py Walker2d --nprocs 8 --total_steps 1000000`` does, and returns the run directory.

Called in a plain process, it runs train.py in a child process, which launches the ranks (mpi_fork) as on the command
line: the same output, the same run directory, restarts with ``max_restarts``. Called in every rank of a job that
mpiexec, mpirun or srun started, it runs that rank's part of the training in the calling process, as
``mpiexec -n 8 python train.py Walker2d`` would. The training loop itself is train.py's ``train``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

TRAIN_SCRIPT = Path(__file__).resolve().parent.parent / "train.py"
# Options that say what train.py does instead of training: they are not run()'s.
_NOT_TRAINING = ("play", "export", "episodes", "video", "env_name", "run_dir")


class TrainingFailed(RuntimeError):
    """The job ended with a nonzero exit status; train.py has said why on stderr."""

    def __init__(self, returncode: int) -> None:
        super().__init__(f"train.py ended with exit status {returncode}; its message above says why")
        self.returncode = returncode


def command_line(env_id: str | None, options: dict[str, Any]) -> list[str]:
    """train.py's arguments for ``env_id`` and ``options`` ({option name: value}, as run() takes them); TypeError
    for a name that is not one of train.py's training options."""
    from trainer.options import parse_args

    known = {name for name in vars(parse_args([])) if name not in _NOT_TRAINING}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"run() got option(s) train.py does not have: {', '.join(unknown)} (see python train.py "
                        "--help)")
    argv = [env_id] if env_id else []
    for name, value in options.items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{name}")
        else:
            shown = ",".join(map(str, value)) if isinstance(value, tuple | list) else str(value)
            argv += [f"--{name}", shown]
    return argv


def run(env_id: str | None = None, **options: Any) -> Path:
    """Train ``env_id`` with train.py's options given as keywords, named as on the command line (``nprocs=8``,
    ``algo="trpo"``, ``hidden=(64, 64)``, ``check_sync=True``, ``resume="runs/..."`` with no env_id); return the run
    directory, RUN_DIR, once the job has ended.

    Raises:
        TypeError: a keyword that is not one of train.py's training options.
        TrainingFailed: the job ended with a nonzero status (a bad option, a failed rank, a stop that left no
            checkpoint); train.py's one-line message on stderr says why.
    """
    from trainer.kernels import pin_numeric_kernels

    pin_numeric_kernels()  # as train.py does first; too late (and harmless) where numpy is loaded already
    import mpi_util

    argv = command_line(env_id, options)
    resumed = Path(options["resume"]) if options.get("resume") else None
    if not mpi_util.under_mpi_launcher():
        run_dir = resumed or new_run_dir(env_id, options)
        try:
            command = [sys.executable, str(TRAIN_SCRIPT), *argv, "--run_dir", str(run_dir)]
            returncode = subprocess.run(command).returncode
        finally:
            _remove_if_empty(run_dir)
    else:  # a rank of a job someone else launched: every rank runs its part here, in a directory rank 0 names
        mpi_util.init()
        run_dir = mpi_util.bcast_object(resumed or new_run_dir(env_id, options) if mpi_util.rank == 0 else None)
        train_script = _train_script()
        try:
            returncode = train_script.main_in_rank(train_script.parse_args([*argv, "--run_dir", str(run_dir)]))
        finally:
            if mpi_util.rank == 0:
                _remove_if_empty(run_dir)
    if returncode != 0:
        raise TrainingFailed(returncode)
    return run_dir


def new_run_dir(env_id: str | None, options: dict[str, Any]) -> Path:
    """A new, empty directory for the run, named as train.py names its own (trainer.run_dir), under ``logdir``."""
    from trainer.config import resolve_env_id
    from trainer.run_dir import create_run_dir, run_dir_name

    name = run_dir_name(resolve_env_id(env_id) if env_id else "run", options.get("algo") or "ppo",
                        int(options.get("seed") or 0))
    return create_run_dir(Path(options.get("logdir") or "runs") / name)


def _remove_if_empty(run_dir: Path) -> None:
    """Remove the directory made for a job that refused to start (it wrote nothing), as train.py leaves nothing."""
    try:
        run_dir.rmdir()
    except OSError:
        pass  # it holds the run


def _train_script() -> Any:
    """train.py as a module (it is a script beside trainer/, not an installed module), loaded once."""
    module = sys.modules.get("mpi_batch_rl_train")
    if module is None:
        spec = importlib.util.spec_from_file_location("mpi_batch_rl_train", TRAIN_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["mpi_batch_rl_train"] = module
        spec.loader.exec_module(module)
    return module
