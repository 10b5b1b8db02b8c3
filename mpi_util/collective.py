"""What every collective here is made of: ranks meet, then the data moves.

MPICH's blocking collectives busy-poll: a rank waiting in ``MPI_Gatherv`` while rank 0 runs a two-second update
burns a whole core, and with 8 ranks on 2 cores that steals the cores the update needs. So each collective takes
two steps. First the ranks meet in an exchange of a few int64 per rank (a digest of what they pass: keys, shapes,
dtypes, row counts), waiting for each other without spinning and within the stall limit (stall.py); a mismatch is
found here, on every rank, before any data moves. Then, all present, the data moves: through shared memory on one
host (host.py), else in non-blocking MPI operations completed at once.

Across hosts, with a stall limit set, COMM_WORLD's ranks meet through rank 0 instead of in an all-gather: each sends
its values to rank 0 (a synchronous send, complete once rank 0 has entered the meet) and rank 0 broadcasts them all.
An all-gather's pending request cannot say which rank is missing; rank 0's pending receives can.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import sys
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from .host import decide_after_first_collective, poll_requests, post_and_complete, transport
from .process import COMM_WORLD
from .stall import CollectiveOrderError, CollectiveStallError, RankEndedError, collective_code, collective_name, watch
from .wakeup import EXCHANGE_WIDTH

MEET_VALUES = EXCHANGE_WIDTH - 1  # a meet's values besides the collective's code

_MEET_TAG = 1
# A rank whose arrival rank 0 has taken waits this much past its own limit for the ranks on its host, so that rank 0,
# which started its wait no later and can name every missing rank, gives up first and its error is the one the user
# reads; ranks on other hosts it leaves to rank 0 alone (it cannot see their progress, rank 0 can).
REPORT_GRACE_S = 5.0
_SCRIPT_END = collective_code("script end")


def signature_digest(signature: object) -> int:
    """A 63-bit digest of a small description (shapes, dtypes, keys) that ranks compare before moving data."""
    return int.from_bytes(hashlib.blake2b(repr(signature).encode(), digest_size=8).digest(), "little") >> 1


def meet_and_exchange(comm: MPI.Comm, values: list[int], what: str) -> np.ndarray:
    """Wait, without spinning, until every rank of ``comm`` has called this, and return every rank's ``values`` (the
    same count on each, at most MEET_VALUES) as an int64 array (size, len(values)). ``what`` names the collective in
    a stall error.

    Every rank also tells the others which collective it is in: ranks that called different ones get a
    CollectiveOrderError here, on every rank, before any data moves. So every meet has the same size, whatever the
    collective: a rank in another collective still meets this one and is named, instead of an MPI size mismatch.
    With the host transport through the doorbell's slots; else through rank 0 or an MPI all-gather.
    """
    if len(values) > MEET_VALUES:
        raise ValueError(f"meet_and_exchange: at most {MEET_VALUES} values, got {len(values)}")
    sequence = watch.enter(what)
    mine = np.zeros(EXCHANGE_WIDTH, dtype=np.int64)
    mine[0], mine[1 : 1 + len(values)] = collective_code(what), values
    host = transport(comm)
    if host is not None:
        everyone = host.exchange(list(mine), what, sequence)
    else:
        everyone = np.empty((comm.Get_size(), EXCHANGE_WIDTH), dtype=np.int64)
        if watch.meet_comm is not None and (comm is COMM_WORLD or comm == COMM_WORLD):
            _meet_through_rank0(watch.meet_comm, mine, everyone, what, sequence)
            decide_after_first_collective(comm)
        else:
            post_and_complete(comm, lambda: [comm.Iallgather(mine, everyone)], what, sequence, then_spin=False)
    _check_same_collective(comm, everyone, what, sequence)
    return everyone[:, 1 : 1 + len(values)]


def _check_same_collective(comm: MPI.Comm, everyone: np.ndarray, what: str, sequence: int) -> None:
    """CollectiveOrderError, the same on every rank, when the codes in ``everyone`` (size, EXCHANGE_WIDTH) are not
    all the same collective's; RankEndedError on the ranks still running when some met at the end of their script."""
    codes = everyone[:, 0]
    ended = np.flatnonzero(codes == _SCRIPT_END)
    if 0 < len(ended) < len(codes):
        if codes[comm.Get_rank()] == _SCRIPT_END:
            return  # this rank is ending: the others raise
        hosts = watch.board.host_names if watch.board is not None else ["?"] * len(codes)
        ended_ranks = [int(r) for r in ended]
        for r in ended_ranks:
            last, code, pid = (int(v) for v in everyone[r, 1:4])
            watch.departed[r] = (last, code, pid, hosts[r])
        watch.gave_up = sequence  # the job cannot go on: no meet at this rank's own end
        raise RankEndedError(watch.ended_message(what, sequence, ended_ranks), ended_ranks)
    others = np.flatnonzero(codes != codes[0])
    if len(others) == 0:
        return
    first = int(others[0])
    raise CollectiveOrderError(
        f"rank {first} called {collective_name(int(codes[first]))} where rank 0 called "
        f"{collective_name(int(codes[0]))} (collective #{sequence} of rank {comm.Get_rank()}, in "
        f"{what}): call the same collectives in the same order on every rank")


def _meet_through_rank0(comm: MPI.Comm, mine: np.ndarray, everyone: np.ndarray, what: str, sequence: int) -> None:
    """Fill ``everyone`` (size, n) with every rank's ``mine`` (n,) through rank 0 of ``comm`` (COMM_WORLD's duplicate
    for meets): a stall error on rank 0 names the ranks whose values have not come, on any host."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        everyone[0] = mine
        receives = [comm.Irecv(everyone[r], source=r, tag=_MEET_TAG) for r in range(1, size)]
        poll_requests(receives, what, sequence,
                      late=lambda: [r for r, request in enumerate(receives, start=1) if not request.Test()])
        poll_requests([comm.Ibcast(everyone, root=0)], what, sequence)
        return
    send = comm.Issend(mine, dest=0, tag=_MEET_TAG)
    result = comm.Ibcast(everyone, root=0)
    poll_requests([send], what, sequence, late=lambda: [0])
    poll_requests([result], what, sequence, extra_s=REPORT_GRACE_S, rank0_judges=True,
                  note="rank 0 has arrived and waits for the ranks it names in its own error")


def meet(comm: MPI.Comm, what: str) -> None:
    """Block until every rank of ``comm`` has called ``meet``, without spinning the CPU."""
    if comm.Get_size() > 1:
        # Never zero bytes: every meet carries the collective's code (through rank 0 a zero-byte Issend and Ibcast
        # completed at once on MPICH, seen across two hosts: ranks went through two meets before the last had entered).
        meet_and_exchange(comm, [], what)


def move_data(comm: MPI.Comm, post: Callable[[], list[MPI.Request]], what: str) -> None:
    """The data round of a collective, after the exchange in which every rank arrived: post its non-blocking MPI
    operations (``post()`` returns their requests) and complete them.

    Completed with a busy ``Waitall`` as soon as every rank has posted its part: a large message moves in pipelined
    chunks that need every rank polling without pause. Until then, with the host transport, a rank sleeps: rank 0 may
    still be allocating its result or be descheduled on a loaded machine, and a rank spinning in MPI meanwhile burns a
    core that rank 0 needs.
    """
    post_and_complete(comm, post, what, watch.sequence, then_spin=True)


def _at_exit() -> None:
    """At the end of a rank's script: tell the ranks that may still wait for it in a collective.

    Across hosts, where COMM_WORLD's ranks meet through rank 0, every rank meets once more as its script ends,
    carrying its last collective: when all end together this is one last meet; a rank that ends early meets the
    others in the collective they wait in, and they raise RankEndedError at once. (A message to rank 0 alone could
    reach a rank 0 that had already finalized, which can end the job; a meet is matched by a rank that waits.) On one
    host, or before the first collective, the ending rank marks the board or tells the ranks that wait (stall.py).
    """
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    if watch.meet_comm is None or watch.gave_up:
        watch.announce_departure()
        return
    try:
        meet_and_exchange(COMM_WORLD, [watch.sequence, watch.code, os.getpid()], "script end")
    except CollectiveStallError as error:  # a rank never came to its end: the job is ending anyway
        sys.stderr.write(f"rank {COMM_WORLD.Get_rank()}: at the end of its script: {error}\n")
        watch.announce_departure()


if MPI.Is_initialized() and COMM_WORLD.Get_size() > 1:  # a rank of a job (not a multiprocessing child of one)
    atexit.register(_at_exit)
