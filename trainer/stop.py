"""Stop requests (Ctrl-C, SIGTERM, SIGHUP, a scheduler's cancel, the launching process's end): every rank finishes
the iteration, rank 0 writes a checkpoint, and the job ends cleanly."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import mpi_util
from trainer.resume import resume_note
from trainer.signals import STOP_SIGNALS, early_stop_signals


class StopRequest:
    """A stop request (Ctrl-C, SIGTERM, SIGHUP): finish the iteration, checkpoint, exit cleanly.

    Rank 0's request decides, through the broadcast counters, so every rank stops after the same iteration, and rank 0
    says so at once, whatever the phase the signal lands in. From the request on, every rank waits at most ``grace_s``
    (--stop_grace) for the others (mpi_util.stall_deadline): a rank that hangs ends the job then, named, instead of
    holding it for the whole stall timeout.

    One request per job, however many copies of the signal arrive: a scheduler's cancel reaches each rank directly,
    through mpiexec and through mpi_fork's launching process. Only a Ctrl-C that comes after rank 0 announced the
    stop, and more than REPEAT_S after the first request, stops at once (rank 0 ends the job, without a checkpoint).
    """

    REPEAT_S = 1.0  # copies of one request arrive within milliseconds; a person's second Ctrl-C comes later

    def __init__(self, grace_s: float, run_dir: Path) -> None:
        self.grace_s, self.run_dir = grace_s, run_dir
        self.signum: int | None = None
        self.requested_at = 0.0
        self.announced = False
        self._requested = threading.Event()
        # The notice comes from a thread of its own: the handler may not print (the signal may land while this rank
        # writes to the same stream, and the write would fail with a reentrant-call RuntimeError), and the loop may
        # be in a long rollout or update.
        self._notifier: threading.Thread | None = None
        if mpi_util.rank == 0:
            self._notifier = threading.Thread(target=self._announce, name="train-stop-notice", daemon=True)
            self._notifier.start()
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._request)
        for signum in early_stop_signals:  # what arrived before these handlers were in place
            self._request(signum, None)

    def _request(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum, self.requested_at = signum, time.monotonic()
            mpi_util.stall_deadline(self.grace_s, f"{self.grace_s:g} s after the stop request (signal {signum})")
            self._requested.set()
        elif signum == signal.SIGINT and self.announced and time.monotonic() - self.requested_at > self.REPEAT_S:
            self._stop_now()

    def _announce(self) -> None:
        self._requested.wait()
        ended = mpi_util.supervise.launcher_ended
        cause = "the launching process has ended" if ended else f"received signal {self.signum}"
        # One write, so that the line stays whole beside the loop's own output.
        sys.stdout.write(f"{cause}: stopping after this iteration with a checkpoint (a second Ctrl-C stops at once, "
                         "without one)\n")
        sys.stdout.flush()
        self.announced = True

    def _stop_now(self) -> None:
        message = ("train.py: stopped at once by a second Ctrl-C, without a final checkpoint; "
                   + resume_note(self.run_dir))
        try:
            mpi_util.abort(message)
        except RuntimeError:  # the signal landed in a write to stdout or stderr: say it without them
            os.write(2, (message + "\n").encode())
            os._exit(1)

    def take(self) -> bool:
        """Whether a stop was requested; on rank 0, once its notice is out (it comes before the stop it asks for)."""
        if self.signum is None:
            return False
        if self._notifier is not None:
            self._notifier.join(timeout=10)
        return True

    @staticmethod
    def ignore_from_now_on() -> None:
        """Training is over and checkpointed: a late stop signal must not kill a rank while MPI shuts down (Python
        restores the default handlers at exit, before MPI_Finalize), which would fail a clean job."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
