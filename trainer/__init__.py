"""The training machinery train.py drives: its configuration and command line, rank 0's learner, the counters,
stop requests, checkpoints and --resume, the run directory, logs, plots and --play.

``algos`` holds the algorithms (PPO, TRPO and their parts); ``mpi_util`` the MPI layer. Importing this package, or
trainer.config, trainer.options, trainer.checkpoint or trainer.play, imports no TensorFlow: the launcher, the rollout
workers and --play need numpy only.
"""
