"""Which GPU each rank uses, and GPU memory caps for the ranks (``--gpu_pct``). TensorFlow is imported only when
setup_gpu or tf_config is called; torch never is."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from .process import launcher_local_rank, local_rank, print0


def check_gpu_pct(gpu_pct: float, name: str = "gpu_pct") -> float:
    """Check a GPU memory fraction (``--gpu_pct``, ``mpi_fork``'s ``gpu_pct``).

    Args:
        gpu_pct: a fraction of each GPU's memory per process, as a number or a string of one.
        name: where it came from, for the error's message.

    Returns:
        gpu_pct as a float.

    Raises:
        ValueError: it is not a number, or not a fraction in [0, 1].
    """
    try:
        value = float(gpu_pct)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1], got {gpu_pct!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(
            f"{name} must be in [0, 1] (fraction of each GPU's memory per process, 0 = grow as needed), got {gpu_pct}"
        )
    return value


def device_for_rank(rank_on_host: int, visible_count: int) -> int | None:
    """The GPU of the process with local rank ``rank_on_host`` (its rank among the job's ranks on its host), as an
    index among the ``visible_count`` GPUs it sees (``cuda:<index>``), or None when it sees none.

    Round robin over the visible GPUs by local rank: ranks 0..k-1 of a host with k GPUs get one each, more ranks
    share them evenly. Where the launcher already gave each task its own GPU (srun --gpus-per-task=1 sets
    CUDA_VISIBLE_DEVICES to that one GPU), every task sees one and gets index 0, its own.
    """
    if rank_on_host < 0 or visible_count < 0:
        raise ValueError(f"device_for_rank: rank_on_host and visible_count must be >= 0, got {rank_on_host}, "
                         f"{visible_count}")
    return rank_on_host % visible_count if visible_count else None


def visible_gpu_ids(environ: Mapping[str, str]) -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES lets a process see, in CUDA's order (indices or GPU-/MIG- UUIDs); None when
    it is unset (every GPU of the host is visible). As CUDA reads it: "" and "-1" hide every GPU, and the list
    ends at the first entry that names no device (Slurm's "NoDevFiles" for a step without GPUs)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    ids = []
    for entry in (part.strip() for part in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        ids.append(entry)
    return ids


def gpu_for_rank(device_count: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """This rank's GPU as an index among the GPUs the process sees (``cuda:<index>``), None without a GPU.

    Local rank modulo the GPU count. Slurm's SLURM_JOB_GPUS and SLURM_STEP_GPUS are not read: Slurm sets
    CUDA_VISIBLE_DEVICES for the GPUs it gives a step, and that is what CUDA numbers. With ``environ`` None it
    asks ``local_rank()``, a collective only where no launcher variable gives the local rank (see there).

    Args:
        device_count: the GPUs the framework sees (``torch.cuda.device_count()``, TensorFlow's GPU list), which
            already honours CUDA_VISIBLE_DEVICES; None counts CUDA_VISIBLE_DEVICES's entries instead.
        environ: None for this process (its local rank as ``local_rank()`` gives it, mpi_fork's under Open MPI);
            a mapping of a launcher's variables gives that rank's answer (no launcher variable: a process alone on
            its host, local rank 0).

    Returns:
        The GPU's index, in [0, device_count), or None when the process sees no GPU.

    Raises:
        ValueError: ``device_count`` is None and CUDA_VISIBLE_DEVICES is unset.
    """
    if device_count is None:
        ids = visible_gpu_ids(os.environ if environ is None else environ)
        if ids is None:
            raise ValueError("gpu_for_rank: CUDA_VISIBLE_DEVICES is unset; pass device_count (the GPUs the framework "
                             "sees, e.g. torch.cuda.device_count())")
        device_count = len(ids)
    if device_count == 0:
        return None
    rank_on_host = local_rank() if environ is None else (launcher_local_rank(environ) or 0)
    return device_for_rank(rank_on_host, device_count)


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
    """Pin this rank to one GPU (``gpu_for_rank``: local rank modulo the GPU count) and cap its TensorFlow memory.

    Call before TensorFlow touches a GPU. Imports TensorFlow without its start-up log lines (see
    _tensorflow_start_up_silenced): call it before anything else imports TensorFlow. Without a GPU it does nothing
    and says so once, on rank 0.

    Args:
        gpu_pct: fraction of the GPU's memory this process may take, in (0, 1]; 0 lets TensorFlow grow as needed.
            None reads MPI_UTIL_GPU_PCT (set by ``mpi_fork``), default 0.

    Returns:
        What was done: {"gpu": index or None, "memory_limit_mb": int or None}.

    Raises:
        ValueError: ``gpu_pct`` (or MPI_UTIL_GPU_PCT) is not a fraction in [0, 1].
        ImportError: TensorFlow is not installed.
    """
    pct = check_gpu_pct(os.environ.get("MPI_UTIL_GPU_PCT", "0") if gpu_pct is None else gpu_pct)
    with _tensorflow_start_up_silenced():
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        if pct > 0:
            print0(f"mpi_util: no GPU visible to TensorFlow; gpu_pct={pct:g} has no effect, running on the CPU")
        return {"gpu": None, "memory_limit_mb": None}
    index = gpu_for_rank(len(gpus))
    assert index is not None  # there are GPUs
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

    Makes only this rank's GPU (local rank modulo the GPU count) visible to the session. Imports TensorFlow.

    Args:
        gpu_pct: the fraction of its GPU each process may take (per_process_gpu_memory_fraction); 0 = allow_growth.

    Returns:
        A ``tf.compat.v1.ConfigProto``.

    Raises:
        ValueError: ``gpu_pct`` is not a fraction in [0, 1].
        ImportError: TensorFlow is not installed.
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
        config.gpu_options.visible_device_list = str(gpu_for_rank(ngpus))
    return config

