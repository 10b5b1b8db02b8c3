"""Benchmark mpi_util's collectives against plain mpi4py ones at 2, 4 and 8 ranks.

What it measures, each as the median over several repetitions (every timed call starts right after all ranks
are synchronized; times are wall-clock ``time.perf_counter`` per rank):

1. Gather of an RL batch (obs float32 (n, 17), act float32 (n, 6), adv float32 (n,), ret float32 (n,); the
   global n of 1k, 10k, 100k and 1M rows split evenly across ranks) to rank 0:
   ``mpi_util.rank0_accum_batches`` (a digest exchange waited on without spinning, then buffer-based
   Gatherv per key) vs a pickle-based
   ``comm.gather`` of the same dict followed by ``np.concatenate`` per key on rank 0. A third column, plain
   ``comm.Gatherv`` per key with the sizes known in advance, is the floor: it has no checks and no meeting.
   The time reported is rank 0's, from just before the call until rank 0 holds the concatenated batch.
2. Broadcast of a list of float32 numpy arrays: a Walker2d policy + value net (two 17-64-64 tanh MLPs, 6 and
   1 outputs, plus log_std: 13 arrays, 11,085 parameters) and a bigger one (two 17-700-700 MLPs: 13 arrays,
   1,011,513 parameters). ``mpi_util.rank0_bcast_wts`` (after a shape check: small arrays packed in one Bcast per dtype,
   large ones in place) vs one
   ``comm.Bcast`` per array vs pickle-based ``comm.bcast`` of the list. Reported: the slowest rank's time
   (the weights are complete everywhere) and rank 0's.
3. CPU burned while waiting: rank 0 works (``time.sleep``) for 2 s before a gather of a 10k-row batch; every
   other rank measures ``time.process_time()`` across its call. mpi_util's non-spinning wait vs a plain
   blocking ``comm.Gatherv`` and ``comm.gather`` (MPICH busy-polls in those). Target: under 0.2 s per waiting
   rank. With more ranks than cores, spinning ranks share the cores, so the per-rank figure of a spinning
   method is bounded by cores x seconds / ranks; the sum over waiting ranks shows the cores taken from others.

Run from the repository root (takes about 1-2 minutes on 2 cores)::

    .venv/bin/python benchmarks/collectives.py

It launches itself as ``mpiexec -n N python benchmarks/collectives.py --worker ...`` for N in --ranks, then
writes gather.csv, bcast.csv, waiting_cpu.csv, results.md (tables with command, machine, MPI library and date)
and gather_time_vs_rows.png to benchmarks/results/collectives/ (--out), and prints the tables.
``--quick`` is a smoke test (few repetitions, rows up to 100k, 0.5 s of work); its numbers mean little.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scaling import versions_line

import mpi_util
from mpi_util.collective import meet
from mpi_util.process import COMM_WORLD

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "collectives"

# The RL batch: key -> trailing shape; all float32.
BATCH_LAYOUT: dict[str, tuple[int, ...]] = {"obs": (17,), "act": (6,), "adv": (), "ret": ()}
BYTES_PER_ROW = 4 * sum(int(np.prod(shape, dtype=np.int64)) for shape in BATCH_LAYOUT.values())

GATHER_ROWS = (1_000, 10_000, 100_000, 1_000_000)
# Repetitions per size: enough for a stable median, few where one call moves 100 MB.
GATHER_REPS = {1_000: 40, 10_000: 30, 100_000: 15, 1_000_000: 7}
BCAST_REPS = 40
WARMUP = 2
WAITING_ROWS = 10_000
WORKER_TIMEOUT_S = 300

GATHER_METHODS = ("mpi_util", "pickle", "raw_gatherv")
BCAST_METHODS = ("mpi_util", "bcast_per_array", "pickle")
WAIT_METHODS = ("mpi_util", "plain_gatherv", "plain_gather")
WAITING_CPU_TARGET_S = 0.2


# ----------------------------------------------------------------------------------------------------------------
# Worker side: runs in every rank under mpiexec.
# ----------------------------------------------------------------------------------------------------------------


def rows_of_rank(total_rows: int, r: int, size: int) -> int:
    """Rows rank r holds when total_rows are split as evenly as possible over size ranks."""
    return total_rows // size + (1 if r < total_rows % size else 0)


def element_counts(total_rows: int, size: int) -> dict[str, list[int]]:
    """{key: [number of array elements rank r sends, for r in range(size)]}, the counts a raw Gatherv needs."""
    return {
        key: [rows_of_rank(total_rows, r, size) * int(np.prod(shape, dtype=np.int64)) for r in range(size)]
        for key, shape in BATCH_LAYOUT.items()
    }


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
    """One rank's part of the benchmark; rank 0 collects every rank's timings."""

    def __init__(self, rows: Sequence[int], reps_scale: float, work_s: float) -> None:
        self.comm = COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.rows = list(rows)
        self.reps_scale = reps_scale
        self.work_s = work_s

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
        counts = element_counts(total_rows, self.size)

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
            reps = self.reps(GATHER_REPS.get(total_rows, 10))
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
            methods = self.bcast_methods(weights, received)
            for method, call in methods.items():
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
                    records.append(
                        {"model": model, "arrays": len(shapes), "params": n_params, "method": method,
                         "reps": self.reps(BCAST_REPS), **times}
                    )
        return records

    # -- 3. CPU while waiting ---------------------------------------------------------------------------------

    def bench_waiting_cpu(self) -> list[dict[str, Any]]:
        comm, is_root = self.comm, self.rank == 0
        batch = make_batch(rows_of_rank(WAITING_ROWS, self.rank, self.size), seed=self.rank)
        counts = element_counts(WAITING_ROWS, self.size)

        def plain_gatherv() -> None:
            for key, value in batch.items():
                if is_root:
                    out = np.empty(sum(counts[key]), value.dtype)
                    comm.Gatherv(value.reshape(-1), [out, counts[key]], root=0)
                else:
                    comm.Gatherv(value.reshape(-1), None, root=0)

        methods: dict[str, Callable[[], Any]] = {
            "mpi_util": lambda: mpi_util.rank0_accum_batches(batch, comm=comm),
            "plain_gatherv": plain_gatherv,
            "plain_gather": lambda: comm.gather(batch, root=0),
        }
        records: list[dict[str, Any]] = []
        for method, call in methods.items():
            self.sync()
            if is_root:
                time.sleep(self.work_s)  # stands in for rank 0's update
            cpu_started, wall_started = time.process_time(), time.perf_counter()
            call()
            cpu_s, wall_s = time.process_time() - cpu_started, time.perf_counter() - wall_started
            everyone = comm.gather((cpu_s, wall_s), root=0)
            if is_root:
                waiting = everyone[1:]
                records.append(
                    {"method": method, "work_s": self.work_s,
                     "cpu_s_per_rank": [c for c, _ in waiting], "wait_wall_s_per_rank": [w for _, w in waiting],
                     "rank0_call_after_work_s": everyone[0][1]}
                )
        return records

    def run(self) -> dict[str, Any] | None:
        started = time.perf_counter()
        load_before = os.getloadavg()
        gather = self.bench_gather()
        bcast = self.bench_bcast()
        waiting = self.bench_waiting_cpu()
        if self.rank != 0:
            return None
        from mpi4py import MPI

        return {
            "ranks": self.size,
            "mpi_library": MPI.Get_library_version().strip().splitlines()[0].strip(),
            "mpi4py": __import__("mpi4py").__version__,
            "numpy": np.__version__,
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg(),
            "elapsed_s": time.perf_counter() - started,
            "gather": gather,
            "bcast": bcast,
            "waiting_cpu": waiting,
        }


def worker_main(args: argparse.Namespace) -> int:
    mpi_util.install_abort_on_exception()
    result = Worker(args.rows, args.reps_scale, args.work_s).run()
    if result is not None:
        Path(args.worker_json).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------------------------------------------
# Driver side: launches the workers, then writes and prints the tables.
# ----------------------------------------------------------------------------------------------------------------


def launch(nprocs: int, args: argparse.Namespace, json_path: Path) -> dict[str, Any]:
    """Run the worker mode of this script as nprocs ranks; return rank 0's results."""
    command = [
        mpi_util.find_mpiexec(), "-n", str(nprocs), sys.executable, "-u", str(Path(__file__).resolve()),
        "--worker-json", str(json_path), "--reps-scale", str(args.reps_scale), "--work-s", str(args.work_s),
        "--rows", *map(str, args.rows),
    ]
    env = dict(
        os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
        MPI_UTIL_STALL_TIMEOUT=str(WORKER_TIMEOUT_S),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    proc = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True)
    try:
        returncode = proc.wait(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"{nprocs} ranks: no result after {WORKER_TIMEOUT_S} s: {shlex.join(command)}") from None
    if returncode != 0:
        raise RuntimeError(f"{nprocs} ranks: exit status {returncode}: {shlex.join(command)}")
    return json.loads(json_path.read_text())


def _command_output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def describe_machine() -> dict[str, str]:
    """nproc, CPU model, memory and OS, read the way `nproc`, `lscpu` and /proc/meminfo report them."""
    model = next(
        (line.split(":", 1)[1].strip() for line in _command_output(["lscpu"]).splitlines()
         if line.startswith("Model name")),
        platform.processor() or "unknown",
    )
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return {
        "nproc": _command_output(["nproc"]) or str(os.cpu_count()),
        "cpu_model": model,
        "memory": memory,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "date_utc": _command_output(["date", "-u"])
        or datetime.datetime.now(datetime.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y"),
    }


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def summarize(runs: list[dict[str, Any]], out: Path) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """Write the CSVs; return the markdown tables and the flat rows."""
    gather_rows, bcast_rows, wait_rows = [], [], []
    for run in runs:
        n = run["ranks"]
        for rec in run["gather"]:
            gather_rows.append({
                "ranks": n, "rows": rec["rows"], "mbytes": rec["rows"] * BYTES_PER_ROW / 1e6, "method": rec["method"],
                "reps": rec["reps"], "median_rank0_s": median(rec["rank0"]), "min_rank0_s": min(rec["rank0"]),
                "max_rank0_s": max(rec["rank0"]), "median_slowest_rank_s": median(rec["slowest"]),
            })
        for rec in run["bcast"]:
            bcast_rows.append({
                "ranks": n, "model": rec["model"], "arrays": rec["arrays"], "params": rec["params"],
                "method": rec["method"], "reps": rec["reps"], "median_slowest_rank_s": median(rec["slowest"]),
                "median_rank0_s": median(rec["rank0"]), "min_slowest_rank_s": min(rec["slowest"]),
                "max_slowest_rank_s": max(rec["slowest"]),
            })
        for rec in run["waiting_cpu"]:
            cpu = rec["cpu_s_per_rank"]
            wait_rows.append({
                "ranks": n, "method": rec["method"], "work_s": rec["work_s"], "max_cpu_s": max(cpu),
                "sum_cpu_s": sum(cpu), "mean_wait_wall_s": sum(rec["wait_wall_s_per_rank"]) / len(cpu),
                "rank0_call_after_work_s": rec["rank0_call_after_work_s"],
                "cpu_s_per_rank": " ".join(f"{c:.4f}" for c in cpu),
            })
    write_csv(out / "gather.csv", gather_rows)
    write_csv(out / "bcast.csv", bcast_rows)
    write_csv(out / "waiting_cpu.csv", wait_rows)

    def gather_cell(n: int, rows: int, method: str) -> float:
        key = (n, rows, method)
        return next(r["median_rank0_s"] for r in gather_rows if (r["ranks"], r["rows"], r["method"]) == key)

    gather_md = []
    for n, rows in sorted({(r["ranks"], r["rows"]) for r in gather_rows}):
        t = {m: gather_cell(n, rows, m) for m in GATHER_METHODS}
        gather_md.append([n, f"{rows:,}", f"{rows * BYTES_PER_ROW / 1e6:g}", ms(t["mpi_util"]), ms(t["pickle"]),
                          ms(t["raw_gatherv"]), f"{t['pickle'] / t['mpi_util']:.2f}x"])
    bcast_md = []
    for r in bcast_rows:
        key = (r["ranks"], r["model"], "mpi_util")
        base = next(b for b in bcast_rows if (b["ranks"], b["model"], b["method"]) == key)
        bcast_md.append([r["ranks"], r["model"], f"{r['params']:,}", r["arrays"], r["method"],
                         ms(r["median_slowest_rank_s"]), ms(r["median_rank0_s"]),
                         f"{r['median_slowest_rank_s'] / base['median_slowest_rank_s']:.2f}x"])
    wait_md = [
        [r["ranks"], r["method"], f"{r['max_cpu_s']:.3f}", f"{r['sum_cpu_s']:.3f}", f"{r['mean_wait_wall_s']:.2f}",
         ms(r["rank0_call_after_work_s"]), "yes" if r["max_cpu_s"] < WAITING_CPU_TARGET_S else "**no**"]
        for r in wait_rows
    ]
    markdown = "\n\n".join([
        "Gather to rank 0 (median ms per call on rank 0; pickle / mpi_util > 1 means mpi_util is faster; "
        f"{BYTES_PER_ROW} bytes per row):",
        table(["ranks", "rows", "MB", "mpi_util", "pickle gather", "raw Gatherv", "pickle / mpi_util"], gather_md),
        "Broadcast from rank 0 (median ms per call; slowest rank = weights complete everywhere; "
        "t / mpi_util compares slowest-rank times, > 1 means mpi_util is faster):",
        table(["ranks", "model", "params", "arrays", "method", "slowest rank", "rank 0", "t / mpi_util"], bcast_md),
        f"CPU of the waiting ranks while rank 0 works {runs[0]['waiting_cpu'][0]['work_s']:g} s before a gather of "
        f"{WAITING_ROWS:,} rows (target: under {WAITING_CPU_TARGET_S} s per waiting rank):",
        table(["ranks", "method", "max CPU s (a waiting rank)", "sum CPU s (all waiting)", "wait wall s",
               "rank 0 call after work (ms)", f"< {WAITING_CPU_TARGET_S} s"], wait_md),
    ])
    return markdown, {"gather": gather_rows, "bcast": bcast_rows, "waiting_cpu": wait_rows}


def headline(flat: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Ratios worth a sentence, computed from the tables."""
    lines = []
    g = flat["gather"]
    for n in sorted({r["ranks"] for r in g}):
        for rows in sorted({r["rows"] for r in g}):
            t = {r["method"]: r["median_rank0_s"] for r in g if r["ranks"] == n and r["rows"] == rows}
            lines.append(f"gather {n} ranks {rows:>9,} rows: pickle / mpi_util = {t['pickle'] / t['mpi_util']:.2f}x, "
                         f"mpi_util / raw Gatherv = {t['mpi_util'] / t['raw_gatherv']:.2f}x")
    b = flat["bcast"]
    for n in sorted({r["ranks"] for r in b}):
        for model in MODELS:
            t = {r["method"]: r["median_slowest_rank_s"] for r in b if r["ranks"] == n and r["model"] == model}
            lines.append(f"bcast {n} ranks {model}: pickle / mpi_util = {t['pickle'] / t['mpi_util']:.2f}x, "
                         f"per-array Bcast / mpi_util = {t['bcast_per_array'] / t['mpi_util']:.2f}x")
    for r in flat["waiting_cpu"]:
        lines.append(f"waiting CPU {r['ranks']} ranks {r['method']}: max {r['max_cpu_s']:.3f} s, "
                     f"sum {r['sum_cpu_s']:.3f} s")
    return lines


def plot_gather(gather_rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({r["ranks"] for r in gather_rows})
    fig, axes = plt.subplots(1, len(ranks), figsize=(4.2 * len(ranks), 3.8), sharey=True, squeeze=False)
    styles = {"mpi_util": ("o-", "mpi_util.rank0_accum_batches"), "pickle": ("s--", "comm.gather (pickle) + concat"),
              "raw_gatherv": ("^:", "raw comm.Gatherv (floor)")}
    for ax, n in zip(axes[0], ranks, strict=True):
        for method, (style, label) in styles.items():
            pts = sorted((r["rows"], r["median_rank0_s"] * 1e3) for r in gather_rows
                         if r["ranks"] == n and r["method"] == method)
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_title(f"{n} ranks")
        ax.set_xlabel("rows in the gathered batch (100 B/row)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("median time on rank 0 (ms)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def driver_main(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd() + os.sep) else sys.executable
    command = shlex.join([python, *sys.argv])
    machine = describe_machine()
    started = time.perf_counter()
    runs = []
    for nprocs in args.ranks:
        t0 = time.perf_counter()
        print(f"collectives: {nprocs} ranks ...", flush=True)
        run = launch(nprocs, args, out / f"raw_{nprocs}ranks.json")
        print(f"collectives: {nprocs} ranks done in {time.perf_counter() - t0:.1f} s "
              f"(load average before {run['load_avg_before'][0]:.2f})", flush=True)
        runs.append(run)
    wall_s = time.perf_counter() - started

    tables, flat = summarize(runs, out)
    loads = ", ".join(f"{r['ranks']} ranks: {r['load_avg_before'][0]:.2f}" for r in runs)
    header = "\n".join([
        f"- command: `{command}` (from the repository root)",
        f"- machine: nproc {machine['nproc']}, {machine['cpu_model']}, {machine['memory']} memory, {machine['os']}, "
        f"Python {machine['python']}",
        f"- MPI: {runs[0]['mpi_library']}; mpi4py {runs[0]['mpi4py']}; numpy {runs[0]['numpy']}",
        f"- date: {machine['date_utc']}; total wall time of the run {wall_s:.0f} s",
        versions_line(),
        f"- 1-minute load average when each rank count started ({loads}): the machine is shared, other jobs may "
        "have run during the measurement",
    ])
    markdown = f"{header}\n\n{tables}\n"
    (out / "results.md").write_text(markdown)
    plot_gather(flat["gather"], out / "gather_time_vs_rows.png",
                f"{command} | {machine['cpu_model']}, nproc {machine['nproc']} | {machine['date_utc']}")
    print()
    print(markdown)
    print("\n".join(headline(flat)))
    print(f"\nwrote {', '.join(p.name for p in sorted(out.iterdir()))} to {out}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="rank counts to run at")
    parser.add_argument("--rows", type=int, nargs="+", default=list(GATHER_ROWS), help="global batch sizes to gather")
    parser.add_argument("--reps-scale", type=float, default=1.0, help="multiply the number of timed repetitions")
    parser.add_argument("--work-s", type=float, default=2.0, help="seconds rank 0 works before the waited-for gather")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the CSVs, markdown and plot go")
    parser.add_argument("--quick", action="store_true", help="smoke test: rows up to 100k, few reps, 0.5 s of work")
    parser.add_argument("--worker-json", help=argparse.SUPPRESS)  # internal: run as one rank, rank 0 writes here
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = [r for r in args.rows if r <= 100_000]
        args.reps_scale = min(args.reps_scale, 0.2)
        args.work_s = min(args.work_s, 0.5)
    return args


def main() -> int:
    args = parse_args()
    return worker_main(args) if args.worker_json else driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
