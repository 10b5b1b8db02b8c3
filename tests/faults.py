"""Fault injection: kill, interrupt and corrupt a real 3-rank training run at random points, resume it, and check
that it ends exactly where an undisturbed run with the same seed ends.

What it does:

1. A reference run, undisturbed: ``train.py Pendulum-v1 --nprocs 3 --batch_size 1536 --total_steps 8*1536
   --checkpoint_every 1 --seed S`` (8 iterations). Its final checkpoint (counters, weights and normalizers,
   optimizer, learner and per-rank RNG and env state) and its progress.csv are the reference.
2. ``--trials`` trials (default 20), each with a fresh run directory and the same training seed. A trial starts the
   same run as its own session, waits (polling progress.csv, under a deadline) until a random iteration T in
   2..7 is logged, waits a random 0-1 s more, and injects one fault. Iterations after the first take 0.3-1.5 s, so
   the fault lands in iteration T+1 to T+3, or after the last one (final checkpoint, plot, shutdown); each fault
   is reported with the iteration that was the last logged when it struck. The faults:

   - ``kill_rank``: SIGKILL one rank (0, 1 or 2, at random; found as a descendant of the launcher with PMI_RANK set);
   - ``kill_tree``: SIGKILL every process of the job at once (launcher, mpiexec, proxy, ranks), as a machine crash;
   - ``kill_launcher_group``: SIGKILL the process group of the launching ``train.py`` (mpiexec runs in a session of
     its own, so this kills the launcher only; the ranks see its end and stop on their own, with a checkpoint);
   - ``sigint`` / ``sigterm``: the signal to the launching ``train.py``, as Ctrl-C or a scheduler's preemption;
   - ``corrupt_after_kill``: ``kill_rank`` or ``kill_tree``, then the newest checkpoint is truncated at a random byte
     or has 1-8 random bytes flipped.

   Then it runs ``train.py --resume RUN_DIR --nprocs 3`` until the run has spent its budget (a SIGINT/SIGTERM stop
   exits 0 before the budget, so it is resumed again). With probability 0.25 the first resume gets a second fault, of
   any kind, aimed at 1 or 2 iterations after the one it resumed from (skipped when that is past iteration 7).
   Every fault kind is the first fault of about the same number of trials (the kinds are dealt round-robin, then
   shuffled by ``--seed``).
3. Every launch is bounded in time (a hang is a failure and the job is killed). After each trial it checks:

   - every launcher exit status is the one the fault calls for (nonzero after a kill; 0 and "stopped by signal N"
     with a checkpoint of the last logged iteration after SIGINT/SIGTERM; 0 for an undisturbed resume);
   - no process is left: every process ever seen in the job's tree is gone, and ``pgrep -f TRIAL_DIR`` finds nothing
     (checked after every launch; the time from the launcher's exit to the last process gone is reported);
   - after a corruption the resume printed ``skipping ... ckpt_X.npz is truncated or corrupted`` and resumed from the
     next older checkpoint;
   - the final checkpoint's counters (iteration, steps, episodes) equal the reference's, and every ``ac_state`` array
     (weights, observation and return normalizers) is bit-identical to the reference's;
   - also (reported separately, a failure too): the rest of the checkpoint (optimizer, RNG and env state of every
     rank) is identical, and progress.csv equals the reference's apart from timing columns.

Run from the repository root (about 16 minutes for 20 trials on 2 cores; every launch pays ~20 s of start-up)::

    .venv/bin/python tests/faults.py                    # --trials 3 for a smoke test

It prints one line per trial and a summary, writes ``trials.csv`` and ``results.md`` (table, command, machine, date,
total wall time, failures with the tail of their output) to ``benchmarks/results/faults/`` (``--out``), and exits 1
if any trial failed. Run directories go to a temporary directory, removed at the end unless ``--keep_runs`` (the
directories of failed trials are kept and named in the output).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import math
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import trainer.checkpoint as CHECKPOINT
from envs.snapshot import restore_env
from trainer.versions import stack_versions

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "train.py"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "faults"

ENV_ID = "Pendulum-v1"
NPROCS = 3
BATCH_SIZE = 1536
FAULT_KINDS = ("kill_rank", "kill_tree", "kill_launcher_group", "sigint", "sigterm", "corrupt_after_kill")
SECOND_FAULT_PROBABILITY = 0.25
MAX_LAUNCHES = 6  # per trial: the first run, resumes after faults, a resume after a second fault, spare
MAX_DELAY_S = 1.0  # after the target iteration is logged, wait up to this long more (about one iteration)
LAUNCH_TIMEOUT_S = 300.0  # one launch, start to exit; an undisturbed full run takes ~40 s on 2 cores
GONE_TIMEOUT_S = 90.0  # from the launcher's exit until every process of the job must be gone
POLL_S = 0.2
# Columns of progress.csv that depend on the wall clock; every other value must equal the reference's.
TIMING_COLUMNS = {"steps_per_s", "wall_s", "t_rollout", "t_gather", "t_update", "t_bcast"}
CODE_GLOBS = ("train.py", "algos/*.py", "mpi_util/*.py")




# ----------------------------------------------------------------------------------------------------------------
# Processes, read from /proc.
# ----------------------------------------------------------------------------------------------------------------


def proc_stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start time in clock ticks) of ``pid``; None when it does not exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()
    return int(rest[1]), rest[0], int(rest[19])


def process_table() -> dict[int, tuple[int, str, int]]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            table[int(entry)] = stat
    return table


def descendants(root: int, table: dict[int, tuple[int, str, int]]) -> list[int]:
    """``root`` and every process below it, parents first."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, queue = [], [root] if root in table else []
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(sorted(children.get(pid, [])))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def mpi_rank_of(pid: int) -> int | None:
    """The PMI_RANK mpiexec gave ``pid``, None for processes that are not ranks."""
    try:
        variables = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for variable in variables:
        if variable.startswith(b"PMI_RANK="):
            return int(variable.split(b"=", 1)[1])
    return None


def pgrep(pattern: str) -> list[int]:
    result = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, timeout=30)
    return [int(pid) for pid in result.stdout.split()]


class Tracker:
    """Every process seen in a launcher's tree (by pid and start time, so a reused pid is not mistaken for one)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, int] = {}

    def scan(self) -> dict[int, tuple[int, str, int]]:
        table = process_table()
        for pid in descendants(self.root, table):
            self.seen.setdefault(pid, table[pid][2])
        return table

    def alive(self) -> list[int]:
        """Seen processes still running (zombies count as gone: they hold no resources but a pid)."""
        left = []
        for pid, started in self.seen.items():
            stat = proc_stat(pid)
            if stat is not None and stat[2] == started and stat[1] not in "ZX":
                left.append(pid)
        return left

    def ranks(self) -> dict[int, int]:
        """MPI rank -> pid, for the ranks now running in the tree."""
        table = self.scan()
        found = {}
        for pid in descendants(self.root, table):
            rank = mpi_rank_of(pid)
            if rank is not None and "train.py" in cmdline(pid):
                found[rank] = pid
        return found


def kill_quietly(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ----------------------------------------------------------------------------------------------------------------
# Run directories.
# ----------------------------------------------------------------------------------------------------------------


def logged_iterations(run_dir: Path) -> int:
    """The highest iteration in progress.csv (0 when none); tolerates a half-written last line."""
    try:
        lines = (run_dir / "progress.csv").read_text().splitlines()[1:]
    except OSError:
        return 0
    best = 0
    for line in lines:
        head = line.split(",", 1)[0]
        if head.isdigit():
            best = max(best, int(head))
    return best


def read_progress(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "progress.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in csv.DictReader(f)]


def checkpoint_names(run_dir: Path) -> list[str]:
    return [p.name for p in CHECKPOINT.list_checkpoints(run_dir / "checkpoints")]


def latest_state(run_dir: Path) -> tuple[str, dict[str, Any]]:
    path, state, _ = CHECKPOINT.load_latest_checkpoint(run_dir / "checkpoints")
    return path.name, state


def same_value(a: Any, b: Any, depth: int = 0) -> bool:
    """Deep equality: numpy arrays and scalars bit for bit (dtype, shape, bytes), floats by value (NaN == NaN),
    numpy Generators by state, other objects by type and attributes."""
    if depth > 50:
        raise RecursionError("objects nested more than 50 deep")
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        return (type(a) is type(b) and np.asarray(a).dtype == np.asarray(b).dtype
                and np.shape(a) == np.shape(b) and np.asarray(a).tobytes() == np.asarray(b).tobytes())
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y, depth + 1) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, (str, bytes, int, bool, type(None))):
        return a == b
    if isinstance(a, np.random.Generator):
        return same_value(a.bit_generator.state, b.bit_generator.state, depth + 1)
    if hasattr(a, "__dict__"):
        return same_value(vars(a), vars(b), depth + 1)
    return bool(a == b)


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint with every rank's saved environment restored: two snapshots of the same environment may
    differ in bytes (which equal strings pickle shares), not in what they hold."""
    ranks = [dict(r, envs=[restore_env(blob.data) for blob in r["envs"]]) if isinstance(r, dict) and "envs" in r else r
             for r in state.get("ranks") or []]
    return dict(state, ranks=ranks)


def entries_that_differ(state: dict[str, Any], reference: dict[str, Any], ignored: tuple[str, ...]) -> list[str]:
    """The entries of checkpoint ``state`` that differ from ``reference``'s, less ``ignored`` (an entry in one only
    differs); every rank's saved environments compared by what they hold (comparable)."""
    mine, theirs = comparable(state), comparable(reference)
    return [key for key in sorted(set(mine) | set(theirs))
            if key not in ignored and not same_value(mine.get(key), theirs.get(key))]


def code_digest() -> str:
    """SHA-256 of the code a run executes: another engineer editing it mid-run would explain a mismatch."""
    digest = hashlib.sha256()
    for pattern in CODE_GLOBS:
        for path in sorted(REPO.glob(pattern)):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


@dataclass
class Reference:
    run_dir: Path
    checkpoint: str
    state: dict[str, Any]
    progress: list[dict[str, str]]
    wall_s: float
    code: str  # code_digest() when the reference started


# ----------------------------------------------------------------------------------------------------------------
# Launches and faults.
# ----------------------------------------------------------------------------------------------------------------


def train_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")


@dataclass
class Launch:
    """One ``train.py`` process (the launcher) and the MPI job under it."""

    label: str
    argv: list[str]
    out: Path
    err: Path
    proc: subprocess.Popen
    tracker: Tracker
    started: float
    fault: str = ""
    expected: str = "0"  # "0", "nonzero", or "any" (a fault that landed after the run ended)
    returncode: int | None = None
    wall_s: float = 0.0
    linger_s: float = 0.0

    @classmethod
    def start(cls, label: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Launch:
        """``argv`` as its own session, its output in LOG_DIR/LABEL.out and .err; ``env`` added to train_env()."""
        out, err = log_dir / f"{label}.out", log_dir / f"{label}.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            proc = subprocess.Popen(argv, cwd=REPO, env={**train_env(), **(env or {})}, stdout=stdout, stderr=stderr,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        launch = cls(label, argv, out, err, proc, Tracker(proc.pid), time.monotonic())
        launch.tracker.scan()
        return launch

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def deadline(self) -> float:
        return self.started + LAUNCH_TIMEOUT_S

    def wait_for(self, condition: Callable[[], bool]) -> bool:
        """Poll until ``condition`` holds (True), the launcher exits or the deadline passes (False)."""
        while True:
            self.tracker.scan()
            if condition():
                return True
            if self.proc.poll() is not None or time.monotonic() > self.deadline():
                return condition()
            time.sleep(POLL_S)

    def wait_for_text(self, *needles: str) -> bool:
        return self.wait_for(lambda: all(needle in self.stdout() for needle in needles))

    def wait_for_iteration(self, run_dir: Path, iteration: int) -> bool:
        return self.wait_for(lambda: logged_iterations(run_dir) >= iteration)

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and self.proc.poll() is None:
            self.tracker.scan()
            time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))

    def finish(self, trial_dir: Path) -> list[str]:
        """Wait (bounded) for the launcher to exit and every process of the job to be gone; problems found."""
        problems = []
        while self.proc.poll() is None and time.monotonic() < self.deadline():
            self.tracker.scan()
            time.sleep(POLL_S)
        if self.proc.poll() is None:
            left = self.tracker.alive()
            problems.append(f"{self.label}: HANG, still running {LAUNCH_TIMEOUT_S:.0f} s after its start; "
                            f"killed: {[cmdline(pid)[:80] for pid in left]}")
            kill_quietly(left)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.returncode = self.proc.wait(timeout=30)
        exited = time.monotonic()
        self.wall_s = exited - self.started
        pattern = str(trial_dir)
        while True:
            left = sorted(set(self.tracker.alive()) | set(pgrep(pattern)))
            if not left or time.monotonic() - exited > GONE_TIMEOUT_S:
                break
            time.sleep(POLL_S)
        self.linger_s = time.monotonic() - exited
        if left:
            problems.append(f"{self.label}: ORPHANS {GONE_TIMEOUT_S:.0f} s after the launcher exited: "
                            + "; ".join(f"{pid} {cmdline(pid)[:100]}" for pid in left))
            kill_quietly(left)
        ok = {"0": self.returncode == 0, "nonzero": self.returncode != 0, "any": True}[self.expected]
        if not ok:
            out = [line.strip() for line in self.stdout().splitlines() if line.strip().strip("=")]
            after_done = " (the run had printed 'done:': the fault reached it while its processes shut down)" \
                if any(line.startswith("done:") for line in out) else ""
            problems.append(f"{self.label}: exit status {self.returncode}, expected {self.expected} "
                            f"(fault: {self.fault or 'none'}){after_done}; its output ends {out[-4:]}")
        return problems


def corrupt(path: Path, rng: random.Random) -> str:
    """Truncate ``path`` at a random byte or flip 1-8 random bytes of it; a description of what was done."""
    data = bytearray(path.read_bytes())
    if rng.random() < 0.5:
        keep = rng.randrange(len(data))
        path.write_bytes(bytes(data[:keep]))
        return f"truncated {path.name} to {keep} of {len(data)} bytes"
    offsets = sorted(rng.sample(range(len(data)), rng.randint(1, 8)))
    for offset in offsets:
        data[offset] ^= rng.randint(1, 255)
    path.write_bytes(bytes(data))
    return f"flipped {len(offsets)} byte(s) of {path.name} at {offsets}"


def inject(kind: str, launch: Launch, rng: random.Random) -> str:
    """Send the fault ``kind`` to the running job (the corruption comes later); a description."""
    if kind in ("kill_rank", "corrupt_after_kill") and (kind == "kill_rank" or rng.random() < 0.5):
        ranks = launch.tracker.ranks()
        if not ranks:
            return "no rank process found"
        rank = rng.choice(sorted(ranks))
        os.kill(ranks[rank], signal.SIGKILL)
        return f"SIGKILL rank {rank}"
    if kind in ("kill_tree", "corrupt_after_kill"):
        launch.tracker.scan()
        job = launch.tracker.alive()
        kill_quietly(job)
        return f"SIGKILL all {len(job)} processes"
    if kind == "kill_launcher_group":
        os.killpg(launch.proc.pid, signal.SIGKILL)
        return "SIGKILL launcher's group"
    signum = signal.SIGINT if kind == "sigint" else signal.SIGTERM
    os.kill(launch.proc.pid, signum)
    return f"{signum.name} to launcher"


# ----------------------------------------------------------------------------------------------------------------
# Trials.
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TrialResult:
    index: int
    kind: str
    faults: list[str] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    counters: list[int] = field(default_factory=list)
    counters_ok: bool = False
    weights_ok: bool = False
    rest_ok: bool = False
    progress_ok: bool = False
    injected: int = 0
    corruptions: int = 0
    corruption_checked: int = 0
    stale_temp_files: int = 0
    code_changed: bool = False
    wall_s: float = 0.0
    run_dir: Path | None = None

    @property
    def passed(self) -> bool:
        return not self.problems

    def fault_text(self) -> str:
        return "; ".join(self.faults) or "none"


def run_trial(index: int, kind: str, rng: random.Random, work: Path, iterations: int, seed: int,
              reference: Reference) -> TrialResult:
    started = time.monotonic()
    code_before = code_digest()
    result = TrialResult(index, kind)
    trial_dir = work / f"trial_{index:02d}"
    trial_dir.mkdir(parents=True)
    total_steps = iterations * BATCH_SIZE
    run_dir: Path | None = None
    corrupted: tuple[str, str] | None = None  # (bad checkpoint, the one the resume must use)
    done = False
    for n in range(MAX_LAUNCHES):
        if n == 0:
            argv = [sys.executable, str(TRAIN), ENV_ID, "--nprocs", str(NPROCS), "--batch_size", str(BATCH_SIZE),
                    "--total_steps", str(total_steps), "--checkpoint_every", "1", "--seed", str(seed),
                    "--logdir", str(trial_dir / "runs")]
            fault = kind
        else:
            assert run_dir is not None
            argv = [sys.executable, str(TRAIN), "--resume", str(run_dir), "--nprocs", str(NPROCS)]
            fault = rng.choice(FAULT_KINDS) if n == 1 and rng.random() < SECOND_FAULT_PROBABILITY else ""
        launch = Launch.start(f"launch{n}_{'start' if n == 0 else 'resume'}", argv, trial_dir)
        result.launches.append(launch)
        try:
            # The iteration to strike at: after the first checkpoint exists (row k logged means ckpt k-1 is
            # complete), two of them for a corruption, and before the budget ends.
            first = 0
            if n == 0:
                launch.wait_for_text(" budget ")
                found = sorted((trial_dir / "runs").glob("*/config.json"))
                run_dir = found[0].parent if found else None
            else:
                launch.wait_for_text("resuming", " budget ")
                text = launch.stdout()
                marker = text.find(": iteration ")
                first = int(text[marker + 12 :].split(",", 1)[0]) if marker >= 0 else iterations
            low = first + (3 if fault == "corrupt_after_kill" and n == 0 else 1 if n else 2)
            if fault and run_dir is not None and low <= iterations - 1:
                target = rng.randint(low, min(low + 1, iterations - 1)) if n else rng.randint(low, iterations - 1)
                delay = rng.uniform(0.0, MAX_DELAY_S)
                launch.wait_for_iteration(run_dir, target)
                launch.sleep(delay)
                if launch.proc.poll() is None and time.monotonic() < launch.deadline():
                    at = logged_iterations(run_dir)
                    what = inject(fault, launch, rng)
                    launch.fault = fault
                    launch.expected = "0" if fault in ("sigint", "sigterm") else "nonzero"
                    result.injected += 1
                    result.faults.append(f"{what} ({fault}) with iter {at} logged "
                                         f"(aimed: iter {target} + {delay:.2f} s)")
                else:
                    result.faults.append(f"{fault}: run ended before iter {target}; not injected")
            elif fault:
                result.faults.append(f"{fault}: skipped (resumed at iter {first}, too late to strike)")
        finally:
            result.problems += launch.finish(trial_dir)
        if run_dir is None:
            result.problems.append(f"{launch.label}: no run directory appeared")
            break
        out = launch.stdout()
        if corrupted is not None:  # this launch resumed after a corruption
            bad, good = corrupted
            warned = "skipping" in out and bad in out and ("truncated or corrupted" in out or "bad header" in out)
            if not warned or f"from {good}:" not in out:
                said = [line for line in out.splitlines() if "skipping" in line or "resuming" in line]
                result.problems.append(f"{launch.label}: after corrupting {bad} expected a 'skipping ... {bad} is "
                                       f"truncated or corrupted' warning and a resume from {good}; it said {said}")
            result.corruption_checked += 1
            corrupted = None
        if launch.fault in ("sigint", "sigterm") and launch.returncode == 0:
            signum = int(signal.SIGINT if launch.fault == "sigint" else signal.SIGTERM)
            newest = checkpoint_names(run_dir)[-1] if checkpoint_names(run_dir) else "none"
            logged = logged_iterations(run_dir)
            # A signal that lands after the last iteration is ignored by design (training is over): then the run
            # ends at its budget with "done:" and no "stopped by signal".
            finished_anyway = f"done: {total_steps} steps" in out
            if f"stopped by signal {signum}" not in out and not finished_anyway:
                result.problems.append(f"{launch.label}: no 'stopped by signal {signum}' in its output")
            if newest != f"ckpt_{logged:08d}.npz":
                result.problems.append(f"{launch.label}: stopped with iteration {logged} logged but the newest "
                                       f"checkpoint is {newest}")
        if launch.fault == "corrupt_after_kill":
            names = checkpoint_names(run_dir)
            if len(names) >= 2:
                result.faults[-1] += "; " + corrupt(run_dir / "checkpoints" / names[-1], rng)
                result.corruptions += 1
                corrupted = (names[-1], names[-2])
            else:
                result.faults[-1] += f"; not corrupted: only {names}"
        try:
            _, state = latest_state(run_dir)
            done = launch.returncode == 0 and int(state["counters"][1]) >= total_steps
        except CHECKPOINT.CheckpointError as error:
            result.problems.append(f"after {launch.label}: {error}")
            break
        if done:
            break
        if not launch.fault and launch.returncode != 0:
            result.problems.append(f"{launch.label}: failed without a fault (exit {launch.returncode})")
            break
        if not launch.fault:
            result.problems.append(f"{launch.label}: exited 0 before the budget without a fault")
            break
    result.run_dir = run_dir
    if run_dir is not None and not result.problems and not done:
        result.problems.append(f"budget not reached after {MAX_LAUNCHES} launches")
    if run_dir is not None and done:
        compare(result, run_dir, reference)
        result.stale_temp_files = len([p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")])
    left = pgrep(str(trial_dir))
    if left:
        result.problems.append(f"processes left at the end: {[cmdline(pid)[:100] for pid in left]}")
        kill_quietly(left)
    result.code_changed = not code_before == code_digest() == reference.code
    if result.code_changed:
        result.problems.append("the project's code changed since the reference run started (someone edited it): "
                               "not comparable")
    result.wall_s = time.monotonic() - started
    return result


def compare(result: TrialResult, run_dir: Path, reference: Reference) -> None:
    name, state = latest_state(run_dir)
    ref = reference.state
    result.counters = [int(c) for c in state["counters"][:3]]
    result.counters_ok = result.counters == [int(c) for c in ref["counters"][:3]]
    if not result.counters_ok:
        result.problems.append(f"final counters (iteration, steps, episodes) {result.counters} != reference "
                               f"{[int(c) for c in ref['counters'][:3]]} ({name})")
    arrays, ref_arrays = state["ac_state"], ref["ac_state"]
    bad = [i for i, (a, b) in enumerate(zip(arrays, ref_arrays, strict=False)) if not same_value(a, b)]
    result.weights_ok = len(arrays) == len(ref_arrays) and not bad
    if not result.weights_ok:
        worst = max((float(np.max(np.abs(np.asarray(arrays[i], np.float64) - np.asarray(ref_arrays[i], np.float64))))
                     for i in bad if np.shape(arrays[i]) == np.shape(ref_arrays[i])), default=math.nan)
        result.problems.append(f"ac_state differs from the reference: arrays {bad} of {len(ref_arrays)} "
                               f"(largest difference {worst:.3g})")
    rest = entries_that_differ(state, ref, ("elapsed_s", "ac_state", "counters"))
    result.rest_ok = not rest and same_value(state["counters"], ref["counters"])
    if not result.rest_ok:
        result.problems.append(f"checkpoint entries differ from the reference: {rest or ['counters[3]']}")
    progress = read_progress(run_dir)
    result.progress_ok = progress == reference.progress
    if not result.progress_ok:
        result.problems.append(f"progress.csv differs from the reference (iterations "
                               f"{[r.get('iteration') for r in progress]})")


def run_reference(work: Path, iterations: int, seed: int) -> Reference:
    trial_dir = work / "reference"
    trial_dir.mkdir(parents=True)
    code = code_digest()
    argv = [sys.executable, str(TRAIN), ENV_ID, "--nprocs", str(NPROCS), "--batch_size", str(BATCH_SIZE),
            "--total_steps", str(iterations * BATCH_SIZE), "--checkpoint_every", "1", "--seed", str(seed),
            "--logdir", str(trial_dir / "runs")]
    launch = Launch.start("reference", argv, trial_dir)
    problems = launch.finish(trial_dir)
    found = sorted((trial_dir / "runs").glob("*/config.json"))
    if problems or not found:
        raise SystemExit(f"faults.py: the undisturbed reference run failed: {problems}\n{launch.stderr()[-3000:]}")
    run_dir = found[0].parent
    name, state = latest_state(run_dir)
    return Reference(run_dir, name, state, read_progress(run_dir), launch.wall_s, code)


# ----------------------------------------------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------------------------------------------


def git(*args: str) -> str:
    """git's output in this checkout, empty where git cannot answer."""
    result = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO), *args], capture_output=True, text=True,
                            check=False)
    return result.stdout.strip() if result.returncode == 0 else ""


def describe_machine() -> dict[str, str]:
    """The machine, code and date lines of the results files (fault_table.py's too)."""
    status = git("status", "--porcelain")
    return {
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, {platform.platform()}, "
                   f"Python {platform.python_version()}",
        "versions": "- versions: " + ", ".join(f"{name} {value}" for name, value in stack_versions().items()),
        "commit": git("rev-parse", "--short", "HEAD") or "unknown",
        "modified": ", ".join(line.split(maxsplit=1)[1] for line in status.splitlines() if line.split()[0] == "M")
        or "none",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y"),
    }


CSV_COLUMNS = ["trial", "kind", "faults", "launches", "exit_codes", "final_iteration", "final_steps",
               "final_episodes", "counters_match", "weights_bit_identical", "rest_of_checkpoint_identical",
               "progress_csv_identical", "kills_or_signals", "corruptions", "corruptions_checked", "max_linger_s",
               "stale_temp_files", "code_changed", "result", "problems", "wall_s"]


def csv_row(r: TrialResult) -> dict[str, Any]:
    return {
        "trial": r.index, "kind": r.kind, "faults": r.fault_text(), "launches": len(r.launches),
        "exit_codes": " ".join(str(launch.returncode) for launch in r.launches),
        "final_iteration": r.counters[0] if r.counters else "", "final_steps": r.counters[1] if r.counters else "",
        "final_episodes": r.counters[2] if r.counters else "", "counters_match": r.counters_ok,
        "weights_bit_identical": r.weights_ok, "rest_of_checkpoint_identical": r.rest_ok,
        "progress_csv_identical": r.progress_ok, "kills_or_signals": r.injected, "corruptions": r.corruptions,
        "corruptions_checked": r.corruption_checked,
        "max_linger_s": f"{max((launch.linger_s for launch in r.launches), default=0.0):.2f}",
        "stale_temp_files": r.stale_temp_files, "code_changed": r.code_changed,
        "result": "pass" if r.passed else "FAIL", "problems": " | ".join(r.problems), "wall_s": f"{r.wall_s:.1f}",
    }


def write_results(out: Path, results: list[TrialResult], reference: Reference, args: argparse.Namespace,
                  machine: dict[str, str], wall_s: float, loads: tuple[float, float], command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_row(r) for r in results)
    passed = sum(r.passed for r in results)
    launches = [launch for r in results for launch in r.launches]
    injected = sum(r.injected for r in results)
    corruptions = sum(r.corruptions for r in results)
    exact = sum(r.counters_ok and r.weights_ok for r in results)
    lingers = [launch.linger_s for launch in launches]
    ref_counters = [int(c) for c in reference.state["counters"][:3]]
    lines = [
        "# Fault injection",
        "",
        f"**{passed} of {len(results)} trials passed.** {injected} kills or signals and {corruptions} checkpoint "
        f"corruptions over {len(launches)} launches of `train.py`; {exact} of {len(results)} trials ended at "
        f"iteration {ref_counters[0]}, step {ref_counters[1]}, episode {ref_counters[2]} with weights and normalizers "
        "bit-identical to the undisturbed run.",
        "",
        f"- command: `{command}` (from the repository root)",
        f"- run: {ENV_ID}, PPO, {NPROCS} ranks, batch {BATCH_SIZE}, {args.iterations} iterations "
        f"({args.iterations * BATCH_SIZE} steps), `--checkpoint_every 1`, training seed {args.train_seed}, "
        f"fault seed {args.seed}",
        f"- reference (undisturbed) run: {reference.wall_s:.1f} s, final checkpoint {reference.checkpoint}, "
        f"counters {ref_counters}",
        f"- machine: {machine['machine']}",
        f"- code: commit {machine['commit']}, uncommitted changes in: {machine['modified']}; digest of train.py, "
        f"algos/, mpi_util/ {reference.code} (every trial checks it is unchanged)",
        f"- date: {machine['date_utc']}; total wall time {wall_s:.0f} s ({wall_s / 60:.1f} min)",
        machine["versions"],
        f"- 1-minute load average at the start {loads[0]:.2f}, at the end {loads[1]:.2f} (shared machine)",
        f"- processes: the launcher's exit to the last process of the job gone: median {np.median(lingers):.2f} s, "
        f"max {max(lingers):.2f} s over {len(lingers)} launches",
        "",
        "| trial | faults | launches | exit codes | final iter / steps / episodes | weights | rest of ckpt | "
        "progress.csv | max linger s | result | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        row = csv_row(r)
        lines.append(
            f"| {r.index} | {r.fault_text()} | {len(r.launches)} | {row['exit_codes']} | "
            f"{' / '.join(str(c) for c in r.counters) or '-'} | {'identical' if r.weights_ok else '**differ**'} | "
            f"{'identical' if r.rest_ok else '**differ**'} | {'identical' if r.progress_ok else '**differ**'} | "
            f"{row['max_linger_s']} | {'pass' if r.passed else '**FAIL**'} | {r.wall_s:.0f} |")
    by_kind: dict[str, list[TrialResult]] = {}
    for r in results:
        by_kind.setdefault(r.kind, []).append(r)
    lines += ["", "| first fault | trials | passed |", "| --- | --- | --- |"]
    lines += [f"| {kind} | {len(rs)} | {sum(r.passed for r in rs)} |" for kind, rs in sorted(by_kind.items())]
    failed = [r for r in results if not r.passed]
    if failed:
        lines += ["", "## Failures", ""]
        for r in failed:
            lines.append(f"- trial {r.index} ({r.fault_text()}), run directory {r.run_dir}:")
            lines += [f"  - {problem}" for problem in r.problems]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="number of trials (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule (default: %(default)s)")
    parser.add_argument("--train_seed", type=int, default=0, help="train.py --seed of every run (default: 0)")
    parser.add_argument("--iterations", type=int, default=8, help="iterations of a whole run (default: 8)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where trials.csv and results.md go")
    parser.add_argument("--keep_runs", action="store_true", help="keep every run directory, not just failed ones")
    args = parser.parse_args()
    if args.trials < 1 or args.iterations < 4:
        parser.error("--trials must be >= 1 and --iterations >= 4 (a corruption needs two checkpoints and a later "
                     "iteration to strike at)")
    command = shlex.join([".venv/bin/python", "tests/faults.py", *sys.argv[1:]])
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    machine = describe_machine()
    work = Path(tempfile.mkdtemp(prefix="faults_"))
    print(f"faults: {args.trials} trials of {ENV_ID} at {NPROCS} ranks, {args.iterations} iterations of "
          f"{BATCH_SIZE} steps; run directories in {work}", flush=True)
    reference = run_reference(work, args.iterations, args.train_seed)
    print(f"reference: {reference.checkpoint}, counters {[int(c) for c in reference.state['counters'][:3]]}, "
          f"{reference.wall_s:.1f} s", flush=True)

    schedule_rng = random.Random(args.seed)
    kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(args.trials)]  # every kind about equally often
    schedule_rng.shuffle(kinds)
    results: list[TrialResult] = []
    for index, kind in enumerate(kinds, start=1):
        result = run_trial(index, kind, random.Random(f"{args.seed}-{index}"), work, args.iterations,
                           args.train_seed, reference)
        results.append(result)
        exits = " ".join(str(launch.returncode) for launch in result.launches)
        print(f"trial {index:2d}/{args.trials} {'pass' if result.passed else 'FAIL'} {result.wall_s:5.1f} s  "
              f"launches {len(result.launches)} exits [{exits}]  {result.fault_text()}", flush=True)
        for problem in result.problems:
            print(f"    {problem}", flush=True)
        if result.passed and not args.keep_runs:
            shutil.rmtree(work / f"trial_{index:02d}", ignore_errors=True)

    wall_s = time.monotonic() - started
    write_results(args.out, results, reference, args, machine, wall_s, (load_start, os.getloadavg()[0]), command)
    passed = sum(r.passed for r in results)
    print(f"\n{passed} of {len(results)} trials passed in {wall_s:.0f} s; results in {args.out}", flush=True)
    if passed == len(results) and not args.keep_runs:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"run directories kept in {work}", flush=True)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
