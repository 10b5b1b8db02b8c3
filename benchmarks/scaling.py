"""Scaling of train.py with the number of MPI processes: the original's table, the time split per iteration, the
sampling-phase efficiency, the serial share and Amdahl's prediction (benchmarks/README.md, section scaling.py).

Runs ``train.py ENV --nprocs N --total_steps B`` at each N, interleaved (repeat 1 goes up the Ns, repeat 2 down, ...),
takes each run's figures from progress.csv after ``--warmup`` iterations, pairs ratios within a repeat and reports
medians over repeats. Sampling efficiency at N = sampling rate(N) / (min(N, cores) x sampling rate(1)); serial share
= (update + bcast + other) / iteration; Amdahl on n cores = batch / (serial + sampling core-seconds / n).
Writes runs.csv, results.md and scaling.png to ``--out``; ``--quick`` is a smoke test whose numbers mean little.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import (
    TIME_KEYS,
    describe_machine,
    fmt,
    load_average,
    median,
    options,
    run_train,
    summarize_run,
    table,
    write_results,
)

PREDICT_CORES = (1, 2, 4, 8, 16, 32, 64)
# The original's table (hex-core Xeon, Walker2d-v1, TRPO with its own batch settings): nprocs -> steps/s.
ORIGINAL_STEPS_PER_S = {1: 546, 2: 1040, 9: 2484}


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
    keys = [k for k in runs[0] if k not in ("repeat", "nprocs")]
    out = []
    for n in sorted({r["nprocs"] for r in runs}):
        mine = [r for r in runs if r["nprocs"] == n]
        out.append({"nprocs": n, "repeats": len(mine), **{k: median([float(r[k]) for r in mine]) for k in keys}})
    return out


def amdahl_steps_per_s(batch: float, t_serial: float, sampling_core_s: float, cores: int) -> float:
    """Predicted steps/s on ``cores`` cores, one rank per core: batch / (serial + sampling work / cores)."""
    return batch / (t_serial + sampling_core_s / cores)


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
    split = [[r["nprocs"], fmt(r["steps_per_s"]), fmt(ORIGINAL_STEPS_PER_S.get(r["nprocs"], math.nan)),
              fmt(r["t_iteration"], 3), fmt(r["t_rollout"], 3), fmt(r["t_gather"], 3), fmt(r["t_update"], 3),
              fmt(r["t_bcast"], 4), fmt(r["t_other"], 3), f"{r['serial_share']:.0%}", fmt(r["sampling_steps_per_s"]),
              f"{r['speedup_vs_1']:.2f}x", f"{r['sampling_efficiency']:.0%}", f"{r['steps_per_s_vs_2']:.2f}x",
              fmt(r["epochs_mean"], 1), fmt(r["process_wall_s"])] for r in per_n]
    pred = [[r["basis_nprocs"], fmt(r["t_serial"], 3), fmt(r["sampling_core_s"], 3),
             f"{r['serial_share_1core']:.0%}", *(fmt(r[f"pred_{n}_cores"]) for n in (1, 2, 8, 16, 64)),
             fmt(r["ceiling"])] for r in amdahl]
    return "\n\n".join([
        f"Throughput and time split per iteration (steps/s after the warm-up; rank 0's seconds, mean after the "
        f"warm-up; medians of repeats). serial share = (update + bcast + other) / iteration; sampling = batch / "
        f"(rollout + gather); efficiency = sampling rate / (min(N, {cores} cores) x sampling rate at 1 process), "
        f"paired within a repeat; original = the original's table (Walker2d-v1, hex-core Xeon):",
        table(["nprocs", "steps/s", "original", "iteration", "rollout", "gather", "update", "bcast", "other",
               "serial share", "sampling steps/s", "speedup vs 1", "sampling efficiency", "steps/s vs 2 procs",
               "PPO epochs", "process wall s"], split),
        "Amdahl: steps/s predicted on n cores (one rank per core) = batch / (serial + sampling core-seconds / n), "
        "from the split measured at each nprocs that does not oversubscribe; ceiling = batch / serial:",
        table(["from nprocs", "serial s/iter", "sampling core-s/iter", "serial share on 1 core", "1 core",
               "2 cores", "8 cores", "16 cores", "64 cores", "ceiling"], pred),
    ])


def parse_args() -> argparse.Namespace:
    parser = options(__doc__, "scaling", env="Walker2d-v5", nprocs=[1, 2, 3, 4, 8], total_steps=40_960, repeats=2,
                     warmup=2, tail=5, timeout=600.0)
    parser.add_argument("--train_args", default="", help="extra train.py arguments, one shell-quoted string")
    parser.add_argument("--quick", action="store_true", help="smoke test: nprocs 1 2, 8192 steps, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.nprocs, args.total_steps, args.repeats, args.warmup, args.tail = [1, 2], 8192, 1, 1, 2
    return args


def main() -> int:
    args = parse_args()
    out = args.out.resolve()
    cores = os.cpu_count() or 1
    workroot = Path(tempfile.mkdtemp(prefix="bench_scaling_", dir="/tmp"))
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    try:
        for repeat in range(args.repeats):
            for nprocs in args.nprocs if repeat % 2 == 0 else list(reversed(args.nprocs)):
                print(f"scaling: repeat {repeat + 1}/{args.repeats}, {nprocs} processes, {args.total_steps} steps "
                      f"(load {load_average():.2f}) ...", flush=True)
                run = run_train(args.env, nprocs, args.total_steps, workroot / f"r{repeat}_n{nprocs}", args.timeout,
                                shlex.split(args.train_args))
                summary = {"repeat": repeat + 1, **summarize_run(run, args.warmup, args.tail, cores)}
                runs.append(summary)
                print(f"  {summary['steps_per_s']:,.0f} steps/s, split " + " ".join(
                    f"{key[2:]} {summary[key]:.4f}" for key in (*TIME_KEYS, "t_other")), flush=True)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    paired_ratios(runs, cores)
    per_n = aggregate(runs)
    amdahl = amdahl_table(per_n, cores)
    about = [f"- runs: `train.py {args.env} --nprocs N --total_steps {args.total_steps}"
             + (f" {args.train_args}" if args.train_args else "") + f"` (default hyperparameters), {args.repeats} "
             f"interleaved repeat(s); warm-up {args.warmup} iteration(s) left out; mean return over the last "
             f"{args.tail} iterations"]
    loads = ", ".join(f"r{r['repeat']} n{r['nprocs']}: {r['load_before']:.2f}" for r in runs)
    write_results(out, runs, markdown_tables(per_n, amdahl, cores), time.perf_counter() - started, loads, about)
    plot(runs, per_n, amdahl, cores, out / "scaling.png",
         f"train.py {args.env}, {args.total_steps} steps per run | nproc {cores} | {describe_machine()['date_utc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
