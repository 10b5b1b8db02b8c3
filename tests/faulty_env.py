"""A Pendulum that fails on purpose, for the reliability tests: ``train.py tests.faulty_env:FaultyPendulum-v0``.

FAULT_KIND (raise | kill | hang | nan | slow), FAULT_RANK and FAULT_AT_STEP (this process's env steps) choose what
goes wrong, on which rank, when; FAULT_KIND=huge gives rewards of 1e300 on every rank from step FAULT_AT_STEP on.
FAULT_KIND=file_limit caps the size of files the ranks may write at FAULT_FILE_BYTES
from their step FAULT_AT_STEP on (as a full disk would fail the writes; a full disk leaves /dev/shm alone, so the cap
comes once MPI's and mpi_util's shared memory exists: under Open MPI a window's ftruncate failing on one rank left the
others waiting in the window's creation until killed). FAULT_AFTER_FILE (a glob) makes the chosen rank wait, at most
60 s, until a file matching it exists before it fails: a checkpoint the test expects to survive is then complete,
instead of racing the failure. FAULT_ONCE_MARKER (a path) makes the fault happen once: the rank creates the file
as it fails, and fails no more while it exists. FAULT_KIND=kill with FAULT_REPORT_DIR writes the rank's pid and the
/dev/shm files it has mapped (named or not) to FAULT_REPORT_DIR/killed_RANK.json first.
FAULT_KIND=reset makes the chosen rank's reset raise once it has taken FAULT_AT_STEP steps (an env that cannot
start another episode).
FAULT_KIND=slow makes the chosen rank's env take FAULT_SLOW_S longer per step from FAULT_AT_STEP on (a slow simulator).
FAULT_RANK=all chooses every rank (with FAULT_KIND=slow it bounds a job's steps/s on any machine).
FAULT_KIND=report_modules makes every rank write, at its first step, which of tensorflow, keras and torch it has
imported and its resident memory to FAULT_REPORT_DIR/modules_RANK.json. Without FAULT_KIND it is a plain Pendulum-v1.
"""

import glob
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

import gymnasium

# A rank's world rank as its launcher gives it: MPICH's hydra (and Slurm's PMI) set PMI_RANK, Open MPI sets
# OMPI_COMM_WORLD_RANK; neither in the process that mpi_fork relaunches.
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


def launched_rank() -> int | None:
    return next((int(os.environ[name]) for name in RANK_VARIABLES if name in os.environ), None)


def is_chosen(rank: int) -> bool:
    """Whether FAULT_RANK names ``rank`` or is "all"."""
    return os.environ.get("FAULT_RANK") in ("all", str(rank))


class FaultyPendulum(gymnasium.Wrapper):
    def __init__(self) -> None:
        super().__init__(gymnasium.make("Pendulum-v1"))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        kind = os.environ.get("FAULT_KIND")
        rank = launched_rank() or 0
        if kind == "file_limit" and self.steps == int(os.environ["FAULT_AT_STEP"]) and launched_rank() is not None:
            limit = int(os.environ["FAULT_FILE_BYTES"])
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        if kind == "report_modules" and self.steps == 1:
            heavy = sorted(name for name in ("tensorflow", "keras", "torch") if name in sys.modules)
            resident_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                               if line.startswith("VmRSS:"))
            report = Path(os.environ["FAULT_REPORT_DIR"]) / f"modules_{rank}.json"
            report.write_text(json.dumps({"modules": heavy, "resident_mb": resident_kb / 1024}))
        if kind == "huge" and self.steps >= int(os.environ["FAULT_AT_STEP"]):
            reward = 1e300  # finite, but no float32 network can fit it
        if kind == "slow" and is_chosen(rank) and self.steps >= int(os.environ["FAULT_AT_STEP"]):
            time.sleep(float(os.environ["FAULT_SLOW_S"]))  # the simulator's work
        chosen = kind in ("raise", "kill", "hang", "nan") and is_chosen(rank)
        if chosen and self.steps == int(os.environ["FAULT_AT_STEP"]):
            after = os.environ.get("FAULT_AFTER_FILE")
            waited_until = time.monotonic() + 60
            while after and not glob.glob(after) and time.monotonic() < waited_until:
                time.sleep(0.01)  # polls for the file; the test fails on its assertions if it never comes
            if kind == "raise":
                raise RuntimeError(f"injected fault at step {self.steps}")
            once = os.environ.get("FAULT_ONCE_MARKER")
            if once and os.path.exists(once):
                return obs, reward, terminated, truncated, info  # failed once already (a restarted job goes on)
            if once:
                Path(once).write_text(str(os.getpid()))
            if kind == "kill":
                if os.environ.get("FAULT_REPORT_DIR"):  # what the test needs to find this rank's leftovers
                    mapped = {line.split(maxsplit=5)[5].strip() for line in Path("/proc/self/maps").read_text()
                              .splitlines() if " /dev/shm/" in line}  # "PATH" or "PATH (deleted)" when unnamed
                    report = {"pid": os.getpid(), "shm": sorted(mapped)}
                    (Path(os.environ["FAULT_REPORT_DIR"]) / f"killed_{rank}.json").write_text(json.dumps(report))
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "hang":
                time.sleep(3600)
            if kind == "nan":
                reward = float("nan")
        return obs, reward, terminated, truncated, info


    def reset(self, **kwargs):
        if (os.environ.get("FAULT_KIND") == "reset" and is_chosen(launched_rank() or 0)
                and self.steps >= int(os.environ["FAULT_AT_STEP"])):
            raise RuntimeError(f"injected failure of reset after step {self.steps}")
        return self.env.reset(**kwargs)


gymnasium.register("FaultyPendulum-v0", entry_point=FaultyPendulum, max_episode_steps=200)
