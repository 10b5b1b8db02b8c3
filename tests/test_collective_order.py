"""Ranks out of step: a rank in another collective, or one whose script has ended, is named on every rank within
seconds, under a real mpiexec, and no rank is left waiting."""

from __future__ import annotations

import re

import pytest
from conftest import mpiexec

CASES = {
    # case: (what rank 0 must say, what every other waiting rank must say)
    "out_of_sync_on_rank0": (r"CollectiveOrderError after [\d.]+ s: rank 1 called rank0_bcast_wts where rank 0 called "
                             r"ranks_out_of_sync \(collective #2 of rank 0, in ranks_out_of_sync\): call the same "
                             r"collectives in the same order on every rank", r"CollectiveOrderError .* rank 1 called "
                             r"rank0_bcast_wts where rank 0 called ranks_out_of_sync"),
    "bcast_where_gather": (r"CollectiveOrderError after [\d.]+ s: rank 2 called rank0_bcast_wts where rank 0 called "
                           r"rank0_accum_batches \(collective #1 of rank 0, in rank0_accum_batches\)",
                           r"CollectiveOrderError .* rank 2 called rank0_bcast_wts where rank 0 called "
                           r"rank0_accum_batches"),
    # Rank 1 may give up and end first: then both are named.
    "ends_after_a_collective": (r"RankEndedError after [\d.]+ s: rank 0 waits in rank0_accum_batches \(collective #2\) "
                                r"for (rank 1 \(on host \S+, pid \d+\) and )?rank 2 \(on host \S+, pid \d+\), "
                                r"whose script has ended \(returned, exited or "
                                r"raised\) after rank0_accum_batches \(its collective #1\)",
                                r"RankEndedError .* rank [02] \(on host \S+, pid \d+\), whose script has ended"),
    "ends_before_any": (r"RankEndedError after [\d.]+ s: rank 0 waits in rank0_accum_batches \(collective #1\) for "
                        r"rank 2 \(on host \S+, pid \d+\), whose script has ended \(returned, exited or raised\) "
                        r"before any collective",
                        r"RankEndedError .* for rank 2 \(on host \S+, pid \d+\), whose script has ended \(returned, "
                        r"exited or raised\) before any collective"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_rank_out_of_step_is_named_on_every_rank_within_seconds(case):
    result = mpiexec(3, "order_cases.py", case, timeout=60)
    lines = {int(m.group(1)): m.group(2) for m in re.finditer(r"^rank (\d): (.*)$", result.stdout, re.MULTILINE)}
    assert sorted(lines) == [0, 1, 2], result.stdout
    rank0, others = CASES[case]
    assert re.fullmatch(rank0 + r".*", lines[0]), lines[0]
    waiting = [1] if case.startswith("ends") else [1, 2]
    for rank in waiting:
        assert re.match(others, lines[rank]) or re.search(others, lines[rank]), lines[rank]
        assert float(re.search(r"after ([\d.]+) s", lines[rank]).group(1)) < 5, lines[rank]
    assert float(re.search(r"after ([\d.]+) s", lines[0]).group(1)) < 5, lines[0]
    if case.startswith("ends"):
        assert lines[2] == "ended"
    assert result.stderr == "", result.stderr[-2000:]  # one line per rank, nothing else (MPICH's own included)
