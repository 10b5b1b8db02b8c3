"""Launched with plain python: ``fork_hold.py N`` relaunches itself as N ranks with mpi_fork(N); every rank prints
its rank and pid, then rank 1 waits for a signal and the others for rank 1 in a gather: the job runs until the test
kills a rank."""

import os
import signal
import sys

import mpi_util

result = mpi_util.mpi_fork(int(sys.argv[1]))
if result == "parent":
    print(f"parent: job exited with {result.returncode}", flush=True)
    sys.exit(result.returncode)

print(f"rank {mpi_util.rank} pid {os.getpid()}", flush=True)
if mpi_util.rank == 1:
    signal.pause()
mpi_util.gather_objects(mpi_util.rank)
