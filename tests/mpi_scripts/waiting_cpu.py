"""Rank 0 works (sleeps) argv[1] seconds before each collective; every rank writes the CPU time it burned waiting
to argv[2]/cpu_RANK.json, and whether its collectives went through the doorbell (mpi_util/wakeup.py).

With argv[3] == "late_data", rank 0 instead sleeps between the exchange in which all ranks meet and the data
round of rank0_accum_batches and rank0_bcast_wts, as a rank descheduled on a loaded machine is late there."""

import json
import sys
import time
from pathlib import Path

import numpy as np

import mpi_util
from mpi_util import bcast, collective, gather
from mpi_util.host import transport
from mpi_util.process import COMM_WORLD

busy_s = float(sys.argv[1])
late_data = sys.argv[3:] == ["late_data"]
rank = mpi_util.rank
if late_data and rank == 0:

    def exchange_then_stall(*args, **kwargs):
        exchanged = collective.meet_and_exchange(*args, **kwargs)
        time.sleep(busy_s)
        return exchanged

    gather.meet_and_exchange = bcast.meet_and_exchange = exchange_then_stall
# The doorbell is set up once the ranks have met in a first collective over COMM_WORLD.
collective.meet(COMM_WORLD, "warm-up")
cpu = {"doorbell": transport(COMM_WORLD) is not None}
calls = ["rank0_accum_batches", "rank0_bcast_wts"] + ([] if late_data else ["meet"])
for name in calls:
    if rank == 0 and not late_data:
        time.sleep(busy_s)  # stands in for rank 0's update
    wall, started = time.perf_counter(), time.process_time()
    if name == "rank0_accum_batches":
        mpi_util.rank0_accum_batches({"x": np.zeros((1000, 17), np.float32)})
    elif name == "rank0_bcast_wts":
        mpi_util.rank0_bcast_wts([np.zeros(40_000, np.float32)])
    else:
        collective.meet(COMM_WORLD, "after rank 0's work")
    cpu[name] = {"cpu_s": time.process_time() - started, "wall_s": time.perf_counter() - wall}
(Path(sys.argv[2]) / f"cpu_{rank}.json").write_text(json.dumps(cpu))
