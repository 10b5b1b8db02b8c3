"""setup_gpu(argv[1]) on every rank; each prints what it did."""

import sys

import mpi_util

result = mpi_util.setup_gpu(float(sys.argv[1]))
import tensorflow as tf  # noqa: E402

mpi_util.print0(f"GPU_COUNT {len(tf.config.list_physical_devices('GPU'))}")
print(f"SETUP {result}", flush=True)
