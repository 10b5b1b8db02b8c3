"""mpi_util: parallelize a batch RL algorithm with MPI. Numpy in, numpy out; TensorFlow is never imported here.

The recipe, run by every rank::

    if mpi_fork(nprocs) == "parent": sys.exit(...)     # relaunch under mpiexec
    set_global_seeds(seed)                             # an independent stream per rank
    for iteration in ...:
        batch = rollout(...)                           # every rank, dict of numpy arrays
        batch = rank0_accum_batches(batch)             # rank 0: everyone's rows, in rank order
        if rank == 0:
            update(batch)                              # rank 0 alone learns
        rank0_bcast_wts(model)                         # everyone: rank 0's weights, bit for bit
"""

from .bcast import WeightMismatchError, rank0_bcast_wts
from .budget import SharedBudget
from .comm import (
    COMM_WORLD,
    CollectiveStallError,
    abort,
    all_mean,
    all_sum,
    install_abort_on_exception,
    local_rank,
    meet,
    nworkers,
    print0,
    rank,
    set_stall_timeout,
    wait_without_spinning,
)
from .gather import BatchMismatchError, rank0_accum_batches
from .gpu import check_gpu_pct, setup_gpu, tf_config
from .launch import ForkResult, MpiexecNotFoundError, find_mpiexec, mpi_fork, under_mpi_launcher
from .seeding import rank_seed, set_global_seeds

__all__ = [
    "COMM_WORLD",
    "BatchMismatchError",
    "CollectiveStallError",
    "ForkResult",
    "MpiexecNotFoundError",
    "SharedBudget",
    "WeightMismatchError",
    "abort",
    "all_mean",
    "all_sum",
    "check_gpu_pct",
    "find_mpiexec",
    "install_abort_on_exception",
    "local_rank",
    "meet",
    "mpi_fork",
    "nworkers",
    "print0",
    "rank",
    "rank0_accum_batches",
    "rank0_bcast_wts",
    "rank_seed",
    "set_global_seeds",
    "set_stall_timeout",
    "setup_gpu",
    "tf_config",
    "under_mpi_launcher",
    "wait_without_spinning",
]
