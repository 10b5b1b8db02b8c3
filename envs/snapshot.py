"""Exact snapshots of a gymnasium environment mid-episode, for checkpoints that resume without a seam.

Most environments pickle with their full state. MuJoCo and Atari (ale-py) environments do not: gymnasium pickles
them by their constructor arguments and rebuilds them fresh. For those the simulator's state and the env's RNG are
saved beside the pickle and put back after it is loaded: MuJoCo's whole MjData (which includes the solver's warm
start, so the continuation is bit-identical), and the Atari emulator's state with its own RNG (sticky actions draw
from it). The wrappers around them (frame stacks, the frame buffers of the preprocessing) pickle with their state.

Snapshots are zlib-compressed: a MuJoCo MjData pickles with its whole arena, which is mostly zeros. They are pickles,
so restore_env runs whatever they say: give it only snapshots this user made (trainer.checkpoint signs them).
"""

from __future__ import annotations

import pickle
import zlib

import gymnasium
import numpy as np

from envs.atari import is_atari


def _is_mujoco(env: gymnasium.Env) -> bool:
    inner = env.unwrapped
    return hasattr(inner, "model") and hasattr(inner, "data") and type(inner.data).__module__.startswith("mujoco")


def snapshot_env(env: gymnasium.Env) -> bytes:
    """Bytes from which ``restore_env`` rebuilds ``env`` in its current state (wrappers, counters, RNG)."""
    extra = None
    inner = env.unwrapped
    if _is_mujoco(env):
        extra = {"mjdata": inner.data, "np_random": inner.np_random.bit_generator.state}
    elif env.spec is not None and is_atari(env.spec.id):
        extra = {"ale_state": inner.clone_state(include_rng=True), "np_random": inner.np_random.bit_generator.state}
    # Level 1: a 20x smaller checkpoint for 1.5 ms per env; higher levels gain little more for twice the time.
    # "mujoco" names the simulator's part whichever simulator it is (the key older checkpoints hold).
    return zlib.compress(pickle.dumps({"env": env, "mujoco": extra}, protocol=pickle.HIGHEST_PROTOCOL), 1)


def restore_env(blob: bytes) -> gymnasium.Env:
    """The environment saved by ``snapshot_env``, continuing exactly where it was."""
    saved = pickle.loads(zlib.decompress(blob))
    env, extra = saved["env"], saved["mujoco"]
    if extra is None:
        return env
    inner = env.unwrapped
    if "mjdata" in extra:
        import mujoco

        mujoco.mj_copyData(inner.data, inner.model, extra["mjdata"])
    else:
        inner.restore_state(extra["ale_state"])
    generator = np.random.Generator(np.random.PCG64())
    generator.bit_generator.state = extra["np_random"]
    inner.np_random = generator
    return env
