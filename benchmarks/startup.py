"""Start-up time and memory per rank of train.py, for two or more checkouts side by side (benchmarks/README.md,
section "Start-up and memory per rank").

A variant is ``NAME=TREE``: the checkout whose train.py (and, since Python puts the script's folder first on the
module path, whose mpi_util and algos) runs. Every process of the job is sampled every 50 ms for its rank
(PMI_RANK) and peak resident memory (VmHWM); the job's CPU time (user and system, every process) is read when it
ends. Variants alternate in order from repeat to repeat and ratios pair runs of the same repeat. ``--args_of
NAME=ARGS`` gives one variant train.py arguments of its own (another checkout's defaults given by flags, say).
Writes runs.csv and results.md to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import REPO, children_cpu_s, fmt, load_average, median, options, table, write_results

FIRST_ITERATION = re.compile(r"^\s+1\s+\d+\s")
# The table's medians and its ratios to the baseline per repeat, in column order.
MEDIANS = ("first_iteration_s", "rank0_peak_mb", "worker_peak_mb", "job_peak_mb", "steps_per_s")
RATIOS = ("first_iteration_s", "job_peak_mb", "steps_per_s", "job_cpu_s")


def job_processes(root_pid: int) -> list[int]:
    """Process ids of ``root_pid``'s descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [root_pid]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, []):
            found.append(child)
            frontier.append(child)
    return found


def rank_and_peak_mb(pid: int) -> tuple[int, float] | None:
    """(MPI rank, peak resident MB) of a rank process, None for other processes (mpiexec, its proxies)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rank = next((int(item.split(b"=", 1)[1]) for item in environ if item.startswith(b"PMI_RANK=")), None)
    peak = next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return None if rank is None or peak is None else (rank, peak)


def run_once(name: str, tree: Path, env_id: str, nprocs: int, total_steps: int, workdir: Path,
             timeout_s: float, train_args: str) -> dict[str, Any]:
    command = [sys.executable, "-u", str(tree / "train.py"), env_id, "--nprocs", str(nprocs),
               "--total_steps", str(total_steps), "--logdir", str(workdir / "runs"), *shlex.split(train_args)]
    load_before = load_average()
    peaks: dict[int, float] = {}
    cpu_before = children_cpu_s()
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid in job_processes(proc.pid):
                found = rank_and_peak_mb(pid)
                if found:
                    peaks[found[0]] = max(peaks.get(found[0], 0.0), found[1])
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    first_iteration_s = float("nan")
    output = []
    timer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout:
            output.append(line)
            if math.isnan(first_iteration_s) and FIRST_ITERATION.match(line):
                first_iteration_s = time.monotonic() - started
        returncode = proc.wait()
    finally:
        timer.cancel()
        done.set()
        sampler.join()
    if returncode != 0:
        raise RuntimeError(f"exit status {returncode}: {shlex.join(command)}\n" + "".join(output[-15:]))
    progress = next((workdir / "runs").glob("*/progress.csv"))
    with progress.open(newline="") as f:
        rows = list(csv.DictReader(f))
    workers = [peaks[r] for r in range(1, nprocs) if r in peaks]
    return {
        "variant": name, "tree": str(tree), "nprocs": nprocs,
        "first_iteration_s": first_iteration_s,
        "rank0_peak_mb": peaks.get(0, float("nan")),
        "worker_peak_mb": median(workers) if workers else float("nan"),
        "job_peak_mb": sum(peaks.values()),
        "ranks_seen": len(peaks),
        "job_cpu_s": children_cpu_s() - cpu_before,
        "steps_per_s": median([float(row["steps_per_s"]) for row in rows[2:]]),
        **{f"{key}_s": median([float(row[key]) for row in rows[2:]]) for key in ("t_rollout", "t_update")},
        "wall_s": time.monotonic() - started,
        "load_before": load_before,
        "command": shlex.join(command),
    }


def parse_args() -> argparse.Namespace:
    parser = options(__doc__, "startup", env="Walker2d-v5", nprocs=8, total_steps=20480, repeats=3, timeout=600.0)
    parser.add_argument("variants", nargs="+", help="NAME=TREE, the first is the baseline")
    parser.add_argument("--train_args", default="", help="extra train.py arguments, one shell-quoted string")
    parser.add_argument("--args_of", action="append", default=[], metavar="NAME=ARGS",
                        help="extra train.py arguments of variant NAME alone, one shell-quoted string (repeatable)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    variants = []
    for text in args.variants:
        name, sep, tree = text.partition("=")
        if not sep or not (Path(tree) / "train.py").is_file():
            raise SystemExit(f"startup.py: error: a variant is NAME=TREE with TREE/train.py, got {text!r}")
        variants.append((name, Path(tree).resolve()))
    args_of = dict(text.partition("=")[::2] for text in args.args_of)
    unknown = set(args_of) - {name for name, _ in variants}
    if unknown:
        raise SystemExit(f"startup.py: error: --args_of names no variant: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            order = variants if repeat % 2 == 0 else variants[::-1]
            for name, tree in order:
                run = run_once(name, tree, args.env, args.nprocs, args.total_steps,
                               Path(scratch) / f"r{repeat}_{name}", args.timeout,
                               f"{args.train_args} {args_of.get(name, '')}")
                run["repeat"] = repeat
                runs.append(run)
                print(f"repeat {repeat} {name}: first iteration {run['first_iteration_s']:.1f} s, rank 0 "
                      f"{run['rank0_peak_mb']:.0f} MB, worker {run['worker_peak_mb']:.0f} MB, job "
                      f"{run['job_peak_mb']:.0f} MB, {run['steps_per_s']:.0f} steps/s (rollout "
                      f"{run['t_rollout_s']:.2f} s, update {run['t_update_s']:.2f} s)", flush=True)
    baseline = variants[0][0]
    for run in runs:
        base = next(r for r in runs if r["repeat"] == run["repeat"] and r["variant"] == baseline)
        for key in RATIOS:
            run[f"{key}_ratio"] = run[key] / base[key] if base[key] else math.nan  # no peak: one process, no ranks
    rows = []
    for name, _ in variants:
        mine = [r for r in runs if r["variant"] == name]
        rows.append([name, args.nprocs, fmt(median([r["first_iteration_s"] for r in mine]), 1),
                     *(fmt(median([r[key] for r in mine])) for key in MEDIANS[1:]),
                     fmt(median([r["job_cpu_s"] for r in mine]), 1),
                     *(fmt(median([r[key] for r in mine]), 2) for key in ("t_rollout_s", "t_update_s")),
                     *(", ".join(f"{r[key + '_ratio']:.2f}" for r in mine) for key in RATIOS)])
    header = ["variant", "nprocs", "launch to first iteration (s)", "rank 0 peak (MB)", "worker peak (MB)",
              "job peak (MB)", "steps/s", "job CPU (s)", "t_rollout (s)", "t_update (s)",
              f"first iteration / {baseline}", f"job memory / {baseline}",
              f"steps/s / {baseline}", f"job CPU / {baseline}"]
    text = table(header, rows)
    about = (f"- runs: `TREE/train.py {args.env} --nprocs {args.nprocs} --total_steps {args.total_steps}"
             + (f" {args.train_args}" if args.train_args else "") + "`; "
             + "; ".join(f"{name} = {tree}" + (f" with `{args_of[name]}`" if name in args_of else "")
                         for name, tree in variants)
             + f"; {args.repeats} interleaved repeat(s); medians, ratios per repeat (in repeat order)")
    loads = ", ".join(f"r{r['repeat']} {r['variant']}: {r['load_before']:.2f}" for r in runs)
    write_results(args.out, runs, text, time.monotonic() - started, loads, [about])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
