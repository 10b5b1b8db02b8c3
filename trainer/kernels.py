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
    machine = platform.machine() if machine is None else machine
    flags = set((cpu_model_and_flags()[1] if cpu_flags is None else cpu_flags).split())
    if machine.lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= flags:
        environ.setdefault("OPENBLAS_CORETYPE", OPENBLAS_CORETYPE)
