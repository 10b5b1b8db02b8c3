"""Started by an outside mpiexec: calls mpi_fork as every script does, then rank 0 writes to argv[1] one line per
rank: world rank, local_rank(), the rank within a shared-memory split of COMM_WORLD, stdout_is_terminal()."""

import sys

from mpi4py import MPI

import mpi_util

mpi_util.mpi_fork(3)  # under a launcher: returns "child" without relaunching
node_rank = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
rows = mpi_util.gather_objects((mpi_util.rank, mpi_util.local_rank(), node_rank, mpi_util.stdout_is_terminal()))
if mpi_util.rank == 0:
    with open(sys.argv[1], "w") as out:
        out.writelines(" ".join(str(v) for v in row) + "\n" for row in rows)
