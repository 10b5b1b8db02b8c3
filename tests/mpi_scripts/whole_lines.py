"""Launched with plain python: ``whole_lines.py N`` relaunches itself as N ranks with mpi_fork(N). Every rank prints a
line after each of 300 barriers, all at once; then rank 1 prints the start of a line, the others print theirs after a
barrier, and rank 1 ends its line after another. Each line must come out whole, on a line of its own."""

import sys

from mpi4py import MPI

import mpi_util

result = mpi_util.mpi_fork(int(sys.argv[1]))
if result == "parent":
    sys.exit(result.returncode)

comm = MPI.COMM_WORLD
for i in range(300):
    comm.Barrier()
    print(f"rank {mpi_util.rank} line {i}")
comm.Barrier()
if mpi_util.rank == 1:
    print("rank 1 begins a line", end="")
comm.Barrier()
if mpi_util.rank != 1:
    print(f"rank {mpi_util.rank} prints a whole line")
comm.Barrier()
if mpi_util.rank == 1:
    print(" and ends it")
