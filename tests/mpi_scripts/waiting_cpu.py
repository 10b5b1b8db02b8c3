"""Rank 0 works (sleeps) argv[1] seconds before each collective; every rank writes the CPU time it burned waiting
to argv[2]/cpu_RANK.json."""

import json
import sys
import time
from pathlib import Path

import numpy as np

import mpi_util

busy_s = float(sys.argv[1])
rank = mpi_util.rank
cpu = {}
for name in ("rank0_accum_batches", "rank0_bcast_wts"):
    if rank == 0:
        time.sleep(busy_s)  # stands in for rank 0's update
    wall, started = time.perf_counter(), time.process_time()
    if name == "rank0_accum_batches":
        mpi_util.rank0_accum_batches({"x": np.zeros((1000, 17), np.float32)})
    else:
        mpi_util.rank0_bcast_wts([np.zeros(40_000, np.float32)])
    cpu[name] = {"cpu_s": time.process_time() - started, "wall_s": time.perf_counter() - wall}
(Path(sys.argv[2]) / f"cpu_{rank}.json").write_text(json.dumps(cpu))
