"""Each rank's GPU as mpi_util picks it: for this process (local rank as local_rank() gives it) with 8 and 2 GPUs
and with CUDA_VISIBLE_DEVICES's count, and from its launcher's variables alone. Rank 0 prints one line per rank:
RANK r LOCAL l GPU_OF_8 g GPU_OF_2 g GPU_OF_VISIBLE g FROM_LAUNCHER_VARIABLES g."""

import os

import mpi_util

mpi_util.mpi_fork(mpi_util.nworkers)  # under the launcher already: settles the local rank (Open MPI)
row = (mpi_util.rank, mpi_util.local_rank(), mpi_util.gpu_for_rank(8), mpi_util.gpu_for_rank(2),
       mpi_util.gpu_for_rank(), mpi_util.gpu_for_rank(8, dict(os.environ)))
rows = mpi_util.gather_objects(row)
if rows is not None:
    for r in rows:
        print("RANK {} LOCAL {} GPU_OF_8 {} GPU_OF_2 {} GPU_OF_VISIBLE {} FROM_LAUNCHER_VARIABLES {}".format(*r))
