"""Each rank seeds from base seed argv[2] and saves its seed and its first draws into argv[1]."""

import random
import sys
from pathlib import Path

import numpy as np

import mpi_util

out_dir, base_seed = Path(sys.argv[1]), int(sys.argv[2])
seed = mpi_util.set_global_seeds(base_seed)
np.savez(out_dir / f"seed_{mpi_util.rank}.npz", seed=seed, numpy_draw=np.random.random(3), python_draw=random.random())
