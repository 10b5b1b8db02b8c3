"""train.py variants side by side: interleaved runs of each variant at each --nprocs, and their ratios
(benchmarks/README.md, section variants.py).

A variant is ``NAME=ARGS``: extra train.py arguments, with words ``VAR=value`` going to the run's environment; the
first is the baseline. Another checkout's mpi_util and algos run with ``PYTHONSAFEPATH=1 PYTHONPATH=/path/to/tree``.
Ratios to the baseline pair runs of the same repeat; the table gives medians. Writes runs.csv and results.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import TIME_KEYS, fmt, load_average, median, options, run_train, summarize_run, table, write_results


def parse_variant(text: str) -> tuple[str, list[str], dict[str, str]]:
    """"NAME=ARGS" -> (name, train.py arguments, environment settings)."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"variants.py: error: a variant is NAME=ARGS (ARGS may be empty), got {text!r}")
    args, env = [], {}
    for word in shlex.split(rest):
        if "=" in word and not word.startswith("-") and word.split("=", 1)[0].isidentifier():
            key, value = word.split("=", 1)
            env[key] = value
        else:
            args.append(word)
    return name, args, env


def parse_args() -> argparse.Namespace:
    parser = options(__doc__, "variants", env="Walker2d-v5", nprocs=[2, 8], total_steps=40_960, repeats=3, warmup=2,
                     timeout=600.0)
    parser.add_argument("variants", nargs="+", help="NAME=ARGS, the first is the baseline (see above)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    variants = [parse_variant(text) for text in args.variants]
    names = [name for name, _, _ in variants]
    if len(set(names)) != len(names) or len(variants) < 2:
        raise SystemExit("variants.py: error: give at least two variants with different names")
    cores = os.cpu_count() or 1
    workroot = Path(tempfile.mkdtemp(prefix="bench_variants_", dir="/tmp"))
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    try:
        for repeat in range(args.repeats):
            order = variants if repeat % 2 == 0 else list(reversed(variants))
            for nprocs in args.nprocs:
                for name, train_args, env in order:
                    print(f"variants: repeat {repeat + 1}/{args.repeats}, {nprocs} processes, {name} "
                          f"(load {load_average():.2f}) ...", flush=True)
                    run = run_train(args.env, nprocs, args.total_steps, workroot / f"r{repeat}_n{nprocs}_{name}",
                                    args.timeout, train_args, env)
                    summary = {"variant": name, "repeat": repeat + 1,
                               **summarize_run(run, args.warmup, tail=1, cores=cores)}
                    runs.append(summary)
                    print(f"  {summary['steps_per_s']:,.0f} steps/s, split "
                          + " ".join(f"{key[2:]} {summary[key]:.4f}" for key in TIME_KEYS), flush=True)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)

    by_key = {(r["variant"], r["repeat"], r["nprocs"]): r for r in runs}
    rows = []
    for nprocs in args.nprocs:
        for name in names:
            mine = [r for r in runs if r["variant"] == name and r["nprocs"] == nprocs]
            ratios = [r["steps_per_s"] / by_key[(names[0], r["repeat"], nprocs)]["steps_per_s"] for r in mine]
            rows.append([nprocs, name, fmt(median([r["steps_per_s"] for r in mine])),
                         *(fmt(median([r[key] for r in mine]), 4) for key in TIME_KEYS),
                         f"{median(ratios):.2f}x", ", ".join(f"{x:.2f}" for x in ratios)])
    loads = ", ".join(f"r{r['repeat']} n{r['nprocs']} {r['variant']}: {r['load_before']:.2f}" for r in runs)
    about = [f"- runs: `train.py {args.env} --nprocs N --total_steps {args.total_steps}` plus each variant: "
             + "; ".join(f"{name}: `{shlex.join(a) or '(nothing)'}`"
                         + (f" with {' '.join(f'{k}={v}' for k, v in e.items())}" if e else "")
                         for name, a, e in variants)
             + f"; {args.repeats} interleaved repeat(s); warm-up {args.warmup} iteration(s) left out"]
    body = (f"Medians over repeats (seconds per iteration, rank 0); ratio = steps/s / the baseline's ({names[0]}), "
            "paired within a repeat:\n\n" + table(["nprocs", "variant", "steps/s", "rollout", "gather", "update",
                                                   "bcast", f"vs {names[0]}", "ratio per repeat"], rows))
    write_results(args.out.resolve(), runs, body, time.perf_counter() - started, loads, about)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
