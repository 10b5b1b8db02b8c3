"""Launched with plain python: relaunches itself under mpiexec with mpi_fork(argv[1]). argv[2] == "fail" makes
rank 1 raise while the others wait in a gather. The parent prints the /dev/shm files it has mapped."""

import os
import sys

import numpy as np

import mpi_util

result = mpi_util.mpi_fork(int(sys.argv[1]))
if result == "parent":
    mapped = sorted({line.split(maxsplit=5)[5].strip() for line in open("/proc/self/maps") if " /dev/shm/" in line})
    print(f"parent: mapped {mapped}", flush=True)  # "PATH", or "PATH (deleted)" once unnamed
    print(f"parent: job exited with {result.returncode}", flush=True)
    sys.exit(result.returncode)

if len(sys.argv) > 2 and sys.argv[2] == "fail" and mpi_util.rank == 1:
    raise RuntimeError("injected failure on rank 1")
gathered = mpi_util.rank0_accum_batches({"rank": np.array([mpi_util.rank])})
print(f"child rank {mpi_util.rank} of {mpi_util.nworkers}", flush=True)
threads = mpi_util.gather_objects(os.environ.get("OMP_NUM_THREADS"))  # printed by rank 0: lines can interleave
mpi_util.print0(f"OMP_NUM_THREADS by rank {threads}")
mpi_util.print0(f"gathered {gathered['rank'].tolist()}")
