"""Rank 0's PPO update on TensorFlow's single-threaded executor against its default executor, in one process.

    .venv/bin/python benchmarks/executor.py --repeats 5

A lever tried and not kept (benchmarks/README.md). The two executors run the same graphs with the same kernels, with
the same results bit for bit; only how ready ops are dispatched differs. How much that matters depends on the state
of a shared machine, which can change more between two processes started a few seconds apart than the effect
measured. So one process times both, in pairs: Walker2d-v5's ActorCritic (17 observations, 6 actions, 64x64
networks), PPO with the default hyperparameters but target_kl=None (all 10 epochs), one fixed 2,048-row batch, and
before each timed update ``--between``: 1,024 steps of Walker2d-v5 (rank 0's rollout at ``--nprocs 2``), or nothing
(updates back to back). Within a pair the order alternates. TensorFlow's threads are set as train.py sets them (1
intra-op thread, inter-op min(2, CPUs), oneDNN off). A repeat is a new process; the ratio single-threaded / default
is the median over its pairs.

Writes runs.csv and results.md to ``--out`` (default benchmarks/results/executor_tried/paired_in_one_process/) and
prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scaling import fmt, load_average, median, table, write_results
from update import REPO, ROLLOUT_STEPS, random_rollout, set_up_tensorflow, walker2d_env, walker2d_ppo

EXECUTORS = {"single-threaded": "SINGLE_THREADED_EXECUTOR", "default": None}


def child(between: str, pairs: int) -> None:
    """Time ``pairs`` updates on each executor, alternating; print {"single-threaded": [s, ...], "default": [...]}."""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # as train.py runs the learner
    set_up_tensorflow(REPO, intra_threads=1)
    import tensorflow as tf

    ppo, batch = walker2d_ppo()
    env = walker2d_env()

    def executor(name: str) -> contextlib.AbstractContextManager:
        return tf.experimental.function_executor_type(EXECUTORS[name])

    for name in EXECUTORS:  # the first update on each traces and instantiates its graphs
        with executor(name):
            ppo.update(*batch)
            ppo.update(*batch)
    times: dict[str, list[float]] = {name: [] for name in EXECUTORS}
    for pair in range(pairs):
        for name in list(EXECUTORS) if pair % 2 == 0 else list(EXECUTORS)[::-1]:
            if between == "rollout":
                random_rollout(env)
            with executor(name):
                start = time.perf_counter()
                ppo.update(*batch)
                times[name].append(time.perf_counter() - start)
    print(json.dumps(times))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="processes per --between (default: %(default)s)")
    parser.add_argument("--pairs", type=int, default=15, help="timed pairs of updates per process "
                                                               "(default: %(default)s)")
    parser.add_argument("--between", nargs="+", choices=("rollout", "none"), default=["rollout", "none"],
                        help=f"what runs before each timed update: rollout ({ROLLOUT_STEPS:,} random-action steps of "
                             "Walker2d-v5) or none (default: %(default)s)")
    parser.add_argument("--out", type=Path,
                        default=REPO / "benchmarks" / "results" / "executor_tried" / "paired_in_one_process",
                        help="where runs.csv and results.md go (default: %(default)s)")
    parser.add_argument("--child", choices=("rollout", "none"), help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.child is not None:
        child(args.child, args.pairs)
        return 0
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for between in args.between:
            load = load_average()
            result = subprocess.run([sys.executable, __file__, "--child", between, "--pairs", str(args.pairs)],
                                    capture_output=True, text=True, timeout=600, check=False)
            if result.returncode != 0:
                raise SystemExit(f"executor.py: the {between} run failed:\n{result.stderr[-3000:]}")
            times = json.loads(result.stdout.strip().splitlines()[-1])
            ratios = [s / d for s, d in zip(times["single-threaded"], times["default"], strict=True)]
            run = {"repeat": repeat, "between": between, "load_before": load,
                   "single_threaded_ms": median(times["single-threaded"]) * 1000,
                   "default_ms": median(times["default"]) * 1000, "ratio": median(ratios)}
            runs.append(run)
            print(f"repeat {repeat}, {between}: single-threaded {run['single_threaded_ms']:.1f} ms, default "
                  f"{run['default_ms']:.1f} ms, ratio {run['ratio']:.2f}", flush=True)
    rows = []
    for between in args.between:
        mine = [r for r in runs if r["between"] == between]
        rows.append([between, fmt(median([r["single_threaded_ms"] for r in mine]), 1),
                     fmt(median([r["default_ms"] for r in mine]), 1),
                     ", ".join(f"{r['ratio']:.2f}" for r in mine), fmt(median([r["ratio"] for r in mine]), 2)])
    text = table(["before each update", "single-threaded (ms, median)", "default (ms, median)",
                  "single-threaded / default, per process", "median"], rows)
    about = (f"- each process: PPO update of Walker2d's ActorCritic on a fixed 2,048-row batch, 10 epochs x 32 "
             f"minibatches, target_kl off; {args.pairs} pairs of updates (one per executor, order alternating) after "
             f"2 warm-up updates on each; medians over the pairs")
    write_results(args.out, runs, text, about, time.monotonic() - started, "between")
    return 0


if __name__ == "__main__":
    sys.exit(main())
