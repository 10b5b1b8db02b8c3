"""``SharedBudget``: work the ranks draw from while they work, so that a rank slowed down does less of it.

With an even split (each rank ``total / nworkers`` units), a synchronous gather waits for the slowest rank: on a
shared or oversubscribed machine some rank is always descheduled at the wrong moment. Drawing small pieces from one
counter instead makes every rank finish within one piece of the others. The counter lives in an MPI shared-memory
window on rank 0 and is updated with MPI's atomic fetch-and-add, which, on a window in shared memory, completes
without rank 0 calling into MPI. So it needs every rank on one host.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .process import COMM_WORLD
from .shm import all_on_one_host, shared_int64


class SharedBudget:
    """``total`` units of work that the ranks of ``comm`` take from in pieces, in any order, while they work.

    Collective over ``comm`` to create (every rank must be on the same host: raises ValueError otherwise, on every
    rank). ``take(n)`` is not collective. ``refill()`` is called by one rank while no rank is taking, between two
    collectives every rank passes: for a rollout, after ``rank0_accum_batches`` (every rank has finished taking to
    reach it) and before ``rank0_bcast_wts`` (no rank starts again before it).
    Which rank gets which units depends on timing: runs that use it are not reproducible bit for bit.

    Args:
        total: the units of work, an integer >= 0.
        comm: the communicator; None for COMM_WORLD.

    Raises:
        ValueError: ``total`` < 0, or the ranks of ``comm`` are not all on one host (on every rank).
    """

    def __init__(self, total: int, comm: MPI.Comm | None = None) -> None:
        comm = COMM_WORLD if comm is None else comm
        if total < 0:
            raise ValueError(f"SharedBudget: total must be >= 0, got {total}")
        if not all_on_one_host(comm):
            raise ValueError("SharedBudget: every rank must run on one host (the budget is a shared-memory counter); "
                             "on several hosts split the work evenly instead")
        self.total = total
        # The array itself is only ever touched through MPI atomics: units handed out since the refill.
        self.window, _ = shared_int64(comm, (1,))
        self._operand = np.zeros(1, dtype=np.int64)
        self._result = np.zeros(1, dtype=np.int64)

    def take(self, n: int) -> int:
        """Take up to ``n`` units. Not collective.

        Args:
            n: the units wanted; 0 or less takes none.

        Returns:
            How many this rank got: ``n``, fewer when the budget runs out, 0 after.
        """
        if n <= 0:
            return 0
        self._operand[0] = n
        self.window.Fetch_and_op(self._operand, self._result, 0, 0, MPI.SUM)
        self.window.Flush(0)
        return int(min(n, max(0, self.total - self._result[0])))

    def refill(self) -> None:
        """Make all ``total`` units available again (one rank, while no rank takes; see the class docstring)."""
        self._operand[0] = 0
        self.window.Fetch_and_op(self._operand, self._result, 0, 0, MPI.REPLACE)
        self.window.Flush(0)
