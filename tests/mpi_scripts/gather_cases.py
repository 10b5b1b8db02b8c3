"""Every rank gathers a set of batches; each rank saves its input and what it got back, into argv[1], and which
cases went through the shared-memory segments (routes_{rank}.json).

Sizes vary so that the segments grow, and the "race_*" cases run back to back while rank 0 copies each gather out
late: the other ranks write the next gather meanwhile, which must not overwrite what rank 0 is still reading.
With GATHER_FILE_LIMIT=N in the environment, files larger than N bytes cannot be written during the gathers
(RLIMIT_FSIZE, as a small /dev/shm refuses them): the segments cannot be allocated, and every gather must go
through MPI; every rank saves whether it gave up on shared memory (refused_{rank}.json).
"""

import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

import mpi_util
from mpi_util.host import HostTransport, transport
from mpi_util.process import COMM_WORLD


def gathers_through_segments() -> int:
    """Gathers whose data went through the one-host transport's shared segments so far (0 without one)."""
    host = transport(COMM_WORLD)
    return host.gathers_through_segments if host else 0


out_dir = Path(sys.argv[1])
rank, size = mpi_util.rank, mpi_util.nworkers
rng = np.random.default_rng(1000 + rank)


def rows_for(case: str) -> int:
    if case == "zero_rows_on_rank1":
        return 0 if rank == 1 else 7
    if case == "all_zero_rows":
        return 0
    if case == "large":
        return 100_000 + rank  # over the shared segments' limit: MPI
    if case.startswith("medium"):
        return 20_000 + rank  # 2.3 MB per rank: the segments grow to hold it
    if case.startswith("race_"):
        return 3 * rank + 2 + 50 * int(case[-1])
    return 3 * rank + 2  # a different count on every rank


take_from_segment = HostTransport.gather_take


def late_take(*args, **kwargs) -> None:
    time.sleep(0.05)
    take_from_segment(*args, **kwargs)


CASES = ["mixed_dtypes", "zero_rows_on_rank1", "all_zero_rows", "mixed_dtypes_again", "large", "medium",
         "medium_again", *(f"race_{k}" for k in range(6))]
file_limit = int(os.environ.get("GATHER_FILE_LIMIT", "0"))
unlimited = resource.getrlimit(resource.RLIMIT_FSIZE)
routes = {}
for case in CASES:
    if case == "race_0":
        HostTransport.gather_take = late_take
    n = rows_for(case)
    batch = {
        "obs": rng.standard_normal((n, 17)).astype(np.float32),
        "act": rng.standard_normal((n, 6)),
        "half": rng.standard_normal((n, 2, 3)).astype(np.float16),
        "image": rng.integers(0, 255, (n, 4, 4, 3), dtype=np.uint8),
        "step": rng.integers(-(2**40), 2**40, n, dtype=np.int64),
        "small_int": rng.integers(-5, 5, n, dtype=np.int32),
        "done": rng.random(n) < 0.5,
        "phase": (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64),
    }
    if case == "large" or case.startswith("medium"):
        batch = {"obs": batch["obs"], "act": batch["act"]}
    before = gathers_through_segments()
    if file_limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, unlimited[1]))
    result = mpi_util.rank0_accum_batches(batch)
    resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)
    routes[case] = "shared" if gathers_through_segments() > before else "mpi"
    np.savez(out_dir / f"{case}_in_{rank}.npz", **batch)
    np.savez(out_dir / f"{case}_out_{rank}.npz", **result)
    assert list(result) == list(batch), (list(result), list(batch))
(out_dir / f"routes_{rank}.json").write_text(json.dumps(routes))
host = transport(COMM_WORLD)
(out_dir / f"refused_{rank}.json").write_text(json.dumps(host.segments_refused if host else None))
