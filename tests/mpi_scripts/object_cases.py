"""gather_objects, bcast_object and ranks_out_of_sync on every rank; writes what each rank got to
argv[1]/objects_{rank}.pkl."""

import pickle
import sys
from pathlib import Path

import numpy as np

import mpi_util

out_dir = Path(sys.argv[1])
rank, size = mpi_util.rank, mpi_util.nworkers
got = {}
# Small objects of different sizes per rank, then large ones (3 MB per rank; 20 MB broadcast, over the shared window).
got["gathered"] = mpi_util.gather_objects({"rank": rank, "items": list(range(100 * rank)), "name": f"r{rank}"})
got["gathered_large"] = mpi_util.gather_objects(np.full(3 << 18, rank, dtype=np.float32))
got["gathered_none"] = mpi_util.gather_objects(None)
got["bcast"] = mpi_util.bcast_object({"config": [1, 2.5, "x"], "from": rank} if rank == 0 else None)
got["bcast_large"] = mpi_util.bcast_object(np.arange(5 << 20, dtype=np.float32) * (rank == 0))
weights = [np.arange(12, dtype=np.float32).reshape(3, 4), np.ones(5)]
got["in_sync"] = mpi_util.ranks_out_of_sync(weights)
if rank == size - 1 and size > 1:
    weights[1][2] = np.nextafter(1.0, 2.0)  # one bit
got["one_rank_off"] = mpi_util.ranks_out_of_sync(weights)
(out_dir / f"objects_{rank}.pkl").write_bytes(pickle.dumps(got))
