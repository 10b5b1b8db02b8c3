"""What the policy makes of an env's spaces: flat vectors or images in, a Gaussian or categorical actions out (the
envs themselves are made in envs/).

Numpy only (gymnasium is imported by the functions that read a space): the workers and --play use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.make import SUPPORTED, one_line, unsupported_obs


@dataclass(frozen=True)
class ObsSpec:
    """The observations a policy reads: a flat float32 vector (normalized by running statistics), or an image that
    travels as uint8 and is scaled to [0, 1] inside the network."""

    shape: tuple[int, ...]
    """(obs_dim,) for a vector, (H, W, C) for an image."""
    scale: float = 1.0
    """Images: what the network multiplies the uint8 pixels by (1 / the space's high: 1/255 for a camera, 1 for 0/1
    planes). 1.0 for vectors, which the observation normalizer scales instead."""

    @property
    def is_image(self) -> bool:
        return len(self.shape) == 3

    @property
    def dtype(self) -> type:
        """How observations are stored and gathered: uint8 images (a quarter of float32's bytes), float32 vectors."""
        return np.uint8 if self.is_image else np.float32


@dataclass(frozen=True)
class ActionSpec:
    """How the policy acts: a diagonal Gaussian over a Box, or independent categoricals over ``nvec`` choices."""

    shape: tuple[int, ...]
    """One action's shape: () for Discrete; (d,) for a Box, MultiDiscrete or MultiBinary of d dimensions."""
    nvec: tuple[int, ...] | None = None
    """The number of choices of each categorical dimension (Discrete(n): (n,); MultiBinary(d): (2,) * d); None for
    a Box."""

    @property
    def discrete(self) -> bool:
        return self.nvec is not None

    @property
    def n_outputs(self) -> int:
        """The policy network's outputs: the Gaussian's means, or every categorical's logits."""
        return sum(self.nvec) if self.nvec is not None else self.shape[0]


def conv_layers(image_shape: tuple[int, ...]) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """The convolutional torso for images of (H, W, C): its layers as (filters, kernel, stride), valid padding, each
    followed by ReLU, and the width of the ReLU dense layer after them. The Nature CNN (Mnih et al. 2015) where the
    image is large enough for it (36 pixels or more a side; Atari's 84x84), else the one-layer torso MinAtar's
    authors use for its 10x10 boards."""
    if min(image_shape[:2]) >= 36:
        return ((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512
    return ((16, 3, 1),), 128


PRECISIONS = ("float32", "bfloat16")
"""What an image network's CNN layers may compute in (algos.networks.build_cnn_torso's ``precision``); the first is
the default, of train.py's --precision too."""


def network_kind(obs: ObsSpec) -> str:
    """The kind of network that reads ``obs``: "mlp" for vectors, "nature_cnn" or "small_cnn" (conv_layers) for
    images."""
    if not obs.is_image:
        return "mlp"
    return "nature_cnn" if len(conv_layers(obs.shape)[0]) > 1 else "small_cnn"


def obs_spec(space: Any) -> ObsSpec:
    """The ObsSpec of a gymnasium observation space (after flatten_obs_space); ValueError with a one-line reason
    naming what is supported."""
    import gymnasium

    if isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1:
        return ObsSpec((int(space.shape[0]),))
    if isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 3:
        high = float(np.max(space.high))
        integers = np.issubdtype(space.dtype, np.integer) or space.dtype == np.bool_
        if not integers or not 0 < high <= 255:
            raise ValueError("image observations must be uint8 or bool with values in [0, 255], got "
                             f"{one_line(space)}")
        return ObsSpec(tuple(int(n) for n in space.shape), scale=1.0 / high)
    raise unsupported_obs(space)


def action_spec(space: Any) -> ActionSpec:
    """The ActionSpec of a gymnasium action space; ValueError with a one-line reason naming what is supported."""
    import gymnasium

    if isinstance(space, gymnasium.spaces.Discrete):
        return ActionSpec((), (int(space.n),))
    if isinstance(space, gymnasium.spaces.Box) and len(space.shape) == 1:
        return ActionSpec((int(space.shape[0]),))
    if isinstance(space, gymnasium.spaces.MultiDiscrete) and len(space.shape) == 1 and not np.any(space.start):
        return ActionSpec((len(space.nvec),), tuple(int(n) for n in space.nvec))
    if isinstance(space, gymnasium.spaces.MultiBinary) and len(space.shape) == 1:
        return ActionSpec((int(space.n),), (2,) * int(space.n))
    raise ValueError(f"action space {one_line(space)} is not supported; supported: {SUPPORTED}")
