"""Ranks, printing, reductions, and the non-spinning wait every collective here goes through.

MPICH's blocking collectives busy-poll: a rank waiting in ``MPI_Gatherv`` while rank 0 runs a two-second
update burns a whole core. With 8 ranks on 2 cores that steals the cores the update needs. So every
collective in ``mpi_util`` takes two rounds: ranks exchange a fixed-size digest of what they pass (shapes,
dtypes, keys) in a non-blocking all-gather polled with short, growing sleeps, which is where they wait for
each other; then, all present, the data moves in non-blocking buffer-based operations completed with a busy
``Waitall`` (short, and large messages move in chunks that need every rank polling without pause). Each round on
oversubscribed cores costs milliseconds, so rounds are kept few. Over COMM_WORLD on one host, MPI is left out
where it can be: ranks wait on a shared-memory doorbell (mpi_util/wakeup.py), asleep until the others arrive; the
exchange goes through the doorbell's own slots (_exchange_on_host); a broadcast's data through a shared-memory
window that rank 0 fills and leaves at once (bcast_on_host), and a gather's through per-rank shared segments that
rank 0 reads after the exchange (gather.py).
"""

from __future__ import annotations

import array
import fcntl
import hashlib
import math
import os
import stat
import sys
import termios
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from .shm import all_on_one_host, allocate_agreed, free_shared, shared_int64
from .wakeup import EXCHANGE_WIDTH, Doorbell, doorbell_supported

COMM_WORLD: MPI.Comm = MPI.COMM_WORLD
rank: int = COMM_WORLD.Get_rank()
nworkers: int = COMM_WORLD.Get_size()

# Polling schedule of a waiting rank: busy-poll for a few microseconds (a collective whose ranks are all there
# completes at once), then sleep, doubling up to MAX, so a long wait costs about 1% of a core. MAX bounds the
# latency each step of a multi-step collective can add once the last rank arrives.
_POLL_SPIN_S = 50e-6
_POLL_FIRST_SLEEP_S = 50e-6
_POLL_MAX_SLEEP_S = 1e-3

_stall_timeout_s: float | None = None
_env_timeout = os.environ.get("MPI_UTIL_STALL_TIMEOUT")
if _env_timeout:
    _stall_timeout_s = float(_env_timeout)


class CollectiveStallError(RuntimeError):
    """A rank waited longer than the stall timeout for the others to reach a collective."""


class _ArrivalBoard:
    """Which collective each rank on this host last entered, in a shared-memory MPI window.

    Each rank stores (sequence number, collective name code) into its own slot on entering a collective, a
    plain memory write; a rank that times out reads every slot to say who has not arrived. Ranks on other
    hosts are not on the board (they are reported as unknown).
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


_board: _ArrivalBoard | None = None
_sequence = 0  # how many collectives this rank has entered; equal on all ranks when they are in step
_COLLECTIVE_NAMES: list[str] = []


def set_stall_timeout(seconds: float | None) -> None:
    """Raise CollectiveStallError from any mpi_util collective that waits ``seconds`` for the other ranks.

    The error names the ranks that have not arrived and the collective each last entered (for ranks on the
    same host). Collective over COMM_WORLD: every rank must call it, at the same point. None waits forever
    (the default; the MPI_UTIL_STALL_TIMEOUT environment variable sets a timeout without the names).
    Under ``mpi_fork`` an uncaught CollectiveStallError aborts the whole job.
    """
    global _stall_timeout_s, _board
    if seconds is not None and not seconds > 0:
        raise ValueError(f"stall timeout must be > 0 seconds or None, got {seconds!r}")
    _stall_timeout_s = seconds
    if seconds is not None and _board is None and COMM_WORLD.Get_size() > 1:
        _board = _ArrivalBoard()


def _enter_collective(what: str) -> int:
    """Count this collective and post the arrival on the board; returns its sequence number."""
    global _sequence
    _sequence += 1
    if _board is not None:
        if what not in _COLLECTIVE_NAMES:
            _COLLECTIVE_NAMES.append(what)
        _board.arrive(_sequence, _COLLECTIVE_NAMES.index(what))
    return _sequence


def _stall_message(what: str, sequence: int | None) -> str:
    message = f"rank {COMM_WORLD.Get_rank()}: no progress for {_stall_timeout_s:g} s in {what}"
    if sequence is not None:
        message += f" (collective #{sequence})"
    if _board is not None and sequence is not None:
        late = [
            f"rank {r} has not arrived (last entered "
            + (f"{_COLLECTIVE_NAMES[code]}, collective #{seq})" if code >= 0 else "no collective yet)")
            for r, seq, code in _board.missing(sequence)
        ]
        if late:
            message += ": " + "; ".join(late)
    return message + "; a rank is stuck or dead (a slow but healthy job needs a longer stall timeout)"


def _time_left(started: float, what: str, sequence: int | None) -> float:
    """Seconds left before the stall timeout of a wait that began at ``started`` (inf without a timeout); raises
    CollectiveStallError once they have run out."""
    if _stall_timeout_s is None:
        return math.inf
    waited = time.monotonic() - started
    if waited > _stall_timeout_s:
        raise CollectiveStallError(_stall_message(what, sequence))
    return _stall_timeout_s - waited


def wait_without_spinning(requests: MPI.Request | list[MPI.Request], what: str, sequence: int | None = None) -> None:
    """Complete ``requests`` by polling ``Test`` with short sleeps instead of a busy ``Wait``.

    ``what`` (and ``sequence``, the collective's number) name the collective in the stall error.
    """
    pending = requests if isinstance(requests, list) else [requests]
    started = time.monotonic()
    while time.monotonic() - started < _POLL_SPIN_S:
        if MPI.Request.Testall(pending):
            return
    sleep_s = _POLL_FIRST_SLEEP_S
    while not MPI.Request.Testall(pending):
        _time_left(started, what, sequence)
        time.sleep(sleep_s)
        sleep_s = min(2 * sleep_s, _POLL_MAX_SLEEP_S)


_doorbell: Doorbell | None = None
_doorbell_decided = False


def _is_world(comm: MPI.Comm) -> bool:
    return comm.Get_size() > 1 and (comm is COMM_WORLD or comm == COMM_WORLD)


def host_doorbell(comm: MPI.Comm) -> Doorbell | None:
    """COMM_WORLD's doorbell when ``comm`` is COMM_WORLD and every rank uses one (all on this host), else None."""
    return _doorbell if _is_world(comm) else None


def _decide_doorbell() -> None:
    """Create COMM_WORLD's doorbell if every rank can use it: all on one host, all on a platform with futexes.

    Called by every rank right after its first collective over COMM_WORLD completes, so all ranks are together and
    the blocking collectives here (which busy-poll) are short.
    """
    global _doorbell, _doorbell_decided
    _doorbell_decided = True
    # Both answers are agreed on by every rank, so every rank takes the same branch into Doorbell's collectives.
    if all_on_one_host(COMM_WORLD) and COMM_WORLD.allreduce(doorbell_supported(), op=MPI.LAND):
        _doorbell = Doorbell(COMM_WORLD)


def _wait_collective(comm: MPI.Comm, post: Callable[[], MPI.Request], what: str, sequence: int) -> None:
    """Post a non-blocking collective over ``comm`` (``post()`` returns its request) and wait for it to complete.

    Over COMM_WORLD with a doorbell: ring it, then sleep until rung while some rank has not arrived, and poll once
    all have. Otherwise timed polling (wait_without_spinning).
    """
    doorbell = host_doorbell(comm)
    request = post()
    if doorbell is None:
        wait_without_spinning(request, what, sequence)
        if _is_world(comm) and not _doorbell_decided:
            _decide_doorbell()
        return
    _sleep_until_all_arrived(doorbell, [request], what, sequence, then_spin=False)


def move_data(comm: MPI.Comm, post: Callable[[], list[MPI.Request]], what: str) -> None:
    """The data round of a collective, after the exchange in which every rank arrived: post its non-blocking
    operations (``post()`` returns their requests) and complete them.

    Completed with a busy ``Waitall`` as soon as every rank has posted its part: a large message moves in
    pipelined chunks that need every rank polling without pause. Until then, over COMM_WORLD with a doorbell, a
    rank sleeps: rank 0 may still be allocating its result or be descheduled on a loaded machine, and a rank
    spinning in MPI meanwhile burns a core (40 ms seen in CI). Elsewhere it spins from the start.
    """
    doorbell = host_doorbell(comm)
    requests = post()
    if doorbell is None:
        MPI.Request.Waitall(requests)
    else:
        _sleep_until_all_arrived(doorbell, requests, what, _sequence, then_spin=True)


# Broadcasts up to this size go through a shared-memory window when the doorbell is in use (see bcast_on_host).
_HOST_BCAST_MAX_BYTES = 16 << 20  # well under the 64 MB /dev/shm a container gets by default
_host_bcast_window: tuple[MPI.Win, np.ndarray] | None = None
_host_bcast_failed = False  # a window could not be allocated; every rank agreed to use MPI broadcasts from then on


def bcast_on_host(comm: MPI.Comm, buffers: list[np.ndarray], what: str) -> bool:
    """Copy rank 0's ``buffers`` into every other rank's through a shared-memory window; False (nothing done) where
    that does not apply: not COMM_WORLD with a doorbell, more than 16 MiB, or the system refused the shared memory
    (then never again). Every rank must call it, after an exchange in which all have arrived, with buffers of the
    same sizes.

    Why: an MPI broadcast among 8 ranks on 2 cores takes several rounds, each needing ranks the scheduler has not
    run yet, and rank 0 waits for them: in train.py at 8 processes an Ibcast of the 44 KB of Walker2d weights took
    rank 0 0.019-0.023 s per iteration (a blocking Bcast 0.006 s), this 0.003-0.005 s
    (benchmarks/results/variants_mpi_data_round). Rank 0 copies its buffers into the window, rings the doorbell and
    goes on at once; every other rank sleeps until rank 0 has rung and copies them out. Rank 0 writes the window
    again only in a later broadcast, after that broadcast's exchange, which every rank enters only once it has
    copied this one out.
    """
    global _host_bcast_window, _host_bcast_failed
    doorbell = host_doorbell(comm)
    total = sum(b.nbytes for b in buffers)
    if doorbell is None or _host_bcast_failed or total > _HOST_BCAST_MAX_BYTES:
        return False
    if _host_bcast_window is None or _host_bcast_window[1].nbytes < total:
        # The same decision on every rank (the same sizes): a collective re-allocation, rare (the first broadcast).
        # Its MPI calls block, spinning; meet first, which sleeps while a rank (rank 0, say) is still on its way.
        meet(comm, what)
        if _host_bcast_window is not None:
            free_shared(_host_bcast_window[0])
            _host_bcast_window = None
        n_words = max(1, (total + 7) // 8)  # held by rank 0
        allocated = allocate_agreed(comm, 8 * n_words if comm.Get_rank() == 0 else 0,
                                    lambda: shared_int64(comm, (n_words,)))
        if allocated is None:  # no room in /dev/shm, or the system refused it: MPI broadcasts from now on
            _host_bcast_failed = True
            return False
        _host_bcast_window = allocated[0], allocated[1].view(np.uint8)
    window, shared = _host_bcast_window
    is_root = comm.Get_rank() == 0
    if is_root:
        offset = 0
        for b in buffers:
            shared[offset : offset + b.nbytes] = b.reshape(-1).view(np.uint8)
            offset += b.nbytes
        window.Sync()  # the data is in place before the ring below says so
    arrival = doorbell.ring()
    if is_root:
        return True
    _sleep_until_arrived(doorbell, arrival, what, _sequence, rank=0)
    window.Sync()
    offset = 0
    for b in buffers:
        b.reshape(-1).view(np.uint8)[...] = shared[offset : offset + b.nbytes]
        offset += b.nbytes
    return True


def _sleep_until_arrived(doorbell: Doorbell, arrival: int, what: str, sequence: int, rank: int | None = None) -> None:
    """Sleep until every rank (or just ``rank``) has rung for collective number ``arrival``, within the stall
    timeout."""
    started = time.monotonic()
    while not doorbell.all_arrived(arrival, rank):
        doorbell.sleep_until_rung(arrival, _time_left(started, what, sequence), rank)


def _sleep_until_all_arrived(
    doorbell: Doorbell, requests: list[MPI.Request], what: str, sequence: int, then_spin: bool
) -> None:
    """Ring the doorbell and complete ``requests``: asleep while some rank has not arrived; once all have, a busy
    ``Waitall`` if ``then_spin``, else polling with short, growing sleeps."""
    arrival = doorbell.ring()
    started = time.monotonic()
    while time.monotonic() - started < _POLL_SPIN_S:
        if MPI.Request.Testall(requests):
            return
    sleep_s = _POLL_FIRST_SLEEP_S
    while not MPI.Request.Testall(requests):
        time_left = _time_left(started, what, sequence)
        if not doorbell.all_arrived(arrival):
            doorbell.sleep_until_rung(arrival, time_left)
        elif then_spin:
            MPI.Request.Waitall(requests)
            return
        else:
            time.sleep(sleep_s)
            sleep_s = min(2 * sleep_s, _POLL_MAX_SLEEP_S)


def meet(comm: MPI.Comm, what: str) -> None:
    """Block until every rank of ``comm`` has called ``meet``, without spinning the CPU."""
    if comm.Get_size() > 1:
        sequence = _enter_collective(what)
        _wait_collective(comm, comm.Ibarrier, what, sequence)


def print0(*args: Any, comm: MPI.Comm | None = None, **kwargs: Any) -> None:
    """``print`` on rank 0 of ``comm`` only, flushed at once (output from mpiexec is otherwise held back)."""
    comm = COMM_WORLD if comm is None else comm
    if comm.Get_rank() == 0:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def _reduction_buffer(x: Any, what: str) -> tuple[np.ndarray, np.dtype]:
    """Return (send buffer, dtype to give back) for a sum of ``x``; bool and float16 are summed wider."""
    arr = np.array(x, copy=True, order="C")
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{what}: expected numbers, got an array of dtype {arr.dtype}; pass a numeric scalar or array")
    if arr.dtype.kind == "b":
        return arr.astype(np.int64), np.dtype(np.int64)
    if arr.dtype == np.float16:
        # MPI has no standard half-precision type; sum in float32 and return float16.
        return arr.astype(np.float32), arr.dtype
    return arr, arr.dtype


def signature_digest(signature: object) -> int:
    """A 63-bit digest of a small description (shapes, dtypes, keys) that ranks compare before moving data."""
    return int.from_bytes(hashlib.blake2b(repr(signature).encode(), digest_size=8).digest(), "little") >> 1


def exchange_int64(comm: MPI.Comm, values: list[int], what: str) -> np.ndarray:
    """Every rank's ``values`` (the same count on each) as an int64 array (size, len(values)), without spinning.

    This is also where ranks meet: the others may arrive much later (rank 0 finishing its update). Over COMM_WORLD
    with a doorbell and at most EXCHANGE_WIDTH values, through the doorbell's window (_exchange_on_host); else an
    MPI all-gather.
    """
    sequence = _enter_collective(what)
    doorbell = host_doorbell(comm)
    if doorbell is not None and len(values) <= EXCHANGE_WIDTH:
        return _exchange_on_host(doorbell, values, what, sequence)
    mine = np.array(values, dtype=np.int64)
    everyone = np.empty((comm.Get_size(), len(values)), dtype=np.int64)
    _wait_collective(comm, lambda: comm.Iallgather(mine, everyone), what, sequence)
    return everyone


def _exchange_on_host(doorbell: Doorbell, values: list[int], what: str, sequence: int) -> np.ndarray:
    """exchange_int64 without MPI: write ``values`` into this rank's exchange slot, ring, sleep until every rank has
    rung, read every slot.

    Why: MPI's all-gather among 8 ranks on 2 cores takes several rounds, each needing ranks the scheduler has not
    run yet; here the last rank to arrive wakes the others once and they are done. The slots alternate between
    two sets: a rank writes its exchange k into set k % 2 after exchange k - 1, which it left only once every rank
    had arrived there, so every rank has read exchange k - 2 out of that set by then.
    """
    slots = doorbell.exchange_slots[doorbell.exchanges % 2]
    doorbell.exchanges += 1
    slots[doorbell.index, : len(values)] = values
    arrival = doorbell.ring()  # its memory barriers publish the values before the arrival
    _sleep_until_arrived(doorbell, arrival, what, sequence)
    doorbell.window.Sync()  # read the values only after seeing the arrivals
    return slots[:, : len(values)].copy()


def _allreduce_sum(x: Any, comm: MPI.Comm, what: str) -> np.ndarray:
    sendbuf, out_dtype = _reduction_buffer(x, what)
    if comm.Get_size() == 1:
        return sendbuf.astype(out_dtype, copy=False)
    digests = exchange_int64(comm, [signature_digest((sendbuf.shape, sendbuf.dtype.str))], what)
    if np.any(digests[:, 0] != digests[0, 0]):
        shapes = comm.allgather((sendbuf.shape, str(out_dtype)))
        raise ValueError(f"{what}: ranks passed different shapes or dtypes {shapes}; every rank must pass the same")
    recvbuf = np.empty_like(sendbuf)
    comm.Allreduce(sendbuf, recvbuf, op=MPI.SUM)  # every rank has arrived: blocking is short
    return recvbuf.astype(out_dtype, copy=False)


def all_sum(x: Any, comm: MPI.Comm | None = None) -> Any:
    """Sum of ``x`` over all ranks, on every rank.

    x: a number or an array of any numeric dtype, the same shape on every rank. Returns a Python number for a
    scalar, an array of x's shape and dtype otherwise (bool sums to int64).
    """
    comm = COMM_WORLD if comm is None else comm
    total = _allreduce_sum(x, comm, "all_sum")
    return total.item() if total.ndim == 0 else total


def all_mean(x: Any, comm: MPI.Comm | None = None) -> Any:
    """Mean of ``x`` over all ranks, on every rank: float64 for integer or bool input, x's float dtype otherwise."""
    comm = COMM_WORLD if comm is None else comm
    arr = np.asarray(x)
    if arr.dtype.kind in "biu":
        arr = arr.astype(np.float64)
    total = _allreduce_sum(arr, comm, "all_mean")
    mean = (total / comm.Get_size()).astype(total.dtype, copy=False)
    return mean.item() if mean.ndim == 0 else mean


def local_rank(comm: MPI.Comm | None = None) -> int:
    """Rank of this process among the ranks on the same host (for pinning one GPU per process).

    Read from the launcher's environment when it sets one; otherwise computed with a shared-memory
    communicator split, which is a collective: then every rank must call this.
    """
    comm = COMM_WORLD if comm is None else comm
    if comm is COMM_WORLD:
        for name in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "SLURM_LOCALID"):
            if name in os.environ:
                return int(os.environ[name])
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node_comm.Get_rank()
    finally:
        node_comm.Free()


def abort(message: str, code: int = 1) -> None:
    """Print ``message`` to stderr and end the whole MPI job (every rank) with exit status ``code``.

    For a rank that cannot go on while the others are, or soon will be, waiting for it in a collective.
    """
    sys.stdout.flush()
    sys.stderr.write(message.rstrip("\n") + "\n")
    sys.stderr.flush()
    _wait_for_reader(sys.stderr)
    COMM_WORLD.Abort(code)


def _wait_for_reader(stream: Any, timeout_s: float = 2.0) -> None:
    """Wait (at most ``timeout_s``) until the launcher has read what this rank wrote to ``stream``'s pipe.

    Under mpiexec a rank's stderr is a pipe that the launcher drains; MPI_Abort makes it kill the job, and bytes
    still in the pipe are lost, which happened to about 1 traceback in 6. Not a pipe (a file, a terminal): no wait.
    """
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        deadline = time.monotonic() + timeout_s
        unread = array.array("i", [0])
        while time.monotonic() < deadline:
            fcntl.ioctl(fd, termios.FIONREAD, unread)
            if unread[0] == 0:
                return
            time.sleep(0.005)
    except (OSError, ValueError, AttributeError):
        return


def install_abort_on_exception() -> None:
    """Make an uncaught exception on any rank print its traceback and abort the whole MPI job.

    Without this, the other ranks wait forever in their next collective for the rank that died.
    """
    if COMM_WORLD.Get_size() == 1:
        return

    def abort_hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        # The exception on the first line and the traceback in the same single write, so that what reaches the
        # user names the error even if mpiexec forwards only part of it.
        summary = "".join(traceback.format_exception_only(exc_type, exc)).strip()
        abort(f"mpi_util: uncaught exception on rank {COMM_WORLD.Get_rank()}, aborting all ranks: {summary}\n"
              + "".join(traceback.format_exception(exc_type, exc, tb)))

    sys.excepthook = abort_hook
