"""The one-host transport: when every rank of COMM_WORLD runs on one Linux host, collectives leave MPI out.

One object, ``HostTransport``, owns all of it: the doorbell that waiting ranks sleep on (wakeup.py), the exchange
slots in the doorbell's window, the shared window rank 0 broadcasts through, and the per-rank shared segments a
gather goes through. What each does:

- the doorbell: waiting ranks sleep in the kernel until another rank rings, instead of waking every millisecond to
  poll MPI and taking time slices from rank 0's update;
- the exchange and the gather through shared memory: with more ranks than cores, each round of an MPI collective
  waits for ranks the scheduler has not run yet; here the last rank to arrive wakes the others once, and rank 0
  copies everyone's rows out with no data round;
- the broadcast window: rank 0 copies the weights in, rings and goes on, where an MPI ``Ibcast`` keeps it waiting
  for every rank.

Each was kept because a side-by-side run of train.py showed it pays; the figures, against plain MPI with timed
polling on the same code, are in benchmarks/README.md (variants.py).

Elsewhere (ranks on several hosts, no futexes, ``MPI_UTIL_WAIT=poll``, or /dev/shm without room) ``transport``
returns None and the collectives use MPI. The decision is taken once, by every rank together, right after the
first collective over COMM_WORLD.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from .process import COMM_WORLD
from .shm import all_on_one_host, allocate_agreed, free_shared, shared_int64, shared_segments
from .stall import watch
from .wakeup import Doorbell, doorbell_supported

# Polling schedule of a rank waiting for MPI requests: busy-poll for a few microseconds (a collective whose ranks are
# all there completes at once), then sleep, doubling up to MAX, so a long wait costs about 1% of a core. MAX bounds
# the latency each step of a multi-step collective can add once the last rank arrives.
POLL_SPIN_S = 50e-6
POLL_FIRST_SLEEP_S = 50e-6
POLL_MAX_SLEEP_S = 1e-3

# Broadcasts up to this size go through the shared window; gathers up to this size in all through the segments.
# Together (the segments are double) well under the 64 MB /dev/shm a container gets by default; larger messages go
# through MPI, which moves them as fast as memory copies at that size.
BCAST_MAX_BYTES = 16 << 20
GATHER_MAX_BYTES = 8 << 20
_MIN_SEGMENT_BYTES = 64 << 10


def poll_requests(requests: list[MPI.Request], what: str, sequence: int, **stall: object) -> None:
    """Complete ``requests`` by polling ``Testall`` with short, growing sleeps instead of a busy ``Waitall``.
    ``stall``: what ``StallWatch.wait_until`` should know for an error (late, extra_s, note, rank0_judges)."""
    started = time.monotonic()
    while time.monotonic() - started < POLL_SPIN_S:
        if MPI.Request.Testall(requests):
            return
    sleep_s = POLL_FIRST_SLEEP_S

    def sleep(seconds_left: float) -> None:
        nonlocal sleep_s
        time.sleep(min(sleep_s, seconds_left))
        sleep_s = min(2 * sleep_s, POLL_MAX_SLEEP_S)

    watch.wait_until(lambda: MPI.Request.Testall(requests), sleep, what, sequence, **stall)  # type: ignore[arg-type]


class HostTransport:
    """The doorbell, the exchange slots, the broadcast window and the gather segments of COMM_WORLD's ranks, all on
    this host. Collective to create; its methods are called by every rank inside a collective, in the same order.

    Invariants, and why they hold:
    - Doorbell order: a rank writes what it publishes (its exchange values, its gather segment) before it rings, and
      reads the others' only after it has seen every rank arrive and synced the window (``window.Sync()``); swap
      either and a rank reads a slot before its writer has filled it.
    - Parity: exchange k writes slot set k % 2, and gather g half g % 2 of each segment. Reusing a set is safe
      because no rank can start exchange k before every rank has left exchange k - 1, so all have read exchange
      k - 2 from it. It holds only while every rank counts the same exchanges and gathers: every rank calls each
      collective, in the same order, with no early return on some ranks.
    - One decision for all: whether this transport is used is decided once, by every rank together, after the first
      collective over COMM_WORLD (decide_after_first_collective); a refused window (bcast_refused,
      segments_refused) switches every rank to MPI together, never one alone.
    """

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.doorbell = Doorbell(comm)
        self.exchanges = 0  # exchanges through the doorbell's slots, which alternate between two sets
        self.bcast_window: tuple[MPI.Win, np.ndarray] | None = None  # (window, its bytes), held by rank 0
        self.bcast_refused = False  # the system refused a window once: MPI broadcasts from then on, on every rank
        self.segments_window: MPI.Win | None = None
        self.segments: list[np.ndarray] = []  # every rank's gather segment (two halves), as mapped into this rank
        self.segments_refused = False
        self.gathers = 0  # gathers since set-up; gather g uses half g % 2 of each segment
        self.gathers_through_segments = 0

    # Waiting ---------------------------------------------------------------------------------------------------

    def sleep_until_arrived(self, arrival: int, what: str, sequence: int, rank: int | None = None) -> None:
        """Sleep until every rank (or just ``rank``) has rung for its ``arrival``-th collective."""
        doorbell = self.doorbell
        watch.wait_until(lambda: doorbell.all_arrived(arrival, rank),
                         lambda seconds_left: doorbell.sleep_until_rung(arrival, seconds_left, rank), what, sequence)

    def complete(self, requests: list[MPI.Request], what: str, sequence: int, then_spin: bool) -> None:
        """Ring the doorbell and complete this rank's posted ``requests``: asleep while some rank has not arrived
        (rung after posting its part); then a busy ``Waitall`` if ``then_spin`` (a data round: large messages move in
        pipelined chunks that need every rank polling without pause), else polling with short sleeps."""
        self.sleep_until_arrived(self.doorbell.ring(), what, sequence)
        if then_spin:
            MPI.Request.Waitall(requests)
        else:
            poll_requests(requests, what, sequence)

    # Exchange --------------------------------------------------------------------------------------------------

    def exchange(self, values: list[int], what: str, sequence: int) -> np.ndarray:
        """Every rank's ``values`` (at most EXCHANGE_WIDTH) as int64 (size, len(values)): write them into this rank's
        slot, ring, sleep until every rank has rung, read every slot.

        The slots alternate between two sets: a rank writes its exchange k into set k % 2 after exchange k - 1, which
        it left only once every rank had arrived there, so every rank has read exchange k - 2 out of that set by then.
        """
        slots = self.doorbell.exchange_slots[self.exchanges % 2]
        self.exchanges += 1
        slots[self.rank, : len(values)] = values
        self.sleep_until_arrived(self.doorbell.ring(), what, sequence)  # the ring publishes the values first
        self.doorbell.window.Sync()  # read the values only after seeing the arrivals
        return slots[:, : len(values)].copy()

    # Broadcast -------------------------------------------------------------------------------------------------

    def bcast(self, buffers: list[np.ndarray], what: str, sequence: int) -> bool:
        """Copy rank 0's ``buffers`` into every other rank's through the shared window; False (nothing done) over
        BCAST_MAX_BYTES or once the system has refused the window. Called by every rank after an exchange in which
        all arrived, with buffers of the same sizes.

        Rank 0 copies its buffers in, rings and goes on at once; every other rank sleeps until rank 0 has rung and
        copies them out. Rank 0 writes the window again only in a later broadcast, after that broadcast's exchange,
        which every rank enters only once it has copied this one out.
        """
        total = sum(b.nbytes for b in buffers)
        if self.bcast_refused or total > BCAST_MAX_BYTES:
            return False
        if self.bcast_window is None or self.bcast_window[1].nbytes < total:
            # The same decision on every rank (the same sizes): rare (the first broadcast). The allocation's MPI calls
            # spin: meet first, which sleeps while a rank (rank 0, say) is still on its way.
            self.meet(what, sequence)
            if self.bcast_window is not None:
                free_shared(self.bcast_window[0])
                self.bcast_window = None
            n_words = max(1, (total + 7) // 8)  # held by rank 0
            allocated = allocate_agreed(self.comm, 8 * n_words if self.rank == 0 else 0,
                                        lambda: shared_int64(self.comm, (n_words,)))
            if allocated is None:
                self.bcast_refused = True
                return False
            self.bcast_window = allocated[0], allocated[1].view(np.uint8)
        window, shared = self.bcast_window
        if self.rank == 0:
            _pack(buffers, shared)
            window.Sync()  # the data is in place before the ring says so
        arrival = self.doorbell.ring()
        if self.rank != 0:
            self.sleep_until_arrived(arrival, what, sequence, rank=0)
            window.Sync()
            _unpack(shared, buffers)
        return True

    # Gather ----------------------------------------------------------------------------------------------------

    def gather_capacity(self, r: int) -> int:
        """Bytes of one half of rank r's segment (0 before any)."""
        return len(self.segments[r]) // 2 if self.segments else 0

    def gather_limit(self) -> int:
        """The most bytes one rank may put into its segment per gather."""
        return GATHER_MAX_BYTES // (self.size - 1)

    def gather_put(self, arrays: list[np.ndarray], parity: int) -> bool:
        """Before a gather's exchange: copy this rank's ``arrays`` one after the other into half ``parity`` of its
        segment; False when they do not fit (nothing copied). Rank 0 puts nothing (it keeps its own rows).

        Gather g uses half g % 2. Rank 0 has finished copying gather g - 2 out when it enters gather g - 1, and a rank
        leaves the exchange of g - 1 only once rank 0 has entered it, so no rank overwrites a half rank 0 is still
        reading, and none waits for it.
        """
        half = self._half(self.rank, parity)
        nbytes = sum(a.nbytes for a in arrays)
        if self.rank == 0 or nbytes == 0:
            return True
        if nbytes > len(half):
            return False
        _pack(arrays, half)
        return True

    def gather_take(self, r: int, parity: int, out: list[np.ndarray]) -> None:
        """Rank 0, after the gather's exchange: fill ``out`` with what rank ``r`` put into half ``parity``."""
        self.segments_window.Sync()  # read what the others wrote only after their arrival (seen in the exchange)
        _unpack(self._half(r, parity), out)

    def grow_segments(self, needed: int, what: str, sequence: int) -> None:
        """Reallocate every rank's segment, this one to hold at least ``needed`` bytes per half (with room to spare, up
        to gather_limit). Collective; all ranks must be past any read of the old segments."""
        self.meet(what, sequence)  # the allocation's MPI calls spin: start it with every rank there
        capacity = 0 if self.rank == 0 else min(self.gather_limit(),
                                                max(self.gather_capacity(self.rank), 2 * needed, _MIN_SEGMENT_BYTES))
        if self.segments_window is not None:
            free_shared(self.segments_window)
            self.segments_window, self.segments = None, []
        allocated = allocate_agreed(self.comm, 2 * capacity, lambda: shared_segments(self.comm, 2 * capacity))
        if allocated is None:  # no room in /dev/shm, or the system refused it: MPI from now on
            self.segments_refused = True
            return
        self.segments_window, self.segments = allocated

    def _half(self, r: int, parity: int) -> np.ndarray:
        capacity = self.gather_capacity(r)
        return self.segments[r][parity * capacity : (parity + 1) * capacity] if capacity else np.empty(0, np.uint8)

    def meet(self, what: str, sequence: int) -> None:
        """Every rank here at once, asleep until the last arrives (an exchange of nothing)."""
        self.exchange([], what, sequence)


def _pack(arrays: list[np.ndarray], into: np.ndarray) -> None:
    """Copy the bytes of C-contiguous ``arrays`` one after the other into the uint8 array ``into``."""
    offset = 0
    for a in arrays:
        into[offset : offset + a.nbytes] = a.reshape(-1).view(np.uint8)
        offset += a.nbytes


def _unpack(source: np.ndarray, arrays: list[np.ndarray]) -> None:
    """Fill C-contiguous ``arrays`` from the uint8 array ``source``, one after the other (the inverse of _pack)."""
    offset = 0
    for a in arrays:
        a.reshape(-1).view(np.uint8)[...] = source[offset : offset + a.nbytes]
        offset += a.nbytes


_world: HostTransport | None = None
_decided = False


def transport(comm: MPI.Comm) -> HostTransport | None:
    """COMM_WORLD's host transport when ``comm`` is COMM_WORLD (more than one rank) and every rank can use it, else
    None (also before the first collective over COMM_WORLD has completed)."""
    if _world is None or comm.Get_size() == 1 or not (comm is COMM_WORLD or comm == COMM_WORLD):
        return None
    return _world


def decide_after_first_collective(comm: MPI.Comm) -> None:
    """Called by every rank right after each collective over ``comm`` that went through MPI; the first over
    COMM_WORLD sets up the host transport if every rank can use it: all on one host, all with futexes. Every rank
    is together then, so the set-up's blocking MPI calls (which spin) are short."""
    global _world, _decided
    if _decided or comm.Get_size() == 1 or not (comm is COMM_WORLD or comm == COMM_WORLD):
        return
    _decided = True
    watch.set_up_board()  # for stall reports, unless set_stall_timeout has set it up already
    # Both answers are agreed on by every rank, so every rank takes the same branch into the transport's collectives.
    if all_on_one_host(COMM_WORLD) and COMM_WORLD.allreduce(doorbell_supported(), op=MPI.LAND):
        _world = HostTransport(COMM_WORLD)


def post_and_complete(comm: MPI.Comm, post: Callable[[], list[MPI.Request]], what: str, sequence: int,
                      then_spin: bool) -> None:
    """Post a collective's non-blocking MPI operations (``post()`` returns their requests) and complete them without
    spinning while a rank is missing: with the host transport, asleep on its doorbell; else by timed polling (or,
    with ``then_spin``, a busy ``Waitall``: a data round, after an exchange where every rank arrived)."""
    host = transport(comm)
    requests = post()
    if host is not None:
        host.complete(requests, what, sequence, then_spin)
    elif then_spin:
        MPI.Request.Waitall(requests)
    else:
        poll_requests(requests, what, sequence)
        decide_after_first_collective(comm)


