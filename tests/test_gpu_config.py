"""--gpu_pct on a machine without a GPU: a no-op that says so once, on rank 0; bad values are refused."""

from __future__ import annotations

import pytest

import mpi_util


@pytest.mark.parametrize("nprocs", [1, 2])
def test_setup_gpu_without_gpu_says_so_once(run_mpi, nprocs):
    result = run_mpi(nprocs, "gpu_setup.py", "0.08", timeout=120)
    if "GPU_COUNT 0" not in result.stdout:
        pytest.skip("this machine has a GPU; the no-GPU path does not apply")
    assert result.stdout.count("no GPU visible to TensorFlow; gpu_pct=0.08 has no effect") == 1
    assert result.stdout.count("SETUP {'gpu': None, 'memory_limit_mb': None}") == nprocs


def test_tf_config_is_tf1_style():
    config = mpi_util.tf_config(0.25)
    assert config.gpu_options.per_process_gpu_memory_fraction == pytest.approx(0.25)
    assert mpi_util.tf_config(0.0).gpu_options.allow_growth
    with pytest.raises(ValueError, match=r"gpu_pct must be in \[0, 1\]"):
        mpi_util.tf_config(2.0)
    with pytest.raises(ValueError, match=r"gpu_pct must be a number"):
        mpi_util.setup_gpu("lots")  # type: ignore[arg-type]
