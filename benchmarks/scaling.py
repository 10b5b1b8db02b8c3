"""Scaling of train.py with the number of MPI processes: the original's table, the time split, and Amdahl.

What it measures: ``train.py ENV --nprocs N --total_steps B`` (default hyperparameters: PPO, batch 2048 steps per
iteration over all ranks, 10 epochs of 64-row minibatches, 64-64 tanh MLPs) as users run it, at N = 1, 2, 3, 4, 8,
each run a fresh subprocess bounded in time. From each run's ``progress.csv`` (rank 0's view, one row per iteration)
it takes, after ``--warmup`` iterations (the first ones trace the tf.functions):

- steps/s: environment steps per second of the training loop after the warm-up (the difference of ``wall_s``
  between the last row and the last warm-up row: rollout, gather, update, broadcast, logging and checkpoints);
- the time split per iteration: t_rollout (this rank's own rollout), t_gather (includes waiting for the slowest
  rank), t_update (rank 0 alone), t_bcast, and "other" (logging, checkpoints: what the four do not cover);
- mean return: the mean over the episodes that finished in the last ``--tail`` iterations;
- sampling rate: batch / (t_rollout + t_gather), the sampling phase as rank 0 sees it;
- sampling-phase parallel efficiency at N: sampling rate(N) / (min(N, cores) x sampling rate(1)), paired with
  the 1-process run of the same repeat (more ranks than cores cannot use more than the cores);
- the serial share: (t_update + t_bcast + other) / iteration time; and Amdahl's prediction of steps/s on n
  cores, one rank per core: batch / (serial + W / n), where W = (t_rollout + t_gather) x min(N, cores) is the
  core-seconds of sampling per batch measured at N.

Runs are interleaved: repeat 1 goes N = 1, 2, 3, 4, 8, repeat 2 goes back 8, 4, 3, 2, 1, ..., so slow drifts
in the load of a shared machine hit every N alike; ratios are taken within a repeat, then the median over repeats.

Run from the repository root (about 8-10 minutes on 2 cores with the defaults; ``--quick`` is a 1-2 minute
smoke test whose numbers mean little)::

    .venv/bin/python benchmarks/scaling.py
    .venv/bin/python benchmarks/scaling.py --total_steps 200000 --repeats 3     # longer, steadier

Writes to benchmarks/results/scaling/ (``--out``): runs.csv (every run), scaling.csv (medians per N), amdahl.csv
(predictions), results.md (the tables with command, machine, date and load averages) and scaling.png; prints the
tables. Run directories (checkpoints, TensorBoard files) go to a temporary directory under /tmp, removed at the end
unless ``--keep_runs``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "scaling"
TIME_KEYS = ("t_rollout", "t_gather", "t_update", "t_bcast")
PREDICT_CORES = (1, 2, 4, 8, 16, 32, 64)
# The original's table (hex-core Xeon, Walker2d-v1, TRPO with its own batch settings): nprocs -> steps/s.
ORIGINAL_STEPS_PER_S = {1: 546, 2: 1040, 9: 2484}
EFFICIENCY_TARGET = 0.90
OVERSUBSCRIPTION_TARGET = 0.90


# ----------------------------------------------------------------------------------------------------------------
# Running train.py and reading what it logged (vs_sb3.py uses these too).
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TrainRun:
    """One finished train.py run."""

    nprocs: int
    """MPI processes it ran with."""
    rows: list[dict[str, float]]
    """progress.csv, one dict per iteration, every value as float."""
    process_wall_s: float
    """Wall time of the whole command: start-up (imports, mpiexec, model build) included."""
    load_before: float
    """1-minute load average just before the command started."""
    load_after: float
    """1-minute load average just after it ended."""
    command: str
    """The command line, shell-quoted."""


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def run_for_result(command: list[str], result_path: Path, timeout_s: float, what: str) -> tuple[dict, float, float]:
    """Run ``command`` (a benchmark's child, which writes its result as JSON to ``result_path``) from the repository
    root; (that result, wall seconds, the 1-minute load average before it). A failed child's output is printed and
    ends the benchmark with SystemExit naming ``what``."""
    load = load_average()
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not result_path.exists():
        print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{what} failed with exit status {proc.returncode}")
    return json.loads(result_path.read_text()), wall, load


def run_logged(command: list[str], log_path: Path, timeout_s: float) -> tuple[int, float]:
    """Run ``command`` from the repository root, appending its output to log_path; after timeout_s kill its process
    group (its own session: one signal reaches mpiexec and every rank). Returns (exit status, wall seconds); a
    timeout raises RuntimeError."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    started = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"\n$ {shlex.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"no result after {timeout_s:.0f} s: {shlex.join(command)}; log: {log_path}") from None
    return returncode, time.perf_counter() - started


def run_train(env_id: str, nprocs: int, total_steps: int, workdir: Path, timeout_s: float,
              extra_args: Sequence[str] = ()) -> TrainRun:
    """Run ``train.py env_id --nprocs nprocs --total_steps total_steps`` with its run directory under workdir
    (created; must not exist), its console output to workdir/train.log; kill the whole process group after
    timeout_s seconds. Raises RuntimeError on a timeout, a nonzero exit status or a missing progress.csv."""
    workdir.mkdir(parents=True)
    command = [sys.executable, str(REPO / "train.py"), env_id, "--nprocs", str(nprocs),
               "--total_steps", str(total_steps), "--logdir", str(workdir / "runs"), *extra_args]
    load_before = load_average()
    returncode, process_wall_s = run_logged(command, workdir / "train.log", timeout_s)
    if returncode != 0:
        tail = (workdir / "train.log").read_text().splitlines()[-15:]
        raise RuntimeError(f"exit status {returncode}: {shlex.join(command)}\n" + "\n".join(tail))
    progress = sorted((workdir / "runs").glob("*/progress.csv"))
    if len(progress) != 1:
        raise RuntimeError(f"expected one progress.csv under {workdir / 'runs'}, found {len(progress)}")
    return TrainRun(nprocs=nprocs, rows=read_progress(progress[0]), process_wall_s=process_wall_s,
                    load_before=load_before, load_after=load_average(), command=shlex.join(command))


def read_progress(path: Path) -> list[dict[str, float]]:
    """progress.csv as a list of {column: float} (empty cells as NaN)."""
    with open(path, newline="") as f:
        return [{key: float(value) if value not in ("", None) else math.nan for key, value in row.items()}
                for row in csv.DictReader(f)]


def tail_mean_return(rows: list[dict[str, float]], tail: int) -> float:
    """Mean return over the episodes that finished in the last ``tail`` iterations (NaN if none did)."""
    last = rows[-tail:]
    episodes = sum(r["episodes"] for r in last)
    if episodes == 0:
        return math.nan
    return sum(r["ep_return_mean"] * r["episodes"] for r in last if r["episodes"] > 0) / episodes


def summarize_run(run: TrainRun, warmup: int, tail: int, cores: int) -> dict[str, Any]:
    """Throughput, time split (seconds per iteration, means after the warm-up) and returns of one run."""
    rows = run.rows
    if len(rows) <= warmup:
        raise RuntimeError(f"{run.nprocs} processes: {len(rows)} iterations, not more than the warm-up of {warmup}; "
                           "raise --total_steps")
    steady = rows[warmup:]
    start_wall = rows[warmup - 1]["wall_s"] if warmup else 0.0
    start_steps = rows[warmup - 1]["total_steps"] if warmup else 0.0
    wall = rows[-1]["wall_s"] - start_wall
    steps = rows[-1]["total_steps"] - start_steps
    iterations = len(steady)
    batch = steps / iterations
    split = {key: statistics.fmean(r[key] for r in steady) for key in TIME_KEYS}
    t_iteration = wall / iterations
    t_other = t_iteration - sum(split.values())
    t_sampling = split["t_rollout"] + split["t_gather"]
    t_serial = split["t_update"] + split["t_bcast"] + t_other
    return {
        "nprocs": run.nprocs,
        "iterations": len(rows),
        "steady_iterations": iterations,
        "batch": batch,
        "steps_per_s": steps / wall,
        "steps_per_s_whole_loop": rows[-1]["total_steps"] / rows[-1]["wall_s"],
        "mean_return": tail_mean_return(rows, tail),
        "t_iteration": t_iteration,
        **split,
        "t_other": t_other,
        "t_sampling": t_sampling,
        "sampling_steps_per_s": batch / t_sampling,
        "t_serial": t_serial,
        "serial_share": t_serial / t_iteration,
        "sampling_core_s": t_sampling * min(run.nprocs, cores),
        "epochs_mean": statistics.fmean(r["epochs"] for r in steady) if "epochs" in steady[0] else math.nan,
        "process_wall_s": run.process_wall_s,
        "load_before": run.load_before,
        "load_after": run.load_after,
    }


def amdahl_steps_per_s(batch: float, t_serial: float, sampling_core_s: float, cores: int) -> float:
    """Predicted steps/s on ``cores`` cores, one rank per core: batch / (serial + sampling work / cores)."""
    return batch / (t_serial + sampling_core_s / cores)


def _command_output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def describe_machine() -> dict[str, str]:
    """nproc, CPU model, memory, OS, Python and `date -u` (the same fields as benchmarks/collectives.py, without
    importing mpi_util: a driver that initializes MPI is best avoided when it launches MPI jobs)."""
    model = next((line.split(":", 1)[1].strip() for line in _command_output(["lscpu"]).splitlines()
                  if line.startswith("Model name")), platform.processor() or "unknown")
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return {
        # The CPUs this process may run on, as `nproc` counts them (nproc itself obeys OMP_NUM_THREADS).
        "nproc": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
        "cpu_model": model,
        "memory": memory,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "date_utc": _command_output(["date", "-u"])
        or datetime.datetime.now(datetime.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y"),
    }


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """rows as CSV; the columns are every key of any row, in order of first appearance (empty where absent)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
        writer.writeheader()
        writer.writerows(rows)


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(statistics.median(finite)) if finite else math.nan


def fmt(value: float, digits: int = 0) -> str:
    return "nan" if math.isnan(value) else f"{value:,.{digits}f}"


def versions_line() -> str:
    """The results.md line that records the software stack and CPU a benchmark ran on (trainer/versions.py)."""
    # Imported here, not with this module: benchmarks that import scaling may go on to import another checkout's
    # algos (update.py's baseline), which an algos already in sys.modules would shadow.
    from trainer.versions import stack_versions

    return "- versions: " + ", ".join(f"{name} {value}" for name, value in stack_versions().items())


def machine_lines(command: str, wall_s: float, loads: str) -> list[str]:
    """The command / machine / date / load lines that go above every table."""
    machine = describe_machine()
    return [
        f"- command: `{command}` (from the repository root)",
        f"- machine: nproc {machine['nproc']}, {machine['cpu_model']}, {machine['memory']} memory, {machine['os']}, "
        f"Python {machine['python']}",
        f"- date: {machine['date_utc']} (`date -u` at the end); total wall time of the benchmark {wall_s:.0f} s",
        versions_line(),
        f"- 1-minute load average before each run ({loads}). The machine is shared: other jobs ran during the "
        "measurement, so absolute numbers move from run to run; the ratios pair neighbouring runs.",
    ]


def write_results(out: Path, runs: Sequence[dict[str, Any]], text: str, about: str, wall_s: float,
                  run_label: str) -> None:
    """runs.csv (every run) and results.md (machine_lines with ``about`` after the command line, then the table
    ``text``) in ``out``; prints the table. Each run has "repeat" and "load_before"; its ``run_label`` key names it in
    the load line."""
    out.mkdir(parents=True, exist_ok=True)
    loads = ", ".join(f"r{r['repeat']} {r[run_label]}: {r['load_before']:.2f}" for r in runs)
    write_csv(out / "runs.csv", runs)
    lines = machine_lines(pretty_command(), wall_s, loads)
    lines.insert(1, about)
    (out / "results.md").write_text("\n".join(lines) + "\n\n" + text + "\n")
    print(text)


def pretty_command() -> str:
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd() + os.sep) else sys.executable
    return shlex.join([python, *sys.argv])


# ----------------------------------------------------------------------------------------------------------------
# The scaling benchmark.
# ----------------------------------------------------------------------------------------------------------------


def paired_ratios(runs: list[dict[str, Any]], cores: int) -> None:
    """Add, in place, each run's ratios to the runs of the same repeat: speedup over 1 process, sampling
    efficiency, and steps/s relative to 2 processes (for the oversubscription target)."""
    for run in runs:
        same = {r["nprocs"]: r for r in runs if r["repeat"] == run["repeat"]}
        one, two = same.get(1), same.get(2)
        n_cores = min(run["nprocs"], cores)
        run["speedup_vs_1"] = run["steps_per_s"] / one["steps_per_s"] if one else math.nan
        run["sampling_efficiency"] = (run["sampling_steps_per_s"] / (n_cores * one["sampling_steps_per_s"])
                                      if one else math.nan)
        run["steps_per_s_vs_2"] = run["steps_per_s"] / two["steps_per_s"] if two else math.nan


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over repeats of every numeric column, per nprocs."""
    keys = [k for k in runs[0] if k not in ("repeat", "nprocs", "order")]
    out = []
    for n in sorted({r["nprocs"] for r in runs}):
        mine = [r for r in runs if r["nprocs"] == n]
        out.append({"nprocs": n, "repeats": len(mine), **{k: median([float(r[k]) for r in mine]) for k in keys}})
    return out


def amdahl_table(per_n: list[dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    """Predictions of steps/s on 1..64 cores from the split measured at each nprocs up to the cores."""
    rows = []
    for r in per_n:
        if r["nprocs"] > cores:
            continue  # oversubscribed runs time-share the cores: their split is not one rank's work
        row = {"basis_nprocs": r["nprocs"], "batch": r["batch"], "t_serial": r["t_serial"],
               "sampling_core_s": r["sampling_core_s"], "serial_share_1core":
               r["t_serial"] / (r["t_serial"] + r["sampling_core_s"])}
        for n in PREDICT_CORES:
            row[f"pred_{n}_cores"] = amdahl_steps_per_s(r["batch"], r["t_serial"], r["sampling_core_s"], n)
        row["ceiling"] = r["batch"] / r["t_serial"]
        rows.append(row)
    return rows


def plot(runs: list[dict[str, Any]], per_n: list[dict[str, Any]], amdahl: list[dict[str, Any]], cores: int,
         path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    ax.plot([r["nprocs"] for r in runs], [r["steps_per_s"] for r in runs], "o", color="C0", alpha=0.35,
            label="measured, each repeat")
    ax.plot([r["nprocs"] for r in per_n], [r["steps_per_s"] for r in per_n], "o-", color="C0", lw=2,
            label=f"measured, median (this machine: {cores} cores)")
    dense = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    for style, row in zip(("--", ":"), amdahl, strict=False):
        ax.plot(dense, [amdahl_steps_per_s(row["batch"], row["t_serial"], row["sampling_core_s"], n) for n in dense],
                style, color="C1", label=f"Amdahl from the split at {row['basis_nprocs']} proc "
                f"(serial {row['t_serial']:.2f} s/iter, ceiling {row['ceiling']:,.0f})")
    ax.plot(list(ORIGINAL_STEPS_PER_S), list(ORIGINAL_STEPS_PER_S.values()), "s", color="gray",
            label="original (hex-core Xeon, Walker2d-v1)")
    ax.axvline(cores, color="k", lw=0.8, alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(dense, [str(n) for n in dense])
    ax.set_xlabel("processes (measured) / cores (predicted)")
    ax.set_ylabel("environment steps per second")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    labels = {"t_rollout": "rollout", "t_gather": "gather (incl. waiting)", "t_update": "update (rank 0)",
              "t_bcast": "broadcast", "t_other": "other (log, ckpt)"}
    bottom = [0.0] * len(per_n)
    xs = [str(r["nprocs"]) for r in per_n]
    for key, label in labels.items():
        heights = [max(r[key], 0.0) for r in per_n]
        bx.bar(xs, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    bx.set_xlabel("processes")
    bx.set_ylabel("seconds per iteration (rank 0, median of repeats)")
    bx.legend(fontsize=7)
    bx.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_tables(per_n: list[dict[str, Any]], amdahl: list[dict[str, Any]], cores: int) -> str:
    main = [[r["nprocs"], fmt(r["steps_per_s"]), fmt(r["mean_return"], 1),
             fmt(ORIGINAL_STEPS_PER_S.get(r["nprocs"], math.nan))] for r in per_n]
    split = [[r["nprocs"], fmt(r["t_iteration"], 3), fmt(r["t_rollout"], 3), fmt(r["t_gather"], 3),
              fmt(r["t_update"], 3), fmt(r["t_bcast"], 4), fmt(r["t_other"], 3), f"{r['serial_share']:.0%}",
              fmt(r["sampling_steps_per_s"]), f"{r['speedup_vs_1']:.2f}x", f"{r['sampling_efficiency']:.0%}",
              f"{r['steps_per_s_vs_2']:.2f}x", fmt(r["epochs_mean"], 1), fmt(r["process_wall_s"])] for r in per_n]
    pred = [[r["basis_nprocs"], fmt(r["t_serial"], 3), fmt(r["sampling_core_s"], 3),
             f"{r['serial_share_1core']:.0%}", *(fmt(r[f"pred_{n}_cores"]) for n in (1, 2, 8, 16, 64)),
             fmt(r["ceiling"])] for r in amdahl]
    return "\n\n".join([
        "Throughput (the original's table; steps/s after the warm-up, median of repeats; mean return over the "
        "episodes of the last iterations):",
        table(["nprocs", "steps/s", "mean return", "original (Walker2d-v1, hex-core)"], main),
        f"Time split per iteration (rank 0, seconds, mean after the warm-up, median of repeats). serial share = "
        f"(update + bcast + other) / iteration; sampling = batch / (rollout + gather); efficiency = sampling rate / "
        f"(min(N, {cores} cores) x sampling rate at 1 process), paired within a repeat:",
        table(["nprocs", "iteration", "rollout", "gather", "update", "bcast", "other", "serial share",
               "sampling steps/s", "speedup vs 1", "sampling efficiency", "steps/s vs 2 procs", "PPO epochs",
               "process wall s"], split),
        "Amdahl: steps/s predicted on n cores (one rank per core) = batch / (serial + sampling core-seconds / n), "
        "from the split measured at each nprocs that does not oversubscribe; ceiling = batch / serial:",
        table(["from nprocs", "serial s/iter", "sampling core-s/iter", "serial share on 1 core", "1 core",
               "2 cores", "8 cores", "16 cores", "64 cores", "ceiling"], pred),
    ])


def target_lines(per_n: list[dict[str, Any]], amdahl: list[dict[str, Any]]) -> list[str]:
    by_n = {r["nprocs"]: r for r in per_n}
    lines = []
    if 2 in by_n and not math.isnan(by_n[2]["sampling_efficiency"]):
        e = by_n[2]["sampling_efficiency"]
        lines.append(f"- sampling-phase parallel efficiency at 2 processes: {e:.0%} (target {EFFICIENCY_TARGET:.0%}: "
                     f"{'met' if e >= EFFICIENCY_TARGET else 'missed'})")
    if 8 in by_n and not math.isnan(by_n[8]["steps_per_s_vs_2"]):
        o = by_n[8]["steps_per_s_vs_2"]
        lines.append(f"- steps/s at 8 processes / at 2 processes: {o:.2f} (target {OVERSUBSCRIPTION_TARGET:.2f}: "
                     f"{'met' if o >= OVERSUBSCRIPTION_TARGET else 'missed'})")
    for r in per_n:
        lines.append(f"- serial share at {r['nprocs']} processes: {r['serial_share']:.0%} of the iteration "
                     f"(update {r['t_update']:.3f} s, bcast {r['t_bcast']:.4f} s, other {r['t_other']:.3f} s)")
    for row in amdahl:
        lines.append(f"- Amdahl from {row['basis_nprocs']} process(es): " + ", ".join(
            f"{n} cores {row[f'pred_{n}_cores']:,.0f}" for n in (8, 16, 64)) + f" steps/s; ceiling "
            f"{row['ceiling']:,.0f}")
    return lines


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Walker2d-v5", help="gymnasium env id (default: %(default)s)")
    parser.add_argument("--nprocs", type=int, nargs="+", default=[1, 2, 3, 4, 8],
                        help="process counts; 1 and 2 are needed for the ratios (default: %(default)s)")
    parser.add_argument("--total_steps", type=int, default=40_960,
                        help="step budget of each run (default: %(default)s = 20 iterations of 2048)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per process count (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="first iterations left out of the rates and the split (default: %(default)s)")
    parser.add_argument("--tail", type=int, default=5,
                        help="iterations at the end whose episodes give the mean return (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one train.py run may take before it is killed (default: %(default)s)")
    parser.add_argument("--train_args", default="", help="extra train.py arguments, one shell-quoted string")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    parser.add_argument("--keep_runs", action="store_true", help="keep the run directories under /tmp")
    parser.add_argument("--quick", action="store_true", help="smoke test: nprocs 1 2, 8192 steps, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.nprocs, args.total_steps, args.repeats, args.warmup, args.tail = [1, 2], 8192, 1, 1, 2
    return args


def main() -> int:
    args = parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    command = pretty_command()
    workroot = Path(tempfile.mkdtemp(prefix="bench_scaling_", dir="/tmp"))
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    order = 0
    try:
        for repeat in range(args.repeats):
            sequence = args.nprocs if repeat % 2 == 0 else list(reversed(args.nprocs))
            for nprocs in sequence:
                order += 1
                print(f"scaling: repeat {repeat + 1}/{args.repeats}, {nprocs} processes, {args.total_steps} steps "
                      f"(load {load_average():.2f}) ...", flush=True)
                run = run_train(args.env, nprocs, args.total_steps, workroot / f"r{repeat}_n{nprocs}", args.timeout,
                                shlex.split(args.train_args))
                summary = {"repeat": repeat + 1, "order": order, **summarize_run(run, args.warmup, args.tail, cores)}
                runs.append(summary)
                print(f"  {summary['steps_per_s']:,.0f} steps/s, split rollout {summary['t_rollout']:.3f} gather "
                      f"{summary['t_gather']:.3f} update {summary['t_update']:.3f} bcast {summary['t_bcast']:.4f} "
                      f"other {summary['t_other']:.3f} s/iter; mean return {summary['mean_return']:.1f}; "
                      f"process {run.process_wall_s:.0f} s", flush=True)
    finally:
        if not args.keep_runs:
            shutil.rmtree(workroot, ignore_errors=True)
    wall_s = time.perf_counter() - started

    paired_ratios(runs, cores)
    per_n = aggregate(runs)
    amdahl = amdahl_table(per_n, cores)
    write_csv(out / "runs.csv", runs)
    write_csv(out / "scaling.csv", per_n)
    if amdahl:
        write_csv(out / "amdahl.csv", amdahl)
    loads = ", ".join(f"r{r['repeat']} n{r['nprocs']}: {r['load_before']:.2f}" for r in runs)
    header = machine_lines(command, wall_s, loads)
    header.insert(1, f"- runs: `train.py {args.env} --nprocs N --total_steps {args.total_steps}"
                  + (f" {args.train_args}" if args.train_args else "") + f"` (default hyperparameters), "
                  f"{args.repeats} interleaved repeat(s); warm-up {args.warmup} iteration(s) left out; mean return "
                  f"over the last {args.tail} iterations")
    markdown = "\n".join(header) + "\n\n" + markdown_tables(per_n, amdahl, cores) + "\n\n" + "\n".join(
        target_lines(per_n, amdahl)) + "\n"
    (out / "results.md").write_text(markdown)
    plot(runs, per_n, amdahl, cores, out / "scaling.png",
         f"train.py {args.env}, {args.total_steps} steps per run | nproc {cores} | {describe_machine()['date_utc']}")
    print()
    print(markdown)
    print(f"wrote {', '.join(p.name for p in sorted(out.iterdir()))} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
