"""What rank 0 shows and keeps each iteration: a console line, a progress bar, progress.csv, TensorBoard."""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

# Columns of the console line: (key in the logged row, header, width, format spec). The CSV and TensorBoard
# get every key.
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


def _cell(value: Any, width: int, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return format(value, spec).rjust(width)


class RunLogger:
    """Writes RUN_DIR/progress.csv (every logged value, one row per iteration), TensorBoard event files in
    RUN_DIR/tb, and prints a compact line per iteration; with ``progress_bar`` also a bar with ETA on the
    step budget. Used on rank 0 only."""

    def __init__(self, run_dir: Path, total_steps: int, progress_bar: bool, resume: bool,
                 out: TextIO = sys.stdout) -> None:
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.progress_bar = progress_bar
        self.out = out
        self._csv_path = run_dir / "progress.csv"
        self._columns: list[str] | None = None
        if resume and self._csv_path.exists():
            with open(self._csv_path, newline="") as f:
                header = next(csv.reader(f), None)
            self._columns = header
        elif self._csv_path.exists():
            self._csv_path.unlink()
        self._lines_printed = 0
        self._started = time.monotonic()
        self._start_steps: int | None = None
        import tensorflow as tf

        self._tb = tf.summary.create_file_writer(str(run_dir / "tb"))

    def truncate_after(self, iteration: int) -> None:
        """Drop CSV rows after ``iteration`` (a resumed run redoes them from its checkpoint)."""
        if not self._csv_path.exists():
            return
        with open(self._csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        kept = [row for row in rows if int(row["iteration"]) <= iteration]
        if len(kept) != len(rows) and self._columns:
            with open(self._csv_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self._columns)
                writer.writeheader()
                writer.writerows(kept)

    def log(self, row: dict[str, Any]) -> None:
        """Record one iteration's values (numbers; NaN where there is no value, e.g. no episode finished)."""
        if self._columns is None:
            self._columns = list(row)
            with open(self._csv_path, "w", newline="") as f:
                csv.writer(f).writerow(self._columns)
        with open(self._csv_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self._columns, extrasaction="ignore").writerow(row)
        import tensorflow as tf

        with self._tb.as_default(step=int(row["total_steps"])):
            for key, value in row.items():
                if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
                    tf.summary.scalar(key, value)
        self._tb.flush()
        self._print(row)

    def _print(self, row: dict[str, Any]) -> None:
        if self.progress_bar:
            self.out.write("\r\033[K")  # clear the bar; it is redrawn below the new line
        if self._lines_printed % 20 == 0:
            self.out.write(" ".join(name.rjust(width) for _, name, width, _ in _CONSOLE) + "\n")
        self.out.write(" ".join(_cell(row.get(key), width, spec) for key, _, width, spec in _CONSOLE) + "\n")
        self._lines_printed += 1
        if self.progress_bar:
            self.out.write(self._bar(int(row["total_steps"])))
        self.out.flush()

    def _bar(self, steps: int) -> str:
        if self._start_steps is None:
            self._start_steps = steps
            self._started = time.monotonic()
        fraction = min(1.0, steps / max(1, self.total_steps))
        elapsed = time.monotonic() - self._started
        rate = (steps - self._start_steps) / elapsed if elapsed > 0 else 0.0
        eta = (self.total_steps - steps) / rate if rate > 0 else float("nan")
        filled = int(30 * fraction)
        eta_text = "?" if math.isnan(eta) else time.strftime("%H:%M:%S", time.gmtime(max(0.0, eta)))
        return f"[{'#' * filled}{'.' * (30 - filled)}] {100 * fraction:5.1f}% {steps}/{self.total_steps} ETA {eta_text}"

    def close(self) -> None:
        if self.progress_bar:
            self.out.write("\n")
            self.out.flush()
        self._tb.close()
