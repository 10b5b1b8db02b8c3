"""--gpu_pct on a machine without a GPU: a no-op that says so once, on rank 0 (checked on two ranks by
test_mpi_collectives's TensorFlow broadcast job, which calls setup_gpu as it starts); bad values are refused."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import TENSORFLOW_IN_PROCESS, run_bounded

import mpi_util
from mpi_util.process import mpi_library_is_open_mpi


@TENSORFLOW_IN_PROCESS
def test_tf_config_is_tf1_style():
    config = mpi_util.tf_config(0.25)
    assert config.gpu_options.per_process_gpu_memory_fraction == pytest.approx(0.25)
    assert mpi_util.tf_config(0.0).gpu_options.allow_growth
    with pytest.raises(ValueError, match=r"gpu_pct must be in \[0, 1\]"):
        mpi_util.tf_config(2.0)
    with pytest.raises(ValueError, match=r"gpu_pct must be a number"):
        mpi_util.setup_gpu("lots")  # type: ignore[arg-type]


# What each launcher puts in a rank's environment (the variables gpu_for_rank reads; the others are there to show
# they are ignored), for the rank on a host that is local rank 1 of 2, 3 of 4 and so on.
MPICH_RANK_3_OF_4 = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}
OPEN_MPI_RANK_5_OF_8_HOST_B = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                               "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                               "PMIX_RANK": "5", "PMIX_LOCAL_RANK": "1"}
# srun -N 2 --ntasks-per-node=4: task 6 is local task 2 on the second node. In a batch job mpiexec inherits the batch
# step's SLURM_LOCALID=0, which its own variable overrides.
SRUN_TASK_6 = {"SLURM_PROCID": "6", "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_NTASKS_PER_NODE": "4",
               "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_GPUS": "0,1,2,3", "SLURM_JOB_GPUS": "0,1,2,3"}
MPIEXEC_IN_SBATCH = {**MPICH_RANK_3_OF_4, "SLURM_LOCALID": "0", "SLURM_PROCID": "0", "SLURM_JOB_ID": "77"}


@pytest.mark.parametrize(("environ", "device_count", "expected"), [
    (MPICH_RANK_3_OF_4, 8, 3),  # a GPU for every rank of the host
    (MPICH_RANK_3_OF_4, 2, 1),  # 4 ranks, 2 GPUs: round robin, two ranks a GPU
    ({**MPICH_RANK_3_OF_4, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, None, 3),  # the 4th visible one (physical 7)
    (MPIEXEC_IN_SBATCH, 4, 3),  # MPICH's local rank, not the batch step's SLURM_LOCALID
    (OPEN_MPI_RANK_5_OF_8_HOST_B, 4, 1),  # the local rank on host B, not the world rank
    ({**SRUN_TASK_6, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, 2),  # srun --gres=gpu:4: every task sees all 4
    ({**SRUN_TASK_6, "CUDA_VISIBLE_DEVICES": "2"}, None, 0),  # srun --gpus-per-task=1: the task's own, as cuda:0
    ({**SRUN_TASK_6, "CUDA_VISIBLE_DEVICES": "GPU-8e2a0c1d,GPU-77b1f0aa"}, None, 0),  # UUIDs, local task 2 of 2 GPUs
    ({**SRUN_TASK_6, "CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None, None),  # Slurm step without GPUs
    ({"CUDA_VISIBLE_DEVICES": ""}, None, None),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None, None),
    ({"CUDA_VISIBLE_DEVICES": "0,1,bad,3"}, None, 0),  # CUDA stops at "bad": 2 GPUs, and no launcher: local rank 0
    ({}, 2, 0),  # no launcher: alone on its host
    (MPICH_RANK_3_OF_4, 0, None),  # no GPU
])
def test_gpu_for_rank_from_launcher_variables(environ, device_count, expected):
    assert mpi_util.gpu_for_rank(device_count, environ) == expected


def test_gpu_for_rank_needs_a_count_without_cuda_visible_devices():
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES is unset; pass device_count"):
        mpi_util.gpu_for_rank(None, MPICH_RANK_3_OF_4)


def test_device_for_rank_is_round_robin():
    from mpi_util.gpu import device_for_rank

    assert [device_for_rank(r, 3) for r in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [device_for_rank(r, 1) for r in range(3)] == [0, 0, 0]
    assert device_for_rank(5, 0) is None
    with pytest.raises(ValueError, match="must be >= 0"):
        device_for_rank(-1, 2)


def test_each_rank_of_a_real_mpiexec_gets_its_gpu(run_mpi):
    result = run_mpi(3, "gpu_ranks.py", env={"CUDA_VISIBLE_DEVICES": "5,7"}, timeout=60)
    rows = [line.split()[1::2] for line in result.stdout.splitlines() if line.startswith("RANK ")]
    assert [row[0] for row in rows] == ["0", "1", "2"], result.stdout
    for rank, local, of_8, of_2, of_visible, from_variables in rows:
        assert local == rank  # one host: the local rank follows the world rank
        assert (of_8, of_2, of_visible) == (rank, str(int(rank) % 2), str(int(rank) % 2))
        if not mpi_library_is_open_mpi():  # MPICH's MPI_LOCALRANKID follows the world rank too
            assert from_variables == rank
    # Open MPI's own local rank follows its mapping (mpi_fork settles the one above): still one GPU of 8 per rank.
    assert sorted(row[5] for row in rows) == ["0", "1", "2"]


def test_sb3_rank_device():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (the sb3 extra)")
    from mpi_util.sb3 import rank_device

    local_1_of_2 = {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    # What torch sees, in a process of its own: torch in a pytest worker that imports TensorFlow risks LLVM's abort.
    asked = run_bounded([sys.executable, "-c", "import torch; from mpi_util.sb3 import rank_device; "
                         "print(torch.cuda.is_available(), rank_device(), rank_device('cuda'), "
                         f"rank_device(torch.device('cpu'), 2, {local_1_of_2!r}))"], timeout=60)
    assert asked.returncode == 0, asked.stderr[-3000:]
    cuda, auto, cuda_asked, cpu_given = asked.stdout.split()
    if cuda == "False":
        assert auto == cuda_asked == "cpu"
    assert cpu_given == "cpu"
    assert rank_device("auto", 2, local_1_of_2) == "cuda:1"
    assert rank_device("auto", 0, local_1_of_2) == "cpu"
    assert rank_device("cuda:0", 2, local_1_of_2) == "cuda:0"  # explicit: left alone
