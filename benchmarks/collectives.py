"""mpi_util's collectives against plain mpi4py ones at 2, 4 and 8 ranks (benchmarks/README.md, section
collectives.py): gathering an RL batch to rank 0, broadcasting policy + value weights, and the CPU a rank burns while
it waits for rank 0. Every timed call starts right after all ranks are synchronized; medians over repetitions. The
script launches itself under mpiexec once per rank count (``--worker-json``), then writes runs.csv (one row per
measurement, its ``part`` naming the table) and results.md to ``--out``. ``--quick`` is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import RESULTS, failure, median, run_logged, table, write_results

import mpi_util
from mpi_util.collective import meet
from mpi_util.process import COMM_WORLD

# The RL batch: key -> trailing shape; all float32.
BATCH_LAYOUT: dict[str, tuple[int, ...]] = {"obs": (17,), "act": (6,), "adv": (), "ret": ()}
BYTES_PER_ROW = 4 * sum(int(np.prod(shape, dtype=np.int64)) for shape in BATCH_LAYOUT.values())

# Repetitions per gathered size: enough for a stable median, few where one call moves 100 MB.
GATHER_REPS = {1_000: 40, 10_000: 30, 100_000: 15, 1_000_000: 7}
BCAST_REPS = 40
WARMUP = 2
WAITING_ROWS = 10_000
WORK_S = 2.0  # how long rank 0 works before the waited-for gather
WORKER_TIMEOUT_S = 300
# Waiting-CPU method -> the gather method it times; on the waiting ranks "raw_gatherv" is a plain Gatherv per key.
WAIT_METHODS = {"mpi_util": "mpi_util", "plain_gatherv": "raw_gatherv"}
WAITING_CPU_TARGET_S = 0.2


def rows_of_rank(total_rows: int, r: int, size: int) -> int:
    """Rows rank r holds when total_rows are split as evenly as possible over size ranks."""
    return total_rows // size + (1 if r < total_rows % size else 0)


def make_batch(n: int, seed: int) -> dict[str, np.ndarray]:
    """An RL batch of n rows: {key: float32 array (n, *BATCH_LAYOUT[key])}, values from ``seed``."""
    rng = np.random.default_rng(seed)
    return {key: rng.standard_normal((n, *shape), dtype=np.float32) for key, shape in BATCH_LAYOUT.items()}


def mlp_shapes(in_dim: int, hidden: tuple[int, ...], out_dim: int) -> list[tuple[int, ...]]:
    """Weight shapes [W0 (in, h0), b0 (h0,), ..., W_last (h_last, out), b_last (out,)] of a dense MLP."""
    dims = (in_dim, *hidden, out_dim)
    shapes: list[tuple[int, ...]] = []
    for fan_in, fan_out in zip(dims[:-1], dims[1:], strict=True):
        shapes += [(fan_in, fan_out), (fan_out,)]
    return shapes


def policy_value_shapes(hidden: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Walker2d (obs 17, act 6) Gaussian policy MLP + log_std + value MLP."""
    return [*mlp_shapes(17, hidden, 6), (6,), *mlp_shapes(17, hidden, 1)]


MODELS: dict[str, list[tuple[int, ...]]] = {
    "walker2d_2x64": policy_value_shapes((64, 64)),
    "big_2x700": policy_value_shapes((700, 700)),
}


class Worker:
    """One rank's part of the benchmark; rank 0 collects every rank's timings. ``quick``: rows up to 100k, a fifth
    of the repetitions (at least 3), 0.5 s of work."""

    def __init__(self, quick: bool) -> None:
        self.comm = COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.rows = [rows for rows in GATHER_REPS if not quick or rows <= 100_000]
        self.reps_scale = 0.2 if quick else 1.0
        self.work_s = 0.5 if quick else WORK_S

    def sync(self) -> None:
        """Every rank arrives without spinning (so ranks done early leave the cores to rank 0), then a blocking
        Barrier releases them all at (nearly) the same moment."""
        meet(self.comm, "benchmark sync")
        self.comm.Barrier()

    def reps(self, base: int) -> int:
        return max(3, round(base * self.reps_scale))

    def time_calls(self, call: Callable[[], Any], reps: int) -> dict[str, list[float]]:
        """Seconds per call: {"rank0": [...], "slowest": [...]} on rank 0 (slowest = max over ranks per rep)."""
        mine: list[float] = []
        for _ in range(reps):
            self.sync()
            started = time.perf_counter()
            call()
            mine.append(time.perf_counter() - started)
        everyone = self.comm.gather(mine, root=0)
        if self.rank != 0:
            return {}
        per_rep = np.array(everyone)  # (ranks, reps)
        return {"rank0": per_rep[0].tolist(), "slowest": per_rep.max(axis=0).tolist()}

    def check_everywhere(self, ok: bool, what: str) -> None:
        """Raise on every rank when the result was wrong on any rank."""
        bad = self.comm.allgather(ok)
        if not all(bad):
            raise RuntimeError(f"{what}: wrong result on ranks {[r for r, good in enumerate(bad) if not good]}")

    # -- 1. gather --------------------------------------------------------------------------------------------

    def gather_methods(self, batch: dict[str, np.ndarray], total_rows: int) -> dict[str, Callable[[], Any]]:
        comm, is_root = self.comm, self.rank == 0
        # The element counts of every rank per key, which a raw Gatherv needs.
        counts = {key: [rows_of_rank(total_rows, r, self.size) * int(np.prod(shape, dtype=np.int64))
                        for r in range(self.size)] for key, shape in BATCH_LAYOUT.items()}

        def with_mpi_util() -> dict[str, np.ndarray] | None:
            out = mpi_util.rank0_accum_batches(batch, comm=comm)
            return out if is_root else None

        def with_pickle() -> dict[str, np.ndarray] | None:
            parts = comm.gather(batch, root=0)
            if not is_root:
                return None
            return {key: np.concatenate([part[key] for part in parts]) for key in batch}

        def with_raw_gatherv() -> dict[str, np.ndarray] | None:
            out: dict[str, np.ndarray] = {}
            for key, value in batch.items():
                if is_root:
                    out[key] = np.empty((total_rows, *value.shape[1:]), dtype=value.dtype)
                    comm.Gatherv(value.reshape(-1), [out[key].reshape(-1), counts[key]], root=0)
                else:
                    comm.Gatherv(value.reshape(-1), None, root=0)
            return out if is_root else None

        return {"mpi_util": with_mpi_util, "pickle": with_pickle, "raw_gatherv": with_raw_gatherv}

    def bench_gather(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for total_rows in self.rows:
            batch = make_batch(rows_of_rank(total_rows, self.rank, self.size), seed=self.rank)
            expected = None
            if self.rank == 0:
                parts = [make_batch(rows_of_rank(total_rows, r, self.size), seed=r) for r in range(self.size)]
                expected = {key: np.concatenate([p[key] for p in parts]) for key in BATCH_LAYOUT}
            reps = self.reps(GATHER_REPS[total_rows])
            for method, call in self.gather_methods(batch, total_rows).items():
                self.sync()
                result = call()
                ok = expected is None or all(np.array_equal(result[k], expected[k]) for k in BATCH_LAYOUT)
                self.check_everywhere(ok, f"gather {method} {total_rows} rows")
                self.time_calls(call, WARMUP)
                times = self.time_calls(call, reps)
                if self.rank == 0:
                    records.append({"rows": total_rows, "method": method, "reps": reps, **times})
            del batch, expected
        return records

    # -- 2. broadcast -----------------------------------------------------------------------------------------

    def bcast_methods(
        self, weights: list[np.ndarray], received: list[list[np.ndarray]]
    ) -> dict[str, Callable[[], Any]]:
        """The three ways to broadcast ``weights``; each leaves the weights every rank now holds in received[0]."""
        comm, is_root = self.comm, self.rank == 0

        def with_mpi_util() -> None:
            mpi_util.rank0_bcast_wts(weights, comm=comm)

        def per_array() -> None:
            for w in weights:
                comm.Bcast(w, root=0)

        def with_pickle() -> None:
            received[0] = comm.bcast(weights if is_root else None, root=0)

        return {"mpi_util": with_mpi_util, "bcast_per_array": per_array, "pickle": with_pickle}

    def bench_bcast(self) -> list[dict[str, Any]]:
        is_root = self.rank == 0
        records: list[dict[str, Any]] = []
        for model, shapes in MODELS.items():
            rng = np.random.default_rng(12345)
            reference = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]
            weights = [w.copy() for w in reference] if is_root else [np.zeros(s, np.float32) for s in shapes]
            received: list[list[np.ndarray]] = [weights]
            for method, call in self.bcast_methods(weights, received).items():
                for w in weights:
                    if not is_root:
                        w[...] = 0
                received[0] = weights
                self.sync()
                call()
                ok = all(np.array_equal(a, b) for a, b in zip(received[0], reference, strict=True))
                self.check_everywhere(ok, f"bcast {method} {model}")
                self.time_calls(call, WARMUP)
                times = self.time_calls(call, self.reps(BCAST_REPS))
                if is_root:
                    n_params = sum(int(np.prod(s, dtype=np.int64)) for s in shapes)
                    records.append({"model": model, "arrays": len(shapes), "params": n_params, "method": method,
                                    **times})
        return records

    # -- 3. CPU while waiting ---------------------------------------------------------------------------------

    def bench_waiting_cpu(self) -> list[dict[str, Any]]:
        is_root = self.rank == 0
        batch = make_batch(rows_of_rank(WAITING_ROWS, self.rank, self.size), seed=self.rank)
        gathers = self.gather_methods(batch, WAITING_ROWS)
        records: list[dict[str, Any]] = []
        for method, gather in WAIT_METHODS.items():
            self.sync()
            if is_root:
                time.sleep(self.work_s)  # stands in for rank 0's update
            cpu_started = time.process_time()
            gathers[gather]()
            everyone = self.comm.gather(time.process_time() - cpu_started, root=0)
            if is_root:
                records.append({"method": method, "work_s": self.work_s, "cpu_s_per_rank": everyone[1:]})
        return records

    def run(self) -> dict[str, Any] | None:
        load_before = os.getloadavg()[0]
        gather = self.bench_gather()
        bcast = self.bench_bcast()
        waiting = self.bench_waiting_cpu()
        if self.rank != 0:
            return None
        return {"ranks": self.size, "load_avg_before": load_before, "gather": gather, "bcast": bcast,
                "waiting_cpu": waiting}


def launch(nprocs: int, quick: bool, scratch: Path) -> dict[str, Any]:
    """Run the worker mode of this script as nprocs ranks; return rank 0's results."""
    json_path, log_path = scratch / f"{nprocs}ranks.json", scratch / f"{nprocs}ranks.log"
    command = [mpi_util.find_mpiexec(), "-n", str(nprocs), sys.executable, "-u", str(Path(__file__).resolve()),
               "--worker-json", str(json_path), *(["--quick"] if quick else [])]
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MPI_UTIL_STALL_TIMEOUT": str(WORKER_TIMEOUT_S)}
    returncode, _ = run_logged(command, log_path, WORKER_TIMEOUT_S, env)
    if returncode != 0:
        raise failure(f"{nprocs} ranks", returncode, log_path)
    return json.loads(json_path.read_text())


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def summarize(runs: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown tables and the flat rows of runs.csv."""
    gather_rows, bcast_rows, wait_rows = [], [], []
    for run in runs:
        n = run["ranks"]
        gather_rows += [{"part": "gather", "ranks": n, "rows": rec["rows"], "method": rec["method"],
                         "reps": rec["reps"], "median_rank0_s": median(rec["rank0"]),
                         "median_slowest_rank_s": median(rec["slowest"])} for rec in run["gather"]]
        bcast_rows += [{"part": "bcast", "ranks": n, "model": rec["model"], "arrays": rec["arrays"],
                        "params": rec["params"],
                        "method": rec["method"], "median_rank0_s": median(rec["rank0"]),
                        "median_slowest_rank_s": median(rec["slowest"])} for rec in run["bcast"]]
        wait_rows += [{"part": "waiting_cpu", "ranks": n, "method": rec["method"], "work_s": rec["work_s"],
                       "max_cpu_s": max(rec["cpu_s_per_rank"]), "sum_cpu_s": sum(rec["cpu_s_per_rank"])}
                      for rec in run["waiting_cpu"]]

    def cell(records: list[dict[str, Any]], key: str, **match: Any) -> float:
        return next(r[key] for r in records if all(r[k] == v for k, v in match.items()))

    gather_md = []
    for n, rows in sorted({(r["ranks"], r["rows"]) for r in gather_rows}):
        t = {m: cell(gather_rows, "median_rank0_s", ranks=n, rows=rows, method=m)
             for m in ("mpi_util", "pickle", "raw_gatherv")}
        gather_md.append([n, f"{rows:,}", f"{rows * BYTES_PER_ROW / 1e6:g}", ms(t["mpi_util"]), ms(t["pickle"]),
                          ms(t["raw_gatherv"]), f"{t['pickle'] / t['mpi_util']:.2f}x"])
    bcast_md = []
    for r in bcast_rows:
        base = cell(bcast_rows, "median_slowest_rank_s", ranks=r["ranks"], model=r["model"], method="mpi_util")
        bcast_md.append([r["ranks"], r["model"], f"{r['params']:,}", r["arrays"], r["method"],
                         ms(r["median_slowest_rank_s"]), f"{r['median_slowest_rank_s'] / base:.2f}x"])
    wait_md = [[r["ranks"], r["method"], f"{r['max_cpu_s']:.3f}", f"{r['sum_cpu_s']:.3f}",
                "yes" if r["max_cpu_s"] < WAITING_CPU_TARGET_S else "**no**"] for r in wait_rows]
    markdown = "\n\n".join([
        "Gather to rank 0 (median ms per call on rank 0; pickle / mpi_util > 1 means mpi_util is faster; "
        f"{BYTES_PER_ROW} bytes per row):",
        table(["ranks", "rows", "MB", "mpi_util", "pickle gather", "raw Gatherv", "pickle / mpi_util"], gather_md),
        "Broadcast from rank 0 (median ms per call until the weights are complete on the slowest rank; "
        "t / mpi_util > 1 means mpi_util is faster):",
        table(["ranks", "model", "params", "arrays", "method", "slowest rank", "t / mpi_util"], bcast_md),
        f"CPU of the waiting ranks while rank 0 works {wait_rows[0]['work_s']:g} s before a gather of "
        f"{WAITING_ROWS:,} rows (target: under {WAITING_CPU_TARGET_S} s per waiting rank):",
        table(["ranks", "method", "max CPU s (a waiting rank)", "sum CPU s (all waiting)",
               f"< {WAITING_CPU_TARGET_S} s"], wait_md),
    ])
    return markdown, gather_rows + bcast_rows + wait_rows


def driver_main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory(prefix="collectives_") as scratch:
        for nprocs in args.ranks:
            print(f"collectives: {nprocs} ranks ...", flush=True)
            runs.append(launch(nprocs, args.quick, Path(scratch)))
    markdown, rows = summarize(runs)
    loads = ", ".join(f"{r['ranks']} ranks: {r['load_avg_before']:.2f}" for r in runs)
    # The versions line names the MPI library: this driver has loaded mpi4py's MPI too (mpi_util's COMM_WORLD).
    write_results(Path(args.out).resolve(), rows, markdown, time.perf_counter() - started, loads)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="rank counts to run at")
    parser.add_argument("--out", default=str(RESULTS / "collectives"), help="where runs.csv and results.md go")
    parser.add_argument("--quick", action="store_true", help="smoke test: rows up to 100k, few reps, 0.5 s of work")
    parser.add_argument("--worker-json", help=argparse.SUPPRESS)  # internal: run as one rank, rank 0 writes here
    args = parser.parse_args()
    if args.worker_json:
        mpi_util.install_abort_on_exception()
        result = Worker(args.quick).run()
        if result is not None:
            Path(args.worker_json).write_text(json.dumps(result))
        return 0
    return driver_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
