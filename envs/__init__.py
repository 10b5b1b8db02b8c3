"""Environments: making, wrapping and preprocessing them (envs.make, envs.atari, envs.flatten) and snapshotting
them for exact checkpoints (envs.snapshot), one room that the rollout, evaluation and --play all use. Imports
nothing of algos/ or trainer/.
"""
