"""Waiting for the other ranks of one host without waking up every millisecond: a shared-memory doorbell.

Timed polling (``host.poll_requests``) wakes a waiting rank every millisecond to ask MPI whether the
collective is done. With more ranks than cores, the ranks that wait for rank 0's update wake thousands of times a
second and take time slices from it. Here a waiting rank sleeps in the kernel (a Linux futex on a word of an MPI
shared-memory window) until another rank rings: every rank, having posted its part of a collective over
``COMM_WORLD``, writes how many such collectives it has entered into its own slot of the window, changes the
doorbell word and wakes the sleepers. A sleeper that wakes reads the slots: while some rank has not arrived it
sleeps again; once all have, it polls MPI until the collective completes (a few microseconds to a millisecond,
since a collective's later rounds need every rank calling into MPI).

Used only where it is sound: Linux on x86-64 or aarch64 (the futex system call numbers), every rank of
``COMM_WORLD`` on one host (ranks on other hosts cannot ring), and not disabled with ``MPI_UTIL_WAIT=poll``.
Elsewhere collectives fall back to timed polling.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

import numpy as np
from mpi4py import MPI

from .shm import shared_int64

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
# Not the _PRIVATE variants: the word is shared between processes.
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WAKE_ALL = 2**31 - 1
# int64 values each rank can post in one exchange through the window (HostTransport.exchange in host.py, on one host).
EXCHANGE_WIDTH = 5


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def doorbell_supported() -> bool:
    """Whether this platform has the futex calls the doorbell needs (and the user has not asked for polling)."""
    return sys.platform == "linux" and _SYS_FUTEX is not None and os.environ.get("MPI_UTIL_WAIT", "") != "poll"


class Doorbell:
    """Arrival slots and a wake-up word for the ranks of ``comm`` (all on this host), in a shared MPI window.

    Collective over ``comm`` to create. Window layout (int64): [bell, arrivals of rank 0, arrivals of rank 1, ...,
    then two sets of exchange slots (2, size, EXCHANGE_WIDTH)]; the futex waits on the low 32 bits of ``bell``. Each
    slot has one writer (its rank), so plain stores suffice. The bell is bumped with an MPI atomic fetch-and-add, so
    every ring changes it: with a plain load and store, a ringer preempted between the two could store the value
    another ring had already stored, and a sleeper that had read that value just before would sleep through the
    ring (until ``max_sleep_s``). ``timed_out_sleeps`` counts the sleeps that ended by timeout instead of a ring.
    """

    def __init__(self, comm: MPI.Comm, max_sleep_s: float = 0.25) -> None:
        self.size = comm.Get_size()
        self.index = comm.Get_rank()
        self.max_sleep_s = max_sleep_s
        self.window, self.words = shared_int64(comm, (1 + self.size + 2 * self.size * EXCHANGE_WIDTH,))
        self.arrivals = 0  # how many collectives this rank has entered through the doorbell
        self.exchange_slots = self.words[1 + self.size :].reshape(2, self.size, EXCHANGE_WIDTH)
        self.exchanges = 0  # how many exchanges this rank has made through exchange_slots
        self.timed_out_sleeps = 0
        self._one = np.ones(1, dtype=np.int64)
        self._bell_before = np.zeros(1, dtype=np.int64)
        self._bell_address = ctypes.c_void_p(self.words.ctypes.data)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long

    def ring(self) -> int:
        """Announce that this rank has entered its next collective (its request is posted); returns its number."""
        self.arrivals += 1
        self.window.Sync()  # what this rank wrote before ringing (exchange values, shared data) is seen first
        self.words[1 + self.index] = self.arrivals
        self.window.Sync()
        self.window.Fetch_and_op(self._one, self._bell_before, 0, 0, MPI.SUM)  # the bell is word 0 of rank 0's part
        self.window.Flush(0)
        self._libc.syscall(_SYS_FUTEX, self._bell_address, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
        return self.arrivals

    def all_arrived(self, arrival: int, rank: int | None = None) -> bool:
        """Whether every rank (or just ``rank``) has entered collective number ``arrival``."""
        self.window.Sync()
        if rank is not None:
            return bool(self.words[1 + rank] >= arrival)
        return bool(self.words[1 : 1 + self.size].min() >= arrival)

    def sleep_until_rung(self, arrival: int, timeout_s: float, rank: int | None = None) -> None:
        """Sleep until some rank rings (or ``min(timeout_s, max_sleep_s)`` passes), unless all (or ``rank``) have
        arrived."""
        self.window.Sync()
        bell = int(self.words[0]) & 0xFFFFFFFF
        if self.all_arrived(arrival, rank):
            return
        seconds = max(0.0, min(timeout_s, self.max_sleep_s))
        timeout = _Timespec(int(seconds), int((seconds % 1.0) * 1e9))
        expected = ctypes.c_int32(bell if bell < 2**31 else bell - 2**32)  # the word as the kernel compares it
        if self._libc.syscall(_SYS_FUTEX, self._bell_address, _FUTEX_WAIT, expected, ctypes.byref(timeout), None, 0):
            self.timed_out_sleeps += int(ctypes.get_errno() == errno.ETIMEDOUT)
