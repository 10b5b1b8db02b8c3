"""The numeric kernels train.py's ranks run, fixed before numpy loads OpenBLAS, so that a run's numbers do not
depend on the machine's cores or CPU model.

OpenBLAS picks a kernel family for the CPU it finds (Haswell on AMD Zen and Intel AVX2 parts, SkylakeX on Intel
AVX-512 parts) and each family rounds the rollout policy's matrix products differently, enough for the same
command to end at a different return on another CPU (benchmarks/machine_dependence.py measures it; the figures are
in benchmarks/README.md). Every x86-64 CPU with AVX2 and FMA runs the Haswell family, so it is used on all of
them. Threads would also change the rounding, so BLAS and OpenMP get one each. A value the user set is kept.
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping

from trainer.versions import cpu_model_and_flags

# The OpenBLAS kernel family every x86-64 CPU with AVX2 and FMA can run.
OPENBLAS_CORETYPE = "Haswell"


def pin_numeric_kernels(environ: MutableMapping[str, str] | None = None, machine: str | None = None,
                        cpu_flags: str | None = None) -> None:
    """Set OMP/MKL/OPENBLAS_NUM_THREADS to 1 and, on an x86-64 CPU with AVX2 and FMA, OPENBLAS_CORETYPE to Haswell,
    in ``environ`` (default os.environ), each unless already set. Call it before numpy is imported: OpenBLAS reads
    them once, when it loads. ``machine`` and ``cpu_flags`` (space-separated) default to this machine's."""
    environ = os.environ if environ is None else environ
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        environ.setdefault(name, "1")
    if runs_avx2_kernels(machine, cpu_flags):
        environ.setdefault("OPENBLAS_CORETYPE", OPENBLAS_CORETYPE)


def runs_avx2_kernels(machine: str | None = None, cpu_flags: str | None = None) -> bool:
    """Whether this is an x86-64 CPU with AVX2 and FMA, where OpenBLAS's and oneDNN's kernels are held to AVX2.
    ``machine`` and ``cpu_flags`` (space-separated) default to this machine's."""
    machine = platform.machine() if machine is None else machine
    flags = set((cpu_model_and_flags()[1] if cpu_flags is None else cpu_flags).split())
    return machine.lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= flags


# Per kind of network (algos.spaces.network_kind): (intra-op threads, oneDNN), "all" for every CPU rank 0 may use.
# Each measured side by side with the other three choices (benchmarks/update.py --kernels; benchmarks/README.md):
# - mlp: 64x64 networks spend their time on the number of ops run; a second thread made an update 1.4-1.9x slower,
#   oneDNN 0.95-1.16x (no gain), and both would tie the results to the machine's cores and vector instructions.
# - small_cnn: MinAtar's one 3x3 layer on 10x10 boards: oneDNN's kernels pay, a second thread does not.
# - nature_cnn: Atari's three layers on 84x84 frames: oneDNN on both cores took 0.45x the time of one thread of
#   TensorFlow's own kernels.
RANK0_KERNELS = {"mlp": (1, "0"), "small_cnn": (1, "1"), "nature_cnn": ("all", "1")}


def rank0_tensorflow_kernels(network: str, cpus: int, policy_lag: int, ranks_on_host: int) -> dict[str, int | str]:
    """TensorFlow's thread pools and kernels for rank 0's update of a ``network`` (RANK0_KERNELS' kinds):
    {"tf_intra_op_threads", "tf_inter_op_threads", "tf_enable_onednn_opts", "onednn_max_cpu_isa"}. ``cpus``: the
    CPUs rank 0 may use (affinity, cgroup quota); ``ranks_on_host``: the job's processes on rank 0's host, rank 0
    included.

    Every CPU: the waiting processes sleep while rank 0 learns. Under --policy_lag 1 the others roll out during the
    update, so it leaves them a CPU each. With more than one thread, or oneDNN, the results depend on the thread count
    and the CPU's vector instructions (config.json records both; --resume warns when they change); an MLP's do not.
    A value of TF_ENABLE_ONEDNN_OPTS or ONEDNN_MAX_CPU_ISA the user set is kept.
    """
    threads, onednn = RANK0_KERNELS[network]
    if threads == "all":
        threads = cpus if not policy_lag else max(1, cpus - (ranks_on_host - 1))
    # TensorFlow's own matrix products call oneDNN's sgemm even with oneDNN's ops off, and it picks its code by the
    # CPU's vector instructions: an AMD Zen 3 (AVX2) ended the README's first command at 568.0, a Zen 4 (AVX-512) at
    # 1,139.3, and the Zen 3 with oneDNN held to SSE4.1 at 594.3 (benchmarks/results/machine_dependence_zen3_isa). An
    # MLP holds it to AVX2, as OpenBLAS to Haswell; a CNN keeps every instruction (its results depend on the CPU
    # anyway).
    isa = "AVX2" if network == "mlp" and runs_avx2_kernels() else "ALL"
    return {"tf_intra_op_threads": threads, "tf_inter_op_threads": min(2, cpus),
            "tf_enable_onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS", onednn),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", isa)}
