"""Launched with plain python: ``fork_kill.py N RANK MPIEXEC_ARGS_JSON`` relaunches itself as N ranks with
mpi_fork(N, mpiexec_args=...); after a gather, rank RANK prints its host and pid and kills itself (SIGKILL)."""

import json
import os
import signal
import socket
import sys

import mpi_util

result = mpi_util.mpi_fork(int(sys.argv[1]), mpiexec_args=json.loads(sys.argv[3]))
if result == "parent":
    print(f"parent: job exited with {result.returncode}", flush=True)
    sys.exit(result.returncode)

mpi_util.gather_objects(mpi_util.rank)
if mpi_util.rank == int(sys.argv[2]):
    print(f"rank {mpi_util.rank} on {socket.gethostname()} pid {os.getpid()} kills itself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
mpi_util.gather_objects(mpi_util.rank)  # the others wait here until mpiexec ends the job
