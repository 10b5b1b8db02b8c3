"""Checkpoint files: written atomically, verified by a checksum when read.

A checkpoint is a pickled dict (numpy arrays, numbers, strings, bytes) behind a small header that holds the
SHA-256 of the payload, so a truncated or corrupted file is told apart from a good one. Files are written to a
temporary name in the same directory, flushed to disk, then renamed over the target: a crash or a full disk
leaves the previous checkpoint untouched.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from pathlib import Path
from typing import Any

_MAGIC = b"MPIBRL-CKPT-1\n"
_NAME = re.compile(r"ckpt_(\d{8,})\.pkl")  # whole names only: "copy_of_ckpt_00000010.pkl" is not a checkpoint


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (missing, truncated, corrupted, or from another run)."""


# write_atomic's ".NAME.tmp" (and older ".NAME.tmpPID") of the files a run writes with it: nothing else is removed.
_TEMPORARY = re.compile(r"\.(config\.json|progress\.csv|ckpt_\d{8,}\.pkl)\.tmp\d*")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees either the old file or the complete new one.

    The data goes to ``.NAME.tmp`` beside it first: one name, not one per process, since one process at a time writes
    a run directory (its lock), and a fault-injection test can then name the file. A kill part-way leaves that file
    behind; ``remove_temporary_files`` clears it. The file is created anew (O_EXCL, O_NOFOLLOW): whatever stands at
    that name, a symbolic link planted there included, is unlinked first, never written through."""
    tmp = path.with_name(f".{path.name}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileExistsError:  # stale (the writer was killed) or planted: the lock says no write is under way
            tmp.unlink()
            fd = os.open(tmp, flags, 0o644)
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def remove_temporary_files(directory: Path) -> list[Path]:
    """Remove what write_atomic left in ``directory`` when its writer was killed part-way; call it only while holding
    the directory (its lock), when no write can be under way. Returns what was removed."""
    removed = []
    for path in directory.iterdir() if directory.is_dir() else []:
        if _TEMPORARY.fullmatch(path.name) and (path.is_symlink() or path.is_file()):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def save_checkpoint(directory: Path, iteration: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write ``state`` as directory/ckpt_{iteration:08d}.pkl, then remove the checkpoints of earlier iterations but the
    newest ``keep`` - 1 of them. Only earlier ones: the one just written is never removed, whatever else the directory
    holds (a checkpoint of a later iteration, left by a run resumed from an earlier one, stays until overwritten)."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    path = directory / f"ckpt_{iteration:08d}.pkl"
    write_atomic(path, _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    earlier = [p for p in list_checkpoints(directory) if checkpoint_iteration(p) < iteration]
    for old in earlier[: max(0, len(earlier) - (keep - 1))]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read and verify one checkpoint; CheckpointError saying what is wrong otherwise."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from None
    if not data.startswith(_MAGIC):
        raise CheckpointError(f"{path} is not a checkpoint of this program (bad header)")
    header_end = data.find(b"\n", len(_MAGIC))
    digest, payload = data[len(_MAGIC) : header_end].decode(errors="replace"), data[header_end + 1 :]
    if header_end < 0 or hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(f"{path} is truncated or corrupted (checksum mismatch)")
    return pickle.loads(payload)


def checkpoint_iteration(path: Path) -> int:
    """The iteration of a checkpoint's file name (ckpt_00000012.pkl: 12)."""
    return int(_NAME.fullmatch(path.name).group(1))


def list_checkpoints(directory: Path) -> list[Path]:
    """The checkpoint files in ``directory``, by iteration, the oldest first: files named exactly as save_checkpoint
    names them, nothing else (copies, backups and other names beside them are not checkpoints)."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _NAME.fullmatch(p.name) and p.is_file()), key=checkpoint_iteration)


def load_latest_checkpoint(directory: Path) -> tuple[Path, dict[str, Any], list[str]]:
    """The newest checkpoint that verifies, and a warning for each newer one that did not.

    Raises CheckpointError when there is none.
    """
    warnings: list[str] = []
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, load_checkpoint(path), warnings
        except CheckpointError as error:
            warnings.append(f"skipping {error}")
    reasons = "; ".join(warnings) or "no ckpt_*.pkl files"
    raise CheckpointError(f"no usable checkpoint in {directory} ({reasons})")
