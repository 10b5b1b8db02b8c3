"""What rank 0 shows and keeps each iteration: a console line, a progress bar, progress.csv, TensorBoard."""

from __future__ import annotations

import csv
import io
import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tqdm import tqdm

from trainer.checkpoint import write_atomic

# Columns of the console line: (key in the logged row, header, width, format spec). The CSV and TensorBoard
# get every key. The evaluation's column follows ret_max in runs that evaluate (--eval_every).
_CONSOLE = [
    ("iteration", "iter", 5, "d"),
    ("total_steps", "steps", 9, "d"),
    ("total_episodes", "eps", 6, "d"),
    ("ep_return_mean", "ret_mean", 9, ".1f"),
    ("ep_return_min", "ret_min", 8, ".1f"),
    ("ep_return_max", "ret_max", 8, ".1f"),
    ("steps_per_s", "steps/s", 8, ".0f"),
    ("kl", "kl", 7, ".4f"),
    ("entropy", "entropy", 7, ".3f"),
    ("pi_loss", "pi_loss", 8, ".4f"),
    ("v_loss", "v_loss", 7, ".4f"),
    ("t_rollout", "t_roll", 6, ".2f"),
    ("t_gather", "t_gath", 6, ".3f"),
    ("t_update", "t_upd", 6, ".2f"),
    ("t_bcast", "t_bcast", 7, ".3f"),
]
_EVAL_COLUMN = ("eval_return_mean", "eval", 8, ".1f")


def _cell(value: Any, width: int, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return format(value, spec).rjust(width)


def _whole_row_up_to(line: str, n_columns: int, iteration: int) -> bool:
    """Whether ``line`` of progress.csv is a complete row (its newline, every column) of an iteration <= ``iteration``:
    rows are appended, so a write that a kill or a full disk cut short leaves a partial last line."""
    if not line.endswith("\n"):
        return False
    fields = next(csv.reader([line]), [])
    try:
        return len(fields) == n_columns and int(fields[0]) <= iteration
    except ValueError:
        return False


class RunLogger:
    """Writes RUN_DIR/progress.csv (every logged value, one row per iteration), TensorBoard event files in
    RUN_DIR/tb, and prints a compact line per iteration (with ``evaluates``, the evaluation's mean return too);
    with ``progress_bar`` also a bar with ETA on the step budget; the run's settings go to TensorBoard's HParams
    dashboard. Used on rank 0 only."""

    def __init__(self, run_dir: Path, total_steps: int, progress_bar: bool, resume: bool,
                 hparams: dict[str, Any], tracker: Any = None, out: TextIO = sys.stdout,
                 evaluates: bool = False) -> None:
        self.run_dir = run_dir
        after_max = [key for key, *_ in _CONSOLE].index("ep_return_max") + 1
        self._console = _CONSOLE[:after_max] + [_EVAL_COLUMN] * evaluates + _CONSOLE[after_max:]
        self.total_steps = total_steps
        self.progress_bar = progress_bar
        self.out = out
        self._csv_path = run_dir / "progress.csv"
        self._columns: list[str] | None = None
        if resume and self._csv_path.exists():
            with open(self._csv_path, newline="") as f:
                first_line = f.readline()
            # A header without its newline was cut short: the file is begun again (it held no row).
            self._columns = next(csv.reader([first_line])) if first_line.endswith("\n") else None
        if self._columns is None:
            self._csv_path.unlink(missing_ok=True)
        self._lines_printed = 0
        self._bar: tqdm | None = None  # drawn from the first logged iteration on, below the lines
        self._tb = TensorBoardWriter(run_dir / "tb")
        self._tracker = tracker  # a Weights & Biases run (--track), or None
        self._tb.write_hparams(run_dir.name, hparams, ["ep_return_mean", "eval_return_mean", "steps_per_s"])

    def truncate_after(self, iteration: int) -> None:
        """Drop CSV rows after ``iteration`` (a resumed run redoes them from its checkpoint), and any row a crash or a
        full disk cut short. The file is replaced whole (trainer.checkpoint.write_atomic), never rewritten in place: a
        kill or a full disk part-way leaves it as it was."""
        if not self._csv_path.exists() or not self._columns:
            return
        text = self._csv_path.read_text()
        lines = text.splitlines(keepends=True)
        kept = [lines[0]] + [line for line in lines[1:] if _whole_row_up_to(line, len(self._columns), iteration)]
        if len(kept) != len(lines) or not text.endswith("\n"):
            write_atomic(self._csv_path, "".join(kept).encode())

    def log(self, row: dict[str, Any]) -> None:
        """Record one iteration's values (numbers; NaN where there is no value, e.g. no episode finished)."""
        line = io.StringIO()
        if self._columns is None:  # the header and the first row appear together, or not at all
            self._columns = list(row)
            csv.writer(line).writerow(self._columns)
            csv.DictWriter(line, fieldnames=self._columns, extrasaction="ignore").writerow(row)
            write_atomic(self._csv_path, line.getvalue().encode())
        else:  # appended: a write cut short leaves a partial last line, which the next resume drops
            csv.DictWriter(line, fieldnames=self._columns, extrasaction="ignore").writerow(row)
            with open(self._csv_path, "a", newline="") as f:
                f.write(line.getvalue())
        scalars = {key: value for key, value in row.items()
                   if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))}
        self._tb.write_scalars(int(row["total_steps"]), scalars)
        if self._tracker is not None:
            self._tracker.log(scalars, step=int(row["total_steps"]))
        self._print(row)

    def _print(self, row: dict[str, Any]) -> None:
        lines = []
        if self._lines_printed % 20 == 0:
            lines.append(" ".join(name.rjust(width) for _, name, width, _ in self._console))
        lines.append(" ".join(_cell(row.get(key), width, spec) for key, _, width, spec in self._console))
        self._lines_printed += 1
        steps = int(row["total_steps"])
        if not self.progress_bar:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()
            return
        if self._bar is None:
            # The rate and ETA count from the first logged iteration (a resumed run starts part way).
            self._bar = tqdm(total=self.total_steps, initial=steps, file=self.out, unit="step", unit_scale=True,
                             dynamic_ncols=True, smoothing=0.1)
        for line in lines:
            self._bar.write(line, file=self.out)  # above the bar, which is redrawn below
        self._bar.update(min(steps, self.total_steps) - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._tb.close()
        if self._tracker is not None:
            self._tracker.finish()


class TensorBoardWriter:
    """Scalars to a TensorBoard event file in ``log_dir``, written and flushed in the calling thread.

    Not tf.summary: its 20-odd eager ops and its flush through TensorFlow's writer thread cost rank 0 time every
    iteration, and more with more ranks than cores, where every hand-off to another thread waits for a time slice
    among the busy workers. One event of plain ``simple_value`` scalars per call is what
    TensorBoard's scalar dashboard reads, and needs no TensorFlow.
    """

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        # TensorBoard reads every file whose name holds "tfevents"; time, host and pid keep a resumed run's new
        # file apart from the old ones.
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self._records = RecordWriter(open(log_dir / name, "wb"))
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write_hparams(self, trial: str, hparams: dict[str, Any], metrics: list[str]) -> None:
        """The run's settings for TensorBoard's HParams dashboard: ``hparams`` ({name: value}; tuples shown as
        "64,64", None as "none") as trial ``trial``, with ``metrics`` (scalar tags) its columns."""
        from tensorboard.plugins.hparams import summary_v2

        shown = {name: value if isinstance(value, bool | int | float | str) else
                 "none" if value is None else ",".join(map(str, value)) if isinstance(value, tuple | list) else
                 str(value) for name, value in hparams.items()}
        config = summary_v2.hparams_config_pb([summary_v2.HParam(name) for name in shown],
                                              [summary_v2.Metric(tag) for tag in metrics])
        self._write(Event(wall_time=time.time(), summary=config))
        self._write(Event(wall_time=time.time(), summary=summary_v2.hparams_pb(shown, trial_id=trial)))

    def write_scalars(self, step: int, values: dict[str, float]) -> None:
        """One event at ``step`` holding every ``{tag: value}``, flushed to the file."""
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()])
        self._write(Event(wall_time=time.time(), step=step, summary=summary))

    def _write(self, event: Event) -> None:
        self._records.write(event.SerializeToString())
        self._records.flush()

    def close(self) -> None:
        self._records.close()
