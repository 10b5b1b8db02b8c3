"""The training machinery train.py drives: its configuration and command line, rank 0's learner, the counters,
stop requests, checkpoints and --resume, the run directory, logs, plots and --play.

``algos`` holds the algorithms (PPO, TRPO and their parts); ``mpi_util`` the MPI layer. Importing this package, or
trainer.config, trainer.options, trainer.checkpoint or trainer.play, imports no TensorFlow: the launcher, the rollout
workers and --play need numpy only.

``trainer.run`` trains from Python as train.py does from the command line (trainer.api).
"""

from trainer.api import TrainingFailed, run

__all__ = ["TrainingFailed", "run"]
