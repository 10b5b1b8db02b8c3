"""Stall detection: how long a rank may wait for the others in a collective, and who to blame when it gives up.

Every wait in ``mpi_util`` goes through ``StallWatch.wait_until``. A waiting rank judges each rank that has not
arrived by its last sign of life: the last time that rank called ``heartbeat()`` (train.py's rollouts and updates do,
per env step and per epoch) or entered a collective. A rank is blamed once it has shown no sign of life for the
limit, however long the wait has lasted; a rank that is slow but advancing is never blamed. The limit is one of:
none (wait forever), a fixed number of seconds, or "auto" (the default): ``AUTO_FACTOR`` times the longest silence
seen so far after warm-up (for a rank that ticks, the time between its ticks; for one that never does, its wait),
never less than ``AUTO_FLOOR_S`` (60 s). Under either limit, a rank that has not called ``heartbeat()`` yet gets at
least the start-up allowance (``AUTO_STARTUP_S``, 120 s) in the first ``AUTO_WARMUP_CALLS`` calls of a collective:
imports, building a model, a first compile before its loop ticks.

So with the defaults a rank that hangs in its first rollout is reported within about 60 s of its last tick, or 120 s
into the first wait for it when it hangs before its first tick. Ranks this rank cannot watch (on another host, or
before the first collective has set up the board) are judged by the length of the wait alone: under "auto",
``AUTO_BLIND_WARMUP_S`` (600 s) in warm-up calls, the same adaptive limit after.

Where a rank's signs of life are read: on one host, a board in shared memory (one row per rank: the collective it
last entered, when, and when it last called ``heartbeat()``). Across hosts the board covers each host alone; ranks
meet through rank 0 (collective.py), and a rank on a host without rank 0 sends rank 0 a small message at most once a
second while it calls ``heartbeat()``, so rank 0 judges every rank on every host by its progress and writes the
report; a rank whose arrival rank 0 has taken leaves the report to rank 0.

``stall_deadline`` makes every wait give up at a fixed time on top of all this (a stop was requested: the job must end
soon even if a rank hangs).

The limit comes from the MPI_UTIL_STALL_TIMEOUT environment variable ("auto", seconds, or 0 for never: the words of
train.py's --stall_timeout) or ``set_stall_timeout``; the start-up allowance from MPI_UTIL_STALL_STARTUP (seconds) or
``set_stall_timeout(..., startup_s=...)``.
"""

from __future__ import annotations

import math
import os
import sys
import time
import zlib
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from .process import COMM_WORLD
from .shm import shared_int64
from .text import few

AUTO_WARMUP_CALLS = 2
AUTO_STARTUP_S = 120.0
AUTO_FACTOR = 10.0
AUTO_FLOOR_S = 60.0
AUTO_BLIND_WARMUP_S = 600.0
# How often a waiting rank reads the others' signs of life: finer than any limit worth setting, rare enough to cost
# nothing (a few microseconds per check).
CHECK_EVERY_S = 0.1
# A rank on a host without rank 0 tells rank 0 about its progress at most this often.
FAR_PROGRESS_EVERY_S = 1.0
_PROGRESS_TAG = 2
_STALL_VARIABLE = "MPI_UTIL_STALL_TIMEOUT"
_STARTUP_VARIABLE = "MPI_UTIL_STALL_STARTUP"


# Every collective of mpi_util, by the name it reports: ranks tell each other which collective they are in by a code
# made from its name (the board, the meet, a departure), and a rank reads back the names of codes it knows.
COLLECTIVE_NAMES = ("rank0_accum_batches", "rank0_bcast_wts", "rank0_bcast_tree", "bcast_object", "gather_objects",
                    "ranks_out_of_sync", "all_sum", "all_mean", "SharedRunningStats", "SharedRunningStats.merge",
                    "meet", "script end")
_NAMES_BY_CODE: dict[int, str] = {}
# A rank whose script ends tells the ranks waiting for it, on COMM_WORLD with this tag: high, so as not to meet a
# user's own point-to-point messages.
_DEPARTED_TAG = 32_000 + 17
# The ended rank, its last sequence, that collective's code and its pid (int64), then its host's name.
_DEPARTURE_BYTES = 32 + 64


def collective_code(name: str) -> int:
    """A number for the collective ``name``, the same in every process (31 bits of its CRC-32)."""
    code = zlib.crc32(name.encode()) & 0x7FFFFFFF
    _NAMES_BY_CODE.setdefault(code, name)
    return code


def collective_name(code: int) -> str:
    """The name of the collective with ``code``, as far as this process knows it."""
    return _NAMES_BY_CODE.get(code, f"a collective this rank never called (code {code})")


for _name in COLLECTIVE_NAMES:
    collective_code(_name)


class CollectiveOrderError(RuntimeError):
    """Ranks called different collectives at the same point: raised on every rank, before any data moves."""


class CollectiveStallError(RuntimeError):
    """A rank waited for the others to reach a collective while one of them showed no progress for the limit (or
    past a deadline, such as a stop request's grace).

    Args:
        message: what the error says: the collective, the ranks that have not arrived and where they last were.
        late_ranks: the ranks to blame; None for none.
    """

    def __init__(self, message: str, late_ranks: list[int] | None = None) -> None:
        super().__init__(message)
        self.late_ranks: list[int] = late_ranks or []
        """The ranks that had not arrived and showed no progress (or, past a deadline, had not arrived)."""


class RankEndedError(CollectiveStallError):
    """A rank waited in a collective for a rank whose script has ended (returned, exited or raised) before it."""


def parse_stall_timeout(text: str, name: str = _STALL_VARIABLE) -> float | str | None:
    """The stall limit that ``text`` names, in the words of train.py's --stall_timeout. Not a collective.

    Args:
        text: "auto", a number of seconds, or "0" for never.
        name: where the text came from, for the error's message.

    Returns:
        "auto", a number of seconds > 0, or None for "0" (never).

    Raises:
        ValueError: anything else, naming ``name``.
    """
    text = text.strip()
    if text == "auto":
        return "auto"
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"{name} must be 'auto', a number of seconds, or 0 to wait forever, got '{text}'")
    return None if seconds == 0 else seconds


def _startup_from(text: str, name: str = _STARTUP_VARIABLE) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{name} must be a number of seconds > 0 (the start-up allowance), got '{text}'")
    return seconds


class _ArrivalBoard:
    """Which collective each rank on this host last entered and its last signs of life, in a shared-memory window.

    One row per rank of this host: (sequence number, collective name code, time it entered that collective, time of
    its last ``heartbeat()``; times in CLOCK_MONOTONIC nanoseconds, one clock for every process of a host, 0: never).
    Each rank writes only its own row, plain memory writes; a waiting rank reads every row. Ranks on other hosts
    are not on the board (``covers_all`` is False then). Collective over COMM_WORLD to create.
    """

    SEQUENCE, CODE, ENTERED, HEARTBEAT, PID, ENDED = range(6)  # ENDED: 1 + the last collective of an ended rank

    def __init__(self) -> None:
        self.host_names: list[str] = COMM_WORLD.allgather(MPI.Get_processor_name())  # by world rank
        node_comm = COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
        self.world_ranks: list[int] = node_comm.allgather(COMM_WORLD.Get_rank())
        self.covers_all = COMM_WORLD.allreduce(node_comm.Get_size() == COMM_WORLD.Get_size(), op=MPI.LAND)
        self.index = node_comm.Get_rank()
        self.window, self.slots = shared_int64(node_comm, (node_comm.Get_size(), 6))
        self.row = self.slots[self.index]
        self.row[:] = (0, -1, time.monotonic_ns(), 0, os.getpid(), 0)
        self.window.Sync()
        node_comm.Barrier()
        node_comm.Free()

    def arrive(self, sequence: int, code: int) -> None:
        self.row[: self.HEARTBEAT] = (sequence, code, time.monotonic_ns())
        self.window.Sync()

    def missing(self, sequence: int) -> list[tuple[int, int, int, int, int]]:
        """(world rank, last sequence, last code, last sign of life in ns, last heartbeat in ns) of the ranks on this
        host behind ``sequence``."""
        self.window.Sync()
        return [(self.world_ranks[i], int(seq), int(code), max(int(entered), int(beat)), int(beat))
                for i, (seq, code, entered, beat, _, _) in enumerate(self.slots) if seq < sequence]

    def ended(self) -> list[tuple[int, int, int, int]]:
        """(world rank, last collective, its code, pid) of the ranks on this host whose script has ended."""
        self.window.Sync()
        return [(self.world_ranks[i], int(ended) - 1, int(code), int(pid))
                for i, (_, code, _, _, pid, ended) in enumerate(self.slots) if ended > 0]


class _Suspect:
    """A rank that has not arrived, as a waiting rank sees it at one check."""

    def __init__(self, rank: int, silent_s: float, ticks: bool, blind: bool, last_entered: str = "") -> None:
        self.rank = rank  # -1: some rank this wait cannot name
        self.silent_s = silent_s  # seconds without a sign of life (blind: the wait so far)
        self.ticks = ticks  # it has called heartbeat()
        self.blind = blind  # its signs of life cannot be seen from here
        self.last_entered = last_entered


class StallWatch:
    """This rank's stall limit, its count of collectives entered, and the arrival board. One per process."""

    def __init__(self) -> None:
        self.limit: float | str | None = parse_stall_timeout(os.environ.get(_STALL_VARIABLE, "auto") or "auto")
        self.startup_s = _startup_from(os.environ[_STARTUP_VARIABLE]) if os.environ.get(_STARTUP_VARIABLE) \
            else AUTO_STARTUP_S
        self.board: _ArrivalBoard | None = None
        # Across hosts (the board does not cover every rank), COMM_WORLD's meets go through rank 0 on this duplicate
        # of COMM_WORLD (collective.py), so that rank 0's pending receives name the missing ranks; far ranks' progress
        # messages to rank 0 travel on it too.
        self.meet_comm: MPI.Comm | None = None
        self.sequence = 0  # collectives this rank has entered; equal on all ranks when they are in step
        self.code = self.previous_code = -1  # collective_code of the last one, and of the one before
        self.gave_up = 0  # the sequence of the last collective this rank gave up in (a stall error), 0: none
        # rank -> (its last sequence, that collective's code, its pid, its host), for the ranks that have ended
        self.departed: dict[int, tuple[int, int, int, str]] = {}
        self.calls: dict[str, int] = {}  # calls of each collective so far
        self.longest_silence_s = 0.0  # the longest silence of a rank waited for, after warm-up ("auto")
        self.deadline: tuple[float, str] | None = None  # (monotonic time, why) at which every wait gives up
        self.heartbeats = 0  # this rank's calls of heartbeat()
        # Far progress: on a rank whose host lacks rank 0, when it may next send and the send in flight; on rank 0,
        # when each far rank's last progress message was read.
        self.sends_far_progress = False
        self.next_far_send = 0.0
        self.far_send: MPI.Request | None = None
        self.far_count = np.zeros(1, dtype=np.int64)
        self.far_seen: dict[int, float] = {}

    def enter(self, what: str) -> int:
        """Count a collective named ``what`` and post the arrival on the board; returns its sequence number."""
        self.sequence += 1
        self.calls[what] = self.calls.get(what, 0) + 1
        self.previous_code, self.code = self.code, collective_code(what)
        if self.board is not None:
            self.board.arrive(self.sequence, self.code)
        return self.sequence

    def announce_departure(self) -> None:
        """At this process's exit: tell the ranks waiting for it the last collective it went through, so that a rank
        waiting in a later one knows at once that it never comes.

        The collective a rank gave up in (a stall error, a departed rank) is not one it went through: it announces
        the one before, so that the ranks still waiting in that collective are told it has left rather than wait out
        its silence. Rank 0, when it gave up in the job's first collective because ranks had already ended, passes on
        the first of their departures instead of its own, so that the ranks that hear of one hear of a rank that left
        first."""
        if not MPI.Is_initialized() or MPI.Is_finalized():
            return
        # The last collective this rank went through: not one it gave up in (a stall error, another rank ended).
        gave_up = self.gave_up == self.sequence > 0
        last, code = (self.sequence - 1, self.previous_code) if gave_up else (self.sequence, self.code)
        ended, pid, host_name = COMM_WORLD.Get_rank(), os.getpid(), MPI.Get_processor_name()
        if gave_up and self.departed and last == 0:  # rank 0 ends for a rank that ended first: name that one
            ended = min(self.departed)
            last, code, pid, host_name = self.departed[ended]
        payload = np.zeros(_DEPARTURE_BYTES, dtype=np.uint8)
        payload[:32] = np.array([ended, last, code, pid], dtype=np.int64).view(np.uint8)
        host = host_name.encode()[: _DEPARTURE_BYTES - 32]
        payload[32 : 32 + len(host)] = np.frombuffer(host, dtype=np.uint8)
        if self.board is not None:  # this host's ranks read it on the board
            self.board.row[_ArrivalBoard.SEQUENCE : _ArrivalBoard.ENTERED] = (last, code)
            self.board.row[_ArrivalBoard.ENDED] = last + 1
            self.board.window.Sync()
        # Messages only where there is no board, and only to ranks that wait for this one, and so are alive: a message
        # to a rank that has finalized can end the job (seen with MPICH: the sender killed at exit, now and then, when
        # rank 0 told every rank at every exit).
        requests = [COMM_WORLD.Isend(payload, dest=r, tag=_DEPARTED_TAG) for r in self._ranks_waiting_for(last)]
        MPI.Request.Waitall(requests)  # 96 bytes: sent at once (eagerly)
        if gave_up:
            # The collective this rank gave up in left its MPI requests pending, and MPICH's MPI_Finalize, which runs
            # after this, says so ("Builtin communicator ... has pending N references"): the error said what matters.
            sys.stderr.flush()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)

    def _ranks_waiting_for(self, last: int) -> list[int]:
        """Before the job's first collective has set up the board: rank 0, which waits in it for every rank (when
        this rank went through none); rank 0, when it gave up in it, tells the ranks that have not ended. With the
        board, nobody: this host's ranks read it there (across hosts, ranks meet once more at exit instead:
        collective.py)."""
        if self.board is not None or last > 0:
            return []
        if COMM_WORLD.Get_rank() != 0:
            return [0]
        return [r for r in range(1, COMM_WORLD.Get_size()) if r not in self.departed] if self.gave_up else []

    def _ended_before(self, sequence: int) -> list[int]:
        """The ranks known to have ended before collective ``sequence``, after reading what has come."""
        status, scratch = MPI.Status(), np.zeros(_DEPARTURE_BYTES, dtype=np.uint8)
        while COMM_WORLD.Iprobe(source=MPI.ANY_SOURCE, tag=_DEPARTED_TAG, status=status):
            COMM_WORLD.Recv(scratch, source=status.Get_source(), tag=_DEPARTED_TAG)
            ended, last, code, pid = (int(v) for v in scratch[:32].view(np.int64))
            self.departed[ended] = (last, code, pid, scratch[32:].tobytes().rstrip(b"\0").decode())
        if self.board is not None:
            for r, last, code, pid in self.board.ended():
                self.departed[r] = (last, code, pid, self.board.host_names[r])
        return sorted(r for r, (last, *_) in self.departed.items() if last < sequence)

    def set_up_board(self) -> None:
        """Create the arrival board (and, across hosts, the meeting communicator). Collective over COMM_WORLD."""
        if self.board is not None or COMM_WORLD.Get_size() == 1:
            return
        self.board = _ArrivalBoard()
        self.board.row[: _ArrivalBoard.HEARTBEAT] = (self.sequence, self.code, time.monotonic_ns())
        if self.heartbeats:
            self.board.row[_ArrivalBoard.HEARTBEAT] = time.monotonic_ns()
        if not self.board.covers_all:
            self.meet_comm = COMM_WORLD.Dup()
            self.sends_far_progress = 0 not in self.board.world_ranks

    def send_far_progress(self, now: float) -> None:
        """Tell rank 0 (on another host) that this rank has made progress; at most one message in flight."""
        self.next_far_send = now + FAR_PROGRESS_EVERY_S
        if self.far_send is not None and not self.far_send.Test():
            return
        self.far_count[0] = self.heartbeats
        self.far_send = self.meet_comm.Isend(self.far_count, dest=0, tag=_PROGRESS_TAG)

    def _read_far_progress(self, now: float) -> None:
        """Rank 0: take the progress messages far ranks have sent, noting when each rank's last one was read."""
        comm, status, scratch = self.meet_comm, MPI.Status(), np.zeros(1, dtype=np.int64)
        while comm.Iprobe(source=MPI.ANY_SOURCE, tag=_PROGRESS_TAG, status=status):
            comm.Recv(scratch, source=status.Get_source(), tag=_PROGRESS_TAG)
            self.far_seen[status.Get_source()] = now

    def _waiting(self, now: float) -> None:
        """Show, while this rank waits in a collective, that it is not the one stuck: a rank that waits for it (in a
        later collective, or blocked in a data round this rank must finish) would otherwise blame it."""
        if self.board is not None:
            self.board.row[_ArrivalBoard.ENTERED] = int(now * 1e9)
            if self.sends_far_progress and now >= self.next_far_send:
                self.send_far_progress(now)

    def _allowed_s(self, suspect: _Suspect, warm_up: bool) -> float:
        """Seconds of silence ``suspect`` is allowed in this wait (silence as _suspects measures it: since the rank's
        last heartbeat or collective, or since the wait began for a rank this one cannot see).

        No limit (0): never blamed; only a deadline (a stop request) ends the wait. Otherwise the progress limit: the
        number given, or "auto", the more of AUTO_FLOOR_S and AUTO_FACTOR x the longest silence seen, which
        wait_until learns only past a collective's first AUTO_WARMUP_CALLS calls, so that start-up and compiling never
        raise it. During those calls (warm_up) a blind suspect (another host, or a wait that cannot name who is late)
        gets at least AUTO_BLIND_WARMUP_S under "auto", its start-up not being told from a hang, and a rank that has
        not yet called heartbeat() at least the start-up allowance (startup_s, MPI_UTIL_STALL_STARTUP)."""
        if self.limit is None:
            return math.inf
        if self.limit == "auto":
            progress_limit = max(AUTO_FLOOR_S, AUTO_FACTOR * self.longest_silence_s)
            if warm_up and suspect.blind:
                return max(AUTO_BLIND_WARMUP_S, progress_limit)
        else:
            progress_limit = float(self.limit)
        if warm_up and not (suspect.ticks or suspect.blind):
            return max(self.startup_s, progress_limit)  # before the loop: imports, building a model, compiling
        return progress_limit

    def _suspects(self, sequence: int, started: float, now: float,
                  late: Callable[[], list[int]] | None) -> list[_Suspect]:
        """The ranks that have not arrived at collective ``sequence``, each with its silence; one blind entry (rank
        -1) when this wait cannot name them."""
        suspects: list[_Suspect] = []
        board = self.board
        on_board: set[int] = set()
        if board is not None:
            now_ns = int(now * 1e9)
            for r, seq, code, alive_ns, beat_ns in board.missing(sequence):
                entered = f"{collective_name(code)}, collective #{seq}" if code >= 0 else "no collective yet"
                suspects.append(_Suspect(r, max(0.0, (now_ns - alive_ns) / 1e9), beat_ns > 0, False, entered))
            on_board.update(board.world_ranks)
        if late is not None:
            if self.meet_comm is not None and COMM_WORLD.Get_rank() == 0:
                self._read_far_progress(now)
            for r in late():
                if r in on_board:
                    continue
                if r in self.far_seen:
                    suspects.append(_Suspect(r, now - self.far_seen[r], True, False))
                else:
                    suspects.append(_Suspect(r, now - started, False, True))
        if not suspects:
            suspects.append(_Suspect(-1, now - started, False, True))
        return suspects

    def wait_until(self, done: Callable[[], bool], sleep: Callable[[float], None], what: str, sequence: int,
                   late: Callable[[], list[int]] | None = None, extra_s: float = 0.0, note: str = "",
                   rank0_judges: bool = False) -> None:
        """Call ``sleep(seconds_left)`` until ``done()``; raise CollectiveStallError when a rank that has not arrived
        has shown no sign of life for its limit (plus ``extra_s``), or when the deadline passes first. The silences
        seen feed the "auto" limit.

        late: the world ranks known not to have arrived (for ranks the board does not cover); note: what else the
        error should say about this wait; rank0_judges: rank 0 is in this collective and judges every rank by its
        progress, so this rank blames none it cannot see (only ranks on its board, after ``extra_s`` more).

        Invariants, checked every CHECK_EVERY_S in this order:
        - A deadline (a stop request's grace) ends the wait whatever the ranks do: the job must stop in bounded time.
        - A rank whose script has ended before this collective (its departure, announce_departure) ends it at once:
          it never comes, so waiting out its silence would only delay the same verdict.
        - Otherwise a rank is blamed only when it has shown no sign of life for its limit (_allowed_s). Signs of life
          are its heartbeat ticks and the collectives it enters, both read from the board of this host; a rank on
          another host is blind here, and when rank 0 judges (rank0_judges) only rank 0 blames it.
        - ``done()`` is asked again after the verdict and before raising: a rank that arrived while it was judged is
          not blamed (its arrival is the sign of life the verdict missed).
        - The silences of a wait feed the "auto" limit only after warm-up (compilation, first allocations), and
          without ticks the whole wait counts as one silence, so that "auto" never learns a limit shorter than what
          a healthy rank was seen to need."""
        started = time.monotonic()
        warm_up = self.calls.get(what, 0) <= AUTO_WARMUP_CALLS
        next_check = started + CHECK_EVERY_S
        longest = 0.0  # the longest silence of a rank that ticks, seen in this wait
        any_ticks = False
        while not done():
            now = time.monotonic()
            if self.deadline is not None and self.deadline[0] <= now:
                self.gave_up = sequence
                suspects = self._suspects(sequence, started, now, late)
                raise CollectiveStallError(self._message(what, sequence, now - started, self.deadline[1],
                                                         suspects, [], note),
                                           [s.rank for s in suspects if s.rank >= 0])
            if now >= next_check and (ended := self._ended_before(sequence)) and not done():
                self.gave_up = sequence
                raise RankEndedError(self.ended_message(what, sequence, ended), ended)
            if now >= next_check and self.limit is None:
                next_check = now + CHECK_EVERY_S
            elif now >= next_check:
                suspects = self._suspects(sequence, started, now, late)
                blamed = [s for s in suspects if s.silent_s >= self._allowed_s(s, warm_up) + extra_s
                          and not (s.blind and rank0_judges)]
                if blamed and done():  # the last rank arrived while its lateness was being judged
                    break
                if blamed:
                    self.gave_up = sequence
                    raise CollectiveStallError(self._message(what, sequence, now - started, None, suspects, blamed,
                                                             note), [s.rank for s in blamed if s.rank >= 0])
                self._waiting(now)
                for s in suspects:
                    if s.ticks:
                        any_ticks = True
                        longest = max(longest, s.silent_s)
                next_check = now + CHECK_EVERY_S
            sleep(max(0.0, min(next_check, self.deadline[0] if self.deadline else math.inf) - now))
        if not warm_up:
            # Without ticks to go by, a rank's silence is as long as the wait for it.
            self.longest_silence_s = max(self.longest_silence_s,
                                         longest if any_ticks else time.monotonic() - started)

    def _message(self, what: str, sequence: int, waited_s: float, reason: str | None, suspects: list[_Suspect],
                 blamed: list[_Suspect], note: str) -> str:
        where, rank = self._where, COMM_WORLD.Get_rank()
        silent_s = max((s.silent_s for s in blamed), default=waited_s)
        message = f"rank {rank}{where(rank)}: no progress for {silent_s:.0f} s in {what} (collective #{sequence})"
        if reason:
            message += f", {reason}"
        missing: list[str] = []
        # The blamed first (stable, so in rank order): a large job's message names only a few.
        for s in sorted(suspects, key=lambda s: s not in blamed):
            if s.rank < 0:
                continue
            text = f"rank {s.rank}{where(s.rank)} has not arrived"
            details = [f"last entered {s.last_entered}"] if s.last_entered else []
            if s.blind:
                details.append("its progress cannot be seen from here")
            elif s in blamed or reason:
                details.append(f"no progress for {s.silent_s:.0f} s")
            else:
                details.append(f"still advancing, last progress {s.silent_s:.0f} s ago")
            missing.append(f"{text} ({'; '.join(details)})")
        if missing:
            message += ": " + few(missing, "and", "; ")
        if note:
            message += f"; {note}"
        if reason:
            return message
        return message + ("; a rank is stuck or dead (a rank that is slow but healthy should call mpi_util.heartbeat()"
                          " in its long loops, or the job needs a longer stall timeout)")

    def ended_message(self, what: str, sequence: int, ended: list[int]) -> str:
        rank = COMM_WORLD.Get_rank()
        last, code, _, _ = self.departed[ended[0]]
        after = f"after {collective_name(code)} (its collective #{last})" if last else "before any collective"
        names = few(f"rank {r} (on host {self.departed[r][3]}, pid {self.departed[r][2]})" for r in ended)
        return (f"rank {rank}{self._where(rank)} waits in {what} (collective #{sequence}) for {names}, whose script "
                f"has ended (returned, exited or raised) {after}: every rank must call the same collectives the same "
                "number of times")

    def _where(self, r: int) -> str:
        """' (on HOST)' for world rank ``r`` when the ranks span hosts, else nothing."""
        board = self.board
        return f" (on {board.host_names[r]})" if board is not None and not board.covers_all else ""


watch = StallWatch()


def heartbeat() -> None:
    """Tell the other ranks that this rank is making progress. Call it in every loop that can run long between
    collectives: train.py's rollouts call it once per env step (one step of all this rank's envs), its PPO and TRPO
    updates once per epoch or conjugate-gradient step.

    A rank waiting for this one in a collective blames it only after it has gone the stall limit without a heartbeat
    (or without entering a collective): 60 s by default, or 10x the longest such silence seen once each collective is
    past its first two calls. A rank that has never called this is allowed the start-up allowance (120 s by default)
    in the first two calls of each collective. Not collective, no communication on one host (a store into shared
    memory, about 0.2 microseconds); on a host without rank 0, a small message to rank 0 at most once a second.
    """
    w = watch
    w.heartbeats += 1
    board = w.board
    if board is not None:
        now_ns = time.monotonic_ns()
        board.row[_ArrivalBoard.HEARTBEAT] = now_ns
        if w.sends_far_progress and now_ns >= w.next_far_send * 1e9:
            w.send_far_progress(now_ns / 1e9)


def set_stall_timeout(seconds: float | str | None, startup_s: float | None = None) -> None:
    """Raise CollectiveStallError from any mpi_util collective in which a rank that has not arrived shows no
    progress (no ``heartbeat()``, no collective entered) for too long.

    The MPI_UTIL_STALL_TIMEOUT environment variable sets the value in force before this call, in the same words as
    train.py's --stall_timeout ("auto", seconds, 0 for never).

    The error names the ranks that have not arrived (with the collective each last entered, for ranks on this host;
    and their host, when the ranks span hosts). Collective over COMM_WORLD: every rank calls it, at the same point
    (each rank applies its own value); without it the board the error reads is set up after the first collective
    over COMM_WORLD. Under ``mpi_fork`` an uncaught CollectiveStallError aborts the whole job.

    Args:
        seconds: a fixed limit in seconds; "auto" (the default, see the module's docstring: a rank that calls
            ``heartbeat()`` may go 60 s without one, a rank that has not yet may take ``startup_s`` in the first two
            calls of each collective, and after warm-up 10x the longest silence seen, at least 60 s); None or 0,
            wait forever.
        startup_s: the start-up allowance, under either limit (default 120 s, or MPI_UTIL_STALL_STARTUP); None
            keeps the current one.

    Raises:
        ValueError: ``seconds`` is not "auto", a number >= 0 or None, or ``startup_s`` is not a number > 0.
    """
    if not (seconds is None or seconds == "auto" or (isinstance(seconds, (int, float)) and seconds >= 0
                                                      and math.isfinite(seconds))):
        raise ValueError(f"stall timeout must be 'auto', a number of seconds >= 0 (0: wait forever) or None, "
                         f"got {seconds!r}")
    if startup_s is not None and not (isinstance(startup_s, (int, float)) and startup_s > 0):
        raise ValueError(f"startup_s (the start-up allowance) must be a number of seconds > 0, got {startup_s!r}")
    watch.limit = None if seconds == 0 else seconds
    if startup_s is not None:
        watch.startup_s = float(startup_s)
    watch.set_up_board()


def stall_deadline(seconds: float, reason: str) -> None:
    """Make every wait in an mpi_util collective give up (CollectiveStallError) at most ``seconds`` from now, whatever
    the stall timeout. Not collective: safe in a signal handler. An earlier deadline already set is kept.

    Args:
        seconds: how long from now a wait may still go on.
        reason: what the error says the deadline is for ("a stop was requested").
    """
    at = time.monotonic() + seconds
    if watch.deadline is None or at < watch.deadline[0]:
        watch.deadline = (at, reason)
