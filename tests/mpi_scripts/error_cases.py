"""Each rank passes the batch or weights of error case argv[2]; every rank writes the message it raised."""

import sys
from pathlib import Path

import numpy as np

import mpi_util

out_dir, case = Path(sys.argv[1]), sys.argv[2]
rank, last = mpi_util.rank, mpi_util.nworkers - 1
n = 4
good = {"obs": np.zeros((n, 3), np.float32), "act": np.zeros(n, np.int64)}

if case == "missing_key":
    batch = {"obs": good["obs"]} if rank == last else good
elif case == "dtype":
    batch = dict(good, act=good["act"].astype(np.int32)) if rank == last else good
elif case == "trailing_shape":
    batch = dict(good, obs=np.zeros((n, 4), np.float32)) if rank == last else good
elif case == "non_numeric":
    batch = dict(good, act=np.array(["a"] * n, dtype=object)) if rank == last else good
elif case == "unequal_rows":
    batch = dict(good, act=np.zeros(n + 1, np.int64)) if rank == last else good
elif case in ("bcast_shape", "bcast_count", "bcast_read_only"):
    weights = [np.zeros((3, 2), np.float32), np.zeros(2, np.float64)]
    if rank == last and case == "bcast_shape":
        weights[0] = np.zeros((2, 3), np.float32)
    if rank == last and case == "bcast_count":
        weights = weights[:1]
    if rank == last and case == "bcast_read_only":
        weights[1].flags.writeable = False
elif case == "reduce_shape":
    values = np.zeros(3 if rank != last else 4)
else:
    raise SystemExit(f"unknown case {case}")

try:
    if case.startswith("bcast"):
        mpi_util.rank0_bcast_wts(weights)
    elif case == "reduce_shape":
        mpi_util.all_sum(values)
    else:
        mpi_util.rank0_accum_batches(batch)
    message = "no error"
except (mpi_util.BatchMismatchError, mpi_util.WeightMismatchError, ValueError) as error:
    message = f"{type(error).__name__}: {error}"
(out_dir / f"error_{rank}.txt").write_text(message)
# The communicator must still work after a collective error: one more gather proves no rank is stuck.
assert mpi_util.all_sum(1) == mpi_util.nworkers
