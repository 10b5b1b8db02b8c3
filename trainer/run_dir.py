"""Run directories on shared and cluster filesystems: a name no other job takes, created atomically, and a lock
that holds where ``flock`` is missing (Lustre mounted without flock, NFS without a lock daemon).

Names: ``ENV_ALGO_sSEED_YYYYmmdd-HHMMSS``, plus ``_jobJOBID`` under Slurm (``_jobARRAYJOBID_TASKID`` in a job array,
Slurm's own %A_%a) so a run is found from the job that wrote it. Uniqueness itself comes from ``mkdir``, which fails
for all but one of the processes that create the same path, on NFS and Lustre too: two jobs that pick the same name
in the same second get NAME and NAME-2.

``prepare_run_dir`` creates train.py's run directory and writes its longest path there once, so that a directory
the run cannot use fails before the job starts.

Locks: ``flock`` on RUN_DIR/.lock. Where the filesystem refuses flock (ENOSYS, ENOLCK, EOPNOTSUPP), or grants it on
each node alone (Lustre mounted with ``localflock``, NFS with ``nolock`` or ``local_lock=flock|all``, as the mount's
options in /proc/self/mountinfo say: ``node_local_flock``), an exclusive lock file RUN_DIR/.lock-owner, created with
O_CREAT|O_EXCL, names the holder (host, pid, pid namespace and the process's start time) and is removed when the
holder exits. A lock file left by a process that died (killed, or
ended by an MPI abort) is taken over when that is provable, on the same host; from another host it is reported
with the holder and the command that removes it.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import platform
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

LOCK_FILE = ".lock"
OWNER_FILE = ".lock-owner"
# What flock raises where the filesystem does not support it: Lustre without -o flock (ENOSYS), NFS without a lock
# daemon (ENOLCK), some FUSE filesystems (EOPNOTSUPP).
_FLOCK_UNSUPPORTED = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})


class RunDirInUseError(ValueError):
    """Another training job holds the run directory's lock; the message says which, where that is known."""


def run_dir_name(env_id: str, algo: str, seed: int, environ: Mapping[str, str] | None = None,
                 now: float | None = None) -> str:
    """``ENV_ALGO_sSEED_YYYYmmdd-HHMMSS`` (local time ``now``, default the current time), with ``_jobID`` added
    under Slurm (SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID in a job array, else SLURM_JOB_ID; environ default
    os.environ). A namespace's slash becomes a dash (MinAtar/Breakout-v1: MinAtar-Breakout-v1_...), so that the
    run is one directory."""
    environ = os.environ if environ is None else environ
    name = f"{env_id.replace('/', '-')}_{algo}_s{seed}_{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{name}_job{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    if environ.get("SLURM_JOB_ID"):
        return f"{name}_job{environ['SLURM_JOB_ID']}"
    return name


def create_run_dir(path: Path) -> Path:
    """Create the new directory ``path``, or ``path-2``, ``path-3``, ... when that exists or another process created
    it first, and return the one created. Its parents are created as needed. OSError when it cannot be created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = path, 1
    while True:
        try:
            candidate.mkdir()  # atomic: of the processes creating one path, exactly one succeeds
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}-{n}")


def prepare_run_dir(run_dir: Path, logdir: str, new: bool) -> Path:
    """Create RUN_DIR (``new``: as a new run's directory, which create_run_dir makes unique) and write, then remove, a
    file at the longest path the run will write (its TensorBoard file), so that a directory the run cannot use fails
    now, in one line, not after start-up. What this call made is removed again on failure: a stub left behind would
    pass for a run. Returns the directory created."""
    existing = next((p for p in [run_dir, *run_dir.parents] if p.exists()), None)
    longest = run_dir / "tb" / f"events.out.tfevents.{int(time.time())}.{platform.node()}.{'0' * 10}"
    try:
        if new:
            run_dir = create_run_dir(run_dir)
            longest = run_dir / "tb" / longest.name
        new_tb = not longest.parent.exists()
        longest.parent.mkdir(parents=True, exist_ok=True)
        longest.write_text("ok")
        longest.unlink()
        if new_tb:
            longest.parent.rmdir()
    except OSError as error:
        if existing is not None and existing != run_dir:  # from the first directory this call made, down
            shutil.rmtree(next(p for p in [run_dir, *run_dir.parents] if p.parent == existing), ignore_errors=True)
        if error.errno == errno.ENAMETOOLONG:
            raise ValueError(f"--logdir {logdir}: the run's files would have paths too long for this system "
                             f"({len(str(longest.resolve()))} characters, such as {longest.name}); "
                             "choose a shorter --logdir") from None
        raise
    return run_dir


class RunDirLock:
    """The run directory's lock, held until ``release()`` or the end of the process."""

    def __init__(self, handle: IO[str] | None = None, owner_file: Path | None = None, owner: str = "") -> None:
        self._handle = handle  # the flocked file: closing it releases the lock
        self._owner_file = owner_file  # the lock file, when flock was not available
        self._owner = owner  # what this process wrote into it
        if owner_file is not None:
            atexit.register(self.release)

    @property
    def uses_lock_file(self) -> bool:
        """Whether this lock is the O_EXCL lock file (the filesystem refused flock)."""
        return self._owner_file is not None

    def release(self) -> None:
        """Release the lock; removes the lock file only while it still names this process. Idempotent."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._owner_file is not None:
            path, self._owner_file = self._owner_file, None
            atexit.unregister(self.release)
            try:
                if path.read_text() == self._owner:
                    path.unlink()
            except OSError:
                pass  # already gone


def node_local_flock(path: Path, mountinfo: str | None = None) -> str:
    """Why flock on ``path`` would hold on this node only ("nfs4 mounted with local_lock=flock", say), from the options
    of the mount that holds it in ``mountinfo`` (/proc/self/mountinfo's text when None); "" where it holds across
    nodes, or where that cannot be told."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return ""
    target, best = os.path.realpath(path), ("", "", "")
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        fields, after = fields.split(), after.split()
        if len(fields) < 6 or len(after) < 3:
            continue
        # Octal escapes in mount points: "\040" is a space.
        mount_point = fields[4].encode().decode("unicode_escape")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best[0]):
            best = (mount_point, after[0], f"{fields[5]},{after[2]}")
    _, fstype, options = best
    options = set(options.split(","))
    node_local = {"localflock"} if fstype.startswith("lustre") else (
        {"nolock", "local_lock=flock", "local_lock=all"} if fstype.startswith("nfs") else set())
    found = sorted(node_local & options)
    return f"{fstype} mounted with {found[0]}" if found else ""


def lock_run_dir(run_dir: Path, flock: Callable[[int, int], None] = fcntl.flock,
                 flock_scope: Callable[[Path], str] = node_local_flock) -> RunDirLock:
    """An exclusive lock on ``run_dir`` for this process; RunDirInUseError (a ValueError) when another job holds it.

    Two jobs writing one run directory (a --resume started while the old job still runs) would interleave
    checkpoints and logs. ``flock`` is the system call used, and ``flock_scope`` says why flock holds on this node
    only ("" where it holds everywhere): parameters, so that such filesystems can be stood in for. Where flock fails
    with ENOSYS, ENOLCK or EOPNOTSUPP the lock is the lock file RUN_DIR/.lock-owner; where it holds on this node only,
    the lock is both.
    """
    # Opened without following a link: a link planted at that name is refused, not written through.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(run_dir / LOCK_FILE, flags, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise ValueError(f"{run_dir / LOCK_FILE} is a symbolic link, which train.py does not follow: remove it "
                         "(the run's lock is a plain file)") from None
    handle = os.fdopen(fd, "a")  # kept open: closing it releases the lock
    try:
        flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RunDirInUseError(f"{run_dir} is in use by another training job; wait for it to end") from None
    except OSError as error:
        handle.close()
        if error.errno not in _FLOCK_UNSUPPORTED:
            raise
        return _lock_with_owner_file(run_dir)
    if not flock_scope(run_dir):
        return RunDirLock(handle=handle)
    try:  # a job on another node may hold the same flock: the lock file says whether one does
        return _lock_with_owner_file(run_dir, handle)
    except BaseException:
        handle.close()
        raise


def _lock_with_owner_file(run_dir: Path, handle: IO[str] | None = None) -> RunDirLock:
    """The lock as a file created with O_CREAT|O_EXCL (atomic on local filesystems, NFS v3+ and Lustre) that names
    this process, held with ``handle`` (a flocked file, where flock holds on this node only), if given; a provably
    dead holder's file is taken over (see ``_holder_has_ended``)."""
    path = run_dir / OWNER_FILE
    me = _this_process()
    for _ in range(3):  # a retry after taking over a dead holder's file, or after its holder removed it meanwhile
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = path.read_text()
            except FileNotFoundError:
                continue  # released between our create and read: try again
            if not _holder_has_ended(holder, me):
                raise RunDirInUseError(_in_use_message(run_dir, path, holder, me)) from None
            _take_over(path, holder, run_dir)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
            f.flush()
            os.fsync(f.fileno())
        return RunDirLock(handle=handle, owner_file=path, owner=me)
    raise RunDirInUseError(f"{run_dir} is in use by another training job (its lock file {path} keeps changing "
                           "hands); wait for it to end")


def _this_process() -> str:
    """One line naming this process: host, pid, pid namespace and start time (the last two tell a reused pid, or a
    container sharing the host name, from the process that wrote the line)."""
    return (f"host={socket.gethostname()} pid={os.getpid()} pidns={_pid_namespace()} "
            f"started={_start_time(os.getpid())}\n")


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:")
    except OSError:
        return "?"


def _start_time(pid: int) -> str:
    """Process ``pid``'s start time in clock ticks since boot (/proc/PID/stat field 22); FileNotFoundError when no
    such process exists."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def _holder_has_ended(holder: str, me: str) -> bool:
    """Whether the process ``holder`` names provably no longer runs: it was on this host, in this pid namespace, and
    its pid is gone or now belongs to a process started at another time. False where that cannot be told."""
    theirs, mine = _fields(holder), _fields(me)
    if not theirs.get("pid", "").isdigit() or "?" in (theirs.get("pidns"), mine["pidns"]):
        return False
    if (theirs.get("host"), theirs.get("pidns")) != (mine["host"], mine["pidns"]):
        return False
    try:
        return _start_time(int(theirs["pid"])) != theirs.get("started")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False


def _take_over(path: Path, holder: str, run_dir: Path) -> None:
    """Move the dead holder's lock file aside (rename is atomic: of several processes taking it over, one moves it)
    and remove it; if what was moved is no longer that holder's (a live process took it over first), put it back."""
    aside = path.with_name(f"{path.name}.ended-{socket.gethostname()}-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another process moved it first
    if aside.read_text() != holder:
        os.rename(aside, path)
        return
    aside.unlink()
    theirs = _fields(holder)
    print(f"run directory {run_dir}: taking over the lock left by pid {theirs['pid']} on {theirs['host']}, "
          "which has ended", file=sys.stderr, flush=True)


def _in_use_message(run_dir: Path, path: Path, holder: str, me: str) -> str:
    theirs = _fields(holder)
    if "host" not in theirs or "pid" not in theirs:
        return (f"{run_dir} is locked by {path}, which names no process (it holds {holder.strip()[:80]!r}); "
                f"if no job uses {run_dir}, remove it: rm {path}")
    where = "this host" if theirs["host"] == _fields(me)["host"] else f"host {theirs['host']}"
    return (f"{run_dir} is in use by another training job (pid {theirs['pid']} on {where}; flock on this filesystem "
            f"is missing or holds on one node only, so its lock file {path} says so); wait for it to end, or if that "
            f"job has ended, rm {path}")
