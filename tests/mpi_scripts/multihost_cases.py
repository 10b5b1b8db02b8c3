"""Ranks on several hosts (or made to look so): case argv[2], results into directory argv[1].

data: two rounds of rank0_accum_batches (GATHER_ROWS float32 rows of 64 per rank, 2 MiB, drawn from the rank's seed)
  and rank0_bcast_wts (4 MiB of rank 0's weights); every rank checks what it got against the answer computed
  sequentially and writes data_{rank}.json: {"exact", "host", "node_size", "host_transport"}.
stall: a 2 s stall limit on every rank; the last rank hangs before the third meet (rank 0 enters it late, after the
  others). The job must end with an error that names the last rank and its host.
raise: the last rank raises after one gather; the job must end with its traceback.
far_hang: "auto" with a 2 s no-progress floor and a 60 s start-up allowance; the last rank calls heartbeat() every
  0.1 s for 3 s, then hangs before the first meet. Rank 0, which sees its progress only through its messages, must
  name it about 2 s after they stop, long before the allowance.
far_ends: the last rank's script ends after one gather; the others gather again, and each writes the error it got
  and how long it waited to far_ends_{rank}.json: {"error", "waited_s"}.
far_slow: a fixed 3 s limit; before each of 3 meets the last rank works 7 s, calling heartbeat() every 0.1 s. Nobody
  may blame it: rank 0 sees its messages, its host-mate its board; the others leave the judgement to rank 0.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import mpi_util
from mpi_util.collective import meet
from mpi_util.host import transport
from mpi_util.process import COMM_WORLD

GATHER_ROWS = 8192  # x 64 float32 = 2 MiB per rank
BCAST_FLOATS = 1 << 20  # 4 MiB

out_dir, case = Path(sys.argv[1]), sys.argv[2]
rank, size, last = mpi_util.rank, mpi_util.nworkers, mpi_util.nworkers - 1
mpi_util.init()


def rows_of(r: int, round_: int) -> np.ndarray:
    return np.random.default_rng([r, round_]).standard_normal((GATHER_ROWS, 64)).astype(np.float32)


if case == "data":
    exact = True
    for round_ in range(2):
        gathered = mpi_util.rank0_accum_batches({"obs": rows_of(rank, round_), "rank": np.full(GATHER_ROWS, rank)})
        if rank == 0:
            exact &= np.array_equal(gathered["obs"], np.concatenate([rows_of(r, round_) for r in range(size)]))
            exact &= np.array_equal(gathered["rank"], np.repeat(np.arange(size), GATHER_ROWS))
        expected = np.random.default_rng([99, round_]).standard_normal(BCAST_FLOATS).astype(np.float32)
        weights = [expected.copy() if rank == 0 else np.zeros(BCAST_FLOATS, np.float32), np.array([rank], np.int64)]
        mpi_util.rank0_bcast_wts(weights)
        exact &= np.array_equal(weights[0], expected) and int(weights[1][0]) == 0
    node = COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    record = {"exact": bool(exact), "host": MPI.Get_processor_name(), "node_size": node.Get_size(),
              "host_transport": transport(COMM_WORLD) is not None}
    (out_dir / f"data_{rank}.json").write_text(json.dumps(record))
elif case == "stall":
    mpi_util.set_stall_timeout(2.0)
    for call in range(3):
        if call == 2 and rank == last:
            time.sleep(3600)
        if call == 2 and rank == 0:
            time.sleep(0.5)  # the others wait first: they must leave the report to rank 0
        meet(COMM_WORLD, "step")
elif case in ("far_hang", "far_slow"):
    if case == "far_hang":
        mpi_util.stall.AUTO_FLOOR_S = 2.0
        mpi_util.set_stall_timeout("auto", startup_s=60.0)
    else:
        mpi_util.set_stall_timeout(3.0)
    for _ in range(1 if case == "far_hang" else 3):
        if rank == last:
            for _ in range(30 if case == "far_hang" else 70):
                time.sleep(0.1)  # a slow env step
                mpi_util.heartbeat()
            if case == "far_hang":
                time.sleep(3600)  # hung in the next step
        meet(COMM_WORLD, "step")
    (out_dir / f"far_slow_{rank}.json").write_text(json.dumps({"calls": 3}))
elif case == "far_ends":
    mpi_util.rank0_accum_batches({"x": np.zeros(3)})
    if rank == last:
        sys.exit(0)
    started = time.monotonic()
    try:
        mpi_util.rank0_accum_batches({"x": np.zeros(3)})
        error = ""
    except mpi_util.CollectiveStallError as raised:
        error = f"{type(raised).__name__}: {raised}"
    waited_s = time.monotonic() - started
    (out_dir / f"far_ends_{rank}.json").write_text(json.dumps({"error": error, "waited_s": waited_s}))
elif case == "raise":
    mpi_util.rank0_accum_batches({"x": np.zeros(3)})
    if rank == last:
        raise ValueError(f"boom on {MPI.Get_processor_name()}")
    meet(COMM_WORLD, "after")
else:
    raise SystemExit(f"unknown case {case}")
