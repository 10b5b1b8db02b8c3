"""Mismatched batches and weights raise the same clear error on every rank, naming rank and key, and never hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from conftest import REPO, WAITS

import mpi_util
from mpi_util import stall

CASES = {
    "missing_key": ("BatchMismatchError", ["rank {last}", "key 'act'"]),
    "dtype": ("BatchMismatchError", ["rank {last}", "key 'act'", "int32", "int64"]),
    "trailing_shape": ("BatchMismatchError", ["rank {last}", "key 'obs'", "(4,)", "(3,)"]),
    "non_numeric": ("BatchMismatchError", ["rank {last}", "key 'act'", "non-numeric"]),
    "unequal_rows": ("BatchMismatchError", ["rank {last}", "different numbers of rows"]),
    "bcast_shape": ("WeightMismatchError", ["rank {last}", "variable 0", "[2, 3]", "[3, 2]"]),
    "bcast_count": ("WeightMismatchError", ["rank {last}", "1 variables", "rank 0 has 2"]),
    "bcast_read_only": ("WeightMismatchError", ["rank {last}", "read-only"]),
    "reduce_shape": ("ValueError", ["all_sum", "(3,)", "(4,)", "different shapes"]),
}


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_mismatch_raises_same_error_on_every_rank(run_mpi, tmp_path, nprocs, case):
    run_mpi(nprocs, "error_cases.py", str(tmp_path), case, timeout=60)
    error_type, fragments = CASES[case]
    messages = [(tmp_path / f"error_{r}.txt").read_text() for r in range(nprocs)]
    assert len(set(messages)) == 1, messages
    assert messages[0].startswith(error_type), messages[0]
    for fragment in fragments:
        assert fragment.format(last=nprocs - 1) in messages[0], messages[0]
    assert "\n" not in messages[0]


def test_single_process_checks_its_own_batch():
    with pytest.raises(mpi_util.BatchMismatchError, match="key 'a' has non-numeric dtype"):
        mpi_util.rank0_accum_batches({"a": np.array(["x", "y"])})
    with pytest.raises(mpi_util.BatchMismatchError, match="different numbers of rows"):
        mpi_util.rank0_accum_batches({"a": np.zeros(2), "b": np.zeros(3)})
    with pytest.raises(mpi_util.BatchMismatchError, match="scalar"):
        mpi_util.rank0_accum_batches({"a": np.float32(1)})
    batch = {"a": np.arange(3)}
    assert mpi_util.rank0_accum_batches(batch)["a"] is batch["a"]


def test_bad_arguments_are_clear():
    with pytest.raises(TypeError, match="cannot broadcast a str"):
        mpi_util.rank0_bcast_wts("weights")
    with pytest.raises(TypeError, match="expected numbers"):
        mpi_util.all_sum(np.array(["a"]))
    with pytest.raises(TypeError, match="must be an integer"):
        mpi_util.mpi_fork("2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an integer"):
        mpi_util.mpi_fork(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1"):
        mpi_util.mpi_fork(0)
    with pytest.raises(ValueError, match=r"gpu_pct must be in \[0, 1\]"):
        mpi_util.mpi_fork(2, gpu_pct=1.5)
    with pytest.raises(ValueError, match=r"gpu_pct must be in \[0, 1\]"):
        mpi_util.check_gpu_pct(-0.1)
    with pytest.raises(ValueError, match="stall timeout"):
        mpi_util.set_stall_timeout(-1)


@WAITS
@pytest.mark.parametrize("nprocs", [2, 3])
def test_auto_stall_timeout_allows_warm_up_then_reports_a_hang_within_ten_waits(run_mpi, tmp_path, nprocs):
    # Start-up limit 4 s and floor 1 s (scaled down from 600 s and 60 s): 2 s late in warm-up passes, 0.2 s late sets
    # the limit to 10 x 0.2 = 2 s, and the hang is reported about 2 s into the call, naming the late rank.
    result = run_mpi(nprocs, "stall_cases.py", str(tmp_path), "auto", timeout=60, check=False)
    assert result.returncode == 3, result.stderr[-2000:]
    outcome = json.loads((tmp_path / "stall.json").read_text())
    assert outcome["call"] == 6, outcome
    assert 1.9 <= outcome["waited_s"] <= 3.5, outcome
    assert "in step" in outcome["error"] and "rank 1 has not arrived" in outcome["error"], outcome


@pytest.mark.parametrize(("case", "waited_s"), [("tick_then_hang", (2.8, 4.5)), ("hang_before_first_tick", (5.9, 7.5))])
def test_a_rank_that_stops_advancing_is_reported_in_the_first_call(run_mpi, tmp_path, case, waited_s):
    result = run_mpi(2, "stall_cases.py", str(tmp_path), case, timeout=60, check=False)
    assert result.returncode == 3, result.stderr[-2000:]
    outcome = json.loads((tmp_path / "stall.json").read_text())
    assert outcome["call"] == 0 and waited_s[0] <= outcome["waited_s"] <= waited_s[1], outcome
    silent_s = 2 if case == "tick_then_hang" else 6
    assert f"no progress for {silent_s} s in step (collective #1): rank 1 has not arrived" in outcome["error"], outcome


@WAITS
def test_a_slow_rank_that_advances_is_not_blamed(run_mpi, tmp_path):
    # Each wait lasts about 8 s, 4x the no-progress limit and beyond the start-up allowance: without its heartbeats
    # rank 1 would be blamed in the first call.
    result = run_mpi(2, "stall_cases.py", str(tmp_path), "slow_but_advancing", timeout=90, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "stall.json").read_text()) == {"error": None, "call": 3}


@pytest.mark.parametrize("nprocs", [2, 3])
def test_stall_deadline_ends_a_wait_that_has_no_limit(run_mpi, tmp_path, nprocs):
    result = run_mpi(nprocs, "stall_cases.py", str(tmp_path), "deadline", timeout=60, check=False)
    assert result.returncode == 3, result.stderr[-2000:]
    outcome = json.loads((tmp_path / "stall.json").read_text())
    assert outcome["call"] == 2 and 1.4 <= outcome["waited_s"] <= 3.0, outcome
    assert "a stop was requested" in outcome["error"] and "rank 1 has not arrived" in outcome["error"], outcome


READ_LIMIT = "import mpi_util.stall as s; print(repr(s.watch.limit), s.watch.startup_s)"


@pytest.mark.parametrize(("value", "limit"), [(None, "'auto' 120.0"), ("auto", "'auto' 120.0"), ("0", "None 120.0"),
                                              ("45", "45.0 120.0")])
def test_stall_timeout_variable_takes_the_words_of_the_command_line(value, limit):
    # The words of train.py's --stall_timeout, with the same meanings: 0 waits forever; unset is "auto" (library
    # users get a limit too), with the documented 120 s start-up allowance.
    env = {"MPI_UTIL_STALL_TIMEOUT": value} if value is not None else {}
    env_without = {k: v for k, v in os.environ.items() if k not in ("MPI_UTIL_STALL_TIMEOUT", "MPI_UTIL_STALL_STARTUP")}
    result = subprocess.run([sys.executable, "-c", READ_LIMIT], env={**env_without, "PYTHONPATH": str(REPO), **env},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.split("\n")[0] == limit, result.stderr[-2000:]


@pytest.mark.parametrize(("name", "value", "message"), [
    ("MPI_UTIL_STALL_TIMEOUT", "10m", "MPI_UTIL_STALL_TIMEOUT must be 'auto', a number of seconds, or 0 to wait "
                                     "forever, got '10m'"),
    ("MPI_UTIL_STALL_TIMEOUT", "-5", "got '-5'"),
    ("MPI_UTIL_STALL_STARTUP", "0", "MPI_UTIL_STALL_STARTUP must be a number of seconds > 0"),
])
def test_bad_stall_variables_say_which_and_why(name, value, message):
    result = subprocess.run([sys.executable, "-c", "import mpi_util"], env={**os.environ, "PYTHONPATH": str(REPO),
                            name: value}, capture_output=True, text=True, timeout=60)
    last_line = result.stderr.splitlines()[-1]
    assert result.returncode != 0 and last_line.startswith("ValueError: ") and message in last_line, result.stderr


def test_documented_auto_defaults():
    assert (stall.AUTO_FLOOR_S, stall.AUTO_STARTUP_S, stall.AUTO_FACTOR, stall.AUTO_WARMUP_CALLS) == (60.0, 120.0,
                                                                                                    10.0, 2)
    assert mpi_util.parse_stall_timeout("auto") == "auto" and mpi_util.parse_stall_timeout(" 0 ") is None
    assert mpi_util.parse_stall_timeout("2.5") == 2.5
    with pytest.raises(ValueError, match="--stall_timeout must be 'auto'"):
        mpi_util.parse_stall_timeout("inf", "--stall_timeout")


def test_rank0_bcast_wts_refuses_what_it_cannot_write_in_place_naming_the_fix():
    # A 0-d array is written in place (tested at 3 ranks in test_mpi_collectives); numbers, numpy scalars and dicts
    # are not arrays that can be overwritten, and the message names what to use instead.
    for scalar, name in [(np.float64(1.0), "float64"), (2.5, "float"), (np.int32(3), "int32")]:
        with pytest.raises(TypeError, match=rf"^rank0_bcast_wts: a {name} scalar cannot be overwritten in place; "
                                            r"hold it in a 0-d array \(np.array\(value\).*rank0_bcast_tree"):
            mpi_util.rank0_bcast_wts([np.zeros(2), scalar])
    with pytest.raises(TypeError, match=r"cannot broadcast a dict.*use x = rank0_bcast_tree\(x\)"):
        mpi_util.rank0_bcast_wts({"w": np.zeros(2)})
    zero_d = np.array(4.0)
    mpi_util.rank0_bcast_wts([zero_d])
    assert zero_d.shape == () and zero_d == 4.0


def test_rank0_bcast_tree_single_process_returns_a_copy_and_refuses_non_numeric_leaves():
    tree = {"w": np.arange(3.0), "step": np.int64(7), "lr": 0.5, "done": False, "none": None,
            "frozen": types.MappingProxyType({"b": np.ones(2, np.float32)})}
    got = mpi_util.rank0_bcast_tree(tree)
    assert got.keys() == tree.keys() and got["none"] is None
    assert type(got["frozen"]) is types.MappingProxyType and got["frozen"]["b"].dtype == np.float32
    assert type(got["step"]) is np.int64 and got["step"] == 7
    assert type(got["lr"]) is float and type(got["done"]) is bool
    assert not np.shares_memory(got["w"], tree["w"]) and got["w"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(TypeError, match=r"^rank0_bcast_tree: tree\['name'\] is a str; leaves must be arrays"):
        mpi_util.rank0_bcast_tree({"name": "x", "w": np.zeros(1)})
    with pytest.raises(TypeError, match=r"^rank0_bcast_tree: leaf tree\[0\] has dtype object"):
        mpi_util.rank0_bcast_tree([np.array([None])])
