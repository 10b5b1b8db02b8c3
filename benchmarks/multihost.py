"""What crossing hosts costs: the same 4-rank train.py job on one host (mpi_util's one-host transport), on one host
with plain MPI (``MPI_UTIL_WAIT=poll``), and split 2 + 2 across two hosts made from network namespaces joined by a
veth pair (tests/hosts.py; needs root), interleaved; medians of steps/s, t_gather, t_bcast and t_update after the
warm-up, and the bytes over the veth (benchmarks/README.md, section multihost.py). Writes runs.csv and results.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from harness import (
    REPO,
    TrainRun,
    failure,
    fmt,
    load_average,
    median,
    options,
    read_progress,
    run_logged,
    summarize_run,
    table,
    write_results,
)


def load_hosts() -> ModuleType:
    """tests/hosts.py, the two-host fixture of the tests, loaded from its file: tests/ is not a package."""
    spec = importlib.util.spec_from_file_location("hosts", REPO / "tests" / "hosts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hosts"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


HOSTS = load_hosts()
NPROCS = 4
SETTINGS = ("one host", "one host, plain MPI", "2 + 2 hosts")


def run_setting(setting: str, hosts: Any, args: argparse.Namespace, workdir: Path) -> tuple[TrainRun, int]:
    """One train.py run in ``setting``; (the run, bytes that crossed the veth meanwhile)."""
    workdir.mkdir(parents=True)
    run_dir = workdir / "run"
    common = [str(REPO / "train.py"), args.env, "--total_steps", str(args.total_steps), "--seed", str(args.seed),
              "--run_dir", str(run_dir)]
    environment: dict[str, str] = {}
    if setting == "2 + 2 hosts":
        mpiexec = HOSTS.Launcher(os.environ.get("MPIEXEC") or _find_mpiexec())
        command = hosts.mpiexec_command(mpiexec, NPROCS // 2, common)
    else:
        command = [sys.executable, *common, "--nprocs", str(NPROCS)]
        if setting == "one host, plain MPI":
            environment["MPI_UTIL_WAIT"] = "poll"
    load_before, before = load_average(), hosts.link_bytes()
    returncode, wall_s = run_logged(command, workdir / "train.log", args.timeout, environment)
    crossed = hosts.link_bytes() - before
    if returncode != 0:
        raise failure(f"{setting}: {shlex.join(command)}", returncode, workdir / "train.log")
    run = TrainRun(nprocs=NPROCS, rows=read_progress(run_dir / "progress.csv"), process_wall_s=wall_s,
                   load_before=load_before, load_after=load_average(), command=shlex.join(command))
    return run, crossed


def _find_mpiexec() -> str:
    from mpi_util import find_mpiexec  # initializes MPI in this process only when the hosts run is asked for

    return find_mpiexec()


def parse_args() -> argparse.Namespace:
    parser = options(__doc__, "multihost", env="CartPole-v1", total_steps=100_000, repeats=3, warmup=2, seed=0,
                     timeout=1800.0)
    parser.add_argument("--quick", action="store_true", help="8 iterations, 1 repeat: checks that it works")
    args = parser.parse_args()
    if args.quick:
        args.total_steps, args.repeats = 8 * 2048, 1
    return args


def main() -> int:
    args = parse_args()
    why = HOSTS.TwoHosts.why_unavailable()
    if why:
        print(f"benchmarks/multihost.py: two hosts from network namespaces: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    with HOSTS.TwoHosts() as hosts, tempfile.TemporaryDirectory(prefix="multihost_") as scratch:
        for repeat in range(args.repeats):
            order = SETTINGS if repeat % 2 == 0 else tuple(reversed(SETTINGS))
            for setting in order:
                run, crossed = run_setting(setting, hosts, args, Path(scratch) / f"{repeat}_{setting}")
                summary = summarize_run(run, args.warmup, tail=2, cores=os.cpu_count() or 1)
                summary.update(setting=setting, repeat=repeat,
                               veth_bytes_per_iteration=crossed / len(run.rows), command=run.command)
                runs.append(summary)
                print(f"{setting:20s} repeat {repeat}: {summary['steps_per_s']:.0f} steps/s, "
                      f"gather {summary['t_gather']:.4f} s, bcast {summary['t_bcast']:.4f} s", flush=True)
    rows = []
    for setting in SETTINGS:
        mine = [r for r in runs if r["setting"] == setting]
        rows.append([setting, fmt(median([r["steps_per_s"] for r in mine])),
                     fmt(median([r["t_gather"] for r in mine]), 4), fmt(median([r["t_bcast"] for r in mine]), 4),
                     fmt(median([r["t_update"] for r in mine]), 3),
                     fmt(median([r["veth_bytes_per_iteration"] for r in mine]) / 1e6, 2), len(mine)])
    body = table(["setting (4 ranks)", "steps/s", "t_gather s/iter", "t_bcast s/iter", "t_update s/iter",
                  "MB over the veth per iter", "runs"], rows)
    about = [f"- {args.total_steps} steps per run, medians over {args.repeats} repeats after {args.warmup} warm-up "
             "iterations; the hosts are namespaces of one machine (no real network latency or bandwidth limit)"]
    write_results(args.out, runs, body, time.monotonic() - started, ", ".join(f"{r['load_before']:.1f}" for r in runs),
                  about, f"{NPROCS} ranks of train.py {args.env} on one host and across two (network namespaces)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
