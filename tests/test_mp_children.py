"""A multiprocessing child of a rank (a user's Pool, SB3's SubprocVecEnv) imports mpi_util without initializing MPI,
by every start method, under a real launcher: it knows its rank, and a collective there fails in one line."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import SCRIPTS, mpiexec, run_bounded

from mpi_util.children import launcher_rank_and_size

METHODS = ("fork", "forkserver", "spawn")


def test_a_childs_rank_and_size_come_from_the_launchers_variables():
    assert launcher_rank_and_size({"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "0"}) == (3, 4)  # hydra in Slurm
    open_mpi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_RANK": "1"}
    assert launcher_rank_and_size(open_mpi) == (1, 2)
    assert launcher_rank_and_size({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == (5, 8)
    assert launcher_rank_and_size({}) == (0, 1)


@pytest.mark.parametrize("launched_by", ["mpiexec", "mpi_fork"])
def test_a_pool_in_every_rank_works_by_every_start_method_and_its_children_have_no_mpi(launched_by):
    if launched_by == "mpiexec":
        result = mpiexec(2, "mp_children.py", *METHODS, timeout=60)
    else:  # the script's own mpi_fork(2) relaunches it: a child's mpi_fork must not record itself as a rank
        result = run_bounded([sys.executable, str(SCRIPTS / "mp_children.py"), *METHODS], timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # above all no "PMIU_write error ... PMI_Init returned -1"
    for rank in (0, 1):
        for method in METHODS:
            # fork's children are copies of the rank: its mpi_fork's result, its MPI, its signal handlers
            child_state = "'child', True, False" if method == "fork" else "'child', False, True"
            assert f"rank {rank} {method}: squares {[x * x for x in range(8)]}; children saw [({rank}, 2, " \
                   f"{child_state})]" in result.stdout, result.stdout
        for method in ("forkserver", "spawn"):
            raised = re.search(rf"^rank {rank} {method}: collective in a child raised (.*)$", result.stdout, re.M)
            assert raised and raised.group(1).startswith("NotARankError: mpi_util: this process (pid "), \
                result.stdout
            assert f"is a multiprocessing child of rank {rank} and has no MPI" in raised.group(1)
            assert f"collectives belong to rank {rank}'s own process" in raised.group(1)
        assert f"rank {rank}: sum over ranks 3.0" in result.stdout
