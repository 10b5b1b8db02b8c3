"""Rounds of ring-then-sleep-until-everyone-rang on one Doorbell, back to back, as fast as the ranks go: a lost
wake-up (a ring that leaves the bell word where a sleeper had just read it) leaves that sleeper asleep until its
timeout. The timeout here is long (max_sleep_s), so a sleep that ends by timeout is a lost wake-up, not a slow rank.
The cause of a lost wake-up is a lost ring: every ring must add one to the bell word, so after the rounds it must
equal ranks x rounds (a plain load and store loses counts when ranks ring at once). Writes {"timed_out_sleeps":
count, "slowest_round_s": seconds, "bell": the word's value at the end, "rings": ranks x rounds} to
argv[1]/doorbell_{rank}.json."""

import json
import sys
import time
from pathlib import Path

import mpi_util
from mpi_util.process import COMM_WORLD
from mpi_util.wakeup import Doorbell

out_dir, rounds, max_sleep_s = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
doorbell = Doorbell(COMM_WORLD, max_sleep_s=max_sleep_s)
slowest = 0.0
for _ in range(rounds):
    started = time.monotonic()
    arrival = doorbell.ring()
    while not doorbell.all_arrived(arrival):
        doorbell.sleep_until_rung(arrival, max_sleep_s)
    slowest = max(slowest, time.monotonic() - started)
COMM_WORLD.Barrier()  # every rank has rung for the last time
doorbell.window.Sync()
result = {"timed_out_sleeps": doorbell.timed_out_sleeps, "slowest_round_s": slowest, "bell": int(doorbell.words[0]),
          "rings": rounds * mpi_util.nworkers}
(out_dir / f"doorbell_{mpi_util.rank}.json").write_text(json.dumps(result))
