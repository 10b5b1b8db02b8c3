"""What train.py says about a command line it will not run, and how mpi_util's messages list ranks: one line each,
said before anything starts; a message about a large job names a few ranks and counts the rest."""

from __future__ import annotations

import argparse
import sys

import pytest
from conftest import launcher, run_bounded
from test_train import TRAIN

from mpi_util.supervise import JobWatch
from mpi_util.text import few, name_ranks


def argparse_message(argv: list[str], *args: str, **kwargs: object) -> str:
    """What argparse itself says about ``argv`` for an option made with ``args`` and ``kwargs`` (its wording
    changes between Python versions)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument(*args, **kwargs)
    with pytest.raises(argparse.ArgumentError) as error:
        parser.parse_args(argv)
    return str(error.value)


RESTARTS_NEED_A_LAUNCHER = ("needs --nprocs 2 or more: restarts are made by the process that launches the ranks, and "
                            "a 1-process run has none (--resume RUN_DIR continues it after a failure)")
REFUSED = [
    (["CartPole-v1", "--foo"], "unrecognized arguments: --foo; see --help"),
    (["CartPole-v1", "--batch_split", "foo"],
     argparse_message(["--batch_split", "foo"], "--batch_split", choices=["even", "shared"]) + "; see --help"),
    (["CartPole-v1", "--nprocs"], "argument --nprocs: expected one argument; see --help"),
    (["CartPole-v1", "--video", "walker.gif"],
     "--video needs --play RUN_DIR (it records the episodes --play runs); see --help"),
    (["CartPole-v1", "--episodes", "3"], "--episodes needs --play RUN_DIR (the episodes --play runs): to end training "
                                         "after N episodes, use --num_episodes N; see --help"),
    (["CartPole-v1", "--max_restarts", "2"], f"--max_restarts 2 {RESTARTS_NEED_A_LAUNCHER}"),
    (["CartPole-v1", "--nprocs", "1", "--max_restarts", "1"], f"--max_restarts 1 {RESTARTS_NEED_A_LAUNCHER}"),
]


@pytest.mark.parametrize(("args", "message"), REFUSED)
def test_refused_command_line_is_one_line_and_leaves_no_run_directory(tmp_path, args, message):
    logdir = tmp_path / "runs"
    result = run_bounded([sys.executable, TRAIN, *args, "--logdir", str(logdir)], timeout=60)
    assert result.returncode == 2
    assert result.stderr == f"train.py: error: {message}\n"
    assert result.stdout == ""
    assert not logdir.exists() or not list(logdir.iterdir())


def test_usage_error_under_a_launcher_is_said_once(tmp_path):
    # Every rank parses the same command line; rank 0 alone says what is wrong.
    command, env = launcher("-n", "2", sys.executable, TRAIN, "CartPole-v1", "--foo", "--logdir", str(tmp_path))
    result = run_bounded(command, timeout=60, env=env)
    assert result.returncode == 2
    assert result.stderr == "train.py: error: unrecognized arguments: --foo; see --help\n"
    assert not list(tmp_path.iterdir())


def test_few_names_at_most_three_and_counts_the_rest():
    assert few([]) == ""
    assert few([7]) == "7"
    assert few([0, 1]) == "0 and 1"
    assert few([0, 1, 2, 3]) == "0, 1, 2 and 3"  # "and 1 more" would say no less
    assert few(range(1000)) == "0, 1, 2 and 997 more"
    assert few(["a", "b"], "or") == "a or b"
    assert few(["rank 1: x", "rank 2: y", "rank 3: z", "rank 4: w", "rank 5: v"], "and", "; ") == \
        "rank 1: x; rank 2: y; rank 3: z and 2 more"
    assert name_ranks([3]) == "rank 3"
    assert name_ranks([0, 1]) == "ranks 0 and 1"
    assert name_ranks(range(1000)) == "ranks 0, 1, 2 and 997 more"


def test_a_job_failure_line_names_a_few_of_a_thousand_ranks():
    # The OOM killer can take every rank of a job; none had recorded where it ran.
    watch = JobWatch(1000)
    try:
        watch.ended_first = 999
        line = watch.describe_failure(137)
    finally:
        watch.stop()
        watch.close()
    assert line == ("rank 999 (host unknown) was killed by signal 9 (SIGKILL); ranks 0, 1, 2 and 997 "
                    "more did not say where they ran (another host without a shared filesystem, or they ended before "
                    "calling mpi_fork)")
