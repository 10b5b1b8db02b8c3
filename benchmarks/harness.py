"""What the benchmarks share: running train.py (or a child script) bounded in time, reading progress.csv, and writing
results.md and runs.csv with the command, machine, versions and load averages above the tables.

The scripts run as ``python benchmarks/NAME.py``; Python puts benchmarks/ first on the module path, so they import
this module as ``harness``. It imports nothing of the project at import time: a driver that launches MPI jobs should
not initialize MPI itself, and update.py's children may import another checkout's algos.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
TIME_KEYS = ("t_rollout", "t_gather", "t_update", "t_bcast")


# ----------------------------------------------------------------------------------------------------------------
# Numbers and tables.
# ----------------------------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    """The median of the values that are not NaN (NaN when none is)."""
    finite = [v for v in values if not math.isnan(v)]
    return float(statistics.median(finite)) if finite else math.nan


def fmt(value: float, digits: int = 0) -> str:
    return "nan" if math.isnan(value) else f"{value:,.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """rows as CSV, with the union of their keys as columns (in order of first appearance)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


# What each shared option means, for options().
OPTION_HELP = {
    "env": "gymnasium env id", "nprocs": "MPI process counts", "total_steps": "step budget of each run",
    "repeats": "interleaved repeats", "seed": "seed of every run", "warmup": "first iterations left out of the rates",
    "tail": "iterations at the end whose episodes give the mean return",
    "timeout": "seconds one run may take before it is killed",
}


def options(doc: str, out: str, **defaults: Any) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first paragraph, with --out (default results/OUT) and, for each keyword, the
    option of OPTION_HELP of that name with that default (a list default takes one or more values)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default in defaults.items():
        many = isinstance(default, list)
        parser.add_argument(f"--{name}", type=type(default[0] if many else default), nargs="+" if many else None,
                            default=default, help=f"{OPTION_HELP[name]} (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=RESULTS / out, help="results directory (default: %(default)s)")
    return parser


# ----------------------------------------------------------------------------------------------------------------
# The lines above every table.
# ----------------------------------------------------------------------------------------------------------------


def children_cpu_s() -> float:
    """User and system CPU seconds of this process's waited-for descendants so far: a job's ranks, once mpiexec has
    reaped them."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def command_output(command: list[str]) -> str:
    """A command's stdout, stripped; empty when it cannot run."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def describe_machine() -> dict[str, str]:
    """nproc, CPU model, memory, OS, Python and `date -u`, read the way nproc, lscpu and /proc/meminfo report them."""
    model = next((line.split(":", 1)[1].strip() for line in command_output(["lscpu"]).splitlines()
                  if line.startswith("Model name")), platform.processor() or "unknown")
    memory = next((f"{int(line.split()[1]) / 2**20:.1f} GiB" for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:")), "unknown")
    return {
        "nproc": str(len(os.sched_getaffinity(0))),  # the CPUs this process may run on, as `nproc` counts them
        "cpu_model": model,
        "memory": memory,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "date_utc": command_output(["date", "-u"])
        or datetime.datetime.now(datetime.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y"),
    }


def versions_line() -> str:
    """The results.md line that records the software stack and CPU a benchmark ran on (trainer/versions.py)."""
    from trainer.versions import stack_versions  # here, not at import time: see the module's docstring

    return "- versions: " + ", ".join(f"{name} {value}" for name, value in stack_versions().items())


def pretty_command() -> str:
    """This process's command line, with the interpreter relative to the working directory where it lies below it."""
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd() + os.sep) else sys.executable
    return shlex.join([python, *sys.argv])


def machine_lines(wall_s: float, loads: str, about: Sequence[str] = ()) -> list[str]:
    """The command, ``about`` (what each run is), machine, date, versions and load lines that go above every table."""
    machine = describe_machine()
    return [
        f"- command: `{pretty_command()}` (from the repository root)",
        *about,
        f"- machine: nproc {machine['nproc']}, {machine['cpu_model']}, {machine['memory']} memory, {machine['os']}, "
        f"Python {machine['python']}",
        f"- date: {machine['date_utc']} (`date -u` at the end); total wall time of the benchmark {wall_s:.0f} s",
        versions_line(),
        f"- 1-minute load average before each run ({loads}). The machine is shared: other jobs ran during the "
        "measurement, so absolute numbers move from run to run; the ratios pair neighbouring runs.",
    ]


def write_results(out: Path, runs: Sequence[Mapping[str, Any]], body: str, wall_s: float, loads: str,
                  about: Sequence[str] = (), title: str = "") -> str:
    """runs.csv (every run) and results.md (``title``, machine_lines, then ``body``) in ``out``; prints results.md
    and returns it."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "runs.csv", runs)
    text = "\n".join([*([f"# {title}", ""] if title else []), *machine_lines(wall_s, loads, about), "", body, ""])
    (out / "results.md").write_text(text)
    print(text)
    return text


# ----------------------------------------------------------------------------------------------------------------
# Running train.py and children.
# ----------------------------------------------------------------------------------------------------------------


def run_logged(command: list[str], log_path: Path, timeout_s: float, env: Mapping[str, str] | None = None,
               cwd: Path = REPO) -> tuple[int, float]:
    """Run ``command`` in ``cwd`` with ``env`` added to this environment, appending its output to log_path; after
    timeout_s kill its process group (its own session: one signal reaches mpiexec and every rank). Returns (exit
    status, wall seconds); a timeout raises RuntimeError."""
    started = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"no result after {timeout_s:.0f} s: {shlex.join(command)}; log: {log_path}") from None
    return returncode, time.perf_counter() - started


def failure(what: str, returncode: int, log_path: Path) -> RuntimeError:
    """The error for a child that failed: its exit status and the last lines of its log."""
    tail = log_path.read_text().splitlines()[-15:]
    return RuntimeError(f"{what}: exit status {returncode}, log {log_path}:\n" + "\n".join(tail))


def run_for_result(command: list[str], result_path: Path, timeout_s: float, what: str) -> tuple[dict, float, float]:
    """Run ``command`` (a benchmark's child, which writes its result as JSON to ``result_path``); (that result, wall
    seconds, the 1-minute load average before it). A failure raises RuntimeError naming ``what``."""
    load = load_average()
    log_path = result_path.with_suffix(".log")
    returncode, wall = run_logged(command, log_path, timeout_s)
    if returncode != 0 or not result_path.exists():
        raise failure(what, returncode, log_path)
    return json.loads(result_path.read_text()), wall, load


@dataclass
class TrainRun:
    """One finished train.py run."""

    nprocs: int
    rows: list[dict[str, float]]
    """progress.csv, one dict per iteration, every value as float."""
    process_wall_s: float
    """Wall time of the whole command: start-up (imports, mpiexec, model build) included."""
    load_before: float
    load_after: float
    command: str


def read_progress(path: Path) -> list[dict[str, float]]:
    """progress.csv as a list of {column: float} (empty cells as NaN)."""
    with open(path, newline="") as f:
        return [{key: float(value) if value not in ("", None) else math.nan for key, value in row.items()}
                for row in csv.DictReader(f)]


def run_train(env_id: str, nprocs: int, total_steps: int, workdir: Path, timeout_s: float,
              extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> TrainRun:
    """Run ``train.py env_id --nprocs nprocs --total_steps total_steps`` with its run directory under workdir
    (created; must not exist) and ``env`` added to the environment, its output to workdir/train.log. Raises
    RuntimeError on a timeout, a nonzero exit status or a missing progress.csv."""
    workdir.mkdir(parents=True)
    command = [sys.executable, str(REPO / "train.py"), env_id, "--nprocs", str(nprocs),
               "--total_steps", str(total_steps), "--logdir", str(workdir / "runs"), *extra_args]
    load_before = load_average()
    returncode, process_wall_s = run_logged(command, workdir / "train.log", timeout_s, env)
    if returncode != 0:
        raise failure(shlex.join(command), returncode, workdir / "train.log")
    (progress,) = (workdir / "runs").glob("*/progress.csv")
    return TrainRun(nprocs=nprocs, rows=read_progress(progress), process_wall_s=process_wall_s,
                    load_before=load_before, load_after=load_average(), command=shlex.join(command))


def tail_mean_return(rows: list[dict[str, float]], tail: int) -> float:
    """Mean return over the episodes that finished in the last ``tail`` iterations (NaN if none did)."""
    last = [r for r in rows[-tail:] if r["episodes"] > 0]
    episodes = sum(r["episodes"] for r in last)
    return sum(r["ep_return_mean"] * r["episodes"] for r in last) / episodes if episodes else math.nan


def summarize_run(run: TrainRun, warmup: int, tail: int, cores: int) -> dict[str, Any]:
    """Throughput, time split (seconds per iteration, means after the warm-up) and returns of one run."""
    rows = run.rows
    if len(rows) <= warmup:
        raise RuntimeError(f"{run.nprocs} processes: {len(rows)} iterations, not more than the warm-up of {warmup}; "
                           "raise --total_steps")
    steady = rows[warmup:]
    start = rows[warmup - 1] if warmup else {"wall_s": 0.0, "total_steps": 0.0}
    wall = rows[-1]["wall_s"] - start["wall_s"]
    steps = rows[-1]["total_steps"] - start["total_steps"]
    batch = steps / len(steady)
    split = {key: statistics.fmean(r[key] for r in steady) for key in TIME_KEYS}
    t_iteration = wall / len(steady)
    t_other = t_iteration - sum(split.values())
    t_sampling = split["t_rollout"] + split["t_gather"]
    t_serial = split["t_update"] + split["t_bcast"] + t_other
    return {
        "nprocs": run.nprocs, "iterations": len(rows), "steady_iterations": len(steady), "batch": batch,
        "steps_per_s": steps / wall, "steps_per_s_whole_loop": rows[-1]["total_steps"] / rows[-1]["wall_s"],
        "mean_return": tail_mean_return(rows, tail), "tail_episodes": int(sum(r["episodes"] for r in rows[-tail:])),
        "t_iteration": t_iteration, **split, "t_other": t_other, "t_sampling": t_sampling,
        "sampling_steps_per_s": batch / t_sampling, "t_serial": t_serial, "serial_share": t_serial / t_iteration,
        "sampling_core_s": t_sampling * min(run.nprocs, cores),
        "epochs_mean": statistics.fmean(r["epochs"] for r in steady) if "epochs" in steady[0] else math.nan,
        "process_wall_s": run.process_wall_s, "load_before": run.load_before, "load_after": run.load_after,
    }
