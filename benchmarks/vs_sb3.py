"""train.py --nprocs 2 against stable-baselines3 PPO doing the same work per iteration, side by side (issue 4's
target: train.py at 4x SB3's steps/s; benchmarks/README.md, section vs_sb3.py). It is peers.py with two systems,
train.py and peer_sb3_ppo.py, writing runs.csv, results.md and vs_sb3.png to ``--out``; every other option is
peers.py's (``--nprocs``, ``--repeats``, ``--total_steps``, ...).
"""

from __future__ import annotations

import sys

import peers
from harness import RESULTS

if __name__ == "__main__":
    # The defaults go first so that the user's own --out or --systems, given later, win.
    raise SystemExit(peers.main(["--systems", "ours", "sb3", "--out", str(RESULTS / "vs_sb3"), *sys.argv[1:]],
                                plot_name="vs_sb3.png"))
