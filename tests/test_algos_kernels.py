"""trainer.kernels: train.py's ranks run OpenBLAS's Haswell kernels and one BLAS thread wherever they can."""

from __future__ import annotations

import sys

import pytest
from conftest import run_bounded

from trainer.kernels import pin_numeric_kernels


def test_x86_cpus_with_avx2_and_fma_get_the_haswell_kernels_and_one_thread():
    environ: dict[str, str] = {}
    pin_numeric_kernels(environ, machine="x86_64", cpu_flags="sse4_2 avx avx2 fma avx512f")
    assert environ == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                       "OPENBLAS_CORETYPE": "Haswell"}


@pytest.mark.parametrize(("machine", "flags"), [("aarch64", "fp asimd"), ("x86_64", "sse4_2 avx"),
                                                ("x86_64", "avx2")])
def test_other_cpus_keep_openblas_own_choice(machine, flags):
    environ: dict[str, str] = {}
    pin_numeric_kernels(environ, machine=machine, cpu_flags=flags)
    assert "OPENBLAS_CORETYPE" not in environ and environ["OPENBLAS_NUM_THREADS"] == "1"


def test_what_the_user_set_is_kept():
    environ = {"OPENBLAS_CORETYPE": "SkylakeX", "OMP_NUM_THREADS": "4"}
    pin_numeric_kernels(environ, machine="x86_64", cpu_flags="avx2 fma")
    assert environ["OPENBLAS_CORETYPE"] == "SkylakeX" and environ["OMP_NUM_THREADS"] == "4"


PROBE = """
import ctypes, glob, os, sys
from trainer.kernels import pin_numeric_kernels
os.environ.pop("OPENBLAS_CORETYPE", None)
pin_numeric_kernels()
import numpy
libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__), os.pardir, "numpy.libs", "libscipy_openblas*"))
get = getattr(ctypes.CDLL(libs[0]), "scipy_openblas_get_corename64_", None) if libs else None
if get is None:
    sys.exit(3)
get.restype = ctypes.c_char_p
print(os.environ.get("OPENBLAS_CORETYPE"), get().decode())
"""


def test_numpy_openblas_runs_the_pinned_kernels():
    result = run_bounded([sys.executable, "-c", PROBE], timeout=60)
    if result.returncode == 3:
        pytest.skip("this numpy's OpenBLAS does not name its kernels (not numpy's bundled scipy-openblas)")
    assert result.returncode == 0, result.stderr
    pinned, running = result.stdout.split()
    if pinned == "None":
        pytest.skip("not an x86-64 CPU with AVX2 and FMA: OpenBLAS keeps its own choice")
    assert running == pinned == "Haswell"


@pytest.mark.parametrize(("network", "policy_lag", "threads", "onednn"), [
    ("mlp", 0, 1, "0"), ("small_cnn", 0, 1, "1"), ("nature_cnn", 0, 8, "1"),
    # Under --policy_lag 1 the 3 other processes on rank 0's host roll out during the update: a CPU each.
    ("nature_cnn", 1, 5, "1"), ("mlp", 1, 1, "0")])
def test_rank0_threads_and_kernels_follow_the_network_and_the_cpus(monkeypatch, network, policy_lag, threads, onednn):
    from trainer.kernels import rank0_tensorflow_kernels, runs_avx2_kernels

    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    chosen = rank0_tensorflow_kernels(network, cpus=8, policy_lag=policy_lag, ranks_on_host=4)
    # An MLP's matrix products held to AVX2 wherever the CPU has it, as OpenBLAS's kernels are.
    isa = "AVX2" if network == "mlp" and runs_avx2_kernels() else "ALL"
    assert chosen == {"tf_intra_op_threads": threads, "tf_inter_op_threads": 2, "tf_enable_onednn_opts": onednn,
                      "onednn_max_cpu_isa": isa}
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")  # the user's choice wins
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert rank0_tensorflow_kernels(network, 8, policy_lag, 4)["tf_enable_onednn_opts"] == "0"
    assert rank0_tensorflow_kernels(network, 8, policy_lag, 4)["onednn_max_cpu_isa"] == "AVX512_CORE"


def test_each_observation_gets_its_kind_of_network():
    from algos.spaces import ObsSpec, network_kind

    assert [network_kind(ObsSpec(shape)) for shape in [(17,), (10, 10, 4), (84, 84, 4)]] == \
        ["mlp", "small_cnn", "nature_cnn"]
