"""Ranks that call collectives out of step, case argv[1]; every rank prints the one line it raised, or that it ended.

- out_of_sync_on_rank0: rank 0 alone calls ranks_out_of_sync, the others go on to rank0_bcast_wts;
- bcast_where_gather: the last rank calls rank0_bcast_wts where the others call rank0_accum_batches;
- ends_after_a_collective: the last rank's script ends after one gather, the others gather again;
- ends_before_any: the last rank's script ends before the job's first collective, a gather on the others.
"""

import sys
import time

import numpy as np

import mpi_util

case = sys.argv[1]
rank, last = mpi_util.rank, mpi_util.nworkers - 1
weights = [np.arange(6, dtype=np.float32)]
batch = {"obs": np.full((4, 2), rank, np.float32)}
started = time.monotonic()


def say(line: str) -> None:
    """One write per line: mpiexec merges the ranks' output, and print's two writes can interleave."""
    sys.stdout.write(f"rank {rank}: {line}\n")
    sys.stdout.flush()


try:
    if case == "out_of_sync_on_rank0":
        mpi_util.rank0_bcast_wts(weights)
        if rank == 0:
            say(f"out of sync: {mpi_util.ranks_out_of_sync(weights)}")
        mpi_util.rank0_bcast_wts(weights)
    elif case == "bcast_where_gather":
        if rank == last:
            mpi_util.rank0_bcast_wts(weights)
        else:
            mpi_util.rank0_accum_batches(batch)
    elif case == "ends_after_a_collective":
        mpi_util.rank0_accum_batches(batch)
        if rank == last:
            say("ended")
            sys.exit(0)
        mpi_util.rank0_accum_batches(batch)
    elif case == "ends_before_any":
        if rank == last:
            say("ended")
            sys.exit(0)
        mpi_util.rank0_accum_batches(batch)
    say("no error")
except (mpi_util.CollectiveOrderError, mpi_util.CollectiveStallError) as error:
    say(f"{type(error).__name__} after {time.monotonic() - started:.1f} s: {error}")
