"""A broadcast of 15 MiB and gathers of 3 MiB per rank, checked on every rank; writes, per rank, whether each went
through shared memory to argv[1]/shm_room_{rank}.json. Run with a /dev/shm too small for their windows, it must
fall back to MPI instead of dying of SIGBUS when a window's pages are first written."""

import json
import sys
from pathlib import Path

import numpy as np

import mpi_util
import mpi_util.gather

out_dir = Path(sys.argv[1])
rank, size = mpi_util.rank, mpi_util.nworkers
weights = np.arange(15 << 18, dtype=np.float32) * (1.0 if rank == 0 else 0.0)  # 15 MiB, rank 0's counts up
for _ in range(2):
    mpi_util.rank0_bcast_wts([weights])
    assert np.array_equal(weights, np.arange(15 << 18, dtype=np.float32)), rank
rows = 3 << 16  # 3 MiB of float32 pairs per rank
for k in range(3):
    batch = {"x": np.full((rows, 4), rank + k, dtype=np.float32)}
    result = mpi_util.rank0_accum_batches(batch)
    if rank == 0:
        expected = np.concatenate([np.full((rows, 4), r + k, dtype=np.float32) for r in range(size)])
        assert np.array_equal(result["x"], expected), k
host = mpi_util.host.transport(mpi_util.process.COMM_WORLD)
(out_dir / f"shm_room_{rank}.json").write_text(json.dumps({
    "bcast_fell_back": host.bcast_refused,
    "gather_fell_back": host.segments_refused,
    "gathers_through_shared_memory": host.gathers_through_segments,
}))
