"""SharedBudget under concurrent takes: each rank saves what every take asked and got, per round, to argv[1].

Round 0: every rank takes 1 unit at a time from 100,000 as fast as it can (a lost atomic update would hand out
more than the total). Rounds 1-3: pieces of rank-dependent sizes with simulated work between takes, refilled by
rank 0 between two collectives, as train.py does.
"""

import sys
import time
from pathlib import Path

import numpy as np

import mpi_util

out_dir = Path(sys.argv[1])
rank = mpi_util.rank
rng = np.random.default_rng(rank)
totals = [100_000, 1000, 1, 0]
budgets = {total: mpi_util.SharedBudget(total) for total in sorted(set(totals))}
results = {}
for round_index, total in enumerate(totals):
    budget = budgets[total]
    asked, got = [], []
    while True:
        want = 1 if round_index == 0 else int(rng.integers(1, 40))
        asked.append(want)
        got.append(budget.take(want))
        if got[-1] < want:
            break
        if round_index > 0:
            time.sleep(rng.uniform(0, 0.002) * (rank + 1))  # work, slower on higher ranks
    asked.append(5)
    got.append(budget.take(5))  # once spent, nothing more
    results[f"asked_{round_index}"] = np.array(asked)
    results[f"got_{round_index}"] = np.array(got)
    mpi_util.rank0_accum_batches({"done": np.zeros((1, 1))})
    if rank == 0:
        budget.refill()
    mpi_util.rank0_bcast_wts([np.zeros(1)])
results["after_refill"] = np.array([budgets[1000].take(1000)])
np.savez(out_dir / f"budget_{rank}.npz", **results)
