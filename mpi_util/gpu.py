"""GPU memory caps for the ranks (``--gpu_pct``). TensorFlow is imported only when these are called."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from .process import local_rank, print0


def check_gpu_pct(gpu_pct: float) -> float:
    """Return gpu_pct as a float, or raise ValueError when it is not a fraction in [0, 1]."""
    try:
        value = float(gpu_pct)
    except (TypeError, ValueError):
        raise ValueError(f"gpu_pct must be a number in [0, 1], got {gpu_pct!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"gpu_pct must be in [0, 1] (fraction of each GPU's memory per process, 0 = grow as needed), got {gpu_pct}"
        )
    return value


@contextlib.contextmanager
def _tensorflow_start_up_silenced() -> Iterator[None]:
    """Around TensorFlow's import and its first look at the devices: nothing it writes reaches the terminal, unless
    the import fails (then all of it is written out) or the user set TF_CPP_MIN_LOG_LEVEL below 3 (then nothing is
    held back).

    Why at the file-descriptor level: TensorFlow's C++ code logs through absl before absl is configured ("WARNING: All
    log messages before absl::InitializeLog() is called are written to STDERR", "Could not find cuda drivers", "failed
    call to cuInit: ... CUDA error" on a machine without a GPU), which TF_CPP_MIN_LOG_LEVEL does not reach. Level 3 is
    set for what it logs afterwards. What matters to the user (no GPU, gpu_pct ignored) setup_gpu says in one line.
    """
    if os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3") != "3":
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    with tempfile.TemporaryFile() as held_back:
        os.dup2(held_back.fileno(), 2)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(terminal, 2)
            os.close(terminal)
            if failed:
                held_back.seek(0)
                os.write(2, held_back.read())


def _gpu_total_memory_bytes(index: int) -> int | None:
    """Total memory of CUDA device ``index`` (as CUDA_VISIBLE_DEVICES numbers them), None if unknown.

    Asks the CUDA driver directly (no context is created, so nothing is allocated), else nvidia-smi.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int()
        total = ctypes.c_size_t()
        if (
            cuda.cuInit(0) == 0
            and cuda.cuDeviceGet(ctypes.byref(device), index) == 0
            and cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device) == 0
        ):
            return int(total.value)
    except (OSError, AttributeError):
        pass
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        physical = visible.split(",")[index] if visible else str(index)
        out = subprocess.run(
            ["nvidia-smi", f"--id={physical}", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        return int(float(out.stdout.strip().splitlines()[0])) * 1024 * 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def setup_gpu(gpu_pct: float | None = None) -> dict[str, Any]:
    """Pin this rank to one GPU (local rank modulo the GPU count) and cap its TensorFlow memory.

    gpu_pct: fraction of the GPU's memory this process may take, in (0, 1]; 0 lets TensorFlow grow as needed.
    None reads MPI_UTIL_GPU_PCT (set by ``mpi_fork``), default 0. Call before TensorFlow touches a GPU.
    Imports TensorFlow without its start-up log lines (see _tensorflow_start_up_silenced): call it before anything
    else imports TensorFlow. Without a GPU it does nothing and says so once, on rank 0. Returns what was done:
    {"gpu": index or None, "memory_limit_mb": int or None}.
    """
    pct = check_gpu_pct(os.environ.get("MPI_UTIL_GPU_PCT", "0") if gpu_pct is None else gpu_pct)
    with _tensorflow_start_up_silenced():
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        if pct > 0:
            print0(f"mpi_util: no GPU visible to TensorFlow; gpu_pct={pct:g} has no effect, running on the CPU")
        return {"gpu": None, "memory_limit_mb": None}
    index = local_rank() % len(gpus)
    gpu = gpus[index]
    tf.config.set_visible_devices([gpu], "GPU")
    if pct == 0.0:
        tf.config.experimental.set_memory_growth(gpu, True)
        return {"gpu": index, "memory_limit_mb": None}
    total = _gpu_total_memory_bytes(index)
    if total is None:
        print0("mpi_util: could not read the GPU's total memory; letting TensorFlow grow memory as needed instead")
        tf.config.experimental.set_memory_growth(gpu, True)
        return {"gpu": index, "memory_limit_mb": None}
    limit_mb = max(1, int(total * pct / (1024 * 1024)))
    tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mb)])
    return {"gpu": index, "memory_limit_mb": limit_mb}


def tf_config(gpu_pct: float = 0.0) -> Any:
    """A TF1-style ``tf.compat.v1.ConfigProto`` for code that still builds sessions, as the original did.

    Caps each process at ``gpu_pct`` of its GPU (per_process_gpu_memory_fraction; 0 = allow_growth) and makes
    only this rank's GPU (local rank modulo the GPU count) visible to the session.
    """
    pct = check_gpu_pct(gpu_pct)
    with _tensorflow_start_up_silenced():
        import tensorflow as tf

        ngpus = len(tf.config.list_physical_devices("GPU"))
    config = tf.compat.v1.ConfigProto()
    if pct > 0:
        config.gpu_options.per_process_gpu_memory_fraction = pct
    else:
        config.gpu_options.allow_growth = True
    if ngpus:
        config.gpu_options.visible_device_list = str(local_rank() % ngpus)
    return config

