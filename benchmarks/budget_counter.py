"""mpi_util.SharedBudget.take against mpi4py's own global counter (mpi4py.util.sync.Counter.next), side by side:
the cost of one draw from a budget every rank of one host draws from while it rolls out (train.py's --batch_split
shared draws its env steps in blocks of rows). Each rank draws ``--draws`` times in a row, all ranks at once; the
table gives the median over ``--repeats`` of each rank's mean microseconds per draw, and whether the draws added up.

    python benchmarks/budget_counter.py --nprocs 2 --out benchmarks/results/budget_counter
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from mpi4py import MPI
from mpi4py.util.sync import Counter

import mpi_util

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import load_average, machine_lines  # noqa: E402  (the benchmarks' own directory, put on the path above)


def time_draws(draw: object, draws: int) -> float:
    """Mean seconds of one ``draw()`` over ``draws`` calls in a row, every rank starting together."""
    MPI.COMM_WORLD.Barrier()
    started = time.perf_counter()
    for _ in range(draws):
        draw()  # type: ignore[operator]
    return (time.perf_counter() - started) / draws


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2, help="MPI processes (default: %(default)s)")
    parser.add_argument("--draws", type=int, default=20_000, help="draws per rank per repeat (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats (default: %(default)s)")
    parser.add_argument("--out", default="", help="directory for results.md")
    args = parser.parse_args()
    fork = mpi_util.mpi_fork(args.nprocs)
    if fork == "parent":
        return fork.returncode
    started, load = time.perf_counter(), load_average()
    total = args.draws * mpi_util.nworkers * args.repeats
    budget = mpi_util.SharedBudget(total)
    counter = Counter(0, comm=MPI.COMM_WORLD, typecode="l")
    taken = {"SharedBudget.take(1)": 0, "Counter.next(1)": 0}
    seconds: dict[str, list[float]] = {name: [] for name in taken}

    def take() -> None:
        taken["SharedBudget.take(1)"] += budget.take(1)

    def next_value() -> None:
        counter.next(1)
        taken["Counter.next(1)"] += 1

    for _ in range(args.repeats):
        seconds["SharedBudget.take(1)"].append(time_draws(take, args.draws))
        seconds["Counter.next(1)"].append(time_draws(next_value, args.draws))
    MPI.COMM_WORLD.Barrier()  # every rank's draws done before the counts are read
    final_count = counter.next(0)
    counter.free()
    per_rank = mpi_util.gather_objects({name: statistics.median(values) for name, values in seconds.items()})
    sums = mpi_util.gather_objects(taken)
    if mpi_util.rank == 0:
        lines = [*machine_lines(time.perf_counter() - started, f"{load:.2f}"), "",
                 "| draw | us per draw, each rank (median of repeats) | draws counted |", "| --- | --- | --- |"]
        counted = {"SharedBudget.take(1)": total - budget.take(total), "Counter.next(1)": final_count}
        for name in taken:
            each = ", ".join(f"{record[name] * 1e6:.2f}" for record in per_rank)
            made = sum(s[name] for s in sums)
            lines.append(f"| {name} | {each} | {counted[name]:,} of {made:,} |")
        text = "\n".join(lines) + "\n"
        print(text, end="")
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "results.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
