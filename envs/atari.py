"""Atari games through ale-py, with the standard preprocessing of the DQN and PPO papers.

``ALE/Pong-v5`` and the other ALE ids, and the older ids ale-py registers too (``PongNoFrameskip-v4``, ``Pong-v4``,
``Pong-v0``): up to 30 no-op actions at reset, the agent acting every 4th frame (the max of the last two frames
seen), frames grey and 84x84, the last 4 stacked as the channels of one (84, 84, 4) uint8 image. The preprocessing
skips the frames for every id (an id's own frame skip, fixed or random, is replaced); each id's own sticky actions
stay (at each frame the last action repeats with probability 0.25 for v5 and v0 ids, 0 for v4 ids), as does the
game's minimal action set. The stickiness is gymnasium's StickyAction wrapper at every frame, not ALE's own: ALE's
saved state leaves out the action it repeats, so a game restored from a checkpoint could act differently at its
first step; the wrapper's last action pickles with it, and its random draws come from the env's generator, which the
checkpoint keeps. What only training does, ending a value estimate at a lost life and clipping rewards to their
sign, is the rollout's (RolloutWorker's ``atari``), so that the returns it reports, and --play's, are the game's own
score.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from typing import Any

import gymnasium
import numpy as np

# The form of the ids ale-py registers outside its ALE/ namespace: NAME-v0, NAME-v4, NAMENoFrameskip-v4 (and -v0)
_OLDER_ID = re.compile(r"[A-Z][A-Za-z]*-v[04]")


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an ALE game: ``ALE/NAME-vN``, or an older id that ale-py registers."""
    return env_id.rpartition(":")[2].startswith("ALE/") or is_older_ale_id(env_id)


def is_older_ale_id(env_id: str) -> bool:
    """Whether ``env_id`` is one of the ids ale-py registers outside ALE/ (``PongNoFrameskip-v4``). Imports ale-py
    only for an id of their form, and only when it is installed."""
    name = env_id.rpartition(":")[2]
    return bool(_OLDER_ID.fullmatch(name)) and name in _older_ale_ids()


@functools.cache
def _older_ale_ids() -> frozenset[str]:
    """The ids outside ALE/ whose env is ale-py's (empty when ale-py is not installed); registers ale-py's envs."""
    if importlib.util.find_spec("ale_py") is None:
        return frozenset()
    import ale_py

    gymnasium.register_envs(ale_py)
    return frozenset(env_id for env_id, spec in gymnasium.envs.registry.items()
                     if not env_id.startswith("ALE/") and str(spec.entry_point).startswith("ale_py"))


class ChannelsLast(gymnasium.ObservationWrapper):
    """FrameStackObservation's (4, 84, 84) stack as the (84, 84, 4) image the CNN reads."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gymnasium.spaces.Box(np.moveaxis(space.low, 0, -1), np.moveaxis(space.high, 0, -1),
                                                      dtype=space.dtype)

    def observation(self, observation: Any) -> np.ndarray:
        """(4, 84, 84) uint8 frames -> (84, 84, 4)."""
        return np.ascontiguousarray(np.moveaxis(np.asarray(observation), 0, -1))


def make_atari(env_id: str, **kwargs: Any) -> gymnasium.Env:
    """The ALE game ``env_id`` preprocessed as the module says; ValueError with a one-line reason when ale-py (or
    OpenCV, which the resizing needs) is not installed."""
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError as error:
        raise ValueError(f"{env_id} needs ale-py and opencv ({error}): pip install -e '.[pixels]' in this "
                         "checkout") from None
    gymnasium.register_envs(ale_py)
    # ALE's C++ core prints its banner on every game it loads, which is not this tool's line to print
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    name = env_id.rpartition(":")[2]
    # the id's own stickiness (0.25 where its registration does not say: ale-py's AtariEnv default)
    sticky = kwargs.pop("repeat_action_probability",
                        gymnasium.spec(name).kwargs.get("repeat_action_probability", 0.25))
    env = gymnasium.make(name, frameskip=1, repeat_action_probability=0.0, **kwargs)
    if sticky:
        env = gymnasium.wrappers.StickyAction(env, repeat_action_probability=sticky)
    env = gymnasium.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True,
                                                terminal_on_life_loss=False, scale_obs=False)
    return ChannelsLast(gymnasium.wrappers.FrameStackObservation(env, 4))
