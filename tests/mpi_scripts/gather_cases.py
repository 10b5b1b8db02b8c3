"""Every rank gathers a set of batches; each rank saves its input and what it got back, into argv[1]."""

import sys
from pathlib import Path

import numpy as np

import mpi_util

out_dir = Path(sys.argv[1])
rank, size = mpi_util.rank, mpi_util.nworkers
rng = np.random.default_rng(1000 + rank)


def rows_for(case: str) -> int:
    if case == "zero_rows_on_rank1":
        return 0 if rank == 1 else 7
    if case == "all_zero_rows":
        return 0
    if case == "large":
        return 100_000 + rank
    return 3 * rank + 2  # a different count on every rank


CASES = ["mixed_dtypes", "zero_rows_on_rank1", "all_zero_rows", "large"]
for case in CASES:
    n = rows_for(case)
    batch = {
        "obs": rng.standard_normal((n, 17)).astype(np.float32),
        "act": rng.standard_normal((n, 6)),
        "half": rng.standard_normal((n, 2, 3)).astype(np.float16),
        "image": rng.integers(0, 255, (n, 4, 4, 3), dtype=np.uint8),
        "step": rng.integers(-(2**40), 2**40, n, dtype=np.int64),
        "small_int": rng.integers(-5, 5, n, dtype=np.int32),
        "done": rng.random(n) < 0.5,
        "phase": (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64),
    }
    if case == "large":
        batch = {"obs": batch["obs"], "act": batch["act"]}
    result = mpi_util.rank0_accum_batches(batch)
    np.savez(out_dir / f"{case}_in_{rank}.npz", **batch)
    np.savez(out_dir / f"{case}_out_{rank}.npz", **result)
    assert list(result) == list(batch), (list(result), list(batch))
