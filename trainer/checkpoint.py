"""Checkpoint files: data only, written atomically, verified when read.

A checkpoint, ``checkpoints/ckpt_{iteration:08d}.npz``, is numpy's npz (a zip of ``.npy`` arrays) and nothing else:
the state's structure (dicts, lists, numbers, strings) as JSON text in the array ``state``, every numpy array in its
own ``a0``, ``a1``, ... Reading one runs no code: the arrays are read with ``allow_pickle=False`` (as
``numpy.load(path, allow_pickle=False)`` reads them too), entries are stored, not compressed (a reader refuses a
compressed one, so a received file cannot unpack to more than its size), and the zip's comment holds the SHA-256 of
every entry, so a truncated or corrupted file is told apart from a good one.

The one part that needs pickle is an environment's snapshot (envs.snapshot), for a resume without a seam. It is
kept as opaque bytes (``p0``, ``p1``, ...) with an HMAC-SHA256 under the user's own key (``user_key``), and only
``--resume`` unpickles it, after rank 0 has checked the HMAC (SignedPickle.verified). ``--play`` and ``--export``
read the arrays and never unpickle.

Files are written to a temporary name in the same directory, flushed to disk, then renamed over the target: a crash
or a full disk leaves the previous checkpoint untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import secrets
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "mpi-batch-rl checkpoint 2"
_NAME = re.compile(r"ckpt_(\d{8,})\.npz")  # whole names only: "copy_of_ckpt_00000010.npz" is not a checkpoint
_OLD_NAME = re.compile(r"ckpt_\d{8,}\.pkl")  # the pickled checkpoints of versions before 0.2, never read
_DIGEST_PREFIX = b"sha256:"
KEY_FILE_VARIABLE = "TRAIN_CHECKPOINT_KEY"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (missing, truncated, corrupted, or from another run)."""


@dataclass(frozen=True)
class SignedPickle:
    """A pickle in a checkpoint (an environment's snapshot): its bytes and their HMAC-SHA256 under the key of the
    user who saved it (b"" when there was no key). Kept as bytes until ``verified`` says they are that user's."""

    data: bytes
    tag: bytes

    @classmethod
    def sign(cls, data: bytes, key: bytes | None) -> SignedPickle:
        return cls(data, hmac.digest(key, data, "sha256") if key else b"")

    def verified(self, key: bytes | None) -> bool:
        """Whether these bytes were saved under ``key`` (so by the user who holds it), unchanged."""
        return bool(key) and bool(self.tag) and hmac.compare_digest(self.tag, hmac.digest(key, self.data, "sha256"))


# write_atomic's ".NAME.tmp" (and older ".NAME.tmpPID") of the files a run writes with it: nothing else is removed.
_TEMPORARY = re.compile(r"\.(config\.json|progress\.csv|ckpt_\d{8,}\.npz)\.tmp\d*")


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


def key_path() -> Path:
    """Where the user's checkpoint key lives: $TRAIN_CHECKPOINT_KEY, else ~/.config/mpi-batch-rl/checkpoint.key
    (under $XDG_CONFIG_HOME when set). Only the host of rank 0 needs it: rank 0 signs and checks."""
    if os.environ.get(KEY_FILE_VARIABLE):
        return Path(os.environ[KEY_FILE_VARIABLE]).expanduser()
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config_home / "mpi-batch-rl" / "checkpoint.key"


def user_key(create: bool) -> tuple[bytes | None, str]:
    """The user's 32-byte checkpoint key and "", or None and why it cannot be used. With ``create``, a key is made
    (random, mode 0600) where there is none. A key is used only when it is a regular file of this user's that no one
    else may read or write: a key another user could read would let them sign a pickle we then load."""
    path = key_path()
    if create and not os.path.lexists(path):
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                with open(fd, "wb") as f:
                    f.write(secrets.token_bytes(32))
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)  # whole or not at all; a key another process made first stays
                except FileExistsError:
                    pass
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as error:
            return None, f"cannot create the checkpoint key {path}: {error.strerror or error}"
    try:
        info = os.lstat(path)
    except OSError:
        return None, f"there is no checkpoint key at {path}"
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077 or info.st_size != 32:
        return None, (f"the checkpoint key {path} is not a 32-byte regular file of this user with mode 0600: "
                      "remove it (a new one is made at the next save)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with open(fd, "rb") as f:
            return f.read(), ""
    except OSError as error:
        return None, f"cannot read the checkpoint key {path}: {error.strerror or error}"


_RESERVED = ("__array__", "__pickle__")


def _encode(value: Any, arrays: list[np.ndarray], pickles: list[SignedPickle]) -> Any:
    """``value`` as JSON data, its arrays appended to ``arrays`` and its pickles to ``pickles``."""
    if isinstance(value, SignedPickle):
        pickles.append(value)
        return {"__pickle__": len(pickles) - 1, "hmac": value.tag.hex()}
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject:
            raise TypeError("a checkpoint holds arrays of numbers, not of objects")
        arrays.append(np.asarray(value))
        return {"__array__": len(arrays) - 1}
    if isinstance(value, dict):
        if any(not isinstance(k, str) or k in _RESERVED for k in value):
            raise TypeError(f"a checkpoint's dicts have string keys other than {_RESERVED}: {list(value)}")
        return {k: _encode(v, arrays, pickles) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v, arrays, pickles) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"a checkpoint holds arrays, numbers, strings, lists, dicts and SignedPickle, not {type(value)}")


def _decode(value: Any, arrays: dict[str, np.ndarray], pickles: dict[str, bytes]) -> Any:
    if isinstance(value, dict):
        if "__array__" in value:
            array = arrays[f"a{int(value['__array__'])}"]
            return array[()] if array.ndim == 0 else array
        if "__pickle__" in value:
            return SignedPickle(pickles[f"p{int(value['__pickle__'])}"], bytes.fromhex(value["hmac"]))
        return {k: _decode(v, arrays, pickles) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays, pickles) for v in value]
    return value


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def encode_checkpoint(state: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file holding ``state``: nested dicts (string keys), lists, tuples (read back as
    lists), None, bools, numbers, strings, numpy arrays and scalars (read back as arrays and numpy scalars), and
    SignedPickle."""
    arrays: list[np.ndarray] = []
    pickles: list[SignedPickle] = []
    structure = json.dumps({"format": FORMAT, "state": _encode(state, arrays, pickles)})
    entries = [("state", _npy(np.frombuffer(structure.encode(), dtype=np.uint8)))]
    entries += [(f"a{i}", _npy(array)) for i, array in enumerate(arrays)]
    entries += [(f"p{i}", _npy(np.frombuffer(p.data, dtype=np.uint8))) for i, p in enumerate(pickles)]
    digest = hashlib.sha256()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            digest.update(name.encode() + b"\0" + data)
            archive.writestr(f"{name}.npy", data)
        archive.comment = _DIGEST_PREFIX + digest.hexdigest().encode()
    return buffer.getvalue()


def decode_checkpoint(data: bytes, path: Path) -> dict[str, Any]:
    """The state of a checkpoint file's bytes ``data``; CheckpointError naming ``path`` when they are not one of
    this program's, or are truncated or corrupted. Reads arrays only: nothing in the file is run."""
    corrupted = CheckpointError(f"{path} is truncated or corrupted (checksum mismatch)")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            if any(info.compress_type != zipfile.ZIP_STORED for info in infos):
                raise CheckpointError(f"{path} is not a checkpoint of this program (compressed entries)")
            digest = hashlib.sha256()
            entries: dict[str, bytes] = {}
            for info in infos:
                raw = archive.read(info)
                digest.update(info.filename.removesuffix(".npy").encode() + b"\0" + raw)
                entries[info.filename.removesuffix(".npy")] = raw
            if archive.comment != _DIGEST_PREFIX + digest.hexdigest().encode():
                raise corrupted
    except (zipfile.BadZipFile, EOFError, OSError, ValueError):
        raise corrupted from None
    try:
        arrays = {name: np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False) for name, raw in entries.items()}
        structure = json.loads(arrays.pop("state").tobytes())
        if structure.get("format") != FORMAT:
            raise ValueError
        pickles = {name: arrays.pop(name).tobytes() for name in list(arrays) if name.startswith("p")}
        return _decode(structure["state"], arrays, pickles)
    except (KeyError, ValueError, TypeError, AttributeError):
        raise CheckpointError(f"{path} is not a checkpoint of this program") from None


def save_checkpoint(directory: Path, iteration: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write ``state`` (as encode_checkpoint takes it) as directory/ckpt_{iteration:08d}.npz, then remove the
    checkpoints of earlier iterations but the newest ``keep`` - 1 of them. Only earlier ones: the one just written is
    never removed, whatever else the directory holds (a checkpoint of a later iteration, left by a run resumed from an
    earlier one, stays until overwritten)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt_{iteration:08d}.npz"
    write_atomic(path, encode_checkpoint(state))
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
    return decode_checkpoint(data, path)


def checkpoint_iteration(path: Path) -> int:
    """The iteration of a checkpoint's file name (ckpt_00000012.npz: 12)."""
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
    if not warnings and directory.is_dir() and any(_OLD_NAME.fullmatch(p.name) for p in directory.iterdir()):
        raise CheckpointError(f"{directory} holds only checkpoints of versions before 0.2 (ckpt_*.pkl, pickles), "
                              "which this version does not read, since loading a pickle can run code: finish that run "
                              "with the version that wrote it, or start a new one")
    reasons = "; ".join(warnings) or "no ckpt_*.npz files"
    raise CheckpointError(f"no usable checkpoint in {directory} ({reasons})")
