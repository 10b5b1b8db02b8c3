"""Making an env as training, evaluation and --play all get it: gymnasium.make, with its namespace's package
registered when needed, Dict and Tuple observations flattened (envs.flatten), an ALE game preprocessed (envs.atari);
and the family of an env id, whose defaults algos.registry keeps.

Imports gymnasium in the functions that need it: the launcher checks an env id before any rank starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

SUPPORTED = ("observations: a Box of one dimension (a vector) or three (an image, height x width x channels), or a "
             "Dict or Tuple of Boxes (flattened into a vector); actions: Box of one dimension, Discrete, "
             "MultiDiscrete of one dimension, or MultiBinary of one dimension")


def one_line(space: Any) -> str:
    """A space as one line (numpy prints a 2-D array over several)."""
    return " ".join(str(space).split())


def unsupported_obs(space: Any) -> ValueError:
    """The one-line error for an observation space the policy cannot read."""
    return ValueError(f"observation space {one_line(space)} is not supported; supported: {SUPPORTED}")


def needs_flattening(space: Any) -> bool:
    """Whether an observation space is a Dict or Tuple (of Boxes), which the env is wrapped to flatten."""
    import gymnasium

    return isinstance(space, (gymnasium.spaces.Dict, gymnasium.spaces.Tuple))


# Namespaces whose package registers its envs on import (None), or only when asked (the function that does).
_NAMESPACES = {"MinAtar": ("minatar.gym", "register_envs"), "ALE": ("ale_py", None)}


def register_namespace(env_id: str) -> None:
    """Register the envs of ``env_id``'s namespace when its package does not on import (MinAtar/...), ale-py's
    for its older ids too (``PongNoFrameskip-v4``); ValueError with a one-line reason when the package is not
    installed."""
    import importlib

    import gymnasium

    from envs.atari import is_atari

    namespace = "ALE" if is_atari(env_id) else env_id.rpartition(":")[2].partition("/")[0] if "/" in env_id else ""
    if namespace not in _NAMESPACES or any(key.startswith(namespace + "/") for key in gymnasium.envs.registry):
        return
    module, register = _NAMESPACES[namespace]
    try:
        package = importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{env_id} needs {module.partition('.')[0]}: pip install -e '.[pixels]' in this "
                         "checkout") from None
    if register is not None:
        getattr(package, register)()


def newest_version(name: str, skip: Callable[[str], bool] | None = None) -> str | None:
    """The registered id ``name-vN`` with the highest N, leaving out the ids ``skip`` answers yes for; None if none."""
    import re

    import gymnasium

    # A copy of the ids: skip may register envs (envs.atari.is_older_ale_id registers ale-py's on first use).
    versions = [(int(m.group(1)), env_id) for env_id in list(gymnasium.envs.registry)
                if (m := re.fullmatch(re.escape(name) + r"-v(\d+)", env_id)) and not (skip and skip(env_id))]
    return max(versions)[1] if versions else None


def _installed(namespace: str) -> bool:
    """Whether the package that registers ``namespace``'s envs (a key of _NAMESPACES) is installed."""
    return importlib.util.find_spec(_NAMESPACES[namespace][0].partition(".")[0]) is not None


def ids_in_namespaces(name: str) -> list[str]:
    """``NAMESPACE/name`` if registered, else the newest ``NAMESPACE/name-vN``, of each namespace train.py registers
    (ALE, MinAtar) whose package is installed, sorted: what a game's name without its namespace (``Breakout``,
    ``Pong-v5``) may have meant. Registers those packages' envs."""
    import gymnasium

    found = []
    for namespace in _NAMESPACES:
        if _installed(namespace):
            in_namespace = f"{namespace}/{name}"
            register_namespace(in_namespace)
            found.append(in_namespace if in_namespace in gymnasium.envs.registry else newest_version(in_namespace))
    return sorted(env_id for env_id in found if env_id is not None)


def registered_spelling(name: str) -> str | None:
    """The registered id, or name of ids without their ``-vN``, that ``name`` spells but for case (``pong`` ->
    ``Pong``, ``minatar/breakout-v1`` -> ``MinAtar/Breakout-v1``), registering the envs of a namespace train.py
    registers that it names; None when there is none, or more than one."""
    import re

    import gymnasium

    namespace = name.rpartition("/")[0].lower()
    for known in _NAMESPACES:
        if namespace == known.lower() and _installed(known):
            register_namespace(f"{known}/")
    ids = list(gymnasium.envs.registry)
    spellings = {spelling for env_id in ids for spelling in (env_id, re.sub(r"-v\d+$", "", env_id))
                 if spelling.lower() == name.lower()}
    return spellings.pop() if len(spellings) == 1 else None


FAMILY_NAMES = {"atari": "Atari"}
"""env_family's names -> how --help names them."""


def env_family(env_id: str) -> str | None:
    """The family of envs ``env_id`` belongs to, whose defaults algos.registry keeps (its key in FAMILY_NAMES), or
    None: "atari" for an ALE game (its ALE/ id or an older one), which make_env preprocesses as envs.atari says."""
    from envs.atari import is_atari

    return "atari" if is_atari(env_id) else None


def make_env(env_id: str, **kwargs: Any) -> Any:
    """gymnasium.make(env_id, **kwargs), its Dict or Tuple observations flattened into one float32 vector; an ALE
    game preprocessed as envs.atari says."""
    import gymnasium

    from envs.atari import is_atari, make_atari

    if is_atari(env_id):
        return make_atari(env_id, **kwargs)
    register_namespace(env_id)
    env = gymnasium.make(env_id, **kwargs)
    if needs_flattening(env.observation_space):
        parts = env.observation_space.spaces
        parts = parts.values() if isinstance(parts, dict) else parts
        if not all(isinstance(part, gymnasium.spaces.Box) for part in parts):
            raise unsupported_obs(env.observation_space)
        from envs.flatten import FlattenedObservation

        env = FlattenedObservation(env)
    return env

