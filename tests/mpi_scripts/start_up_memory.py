"""Each rank writes the /dev/shm files MPI mapped for it at start-up to shm_{rank}.json in argv[1], calls
mpi_util.init(), and meets the others; then the last rank ends the job as argv[2] says: "killed" (it sends itself
SIGKILL), "raises" (an uncaught exception: mpi_util ends the job through MPI_Abort) or "raises without init" (the
same with mpi_util.install_abort_on_exception() instead of init()). The others wait in a barrier until the launcher
ends them."""

import json
import os
import signal
import sys
from pathlib import Path

from mpi4py import MPI

import mpi_util
from mpi_util.supervise import mapped_shared_memory

out_dir, ending = Path(sys.argv[1]), sys.argv[2]
comm = MPI.COMM_WORLD
(out_dir / f"shm_{comm.rank}.json").write_text(json.dumps(mapped_shared_memory()))
if ending == "raises without init":
    mpi_util.install_abort_on_exception()
else:
    mpi_util.init()
comm.Barrier()
if comm.rank == comm.size - 1:
    if ending == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("the last rank ends the job")
comm.Barrier()
