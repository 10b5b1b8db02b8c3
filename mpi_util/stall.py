"""Stall detection: how long a rank may wait for the others in a collective, and who to blame when it gives up.

Every wait in ``mpi_util`` goes through ``StallWatch.wait_until``. The limit is one of: none (wait forever, the
default), a fixed number of seconds, or "auto": the first ``AUTO_WARMUP_CALLS`` calls of each collective (start-up,
a first update that compiles) may wait ``AUTO_STARTUP_S``; after that a wait may last ``AUTO_FACTOR`` times the
slowest wait seen so far after warm-up, and never less than ``AUTO_FLOOR_S``. So a job whose iterations take a second
reports a hung rank within a minute, while one whose update takes five minutes waits fifty. On top of the limit,
``stall_deadline`` makes every wait give up at a fixed time (a stop was requested: the job must end soon even if a
rank hangs). A rank that gives up raises CollectiveStallError naming the ranks on its host that have not arrived and
the collective each last entered (an arrival board in shared memory).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

from mpi4py import MPI

from .process import COMM_WORLD
from .shm import shared_int64

AUTO_WARMUP_CALLS = 2
AUTO_STARTUP_S = 600.0
AUTO_FACTOR = 10.0
AUTO_FLOOR_S = 60.0


class CollectiveStallError(RuntimeError):
    """A rank waited longer than the stall limit for the others to reach a collective."""


class _ArrivalBoard:
    """Which collective each rank on this host last entered, in a shared-memory MPI window.

    Each rank stores (sequence number, collective name code) into its own slot on entering a collective, a
    plain memory write; a rank that gives up reads every slot to say who has not arrived. Ranks on other
    hosts are not on the board. Collective over COMM_WORLD to create.
    """

    def __init__(self) -> None:
        node_comm = COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
        self.world_ranks: list[int] = node_comm.allgather(COMM_WORLD.Get_rank())
        self.index = node_comm.Get_rank()
        self.window, self.slots = shared_int64(node_comm, (node_comm.Get_size(), 2))
        self.slots[self.index] = (0, -1)
        self.window.Sync()
        node_comm.Barrier()
        node_comm.Free()

    def arrive(self, sequence: int, code: int) -> None:
        self.slots[self.index] = (sequence, code)
        self.window.Sync()

    def missing(self, sequence: int) -> list[tuple[int, int, int]]:
        """(world rank, last sequence, last code) of the ranks on this host behind ``sequence``."""
        self.window.Sync()
        return [(self.world_ranks[i], int(seq), int(code)) for i, (seq, code) in enumerate(self.slots)
                if seq < sequence]


class StallWatch:
    """This rank's stall limit, its count of collectives entered, and the arrival board. One per process."""

    def __init__(self) -> None:
        from_environment = os.environ.get("MPI_UTIL_STALL_TIMEOUT")
        self.limit: float | str | None = float(from_environment) if from_environment else None
        self.board: _ArrivalBoard | None = None
        self.sequence = 0  # collectives this rank has entered; equal on all ranks when they are in step
        self.names: list[str] = []  # collective names, indexed by the codes on the board
        self.calls: dict[str, int] = {}  # calls of each collective so far
        self.slowest_wait_s = 0.0  # the longest completed wait after warm-up ("auto")
        self.deadline: tuple[float, str] | None = None  # (monotonic time, why) at which every wait gives up

    def enter(self, what: str) -> int:
        """Count a collective named ``what`` and post the arrival on the board; returns its sequence number."""
        self.sequence += 1
        self.calls[what] = self.calls.get(what, 0) + 1
        if what not in self.names:
            self.names.append(what)
        if self.board is not None:
            self.board.arrive(self.sequence, self.names.index(what))
        return self.sequence

    def limit_s(self, what: str) -> float:
        """Seconds a wait in collective ``what`` (its current call) may last; inf without a limit."""
        if self.limit is None:
            return math.inf
        if self.limit == "auto":
            if self.calls.get(what, 0) <= AUTO_WARMUP_CALLS:
                return AUTO_STARTUP_S
            return max(AUTO_FLOOR_S, AUTO_FACTOR * self.slowest_wait_s)
        return float(self.limit)

    def wait_until(self, done: Callable[[], bool], sleep: Callable[[float], None], what: str, sequence: int) -> None:
        """Call ``sleep(seconds_left)`` until ``done()``; raise CollectiveStallError when the limit or the deadline
        passes first. The wait's length feeds the "auto" limit."""
        started = time.monotonic()
        give_up_at = started + self.limit_s(what)
        while not done():
            now = time.monotonic()
            if self.deadline is not None and self.deadline[0] <= now:
                raise CollectiveStallError(self._message(what, sequence, now - started, self.deadline[1]))
            if now >= give_up_at:
                raise CollectiveStallError(self._message(what, sequence, now - started, None))
            sleep(min(give_up_at, self.deadline[0] if self.deadline else math.inf) - now)
        if self.calls.get(what, 0) > AUTO_WARMUP_CALLS:
            self.slowest_wait_s = max(self.slowest_wait_s, time.monotonic() - started)

    def _message(self, what: str, sequence: int, waited_s: float, reason: str | None) -> str:
        message = f"rank {COMM_WORLD.Get_rank()}: no progress for {waited_s:.0f} s in {what} (collective #{sequence})"
        if reason:
            message += f", {reason}"
        if self.board is not None:
            late = [
                f"rank {r} has not arrived (last entered "
                + (f"{self.names[code]}, collective #{seq})" if code >= 0 else "no collective yet)")
                for r, seq, code in self.board.missing(sequence)
            ]
            if late:
                message += ": " + "; ".join(late)
        if reason:
            return message
        return message + "; a rank is stuck or dead (a slow but healthy job needs a longer stall timeout)"


watch = StallWatch()


def set_stall_timeout(seconds: float | str | None) -> None:
    """Raise CollectiveStallError from any mpi_util collective that waits too long for the other ranks.

    seconds: a fixed limit in seconds; "auto" (the first 2 calls of each collective may wait 10 minutes, later ones
    10x the slowest wait seen so far, at least 60 s); or None, wait forever (the default; the MPI_UTIL_STALL_TIMEOUT
    environment variable sets a fixed limit). The error names the ranks on this host that have not arrived and the
    collective each last entered. Collective over COMM_WORLD: every rank calls it, at the same point (each rank
    applies its own value). Under ``mpi_fork`` an uncaught CollectiveStallError aborts the whole job.
    """
    if not (seconds is None or seconds == "auto" or (isinstance(seconds, (int, float)) and seconds > 0)):
        raise ValueError(f"stall timeout must be a number of seconds > 0, 'auto' or None, got {seconds!r}")
    watch.limit = seconds
    if watch.board is None and COMM_WORLD.Get_size() > 1:
        watch.board = _ArrivalBoard()


def stall_deadline(seconds: float, reason: str) -> None:
    """Make every wait in an mpi_util collective give up (CollectiveStallError) at most ``seconds`` from now, whatever
    the stall timeout; ``reason`` goes into the error ("a stop was requested"). Not collective: safe in a signal
    handler. An earlier deadline already set is kept."""
    at = time.monotonic() + seconds
    if watch.deadline is None or at < watch.deadline[0]:
        watch.deadline = (at, reason)
