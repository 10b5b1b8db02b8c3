"""all_sum / all_mean of scalars and arrays of many dtypes; each rank saves its results into argv[1]."""

import sys
from pathlib import Path

import numpy as np

import mpi_util

out_dir = Path(sys.argv[1])
rank = mpi_util.rank
results = {}
for dtype in ("float16", "float32", "float64", "int8", "int32", "int64", "uint16", "bool", "complex128"):
    x = (np.arange(6).reshape(2, 3) + rank).astype(dtype)
    if dtype == "bool":
        x = (np.arange(6).reshape(2, 3) % (rank + 2)) == 0
    results[f"sum_{dtype}"] = mpi_util.all_sum(x)
    results[f"mean_{dtype}"] = mpi_util.all_mean(x)
results["sum_scalar_int"] = np.array(mpi_util.all_sum(rank + 1))
results["sum_scalar_float"] = np.array(mpi_util.all_sum(0.5 * rank))
results["mean_scalar"] = np.array(mpi_util.all_mean(rank))
np.savez(out_dir / f"reductions_{rank}.npz", **results)
