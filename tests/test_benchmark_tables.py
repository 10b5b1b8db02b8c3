"""The learning tables benchmarks/peers.py writes (--window): pure functions of the runs' per-iteration episodes."""

import math
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import peers  # noqa: E402  (benchmarks/ is not a package: its scripts import each other by name)


def test_window_means_weigh_each_iteration_by_its_episodes_and_drop_a_partial_window():
    # (steps so far, mean return of the episodes that ended in the iteration, how many ended)
    ours = [(1024, 1.0, 1), (2048, 4.0, 3), (3072, math.nan, 0), (4096, -21.0, 0), (5120, math.nan, 0),
            (6144, 2.0, 2), (7168, 9.0, 5)]
    assert peers.window_rows(ours, 3)[0] == (1024, 3072, (1.0 + 3 * 4.0) / 4, 4)
    second = peers.window_rows(ours, 3)[1]
    assert second[:2] == (4096, 6144) and second[2:] == (2.0, 2)  # an iteration without episodes adds nothing
    assert len(peers.window_rows(ours, 3)) == 2  # iteration 7 alone is a partial window
    empty = peers.window_rows([(1024, math.nan, 0), (2048, math.nan, 0)], 2)
    assert len(empty) == 1 and math.isnan(empty[0][2]) and empty[0][3] == 0


def test_window_table_has_a_column_per_run_and_a_peer_record_reads_as_episodes():
    record = {"iterations": [{"steps": 1024 * i, "returns": [-21.0] * (i % 2) + [-19.0] * (i % 2)}
                             for i in range(1, 5)]}
    peer = peers.episodes_peer(record)
    assert peer[0] == (1024, -20.0, 2) and peer[2] == (3072, -20.0, 2)
    assert peer[1][::2] == (2048, 0) and math.isnan(peer[1][1])  # an iteration in which no game ended
    assert peers.episodes_peer({"iterations": [{"steps": 1024, "episode_return_mean": -20.0}]}) is None  # RLlib's
    ours = [(1024 * i, -18.0, 1) for i in range(1, 5)]
    lines = peers.window_table([("train.py", ours), ("CleanRL-style", peer)], 2)
    assert lines[-1].splitlines() == [
        "| steps | train.py (episodes) | CleanRL-style (episodes) |", "| --- | --- | --- |",
        "| 1,024-2,048 | -18.00 (2) | -20.00 (2) |", "| 3,072-4,096 | -18.00 (2) | -20.00 (2) |"]
