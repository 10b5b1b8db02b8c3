"""What crossing hosts costs: the same 4-rank train.py job on one host and split 2 + 2 across two hosts.

The two hosts are network namespaces on this machine joined by a veth pair (tests/hosts.py; needs root): the data
goes through the kernel's TCP stack instead of shared memory, as between two machines, but without a real network's
latency and bandwidth limits, so the "across" row is a lower bound on what a real network adds. Three settings:

- one host: ``train.py ENV --nprocs 4`` (mpi_fork; mpi_util's one-host transport: doorbell and shared memory);
- one host, plain MPI: the same with ``MPI_UTIL_WAIT=poll`` (no one-host transport: MPI's own shared memory);
- 2 + 2 hosts: ``train.py ENV`` under hydra's mpiexec with ``-hosts hostA:2,hostB:2`` (MPI over TCP on the veth).

From rank 0's progress.csv after ``--warmup`` iterations (benchmarks/scaling.py's summarize_run): steps/s, and
seconds per iteration of t_gather (rank0_accum_batches, waiting for the slowest rank included) and t_bcast
(rank0_bcast_wts); also the bytes that crossed the veth per iteration. Runs are interleaved over ``--repeats``
(one host, plain MPI, across, then the reverse order, ...); the table gives medians.

Run from the repository root, as root, on an otherwise idle machine::

    .venv/bin/python benchmarks/multihost.py --total_steps 100000 --repeats 3

Writes runs.csv and results.md (the table with command, machine and date) to benchmarks/results/multihost/
(``--out``) and prints the table. ``--quick`` (8 iterations, 1 repeat) checks that it works; its numbers mean little.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests")]

from hosts import Launcher, TwoHosts  # noqa: E402
from scaling import (  # noqa: E402
    TrainRun,
    fmt,
    load_average,
    machine_lines,
    median,
    pretty_command,
    read_progress,
    run_logged,
    summarize_run,
    table,
    write_csv,
)

DEFAULT_OUT = REPO / "benchmarks" / "results" / "multihost"
NPROCS = 4
SETTINGS = ("one host", "one host, plain MPI", "2 + 2 hosts")


def run_setting(setting: str, hosts: TwoHosts, args: argparse.Namespace, workdir: Path) -> tuple[TrainRun, int]:
    """One train.py run in ``setting``; (the run, bytes that crossed the veth meanwhile)."""
    workdir.mkdir(parents=True)
    run_dir = workdir / "run"
    common = [str(REPO / "train.py"), args.env, "--total_steps", str(args.total_steps), "--seed", str(args.seed)]
    environment = {"MPI_BATCH_RL_RUN_DIR": str(run_dir), "PYTHONPATH": str(REPO)}
    if setting == "2 + 2 hosts":
        mpiexec = Launcher(os.environ.get("MPIEXEC") or _find_mpiexec())
        command = hosts.mpiexec_command(mpiexec, NPROCS // 2, common)
    else:
        command = [sys.executable, *common, "--nprocs", str(NPROCS)]
        if setting == "one host, plain MPI":
            environment["MPI_UTIL_WAIT"] = "poll"
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)  # run_logged passes os.environ on
    try:
        load_before, before = load_average(), hosts.link_bytes()
        returncode, wall_s = run_logged(command, workdir / "train.log", args.timeout)
        crossed = hosts.link_bytes() - before
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if returncode != 0:
        tail = (workdir / "train.log").read_text().splitlines()[-15:]
        raise RuntimeError(f"{setting}: exit status {returncode}: {shlex.join(command)}\n" + "\n".join(tail))
    run = TrainRun(nprocs=NPROCS, rows=read_progress(run_dir / "progress.csv"), process_wall_s=wall_s,
                   load_before=load_before, load_after=load_average(), command=shlex.join(command))
    return run, crossed


def _find_mpiexec() -> str:
    from mpi_util import find_mpiexec  # initializes MPI in this process only when the hosts run is asked for

    return find_mpiexec()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium environment (default CartPole-v1)")
    parser.add_argument("--total_steps", type=int, default=100_000, help="steps per run (default 100000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting, interleaved (default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the figures (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default 1800)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results directory (default {DEFAULT_OUT})")
    parser.add_argument("--quick", action="store_true", help="8 iterations, 1 repeat: checks that it works")
    args = parser.parse_args(argv)
    if args.quick:
        args.total_steps, args.repeats = 8 * 2048, 1
    return args


def main() -> int:
    args = parse_args()
    why = TwoHosts.why_unavailable()
    if why:
        print(f"benchmarks/multihost.py: two hosts from network namespaces: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    with TwoHosts() as hosts, tempfile.TemporaryDirectory(prefix="multihost_") as scratch:
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
    markdown = table(["setting (4 ranks)", "steps/s", "t_gather s/iter", "t_bcast s/iter", "t_update s/iter",
                      "MB over the veth per iter", "runs"], rows)
    loads = ", ".join(f"{r['load_before']:.1f}" for r in runs)
    header = [f"# {NPROCS} ranks of train.py {args.env} on one host and across two (network namespaces)", "",
              *machine_lines(pretty_command(), time.monotonic() - started, loads),
              f"- {args.total_steps} steps per run, medians over {args.repeats} repeats after {args.warmup} warm-up "
              "iterations; the hosts are namespaces of one machine (no real network latency or bandwidth limit)", ""]
    text = "\n".join([*header, markdown, ""])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    write_csv(args.out / "runs.csv", runs)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
