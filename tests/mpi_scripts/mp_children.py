"""A user's own multiprocessing Pool inside every rank, by each start method: the spawn and forkserver methods import
this script again in the children (``import mpi_util`` and the ``mpi_fork`` at its top included).

    mpiexec -n 2 python mp_children.py fork forkserver spawn
    python mp_children.py fork forkserver spawn      # the same, relaunched by mpi_fork

Prints, per rank and method, one line of what the Pool's children saw, and (not for fork, whose children are copies
of the rank with its MPI) what a collective called in a child raised.
"""

import multiprocessing
import signal
import sys

import mpi_util

# isort: split
from mpi4py import MPI  # after mpi_util, which tells mpi4py not to initialize MPI in a child

# The script's top runs again in a spawn child and in the forkserver: there it must return "child" and do nothing.
fork = mpi_util.mpi_fork(2)
if fork == "parent":
    sys.exit(fork.returncode)


def square(x: int) -> tuple[int, int, int, str, bool, bool]:
    """x squared, and what this child knows: its rank and the number of ranks, what ``mpi_fork`` returned here,
    whether MPI is initialized here, and whether SIGUSR1 has its default action (mpi_fork installs a handler)."""
    return (x * x, mpi_util.rank, mpi_util.nworkers, str(fork), MPI.Is_initialized(),
            signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL)


def sum_over_ranks(x: float) -> float:
    """A collective: not for a multiprocessing child."""
    return float(mpi_util.all_sum(x))


if __name__ == "__main__":
    rank = mpi_util.rank
    for method in sys.argv[1:]:
        with multiprocessing.get_context(method).Pool(2) as pool:
            results = pool.map(square, range(8))
            squares = [r[0] for r in results]
            seen = sorted({r[1:] for r in results})
            print(f"rank {rank} {method}: squares {squares}; children saw {seen}", flush=True)
            if method != "fork":
                try:
                    pool.apply(sum_over_ranks, (1.0,))
                except Exception as error:  # raised in the child, raised again here by the Pool
                    print(f"rank {rank} {method}: collective in a child raised {type(error).__name__}: {error}",
                          flush=True)
    # The ranks themselves still meet after all this.
    print(f"rank {rank}: sum over ranks {mpi_util.all_sum(float(rank + 1))}", flush=True)
