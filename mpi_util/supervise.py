"""The launching process's view of the MPI job ``mpi_fork`` started: where each rank runs, which one ended first and
how, the shared memory the ranks mapped (removed after the job), and whether this host can run that many processes.

Each rank records itself (rank, host, pid, the /dev/shm files it has mapped) in a directory the launching process
names in MPI_UTIL_JOB_DIR (rank 0 writes every rank's, for hosts that do not share it); a rank that ends through
Python or ``abort`` also leaves a note. Each rank on the launching process's host keeps a connection to it open for
its whole life, so that after the job the launching process knows which rank ended first: mpiexec itself names only
a process id ("BAD TERMINATION ... PID 11389 ... EXIT CODE: 9").
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .cpus import cpus_available
from .text import few, name_ranks

JOB_DIR_VARIABLE = "MPI_UTIL_JOB_DIR"
_SHARED_MEMORY = "/dev/shm"
# More ranks per CPU than this and the job mostly waits for the scheduler (every iteration waits for the slowest).
RANKS_PER_CPU_WARNING = 4

_recorded_rank: int | None = None
_job_dir: Path | None = None  # MPI_UTIL_JOB_DIR as this rank received it (record_rank takes it out of the environment)
_watch_connection: socket.socket | None = None  # held open for this rank's life
launcher_ended = False
"""In a rank on the launching process's host: True once that process has died before the job ended."""
WATCH_SOCKET = "watch.sock"


@dataclass(frozen=True)
class JobFailure:
    """How a job ``mpi_fork`` started ended, as its ``on_failure`` gets it."""

    returncode: int
    """The job's exit status (mpiexec's)."""
    cause: str
    """One line naming the rank that ended it and its host, e.g. "rank 3 (on host node2, pid 4242) was killed by
    signal 9 (SIGKILL)"."""
    restart: int
    """The number the restart would have: 1 for the first."""
    max_restarts: int
    """The most restarts allowed."""


def _write_json(path: Path, record: dict) -> None:
    """Write ``record`` to ``path`` whole or not at all (the reader may look at any moment)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(record))
    os.replace(partial, path)


def mapped_files() -> list[str]:
    """Paths of the files this process has mapped, in /proc/self/maps order (Linux); one unlinked since ends in
    " (deleted)". [] where /proc cannot be read."""
    try:
        with open("/proc/self/maps") as maps:
            return [fields[5].strip() for line in maps if len(fields := line.split(maxsplit=5)) == 6]
    except OSError:
        return []


def mapped_shared_memory() -> list[str]:
    """The files under /dev/shm this process has mapped and that still have a name (MPICH's, for one: it unlinks its
    windows' files at once, but the one it makes at start-up only when the job ends cleanly)."""
    return sorted({path for path in mapped_files()
                   if path.startswith(_SHARED_MEMORY + "/") and not path.endswith(" (deleted)")})


def release_own_shared_memory() -> list[str]:
    """In a process that started MPI alone (no launcher: a one-process run, or mpi_fork's launching process), unlink
    the /dev/shm file its MPI made for it at start-up; mapped, it stays usable, and no other process attaches to it.
    Else it outlives the process: MPICH's (1 MB) when the process is killed, Open MPI 5's (16 MB) at every exit.
    Returns the paths removed."""
    return _unlink_mapped(("mpich_shm_", "sm_segment."))


def release_start_up_shared_memory() -> list[str]:
    """In a rank of an MPICH job, once every rank is past MPI's start-up (init: after a barrier) or when the job is
    ending (abort): unlink the /dev/shm files MPICH made at start-up for this host's ranks. Each rank has them mapped,
    so they stay usable, and no process attaches to them later; MPICH removes them only when the job ends cleanly, so
    a job that aborted, or one of whose ranks was killed, left them (about 1 MB per rank) on every host, where no
    launcher reaches them. Not Open MPI's, which its ranks may map from each other after start-up. Returns the paths
    removed: the first rank of a host to get there removes them."""
    return _unlink_mapped(("mpich_shm_",))


def _unlink_mapped(prefixes: tuple[str, ...]) -> list[str]:
    """Unlink the /dev/shm files this process maps whose names start with one of ``prefixes``; returns those
    removed (another process may have removed one first)."""
    removed = []
    for path in mapped_shared_memory():
        if os.path.basename(path).startswith(prefixes):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def record_rank(rank: int, gather: Callable[[dict], list[dict] | None] | None = None) -> None:
    """In a rank that mpi_fork started: record (rank, host, pid, mapped /dev/shm files) for the launching process,
    and note at exit that this rank ended through Python. ``gather`` (every rank's record to rank 0; a collective,
    so every rank passes one or none does) lets rank 0 write the others' records too, for ranks on hosts that do
    not share the directory. Does nothing outside such a job; a rank that cannot write the directory is skipped."""
    global _recorded_rank, _job_dir
    # Taken out of the environment, so that a process this rank starts (a script of the user's that uses mpi_util)
    # does not take itself for this rank and report to the launching process as one.
    directory = os.environ.pop(JOB_DIR_VARIABLE, None)
    if not directory or _recorded_rank is not None:
        return
    _job_dir = Path(directory)
    ours = job_dir_is_ours(Path(directory))  # may differ from host to host; the gather below is every rank's
    mine = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "shm": mapped_shared_memory()}
    try:
        if ours:
            _write_json(Path(directory) / f"rank_{rank}.json", mine)
            _recorded_rank = rank
            atexit.register(note_exit, "exited")
            _connect_to_watch(Path(directory) / WATCH_SOCKET, rank)
    except OSError:
        pass  # another host, without this directory: rank 0 writes this record
    everyone = gather(mine) if gather is not None else None
    for record in everyone if ours and everyone else []:
        if record["rank"] != rank:
            try:
                _write_json(Path(directory) / f"rank_{record['rank']}.json", record)
            except OSError:
                return


def job_dir_is_ours(path: Path) -> bool:
    """Whether ``path``, MPI_UTIL_JOB_DIR as this rank received it, is a directory the launching process could have
    made: not a link, owned by this user, open to nobody else (mode 0700, as mkdtemp makes it). The same path is named
    on every host, and on a host that does not share the launching one's /tmp another user may have made it first to
    receive the ranks' records and their connection (whose closing makes a rank stop and remove the directory): a
    rank uses it only when this holds, and otherwise leaves it alone, as it does where the path is missing."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 == 0


def _connect_to_watch(path: Path, rank: int) -> None:
    """Connect to the launching process's watch socket and say which rank this is; the connection stays open for
    as long as this process lives, and its closing tells the launching process that the rank has ended. It tells this
    rank, too, when the launching process has ended (see _wait_for_launcher_end)."""
    global _watch_connection
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(path))
        connection.sendall(f"{rank}\n".encode())
    except OSError:
        connection.close()
        return
    _watch_connection = connection
    threading.Thread(target=_wait_for_launcher_end, args=(connection,), name="mpi_util-launcher-watch",
                     daemon=True).start()


def _wait_for_launcher_end(connection: socket.socket) -> None:
    """Until the launching process closes its end (it never writes): then it has died (SIGKILL, the OOM killer; a
    launching process that ends normally waits for the job first). Its job goes on without it under mpiexec, so this
    rank asks itself to stop as a scheduler would, with SIGTERM (a rank with a stop handler, like train.py's, ends
    with a checkpoint; one without ends at once), and cleans up at its end what the launching process would have."""
    global launcher_ended
    try:
        while connection.recv(64):
            pass
    except OSError:
        return  # this rank closed it: it is ending
    launcher_ended = True
    os.kill(os.getpid(), signal.SIGTERM)


def _clean_up_for_the_ended_launcher() -> None:
    """The launching process has died, so nothing removes the job's records or the /dev/shm files MPI made for this
    host's ranks: each rank removes what it can as it ends (the files it has mapped stay usable by the others)."""
    for path in mapped_shared_memory():
        try:
            os.unlink(path)
        except OSError:
            pass
    if _job_dir is not None:
        shutil.rmtree(_job_dir, ignore_errors=True)


def note_exit(how: str, late_ranks: Sequence[int] = ()) -> None:
    """In a recorded rank: note that it ends by itself (``how``: "exited" or "aborted"), so that the launching
    process does not take it for killed. Best effort."""
    if _job_dir is None or _recorded_rank is None:
        return
    if launcher_ended:
        _clean_up_for_the_ended_launcher()
        return
    try:
        _write_json(_job_dir / f"ended_{_recorded_rank}.json",
                    {"how": how, "time": time.time(), "late_ranks": list(late_ranks)})
    except OSError:
        pass


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _signal_in_status(returncode: int) -> int | None:
    """The signal a launcher's exit status reports for a killed rank: MPICH's hydra exits with the signal's number,
    other launchers (and shells) with 128 + the number."""
    if 128 < returncode < 128 + signal.NSIG:
        return returncode - 128
    if 0 < returncode < signal.NSIG:
        return returncode
    return None


class JobWatch:
    """The launching process's side of one job: a directory for the ranks' records (its path goes to the ranks in
    MPI_UTIL_JOB_DIR), a thread that learns which rank on this host ends first, and what to say and clean up after.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.host = socket.gethostname()
        self.directory = Path(tempfile.mkdtemp(prefix="mpi_util_job_"))
        self._shared_before = self._shared_memory_names()
        self.ended_first: int | None = None
        """The rank on this host seen to end first."""
        self._wake_read, self._wake_write = os.pipe()
        self._thread: threading.Thread | None = None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.directory / WATCH_SOCKET))
            listener.listen(max(n, 16))
        except OSError:  # a TMPDIR path too long for a socket's name, say: the ranks are then not named
            listener.close()
            return
        self._thread = threading.Thread(target=self._watch, args=(listener,), name="mpi_util-job-watch", daemon=True)
        self._thread.start()

    @staticmethod
    def _shared_memory_names() -> set[str]:
        try:
            return set(os.listdir(_SHARED_MEMORY))
        except OSError:
            return set()

    def ranks(self) -> dict[int, dict]:
        """What each rank recorded so far, by rank: {"rank", "host", "pid", "shm"}."""
        found = {}
        for path in self.directory.glob("rank_*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            found[int(record["rank"])] = record
        return found

    def _notes(self) -> dict[int, dict]:
        notes = {}
        for path in self.directory.glob("ended_*.json"):
            try:
                notes[int(path.stem.split("_")[1])] = json.loads(path.read_text())
            except (OSError, ValueError, IndexError):
                continue
        return notes

    def _watch(self, listener: socket.socket) -> None:
        """Until told to stop: accept each local rank's connection (its rank number comes first) and note the
        first to close. A rank's sockets close as it dies, before the launcher can learn of it (the launcher learns
        from its pipes and sockets closing) and kill the others, so the first to close is the rank that ended first.
        On Linux the selector is epoll, which hands back ready connections in the order they became ready: the first
        is known even when this thread wakes only after the launcher has killed the others (a loaded machine)."""
        ranks: dict[socket.socket, int | None] = {}  # each rank's connection, and its rank once it has said it
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._wake_read, selectors.EVENT_READ)
            selector.register(listener, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj == self._wake_read:
                        return
                    if key.fileobj is listener:
                        connection, _ = listener.accept()
                        ranks[connection] = None
                        selector.register(connection, selectors.EVENT_READ)
                        continue
                    connection = key.fileobj
                    data = connection.recv(64)
                    if data:
                        ranks[connection] = int(data.split(b"\n")[0])
                        continue
                    selector.unregister(connection)
                    rank = ranks.pop(connection)
                    connection.close()
                    if rank is not None and self.ended_first is None:
                        self.ended_first = rank
                        # The others' connections stay open until the job has ended: a rank takes its connection
                        # closing for this process's death.
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            listener.close()
            for connection in ranks:
                connection.close()

    def stop(self) -> None:
        """The job has ended: stop watching (again: nothing)."""
        if self._wake_write < 0:
            return
        os.write(self._wake_write, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(self._wake_read)
        os.close(self._wake_write)
        self._wake_write = -1

    def _where(self, ranks: list[int], records: dict[int, dict]) -> str:
        """"rank 3 (on host node2, pid 4242)", for one rank or a few (each list cut short by text.few)."""
        names = few(ranks)
        hosts = sorted({records[r]["host"] for r in ranks if r in records})
        pids = [records[r]["pid"] for r in ranks if r in records]
        place = f"on host {few(hosts)}" if hosts else "host unknown"
        return f"rank {names} ({place}, pid {few(pids)})" if pids else f"rank {names} ({place})"

    def describe_failure(self, returncode: int) -> str:
        """One line on how the job ended with ``returncode`` != 0, naming the rank that ended it and its host where
        it can be told."""
        records, notes = self.ranks(), self._notes()
        aborted = sorted((note["time"], rank) for rank, note in notes.items() if note.get("how") == "aborted")
        if aborted:
            by = aborted[0][1]
            late = [int(r) for r in notes[by].get("late_ranks", [])]
            if late:  # the rank that ended the job did so because these stopped making progress: they come first
                return (f"{self._where(late, records)} stopped making progress, and {name_ranks([by])} "
                        f"ended the job (exit status {returncode})")
            return f"{self._where([by], records)} aborted the job (exit status {returncode})"
        first = self.ended_first
        elsewhere = sorted({record["host"] for record in records.values() if record["host"] != self.host})
        unrecorded = sorted(set(range(self.n)) - set(records))
        they = "they" if len(unrecorded) > 1 else "it"
        # mpiexec kills the other ranks (SIGKILL) once one has ended: this host's first may be a rank killed so.
        far = few(f"rank {r} on {record['host']} pid {record['pid']}" for r, record in sorted(records.items())
                  if record["host"] != self.host)
        caveat = (f"; ranks on other hosts cannot be watched from here and may have ended first ({far}; mpiexec "
                  "names the process id that ended first)" if elsewhere else
                  f"; {name_ranks(unrecorded)} did not say where {they} ran (another host without a shared filesystem, "
                  f"or {they} ended before calling mpi_fork)" if unrecorded else "")
        if first is not None:
            signum = _signal_in_status(returncode)
            if first in notes:
                how = f"exited first (exit status {returncode})"
            elif signum is not None:
                how = f"was killed by signal {signum} ({_signal_name(signum)})"
            else:
                how = f"ended abruptly, not through Python (mpiexec's exit status {returncode} names no signal)"
            return f"{self._where([first], records)} {how}{caveat}"
        return f"the job ended with exit status {returncode}{caveat}"

    def remove_shared_memory(self) -> list[str]:
        """Remove the /dev/shm files that ranks on this host mapped and that the job created (not there before it
        started): MPICH leaves one (about 1 MB per rank) whenever a job ends abnormally. Returns what was removed."""
        removed = []
        for record in self.ranks().values():
            if record["host"] != self.host:
                continue
            for path in record["shm"]:
                if os.path.dirname(path) != _SHARED_MEMORY or os.path.basename(path) in self._shared_before:
                    continue
                try:
                    os.unlink(path)
                    removed.append(path)
                except OSError:
                    pass  # removed already (a clean end), or not ours to remove
        return removed

    def close(self) -> None:
        """Remove the records' directory."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _tasks_of_user(uid: int) -> int:
    """Processes and threads this real user id runs now (what RLIMIT_NPROC counts), from /proc; 0 where unreadable."""
    count = 0
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


# Tasks (processes and threads: what RLIMIT_NPROC and a cgroup's pids.max count) that a job of n ranks adds, as
# measured with `train.py CartPole-v1 --nprocs 3` under MPICH (Threads in /proc/PID/status): each worker rank 3 (its
# main thread, MPI's "async" progress thread and the thread that watches for the launching process's end; BLAS and
# OpenMP get one thread there), rank 0 8 (TensorFlow's graph runner and two compute threads, another Python thread and
# the stop notice's, on top), mpiexec 1, its hydra_pmi_proxy 1 and the launching process 3 (its job-watch thread).
# Rank 0 is budgeted 2 more: TensorFlow on another machine, or a GPU's query, may start a few more.
TASKS_PER_WORKER = 3
TASKS_OF_RANK0 = 10
TASKS_OF_LAUNCHER = 3


def tasks_of_job(n: int) -> int:
    """The tasks (processes and threads) a job of ``n`` ranks adds to this host, launcher included."""
    return TASKS_OF_RANK0 + TASKS_PER_WORKER * (n - 1) + TASKS_OF_LAUNCHER


def _ranks_that_fit(tasks: int) -> int:
    """The most ranks a job may have when ``tasks`` more tasks may start (0: not even one)."""
    spare = tasks - TASKS_OF_RANK0 - TASKS_OF_LAUNCHER
    return spare // TASKS_PER_WORKER + 1 if spare >= 0 else 0


def _advice(tasks: int) -> str:
    """What to do when only ``tasks`` more tasks may start."""
    fit = _ranks_that_fit(tasks)
    return f"ask for at most {fit}, or raise the limit" if fit >= 2 else "raise the limit"


_CGROUP_MOUNT = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    """The number in ``path``; None where it is missing, unreadable or says "max" (no limit)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def cgroup_pids_limits() -> list[tuple[Path, int, int]]:
    """Each cgroup pids limit that holds this process: (the cgroup's directory, pids.max, pids.current) for its own
    cgroup and each parent that sets one (a parent's limit counts its children's tasks too), under cgroup v1 (the
    pids hierarchy) and v2 (mounted at /sys/fs/cgroup, or at /sys/fs/cgroup/unified beside v1). [] where none is set
    or /proc and /sys cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    hierarchies = []  # (mount point, this process's cgroup path in it)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # the v2 line, "0::/path"
            hierarchies += [(_CGROUP_MOUNT, path), (_CGROUP_MOUNT / "unified", path)]
        elif "pids" in controllers.split(","):
            hierarchies.append((_CGROUP_MOUNT / controllers, path))
    limits = []
    for mount, path in hierarchies:
        directory = mount / path.lstrip("/")
        while True:
            limit, current = _read_int(directory / "pids.max"), _read_int(directory / "pids.current")
            if limit is not None and current is not None:
                limits.append((directory, limit, current))
            if directory == mount:
                break
            directory = directory.parent
    return limits


def check_process_room(n: int) -> None:
    """ValueError with a one-line reason when a job of ``n`` ranks does not fit this process's limits: the cgroup
    pids limits that hold it (containers, systemd and batch schedulers set one) and this user's RLIMIT_NPROC
    (``ulimit -u``). Beyond either, mpiexec fails part-way with pages of launcher errors. Each rank counts with its
    threads (``tasks_of_job``). Root is not held to RLIMIT_NPROC by the kernel, but a request beyond it is refused
    all the same; a cgroup holds root too."""
    needed = tasks_of_job(n)
    for directory, limit, current in cgroup_pids_limits():
        if needed > limit - current:
            raise ValueError(f"{n} processes requested, but {directory / 'pids.max'} allows {limit} tasks, {current} "
                             f"in use, and each process takes {TASKS_PER_WORKER} or more (its threads): "
                             f"{_advice(limit - current)}")
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return
    if n > soft:
        raise ValueError(f"{n} processes requested, but this user may run at most {soft} (ulimit -u): ask for at "
                         f"most {soft}, or raise the limit")
    if os.geteuid() != 0:
        running = _tasks_of_user(os.getuid())
        if running + needed > soft:
            raise ValueError(f"{n} processes requested, but this user may run at most {soft} tasks (ulimit -u) and "
                             f"runs {running} already, and each process takes {TASKS_PER_WORKER} or more (its "
                             f"threads): {_advice(soft - running)}")


def oversubscription_warning(n: int) -> str | None:
    """A one-line warning when ``n`` ranks exceed RANKS_PER_CPU_WARNING per CPU this process may use (its affinity
    capped by its cgroup quota), else None."""
    cpus = cpus_available()
    if n <= RANKS_PER_CPU_WARNING * cpus:
        return None
    return (f"mpi_util: warning: {n} processes on {cpus} CPU{'s' if cpus > 1 else ''} (more than "
            f"{RANKS_PER_CPU_WARNING} per CPU): each waits its turn for a CPU and every iteration waits for the "
            f"slowest; fewer processes are likely faster")
