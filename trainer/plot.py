"""Learning curves from run directories: ``python -m trainer.plot RUN_DIR [RUN_DIR ...] [-o curves.png]``.

Runs with the same env and algorithm are drawn as one curve: the mean over runs, with the min-max spread
shaded, against environment steps.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def read_progress(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(total_steps (I,), ep_return_mean (I,)) of a run's progress.csv; iterations with no finished episode
    are dropped."""
    steps, returns = [], []
    with open(run_dir / "progress.csv", newline="") as f:
        for row in csv.DictReader(f):
            value = float(row["ep_return_mean"]) if row["ep_return_mean"] not in ("", "nan") else np.nan
            if np.isfinite(value):
                steps.append(int(row["total_steps"]))
                returns.append(value)
    return np.asarray(steps), np.asarray(returns)


def plot_runs(run_dirs: list[Path], out_path: Path) -> Path:
    """Draw the runs' curves into ``out_path`` (PNG) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[Path]] = defaultdict(list)
    for run_dir in run_dirs:
        config = json.loads((run_dir / "config.json").read_text())
        groups[f"{config['env_id']} {config['algo'].upper()}"].append(run_dir)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, dirs in sorted(groups.items()):
        curves = [read_progress(d) for d in dirs]
        curves = [(s, r) for s, r in curves if len(s)]
        if not curves:
            continue
        grid = np.linspace(0, min(s[-1] for s, _ in curves), 200)
        values = np.array([np.interp(grid, s, r) for s, r in curves])
        ax.plot(grid, values.mean(axis=0), label=f"{label} ({len(curves)} run{'s' if len(curves) > 1 else ''})")
        if len(curves) > 1:
            ax.fill_between(grid, values.min(axis=0), values.max(axis=0), alpha=0.25)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean episode return")
    ax.grid(alpha=0.3)
    if ax.lines:  # no finished episode yet: an empty plot, without matplotlib's warning about an empty legend
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (each with progress.csv)")
    parser.add_argument("-o", "--out", type=Path, default=Path("learning_curves.png"),
                        help="PNG to write (default: %(default)s)")
    args = parser.parse_args()
    for run_dir in args.run_dirs:
        if not (run_dir / "progress.csv").is_file():
            parser.error(f"{run_dir} is not a run directory (no progress.csv)")
    print(plot_runs(args.run_dirs, args.out))


if __name__ == "__main__":
    main()
