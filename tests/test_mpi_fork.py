"""mpi_fork relaunches a script under mpiexec, carries the exit status back, and aborts the job when a rank fails;
the README's recipe ends with bit-identical weights on every rank."""

from __future__ import annotations

import ast
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import ODD_EVEN_CLIQUES, REPO, SCRIPTS, JobOutput, mpiexec, run_bounded

import mpi_util
from mpi_util.launch import mpi_library_is_open_mpi


@pytest.mark.parametrize("nprocs", [2, 3])
def test_fork_runs_every_rank_and_returns_parent(nprocs):
    result = run_bounded([sys.executable, str(SCRIPTS / "fork_job.py"), str(nprocs)], timeout=60)
    assert result.returncode == 0, result.stderr
    ranks = sorted(int(m) for m in re.findall(rf"child rank (\d+) of {nprocs}", result.stdout))
    assert ranks == list(range(nprocs))
    assert f"gathered {list(range(nprocs))}" in result.stdout
    assert "parent: job exited with 0" in result.stdout


def test_launching_process_leaves_no_shared_memory_behind():
    # It starts MPI alone (importing mpi4py does): Open MPI 5 left its 16 MB /dev/shm file at every exit, MPICH its
    # 1 MB one when the process was killed. Only this process's files are checked: other jobs share /dev/shm.
    result = run_bounded([sys.executable, str(SCRIPTS / "fork_job.py"), "2"], timeout=60)
    assert result.returncode == 0, result.stderr
    mapped = ast.literal_eval(re.search(r"parent: mapped (\[.*\])", result.stdout).group(1))
    assert mapped, "the launching process mapped nothing under /dev/shm: nothing to check"
    assert [path for path in (entry.removesuffix(" (deleted)") for entry in mapped) if os.path.exists(path)] == []


@pytest.mark.skipif(mpi_library_is_open_mpi(), reason="MPICH's start-up files; Open MPI's are left to mpi_fork")
@pytest.mark.parametrize(("ending", "ranks", "hosts"), [
    ("killed", 3, "one host"), ("killed", 4, "two nodes"), ("raises", 3, "one host"), ("raises", 4, "two nodes"),
    ("raises without init", 3, "one host")])
def test_a_job_a_launcher_started_leaves_no_start_up_shared_memory_however_it_ends(tmp_path, ending, ranks, hosts):
    # Under a plain mpiexec (or srun) no launching process of ours removes what the job leaves. MPICH left its
    # start-up file in /dev/shm (about 1 MB a rank) whenever a rank was killed or the job aborted; "two nodes" makes
    # MPICH treat odd and even ranks as two hosts, each with its own file. Without init() only mpi_util's abort can
    # remove it, on the aborting rank's host. Only this job's files are checked.
    cliques = ODD_EVEN_CLIQUES if hosts == "two nodes" else {}
    result = mpiexec(ranks, "start_up_memory.py", str(tmp_path), ending, timeout=60, env=cliques, check=False)
    assert result.returncode != 0, result.stdout[-2000:]
    mapped = {path for rank in range(ranks) for path in json.loads((tmp_path / f"shm_{rank}.json").read_text())}
    assert len(mapped) == (2 if hosts == "two nodes" else 1), mapped
    assert [path for path in mapped if os.path.exists(path)] == [], result.stderr[-2000:]


def test_workers_get_one_thread_and_rank_0_keeps_the_launching_environment():
    result = run_bounded([sys.executable, str(SCRIPTS / "fork_job.py"), "3"], timeout=60, env={"OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr
    assert "OMP_NUM_THREADS by rank ['2', '1', '1']" in result.stdout, result.stdout


def test_fork_of_a_module_started_with_python_m(tmp_path):
    # Relative imports work only inside the package: run as a file, the relaunched ranks would fail.
    package = tmp_path / "forkpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "greeting.py").write_text("WORDS = 'hello from'\n")
    (package / "job.py").write_text(
        "import sys\nimport mpi_util\nfrom .greeting import WORDS\n"
        "fork = mpi_util.mpi_fork(int(sys.argv[1]))\n"
        "if fork == 'parent':\n    sys.exit(fork.returncode)\n"
        "everyone = mpi_util.gather_objects(f'{WORDS} {__spec__.name} rank {mpi_util.rank} of {mpi_util.nworkers}')\n"
        "mpi_util.print0(everyone)\n")
    result = run_bounded([sys.executable, "-m", "forkpkg.job", "3"], timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{[f'hello from forkpkg.job rank {r} of 3' for r in range(3)]}" in result.stdout, result.stdout


def test_fork_of_one_process_runs_in_place():
    result = run_bounded([sys.executable, str(SCRIPTS / "fork_job.py"), "1"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "child rank 0 of 1" in result.stdout
    assert "parent" not in result.stdout


def test_fork_under_a_launcher_does_not_relaunch():
    # Started by mpiexec with 2 ranks, mpi_fork(3) must not start a nested job of 3.
    result = mpiexec(2, "fork_job.py", "3", timeout=60)
    assert sorted(re.findall(r"child rank (\d+) of (\d+)", result.stdout)) == [("0", "2"), ("1", "2")]
    assert "parent" not in result.stdout


@pytest.mark.parametrize("nprocs", [2, 3])
def test_failing_rank_aborts_job_with_nonzero_status(nprocs):
    # Rank 1 raises while the others wait in a gather: without the abort they would wait forever.
    result = run_bounded([sys.executable, str(SCRIPTS / "fork_job.py"), str(nprocs), "fail"], timeout=60)
    assert result.returncode != 0
    assert "uncaught exception on rank 1" in result.stderr
    assert "RuntimeError: injected failure on rank 1" in result.stderr
    assert f"parent: job exited with {result.returncode}" in result.stdout


PID_LINE = r"^rank (\d+) pid (\d+)$"
"""fork_hold.py's line from each rank."""


def rank_pids(lines: str) -> dict[int, int]:
    """{rank: pid} from the job's PID_LINE lines."""
    return {int(rank): int(pid) for rank, pid in re.findall(PID_LINE, lines, re.MULTILINE)}


def test_the_rank_that_died_first_is_named_even_when_the_launching_process_learns_of_it_late():
    # The launching process tells which rank ended first by the order in which the ranks' connections to it closed.
    # Stopped (SIGSTOP) while rank 1 is killed and mpiexec kills ranks 0 and 2 in turn, as a loaded machine may leave
    # it unscheduled, it finds all three closed when it runs again; the order must still name rank 1.
    job = subprocess.Popen([sys.executable, str(SCRIPTS / "fork_hold.py"), "3"], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    output, pidfds = JobOutput(job), []
    try:
        pids = rank_pids(output.wait_for(PID_LINE, 60, "every rank's pid line", count=3))
        others = [os.pidfd_open(pids[rank]) for rank in (0, 2)]
        pidfds.extend(others)
        os.kill(job.pid, signal.SIGSTOP)
        os.kill(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while others and time.monotonic() < deadline:  # a pidfd reads ready once its process has ended
            ended, _, _ = select.select(others, [], [], deadline - time.monotonic())
            others = [fd for fd in others if fd not in ended]
        assert not others, "mpiexec did not end ranks 0 and 2 within 60 s of rank 1's death"
        os.kill(job.pid, signal.SIGCONT)
        stdout, stderr = output.finish(timeout=60)
    finally:
        if job.poll() is None:  # the test failed before the job ended
            os.killpg(job.pid, signal.SIGKILL)
            os.killpg(job.pid, signal.SIGCONT)
            job.communicate()
        for fd in pidfds:
            os.close(fd)
    assert (f"mpi_util: rank 1 (on host {socket.gethostname()}, pid {pids[1]}) was killed by signal 9 (SIGKILL)"
            in stderr), stderr[-3000:]
    assert f"parent: job exited with {job.returncode}" in stdout


def test_lines_that_ranks_print_at_once_come_out_whole():
    # The launcher merges the ranks' output write by write: a line printed in two writes (python -u writes print's
    # text and its newline apart) could be cut by another rank's. Seen before the fix: 16 to 160 of 900 lines glued.
    result = run_bounded([sys.executable, str(SCRIPTS / "whole_lines.py"), "3"], timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    glued = [line for line in lines if not re.fullmatch(r"rank \d line \d+", line)]
    assert sorted(glued) == ["rank 0 prints a whole line", "rank 1 begins a line and ends it",
                             "rank 2 prints a whole line"], glued[:10]
    assert len(lines) == 900 + 3


def test_find_mpiexec_belongs_to_loaded_library():
    path = mpi_util.find_mpiexec()
    version = run_bounded([path, "--version"], timeout=30).stdout
    if mpi_library_is_open_mpi():
        assert "Open MPI" in version or "OpenRTE" in version
    else:
        assert "HYDRA" in version or "MPICH" in version


def test_readme_recipe_ends_with_identical_weights():
    from conftest import REPO

    nprocs = 2  # the size the docs show; every rank imports TensorFlow, and the collectives are tested at every size
    result = run_bounded([sys.executable, str(REPO / "examples" / "recipe.py"), "--nprocs", str(nprocs)], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    checksums = re.findall(r"rank (\d+): weights sha256 (\w+)", result.stdout)
    assert sorted(int(r) for r, _ in checksums) == list(range(nprocs))
    assert len({c for _, c in checksums}) == 1, checksums
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", result.stdout)]
    assert losses[-1] < 0.01  # the rank-0 learner really learned from everyone's rows


@pytest.mark.parametrize("made_by", ["this user, mode 0700", "this user, open to all", "another user", "a link"])
def test_ranks_use_a_job_directory_only_when_this_user_made_it_for_them(tmp_path, made_by):
    # MPI_UTIL_JOB_DIR names the same path on every host; where another user made it first, the ranks must neither
    # write their records there nor connect to a socket waiting in it (its closing would stop them and remove the
    # directory). The first case shows what the ranks do with a directory that is theirs.
    from conftest import launcher

    from mpi_util.supervise import WATCH_SOCKET

    job_dir = tmp_path / "mpi_util_job_squatted"
    if made_by == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        job_dir.symlink_to(tmp_path / "elsewhere")
    else:
        job_dir.mkdir(mode=0o700)
        if made_by == "this user, open to all":
            job_dir.chmod(0o777)
        elif made_by == "another user":
            if os.geteuid() != 0:
                pytest.skip("needs root to make a directory another user owns")
            os.chown(job_dir, 65534, 65534)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(job_dir / WATCH_SOCKET))
    listener.listen(4)
    command, settings = launcher("-n", "2", sys.executable, "-c", "import mpi_util; mpi_util.init()")
    result = run_bounded(command, 60, {**settings, "PYTHONPATH": str(REPO), "MPI_UTIL_JOB_DIR": str(job_dir)})
    assert result.returncode == 0, result.stderr[-2000:]
    connected = select.select([listener], [], [], 0)[0]
    records = sorted(p.name for p in job_dir.iterdir() if p.name.startswith("rank_"))
    listener.close()
    if made_by == "this user, mode 0700":
        assert connected and records == ["rank_0.json", "rank_1.json"]
    else:
        assert not connected and records == [], (connected, records)
        assert (job_dir / WATCH_SOCKET).exists()  # nothing removed


CHILD_OF_A_RANK = """
import subprocess, sys
import mpi_util
fork = mpi_util.mpi_fork(2)
if fork == "parent":
    sys.exit(fork.returncode)
code = "import os; print(os.environ.get('MPI_UTIL_JOB_DIR'), os.environ.get('MPI_UTIL_FORKED'))"
seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
print(f"rank {mpi_util.rank} started a process that saw {seen}", flush=True)
"""


def test_a_process_a_rank_starts_inherits_none_of_mpi_fork_s_variables(tmp_path):
    # Else a script of the user's that uses mpi_util, started by a rank, took itself for a rank mpi_fork started and
    # reported to the launching process as that rank.
    script = tmp_path / "child_of_a_rank.py"
    script.write_text(CHILD_OF_A_RANK)
    result = run_bounded([sys.executable, str(script)], 90, {"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-2000:]
    saw = [f"rank {rank} started a process that saw ['None', 'None']" for rank in (0, 1)]
    assert sorted(result.stdout.splitlines()) == saw
