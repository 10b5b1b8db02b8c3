"""Stall limits under a real mpiexec. argv[2] chooses the case; rank 0 writes {"error": message or None, "waited_s":
seconds in the call that failed} to argv[1]/stall.json and ends the job (exit 3) once it has given up.

auto: set_stall_timeout("auto") with the floor and start-up limits scaled down (1 s, 4 s) so the test is quick.
  Rank 1 is 2 s late in the first two calls of "step" (warm-up: allowed up to 4 s), 0.2 s late in calls 3-6
  (limit: max(1 s, 10 x 0.2 s) = 2 s), then hangs: rank 0 must give up about 2 s into call 7, naming rank 1.
deadline: no stall limit at all; rank 1 hangs in the third call; rank 0 sets stall_deadline(1.5 s) on entering it
  and must give up then, naming rank 1 and the reason.
Progress ("auto" scaled down: no-progress floor 2 s, start-up allowance 6 s; rank 1 works in steps of 0.1 s, calling
heartbeat() after each, as a rollout does per env step, before each of three calls):
  tick_then_hang: rank 1 works 1 s, then hangs in the first call's work: rank 0 must give up about 2 s after its
    last heartbeat, in the first call, long before the start-up allowance.
  slow_but_advancing: rank 1 works 8 s before each call (4x the floor, beyond the allowance): no error.
  hang_before_first_tick: rank 1 hangs before any heartbeat: rank 0 gives up after the start-up allowance, 6 s.
"""

import json
import sys
import time
from pathlib import Path

import mpi_util
from mpi_util import stall
from mpi_util.collective import meet
from mpi_util.process import COMM_WORLD

out_dir, case = Path(sys.argv[1]), sys.argv[2]
rank = mpi_util.rank
if case == "auto":
    stall.AUTO_FLOOR_S = 1.0
    # Rank 0 alone gives up (at 3 ranks, rank 2 would too, at about the same time, and race it to the file).
    mpi_util.set_stall_timeout("auto" if rank == 0 else None, startup_s=4.0)
    late_s = [2.0, 2.0, 0.2, 0.2, 0.2, 0.2, 3600.0]
elif case == "deadline":
    mpi_util.set_stall_timeout(None)
    late_s = [0.0, 0.0, 3600.0]
else:
    stall.AUTO_FLOOR_S = 2.0
    mpi_util.set_stall_timeout("auto", startup_s=6.0)
    work_s = {"tick_then_hang": [1.0], "slow_but_advancing": [8.0, 8.0, 8.0], "hang_before_first_tick": [0.0]}[case]
    late_s = [0.0] * len(work_s)
    if rank == 1:
        for seconds in work_s:
            for _ in range(round(seconds / 0.1)):
                time.sleep(0.1)  # a slow env step
                mpi_util.heartbeat()
            if case != "slow_but_advancing":
                time.sleep(3600)  # hung in the next step
            meet(COMM_WORLD, "step")
        sys.exit()
for call, late in enumerate(late_s):
    if rank == 1:
        time.sleep(late)
    if rank == 0 and case == "deadline" and call == 2:
        mpi_util.stall_deadline(1.5, "a stop was requested")
    started = time.monotonic()
    try:
        meet(COMM_WORLD, "step")
    except mpi_util.CollectiveStallError as error:
        result = {"error": str(error), "waited_s": time.monotonic() - started, "call": call}
        (out_dir / "stall.json").write_text(json.dumps(result))
        mpi_util.abort("stall case: rank 0 gave up as expected", 3)
if rank == 0:  # (rank 1 may get here once rank 0 has aborted the job: its sleep ends early)
    (out_dir / "stall.json").write_text(json.dumps({"error": None, "call": len(late_s)}))
