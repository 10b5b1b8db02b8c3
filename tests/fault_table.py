"""The fault table: every fault a cluster deals a training job, one row each, from one command.

Each case runs real ``train.py`` jobs (2 ranks under the project's mpiexec, 1,024 steps per iteration), deals one
fault, and records what the user is left with:

- exit: the launching process's exit status; seconds: from the fault (or the start, for faults at start) to its end;
- rows lost: rows of progress.csv that were there before the fault, are covered by the newest checkpoint after it,
  and are gone or changed (the run's history: must be 0);
- steps to redo: steps logged before the fault that the newest checkpoint after it does not hold (work to repeat);
- left: processes of the job still running 90 s after the launcher's end; files nobody removed (temporary files in
  the run directory, the job's /tmp/mpi_util_job_* directory, MPI's /dev/shm files no process maps);
- resumed: a plain ``train.py --resume`` afterwards runs to the budget (or "-" where there is no run to resume);
- last line: the last line the user saw on stderr (stdout where stderr was empty).

The faults: ENOSPC and SIGKILL at each write a resume makes (config.json, progress.csv's rewrite and its appended
row) and SIGKILL at each step of a checkpoint's write (strace; skipped without it), a disk that fills mid-run (a
small tmpfs; root), NaN observations, a failing reset, a frozen rank (SIGSTOP), a killed rank under --max_restarts,
SIGTERM at start-up, mid-rollout and mid-update (to the launcher's process group, and to each process of the tree in
turn, as a scheduler's cancel), SIGHUP, a second Ctrl-C, the launching process SIGKILLed, and a pids cgroup limit
(root, cgroup v1). Run it alone on the machine: a file another job leaves in /dev/shm would be counted as left.

    .venv/bin/python tests/fault_table.py                       # every case, about 8 minutes on 2 cores
    .venv/bin/python tests/fault_table.py --cases sigterm_update_tree,launcher_sigkill

It prints the table and writes results.md and cases.csv (with command, machine and date) to --out; exit status 1 when
a case lost rows, left something behind, or did not resume.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from faults import (
    CHECKPOINT,
    REPO,
    TIMING_COLUMNS,
    TRAIN,
    Launch,
    descendants,
    describe_machine,
    kill_quietly,
    pgrep,
)

DEFAULT_OUT = REPO / "benchmarks" / "results" / "fault_table"
FAULTY = "tests.faulty_env:FaultyPendulum-v0"
JOB = ("--nprocs", "2", "--batch_size", "1024", "--lr_schedule", "constant")
ENDLESS = ("--total_steps", "1000000")
PHASE_TIMEOUT_S = 120.0


@dataclass
class Row:
    case: str
    fault: str
    exit: str = "-"
    seconds: float = 0.0
    rows_lost: int = 0
    steps_to_redo: int = 0
    processes_left: int = 0
    files_left: str = ""
    resumed: str = "-"
    last_line: str = ""

    @property
    def ok(self) -> bool:
        return (self.rows_lost == 0 and self.processes_left == 0 and not self.files_left
                and self.resumed in ("-", "yes"))


# ----------------------------------------------------------------------------------------------------------------
# What a run directory holds, before and after.
# ----------------------------------------------------------------------------------------------------------------


def rows(run_dir: Path | None) -> list[dict[str, str]]:
    if run_dir is None or not (run_dir / "progress.csv").exists():
        return []
    with open(run_dir / "progress.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in csv.DictReader(f)
                if row.get("total_steps")]


def newest_checkpoint(run_dir: Path) -> tuple[int, int]:
    """(iteration, total steps) of the newest checkpoint that verifies; (0, 0) when none."""
    try:
        _, state, _ = CHECKPOINT.load_latest_checkpoint(run_dir / "checkpoints")
    except CHECKPOINT.CheckpointError:
        return 0, 0
    return int(state["counters"][0]), int(state["counters"][1])


def named_env(run_dir: Path) -> str:
    """The env id of a run's config.json, named beside --resume as a user does: train.py imports a module that a
    run's env id names (module:Id) only when the command line names that id too."""
    return json.loads((run_dir / "config.json").read_text())["env_id"]


def run_dir_in(logdir: Path) -> Path | None:
    found = sorted(p.parent for p in logdir.glob("*/config.json"))
    return found[0] if found else None


def leftover_files(run_dir: Path | None, before: dict[str, set[str]]) -> str:
    """What nobody removed: temporary files in the run directory, job directories and unmapped /dev/shm files that
    were not there before the case."""
    left = []
    if run_dir is not None:
        left += [p.name for d in (run_dir, run_dir / "checkpoints") if d.is_dir() for p in d.iterdir()
                 if p.name.startswith(".") and ".tmp" in p.name]
    left += sorted(name for name in set(os.listdir("/tmp")) - before["tmp"] if name.startswith("mpi_util_job_"))
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped |= {line.split()[-1] for line in maps.read_text().splitlines() if "/dev/shm/" in line}
        except OSError:
            continue
    left += [name for name in sorted(set(os.listdir("/dev/shm")) - before["shm"]) if f"/dev/shm/{name}" not in mapped]
    return ", ".join(left)


def snapshot() -> dict[str, set[str]]:
    return {"tmp": set(os.listdir("/tmp")), "shm": set(os.listdir("/dev/shm"))}


# ----------------------------------------------------------------------------------------------------------------
# Jobs and phases.
# ----------------------------------------------------------------------------------------------------------------


def start(work: Path, label: str, *args: str, env: dict[str, str] | None = None,
          prefix: tuple[str, ...] = ()) -> Launch:
    """``train.py ARGS`` (after ``prefix``: strace, a cgroup) as its own session, with ``env`` added."""
    work.mkdir(parents=True, exist_ok=True)
    return Launch.start(label, [*prefix, sys.executable, str(TRAIN), *args], work, env)


def wait(launch: Launch, condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while not condition():
        if launch.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job ended or timed out before {what}")
        launch.tracker.scan()
        time.sleep(0.02)


def catches_sigterm(pid: int) -> bool:
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_phase(launch: Launch, logdir: Path, phase: str) -> None:
    """"start-up": both ranks started and catching SIGTERM, nothing logged; "rollout": iteration 1 logged (the slow
    env then rolls out for seconds); "update": iteration 1 logged and rank 0 has since used 0.3 s of CPU, more than its
    CartPole rollout takes, so it is in the update; "iteration 2": two rows logged."""
    if phase == "start-up":
        wait(launch, lambda: len(r := launch.tracker.ranks()) == 2 and all(catches_sigterm(p) for p in r.values()),
             "the ranks started")
        return
    wait(launch, lambda: len(rows(run_dir_in(logdir))) >= (2 if phase == "iteration 2" else 1), phase)
    if phase == "update":
        rank0 = launch.tracker.ranks()[0]
        used = cpu_s(rank0)
        wait(launch, lambda: cpu_s(rank0) - used > 0.3, "rank 0's update")


PHASE_SETTINGS = {  # the job each phase is dealt its fault in
    "start-up": ((FAULTY,), {}),
    "rollout": ((FAULTY,), {"FAULT_KIND": "slow", "FAULT_RANK": "0", "FAULT_AT_STEP": "0", "FAULT_SLOW_S": "0.004"}),
    "update": (("CartPole-v1", "--epochs", "200", "--kl_targ", "1000"), {}),
    "iteration 2": (("CartPole-v1",), {}),
}


# ----------------------------------------------------------------------------------------------------------------
# One case: start, fault, finish, measure, resume.
# ----------------------------------------------------------------------------------------------------------------


def measure(row: Row, launch: Launch, logdir: Path, before_rows: list[dict[str, str]], before: dict[str, set[str]],
            fault_at: float, resume_args: tuple[str, ...] | None) -> Row:
    """Wait for the faulted job's end and fill ``row``; then resume with ``resume_args`` (None: no resume). What is
    left behind is counted after the resume, which is meant to clear what a killed writer left."""
    launch.expected = "any"  # the row records the exit status; a hang or an orphan is still reported
    problems = launch.finish(logdir)
    row.exit, row.seconds = str(launch.returncode), round(time.monotonic() - fault_at, 1)
    left = sorted(set(launch.tracker.alive()) | set(pgrep(str(logdir))))
    row.processes_left = len(left)
    kill_quietly(left)
    lines = [line for line in (launch.stderr() or launch.stdout()).splitlines() if line.strip()]
    row.last_line = (lines[-1] if lines else "") + (f" [{problems[0][:100]}]" if problems else "")
    run_dir = run_dir_in(logdir)
    if run_dir is not None:
        checkpoint_iteration, checkpoint_steps = newest_checkpoint(run_dir)
        after = rows(run_dir)
        row.rows_lost = sum(1 for r in before_rows if int(r["iteration"]) <= checkpoint_iteration and r not in after)
        logged_steps = max((int(r["total_steps"]) for r in [*before_rows, *after]), default=0)
        row.steps_to_redo = max(0, logged_steps - checkpoint_steps)
        if resume_args is not None:
            resumed = start(logdir, "resume", named_env(run_dir), "--resume", str(run_dir), *resume_args)
            resumed.finish(logdir)
            row.resumed = "yes" if resumed.returncode == 0 and "done:" in resumed.stdout() else \
                f"no ({resumed.returncode})"
    row.files_left = leftover_files(run_dir, before)
    return row


def signal_case(work: Path, phase: str, how: str, signum: int = signal.SIGTERM) -> Row:
    logdir = work / "runs"
    settings, env = PHASE_SETTINGS[phase]
    before = snapshot()
    launch = start(logdir, "job", *settings, *JOB, *ENDLESS, "--logdir", str(logdir), env=env)
    wait_for_phase(launch, logdir, phase)
    before_rows, fault_at = rows(run_dir_in(logdir)), time.monotonic()
    if how == "group":
        os.killpg(launch.proc.pid, signum)
    else:
        for pid in descendants(launch.proc.pid, launch.tracker.scan()):  # launcher, mpiexec, proxy, ranks
            os.kill(pid, signum)
    row = Row("", f"{signal.Signals(signum).name} to {'the launcher' if how == 'group' else 'every process'}, {phase}")
    budget = (len(before_rows) + 2) * 1024
    return measure(row, launch, logdir, before_rows, before, fault_at, ("--total_steps", str(budget)))


def strace_case(work: Path, target: str, call: str, fault: str, resume: bool) -> Row:
    """A fault injected by strace at the first ``call`` on ``target`` (a file of the run directory)."""
    logdir = work / "runs"
    base = start(logdir, "base", "CartPole-v1", *JOB, "--checkpoint_every", "2", "--total_steps",
                 str(4 * 1024 if resume else 3 * 1024), "--logdir", str(logdir))
    base.finish(logdir)
    run_dir = run_dir_in(logdir)
    if resume:  # a run killed between iteration 4's row and its checkpoint: the resume must drop rows 3-4
        (run_dir / "checkpoints" / "ckpt_00000004.npz").unlink()
        args = ("--resume", str(run_dir), "--total_steps", str(6 * 1024))
    else:  # the checkpoint of iteration 4, written at the end of the resumed run
        args = ("--resume", str(run_dir), "--total_steps", str(4 * 1024))
    before, before_rows = snapshot(), rows(run_dir)
    strace = ("strace", "-f", "-qq", "-o", "/dev/null", "-P", str(run_dir / target), "-e", f"trace={call}", "-e",
              f"inject={call}:{fault}:when=1")
    fault_at = time.monotonic()
    launch = start(logdir, "faulted", *args, prefix=strace)
    what = "ENOSPC" if "ENOSPC" in fault else "SIGKILL of rank 0"
    row = Row("", f"{what} at the first {call} to {target}" + (" (a resume)" if resume else ""))
    row = measure(row, launch, logdir, before_rows, before, fault_at, args[2:])
    return row


def fault_env_case(work: Path, fault: str, env: dict[str, str], extra: tuple[str, ...] = (),
                   resume_budget: int = 4 * 1024) -> Row:
    logdir = work / "runs"
    before, fault_at = snapshot(), time.monotonic()
    launch = start(logdir, "job", FAULTY, *JOB, "--checkpoint_every", "1", *extra, "--logdir", str(logdir), env=env)
    return measure(Row("", fault), launch, logdir, [], before, fault_at, ("--total_steps", str(resume_budget)))


def frozen_rank(work: Path) -> Row:
    logdir = work / "runs"
    before = snapshot()
    launch = start(logdir, "job", "CartPole-v1", *JOB, *ENDLESS, "--checkpoint_every", "1", "--stall_timeout", "10",
                   "--logdir", str(logdir))
    wait_for_phase(launch, logdir, "iteration 2")
    before_rows, fault_at = rows(run_dir_in(logdir)), time.monotonic()
    os.kill(launch.tracker.ranks()[1], signal.SIGSTOP)
    row = Row("", "SIGSTOP of rank 1 (--stall_timeout 10)")
    return measure(row, launch, logdir, before_rows, before, fault_at, ("--total_steps", str(4 * 1024)))


def launcher_sigkill(work: Path) -> Row:
    logdir = work / "runs"
    before = snapshot()
    launch = start(logdir, "job", "CartPole-v1", *JOB, *ENDLESS, "--logdir", str(logdir))
    wait_for_phase(launch, logdir, "iteration 2")
    launch.tracker.scan()
    before_rows, fault_at = rows(run_dir_in(logdir)), time.monotonic()
    launch.proc.kill()
    # Launch.finish waits for every process of the job to be gone: the ranks end on their own.
    row = measure(Row("", "SIGKILL of the launching process (the OOM killer)"), launch, logdir, before_rows, before,
                  fault_at, ("--total_steps", str(1024 * (len(before_rows) + 3))))
    row.exit = f"{row.exit} (launcher)"
    row.last_line = next((line for line in reversed((logdir / "job.out").read_text().splitlines()) if line.strip()), "")
    return row


def full_disk(work: Path) -> Row:
    if os.geteuid() != 0:
        return Row("", "a disk that fills mid-run", last_line="skipped: needs root to mount a tmpfs")
    logdir = work / "disk"
    logdir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(logdir)], check=True)
    try:
        before = snapshot()
        launch = start(work, "job", "CartPole-v1", *JOB, *ENDLESS, "--checkpoint_every", "1", "--logdir",
                       str(logdir / "runs"))  # its output outside the full disk
        wait_for_phase(launch, logdir / "runs", "iteration 2")
        before_rows, fault_at = rows(run_dir_in(logdir / "runs")), time.monotonic()
        with open(logdir / "filler", "wb") as filler:  # the disk fills up
            try:
                while True:
                    filler.write(b"\0" * 65536)
            except OSError:
                pass
        row = measure(Row("", "the disk fills mid-run (a 4 MB tmpfs)"), launch, logdir / "runs", before_rows, before,
                      fault_at, None)
        (logdir / "filler").unlink()  # space again: the run goes on from its newest checkpoint
        run_dir = run_dir_in(logdir / "runs")
        resumed = start(work, "resume", named_env(run_dir), "--resume", str(run_dir), "--total_steps",
                        str(1024 * (newest_checkpoint(run_dir)[0] + 1)))
        resumed.finish(work)
        row.resumed = "yes" if resumed.returncode == 0 else f"no ({resumed.returncode})"
        return row
    finally:
        subprocess.run(["umount", "-l", str(logdir)], check=False)


def pids_limit(work: Path) -> Row:
    cgroup = Path("/sys/fs/cgroup/pids") / f"fault_table_{os.getpid()}"
    try:
        cgroup.mkdir()
        (cgroup / "pids.max").write_text("150")
    except OSError as error:
        return Row("", "pids.max 150, --nprocs 1000", last_line=f"skipped: no cgroup v1 pids controller ({error})")
    logdir = work / "runs"
    before, fault_at = snapshot(), time.monotonic()
    try:
        launch = start(logdir, "job", "CartPole-v1", "--nprocs", "1000", "--logdir", str(logdir),
                       prefix=("sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"))
        row = measure(Row("", "pids.max 150 (a container's limit), --nprocs 1000"), launch, logdir, [], before,
                      fault_at, None)
        row.files_left = ", ".join(filter(None, [row.files_left, *(["a run directory"] if any(logdir.iterdir()) and
                                                                   any(p.is_dir() for p in logdir.iterdir()) else [])]))
        return row
    finally:
        for pid in (cgroup / "cgroup.procs").read_text().split():
            kill_quietly([int(pid)])
        cgroup.rmdir()


def second_ctrl_c(work: Path) -> Row:
    logdir = work / "runs"
    settings, env = PHASE_SETTINGS["rollout"]
    before = snapshot()
    launch = start(logdir, "job", *settings, *JOB, *ENDLESS, "--checkpoint_every", "1", "--logdir", str(logdir),
                   env={**env, "FAULT_SLOW_S": "0.01"})  # a 5 s rollout: room for the second Ctrl-C
    wait_for_phase(launch, logdir, "rollout")
    before_rows, fault_at = rows(run_dir_in(logdir)), time.monotonic()
    launch.proc.send_signal(signal.SIGINT)
    wait(launch, lambda: "received signal 2" in launch.stdout() and time.monotonic() - fault_at > 1.2, "the notice")
    launch.proc.send_signal(signal.SIGINT)
    return measure(Row("", "Ctrl-C, then Ctrl-C again after the notice"), launch, logdir, before_rows, before,
                   fault_at, ("--total_steps", str(1024 * (len(before_rows) + 1))))


STRACE_CASES = {
    "resume_enospc_config": (".config.json.tmp", "write", "error=ENOSPC", True),
    "resume_kill_config": (".config.json.tmp", "write", "signal=KILL", True),
    "resume_enospc_progress_rewrite": (".progress.csv.tmp", "write", "error=ENOSPC", True),
    "resume_kill_progress_rewrite": (".progress.csv.tmp", "write", "signal=KILL", True),
    "resume_enospc_appended_row": ("progress.csv", "write", "error=ENOSPC", True),
    "resume_kill_appended_row": ("progress.csv", "write", "signal=KILL", True),
    "checkpoint_kill_write": ("checkpoints/.ckpt_00000004.npz.tmp", "write", "signal=KILL", False),
    "checkpoint_kill_fsync": ("checkpoints/.ckpt_00000004.npz.tmp", "fsync", "signal=KILL", False),
    "checkpoint_kill_rename": ("checkpoints/.ckpt_00000004.npz.tmp", "rename", "signal=KILL", False),
}
CASES: dict[str, Callable[[Path], Row]] = {
    **{name: (lambda work, spec=spec: strace_case(work, *spec)) for name, spec in STRACE_CASES.items()},
    "full_disk": full_disk,
    "nan_observation": lambda work: fault_env_case(work, "NaN reward on rank 1 at its step 700",
                                                   {"FAULT_KIND": "nan", "FAULT_RANK": "1", "FAULT_AT_STEP": "700"},
                                                   ENDLESS),
    "failing_reset": lambda work: fault_env_case(work, "reset raises on rank 1 after its step 700",
                                                 {"FAULT_KIND": "reset", "FAULT_RANK": "1", "FAULT_AT_STEP": "700"},
                                                 ENDLESS),
    "frozen_rank": frozen_rank,
    "rank_killed_with_restarts": lambda work: fault_env_case(
        work, "SIGKILL of rank 1 at its step 700, --max_restarts 1",
        {"FAULT_KIND": "kill", "FAULT_RANK": "1", "FAULT_AT_STEP": "700",
         "FAULT_ONCE_MARKER": str(work / "killed_once")}, ("--total_steps", str(4 * 1024), "--max_restarts", "1")),
    **{f"sigterm_{phase.replace('-', '')}_{how}": (lambda work, phase=phase, how=how: signal_case(work, phase, how))
       for phase in ("start-up", "rollout", "update") for how in ("group", "tree")},
    "sighup_launcher": lambda work: signal_case(work, "rollout", "group", signal.SIGHUP),
    "second_ctrl_c": second_ctrl_c,
    "launcher_sigkill": launcher_sigkill,
    "pids_limit": pids_limit,
}




def write_results(out: Path, table: list[Row], command: str, wall_s: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cases.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(table[0])))
        writer.writeheader()
        writer.writerows(asdict(row) for row in table)
    machine = describe_machine()
    lines = [
        "# Fault table", "",
        f"Command: `{command}`  ", f"Machine: {machine['machine']}  ", f"{machine['versions']}  ",
        f"Date: {machine['date_utc']}; commit {machine['commit']} (modified: {machine['modified']}); "
        f"{wall_s / 60:.1f} minutes in all", "",
        "| case | fault | exit | s | rows lost | steps to redo | processes left | files left | resumed | last line |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table:
        cells = [row.case, row.fault, row.exit, f"{row.seconds:g}", str(row.rows_lost), str(row.steps_to_redo),
                 str(row.processes_left), row.files_left or "none", row.resumed,
                 row.last_line.replace("|", "\\|")[:300]]
        lines.append("| " + " | ".join(cells) + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where results.md and cases.csv go")
    args = parser.parse_args()
    chosen = args.cases.split(",")
    unknown = [name for name in chosen if name not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    started, table = time.monotonic(), []
    for name in chosen:
        if name in STRACE_CASES and shutil.which("strace") is None:
            table.append(Row(name, STRACE_CASES[name][0], last_line="skipped: strace is not installed"))
            continue
        with tempfile.TemporaryDirectory(prefix=f"fault_{name}_") as work:
            try:
                row = CASES[name](Path(work))
            except (RuntimeError, OSError, subprocess.SubprocessError) as error:
                row = Row(name, "", exit="error", last_line=f"the case could not run: {error}")
            row.case = name
        table.append(row)
        print(f"{name:32s} exit {row.exit:>4s} {row.seconds:6.1f} s  rows lost {row.rows_lost}  redo "
              f"{row.steps_to_redo:5d}  left {row.processes_left}/{row.files_left or '-'}  resumed {row.resumed:4s} "
              f"| {row.last_line[:110]}", flush=True)
    command = "python tests/fault_table.py" + ("" if chosen == list(CASES) else f" --cases {args.cases}")
    write_results(args.out, table, command, time.monotonic() - started)
    failed = [row.case for row in table if not row.ok or row.exit == "error"]
    print(f"{len(table) - len(failed)} of {len(table)} cases lost nothing and left nothing; written to {args.out}"
          + (f"; not so: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
