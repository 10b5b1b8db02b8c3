"""train.py from Python: trainer.run takes train.py's options as keywords and returns the run directory.

    python examples/train_from_python.py runs                   # launches 2 ranks itself, as train.py --nprocs 2 does
    mpiexec -n 2 python examples/train_from_python.py runs      # or runs in each rank of a job started by mpiexec
"""

import csv
import sys

import trainer

run_dir = trainer.run("CartPole-v1", nprocs=2, total_steps=1024, batch_size=512, minibatch_size=512,
                      logdir=sys.argv[1])
with open(run_dir / "progress.csv", newline="") as f:
    rows = list(csv.DictReader(f))
print(f"run directory {run_dir}: {len(rows)} iterations, last mean return {float(rows[-1]['ep_return_mean']):.1f}")
