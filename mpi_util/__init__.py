"""mpi_util: parallelize a batch RL algorithm with MPI. Numpy in, numpy out; neither TensorFlow nor torch is
imported here (the adapters for their variables are duck-typed, and ``setup_gpu`` imports TensorFlow when called).

The recipe, run by every rank::

    if mpi_fork(nprocs) == "parent": sys.exit(...)     # relaunch under mpiexec
    set_global_seeds(seed)                             # an independent stream per rank
    rank0_bcast_wts(model)                             # every rank starts from rank 0's weights
    for iteration in ...:
        batch = rollout(...)                           # every rank, dict of numpy arrays
        batch = rank0_accum_batches(batch)             # rank 0: everyone's rows, in rank order
        if rank == 0:
            update(batch)                              # rank 0 alone learns
        rank0_bcast_wts(model)                         # everyone: rank 0's weights, bit for bit

Modules: process (ranks, printing, abort), collective (ranks meet, then data moves), host (the one-host transport:
doorbell, shared-memory exchange, broadcast window and gather segments), stall (stall limits and who to blame),
gather, bcast, reduce, running_stats (normalizer statistics merged over ranks), budget, gpu, launch, seeding, cpus
(the CPUs this process was given), text (a few ranks named in a message, the rest counted), children (a
multiprocessing child of a rank: no MPI there); shm and wakeup are the shared-memory and futex primitives.
"""

# First: in a multiprocessing child of a rank (SubprocVecEnv's envs, a Pool's workers), MPI must not be initialized.
from . import children  # noqa: F401

try:
    from mpi4py import MPI  # noqa: F401  (loads the MPI library now, so that its absence is one line, here)
except RuntimeError as error:  # mpi4py's binary wheel found no libmpi
    raise ImportError(f"mpi_util: mpi4py found no MPI library ({str(error).splitlines()[0]}): install pip's MPICH with "
                      "pip install mpich (this project's 'mpich' extra), or load your cluster's MPI module") from None

from .bcast import WeightMismatchError, bcast_object, rank0_bcast_tree, rank0_bcast_wts, ranks_out_of_sync
from .budget import SharedBudget
from .cpus import cpus_available
from .gather import BatchMismatchError, gather_objects, rank0_accum_batches
from .gpu import check_gpu_pct, gpu_for_rank, setup_gpu, tf_config
from .launch import ForkResult, MpiexecNotFoundError, find_mpiexec, init, mpi_fork, under_mpi_launcher
from .process import abort, install_abort_on_exception, local_rank, nworkers, print0, rank, stdout_is_terminal
from .reduce import all_mean, all_sum
from .running_stats import Moments, SharedRunningStats, merge_moments, read_moments, write_moments
from .seeding import rank_seed, set_global_seeds
from .stall import (
    CollectiveOrderError,
    CollectiveStallError,
    RankEndedError,
    heartbeat,
    parse_stall_timeout,
    set_stall_timeout,
    stall_deadline,
)
from .supervise import JobFailure

__all__ = [
    "BatchMismatchError",
    "CollectiveOrderError",
    "CollectiveStallError",
    "ForkResult",
    "JobFailure",
    "Moments",
    "MpiexecNotFoundError",
    "RankEndedError",
    "SharedBudget",
    "SharedRunningStats",
    "WeightMismatchError",
    "abort",
    "all_mean",
    "all_sum",
    "bcast_object",
    "check_gpu_pct",
    "cpus_available",
    "find_mpiexec",
    "gather_objects",
    "gpu_for_rank",
    "init",
    "heartbeat",
    "install_abort_on_exception",
    "local_rank",
    "merge_moments",
    "mpi_fork",
    "nworkers",
    "parse_stall_timeout",
    "print0",
    "rank",
    "rank0_accum_batches",
    "rank0_bcast_tree",
    "rank0_bcast_wts",
    "rank_seed",
    "ranks_out_of_sync",
    "read_moments",
    "set_global_seeds",
    "set_stall_timeout",
    "setup_gpu",
    "stall_deadline",
    "stdout_is_terminal",
    "tf_config",
    "under_mpi_launcher",
    "write_moments",
]
