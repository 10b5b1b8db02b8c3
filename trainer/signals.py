"""Stop signals that come before the training loop's handlers are in place (a scheduler's cancel at start-up).

They are noted here and acted on by trainer.stop.StopRequest, instead of Python's defaults: SIGTERM and SIGHUP would
end the process without a checkpoint, SIGINT raise KeyboardInterrupt wherever it lands. SIGUSR1 and SIGUSR2 stand for
SIGINT and SIGTERM (mpi_util.launch.STAND_IN_SIGNALS) until mpi_fork installs their translation. Imports nothing but
the standard library: train.py installs these handlers before it imports numpy, TensorFlow or MPI.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_EARLY_MEANING = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGHUP,
                  signal.SIGUSR1: signal.SIGINT, signal.SIGUSR2: signal.SIGTERM}
early_stop_signals: list[int] = []
"""The stop signals received before StopRequest's handlers were in place, as what they stand for, in order."""


def catch_early_stop_signals() -> None:
    """Note every stop signal from now on in early_stop_signals, until StopRequest takes over."""
    for signum in _EARLY_MEANING:
        signal.signal(signum, lambda signum, _frame: early_stop_signals.append(_EARLY_MEANING[signum]))


def restore_default_signal_handlers() -> None:
    """Python's own handling of the stop signals, for --play: Ctrl-C ends it at once."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
