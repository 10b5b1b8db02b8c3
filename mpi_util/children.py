"""Whether this process is a ``multiprocessing`` child of an MPI rank, decided before MPI is loaded.

A process that ``multiprocessing`` starts with the spawn or forkserver method imports the user's main script again
(spawn: as ``__mp_main__`` in the child; forkserver: the server preloads ``__main__``), and with it ``import
mpi_util``. It inherits the rank's environment, the launcher's variables included, so MPI_Init there would
introduce it to the launcher as that rank: MPICH's launcher refuses it ("PMIU_write error ... PMI_Init returned -1")
and ends the whole job. SB3's ``SubprocVecEnv`` (forkserver by default on Linux) runs into this in every rank.

So importing this module (``mpi_util`` does, before mpi4py's MPI) tells mpi4py not to initialize MPI in such a
child. There ``rank`` and ``nworkers`` are those of the rank it belongs to, read from the launcher's variables;
``mpi_fork`` returns "child" and does nothing; and COMM_WORLD is a stand-in that raises ``NotARankError``, so that a
collective called there fails with one line instead of MPICH ending the process (and a Pool waiting for it forever).
A child of a process that no launcher started (a plain ``python script.py``) is left alone: it may initialize MPI
by itself, as it always could, and may even ``mpi_fork`` a job of its own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

# Set by mpiexec / mpirun / srun in every rank they start (MPICH Hydra, Open MPI, PMIx, Slurm's PMI), and mpi_fork's
# mark on the ranks it starts: with any of them MPI_Init talks to a launcher (launch.py's under_mpi_launcher).
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID")
FORKED_MARKER = "MPI_UTIL_FORKED"

# Where each launcher puts the rank and the number of ranks: MPICH's hydra and Slurm's PMI2, Open MPI, PMIx, srun.
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")


class NotARankError(RuntimeError):
    """MPI was used in a multiprocessing child of a rank, which has no MPI: collectives belong to the rank itself."""


def _started_by_multiprocessing() -> bool:
    """Whether ``multiprocessing`` started this process (any start method), looked at without importing it."""
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None:  # a process multiprocessing starts has imported it before anything else
        return False
    # While a spawn child or the forkserver imports the main script (spawn._main, forkserver.main), the parent is
    # not known yet, but current_process()._inheriting is set; from the child's bootstrap on, parent_process() is.
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False)) \
        or multiprocessing.parent_process() is not None


def launcher_rank_and_size(environ: Mapping[str, str]) -> tuple[int, int]:
    """The rank and the number of ranks a launcher put in ``environ``; (0, 1) where it put none."""
    rank = next((int(environ[name]) for name in _RANK_VARIABLES if name in environ), 0)
    size = next((int(environ[name]) for name in _SIZE_VARIABLES if name in environ), 1)
    return rank, size


class ChildCommWorld:
    """COMM_WORLD in a multiprocessing child of a rank: using it in any way raises ``NotARankError``."""

    def __init__(self, parent_rank: int) -> None:
        self.parent_rank = parent_rank

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # what copy, pickle and hasattr look for: not a use of MPI
            raise AttributeError(name)
        raise NotARankError(
            f"mpi_util: this process (pid {os.getpid()}) is a multiprocessing child of rank {self.parent_rank} and has "
            f"no MPI (it was asked for COMM_WORLD.{name}): collectives belong to rank {self.parent_rank}'s own "
            "process, not to its Pool workers or SubprocVecEnv envs")


in_child_of_rank: bool = _started_by_multiprocessing() \
    and any(name in os.environ for name in (*LAUNCHER_VARIABLES, FORKED_MARKER))
"""True in a process that ``multiprocessing`` started from an MPI rank: no MPI here."""

if in_child_of_rank:
    import mpi4py

    # Read when mpi4py's MPI is first imported, which is right after this (mpi_util/__init__.py). MPI_Finalize too
    # would need an initialized MPI.
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
