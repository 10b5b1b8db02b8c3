"""Back-to-back exchange rounds (collective.meet_and_exchange), each checked on every rank: a rank that runs ahead
into the next round must not overwrite values another rank has not read yet. Writes {"wrong": count, "on_host": bool} to
argv[1]/exchange_{rank}.json."""

import json
import sys
from pathlib import Path

import numpy as np

import mpi_util
from mpi_util.collective import meet, meet_and_exchange
from mpi_util.host import transport
from mpi_util.process import COMM_WORLD

out_dir, rounds = Path(sys.argv[1]), int(sys.argv[2])
comm, rank, size = COMM_WORLD, mpi_util.rank, mpi_util.nworkers
meet(comm, "start")  # the first collective sets up the doorbell
wrong = 0
for k in range(rounds):
    got = meet_and_exchange(comm, [k, rank, 7 * k + rank], "exchange_stress")
    wrong += int(not np.array_equal(got, [[k, r, 7 * k + r] for r in range(size)]))
(out_dir / f"exchange_{rank}.json").write_text(json.dumps({"wrong": wrong, "on_host": transport(comm) is not None}))
