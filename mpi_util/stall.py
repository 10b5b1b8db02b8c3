"""Stall detection: how long a rank may wait for the others in a collective, and who to blame when it gives up.

Every wait in ``mpi_util`` goes through ``StallWatch.wait_until``. The limit is one of: none (wait forever, the
default), a fixed number of seconds, or "auto": the first ``AUTO_WARMUP_CALLS`` calls of each collective (start-up,
a first update that compiles) may wait ``AUTO_STARTUP_S``; after that a wait may last ``AUTO_FACTOR`` times the
slowest wait seen so far after warm-up, and never less than ``AUTO_FLOOR_S``. So a job whose iterations take a second
reports a hung rank within a minute, while one whose update takes five minutes waits fifty. On top of the limit,
``stall_deadline`` makes every wait give up at a fixed time (a stop was requested: the job must end soon even if a
rank hangs). A rank that gives up raises CollectiveStallError naming the ranks on its host that have not arrived and
the collective each last entered (an arrival board in shared memory). When the ranks span hosts, the board covers only
this host: there ranks meet through rank 0 (collective.py), whose pending receives name the missing ranks on every
host, and a rank whose arrival rank 0 has taken leaves the report to rank 0.
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
    hosts are not on the board (``covers_all`` is False then). Collective over COMM_WORLD to create.
    """

    def __init__(self) -> None:
        self.host_names: list[str] = COMM_WORLD.allgather(MPI.Get_processor_name())  # by world rank
        node_comm = COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
        self.world_ranks: list[int] = node_comm.allgather(COMM_WORLD.Get_rank())
        self.covers_all = COMM_WORLD.allreduce(node_comm.Get_size() == COMM_WORLD.Get_size(), op=MPI.LAND)
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
        # Across hosts (the board does not cover every rank), COMM_WORLD's meets go through rank 0 on this duplicate
        # of COMM_WORLD (collective.py), so that rank 0's pending receives name the missing ranks.
        self.meet_comm: MPI.Comm | None = None
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

    def wait_until(self, done: Callable[[], bool], sleep: Callable[[float], None], what: str, sequence: int,
                   late: Callable[[], list[int]] | None = None, extra_s: float = 0.0, note: str = "") -> None:
        """Call ``sleep(seconds_left)`` until ``done()``; raise CollectiveStallError when the limit (plus ``extra_s``)
        or the deadline passes first. The wait's length feeds the "auto" limit.

        late: the world ranks known not to have arrived (asked only when giving up), for ranks the board does not
        cover; note: what else the error should say about this wait."""
        started = time.monotonic()
        give_up_at = started + self.limit_s(what) + extra_s
        while not done():
            now = time.monotonic()
            if self.deadline is not None and self.deadline[0] <= now:
                raise CollectiveStallError(self._message(what, sequence, now - started, self.deadline[1], late, note))
            if now >= give_up_at:
                raise CollectiveStallError(self._message(what, sequence, now - started, None, late, note))
            sleep(min(give_up_at, self.deadline[0] if self.deadline else math.inf) - now)
        if self.calls.get(what, 0) > AUTO_WARMUP_CALLS:
            self.slowest_wait_s = max(self.slowest_wait_s, time.monotonic() - started)

    def _message(self, what: str, sequence: int, waited_s: float, reason: str | None,
                 late: Callable[[], list[int]] | None, note: str) -> str:
        board, where, rank = self.board, self._where, COMM_WORLD.Get_rank()
        message = f"rank {rank}{where(rank)}: no progress for {waited_s:.0f} s in {what} (collective #{sequence})"
        if reason:
            message += f", {reason}"
        missing: list[str] = []
        on_board: set[int] = set()
        if board is not None:
            for r, seq, code in board.missing(sequence):
                on_board.add(r)
                missing.append(f"rank {r}{where(r)} has not arrived (last entered "
                               + (f"{self.names[code]}, collective #{seq})" if code >= 0 else "no collective yet)"))
            on_board.update(board.world_ranks)
        if late is not None:
            missing += [f"rank {r}{where(r)} has not arrived" for r in late() if r not in on_board]
        if missing:
            message += ": " + "; ".join(missing)
        if note:
            message += f"; {note}"
        if reason:
            return message
        return message + "; a rank is stuck or dead (a slow but healthy job needs a longer stall timeout)"

    def _where(self, r: int) -> str:
        """' (on HOST)' for world rank ``r`` when the ranks span hosts, else nothing."""
        board = self.board
        return f" (on {board.host_names[r]})" if board is not None and not board.covers_all else ""


watch = StallWatch()


def set_stall_timeout(seconds: float | str | None) -> None:
    """Raise CollectiveStallError from any mpi_util collective that waits too long for the other ranks.

    seconds: a fixed limit in seconds; "auto" (the first 2 calls of each collective may wait 10 minutes, later ones
    10x the slowest wait seen so far, at least 60 s); or None, wait forever (the default; the MPI_UTIL_STALL_TIMEOUT
    environment variable sets a fixed limit). The error names the ranks that have not arrived (with the collective
    each last entered, for ranks on this host; and their host, when the ranks span hosts). Collective over COMM_WORLD:
    every rank calls it, at the same point (each rank applies its own value). Under ``mpi_fork`` an uncaught
    CollectiveStallError aborts the whole job.
    """
    if not (seconds is None or seconds == "auto" or (isinstance(seconds, (int, float)) and seconds > 0)):
        raise ValueError(f"stall timeout must be a number of seconds > 0, 'auto' or None, got {seconds!r}")
    watch.limit = seconds
    if watch.board is None and COMM_WORLD.Get_size() > 1:
        watch.board = _ArrivalBoard()
        if not watch.board.covers_all:
            watch.meet_comm = COMM_WORLD.Dup()


def stall_deadline(seconds: float, reason: str) -> None:
    """Make every wait in an mpi_util collective give up (CollectiveStallError) at most ``seconds`` from now, whatever
    the stall timeout; ``reason`` goes into the error ("a stop was requested"). Not collective: safe in a signal
    handler. An earlier deadline already set is kept."""
    at = time.monotonic() + seconds
    if watch.deadline is None or at < watch.deadline[0]:
        watch.deadline = (at, reason)
