"""Back-to-back exchange rounds (comm.exchange_int64), each checked on every rank: a rank that runs ahead into the
next round must not overwrite values another rank has not read yet. Writes {"wrong": count, "on_host": bool} to
argv[1]/exchange_{rank}.json."""

import json
import sys
from pathlib import Path

import numpy as np

import mpi_util
from mpi_util.comm import exchange_int64, host_doorbell

out_dir, rounds = Path(sys.argv[1]), int(sys.argv[2])
comm, rank, size = mpi_util.COMM_WORLD, mpi_util.rank, mpi_util.nworkers
mpi_util.meet(comm, "start")  # the first collective sets up the doorbell
wrong = 0
for k in range(rounds):
    got = exchange_int64(comm, [k, rank, 7 * k + rank], "exchange_stress")
    wrong += int(not np.array_equal(got, [[k, r, 7 * k + r] for r in range(size)]))
(out_dir / f"exchange_{rank}.json").write_text(json.dumps({"wrong": wrong, "on_host": host_doorbell(comm) is not None}))
