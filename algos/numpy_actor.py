"""What the workers act with: the policy and value networks in numpy, with the observation and return normalizers.

Numpy only (no TensorFlow), so that rollouts and ``train.py --play`` work without importing it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from algos.normalizer import RunningMeanStd
from algos.spaces import ActionSpec, ObsSpec, conv_layers


def numpy_mlp_forward(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The function of build_mlp in numpy: x (N, in_dim) float32 -> (N, out_dim) float32.

    weights: [W0 (in_dim, h0), b0 (h0,), W1, b1, ...], float32, as in model.weights.
    """
    h = np.asarray(x, dtype=np.float32)
    last = len(weights) - 2
    # np.dot and in-place bias and tanh: at one row per call (a worker acting) each numpy call's fixed cost is most
    # of the work, and these take about half of what `h @ w + b` and a new tanh array do.
    for i in range(0, len(weights), 2):
        h = np.dot(h, weights[i])
        h += weights[i + 1]
        if i < last:
            np.tanh(h, out=h)
    return h


def conv2d(x: np.ndarray, kernel: np.ndarray, stride: int) -> np.ndarray:
    """A valid-padding convolution: x (N, H, W, C) float32, kernel (k, k, C, F) as Keras holds it -> (N, Ho, Wo, F)
    float32. A stride that divides the kernel and is above 1 (the Nature CNN's 8/4 and 4/2) goes by blocks
    (conv2d_by_blocks); any other by one matrix product over every k x k window (im2col on BLAS), which is faster
    for the small images of MinAtar's 3x3 layer."""
    k = kernel.shape[0]
    if stride > 1 and k % stride == 0:
        return conv2d_by_blocks(x, kernel, stride)
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))[:, ::stride, ::stride]
    n, ho, wo = windows.shape[:3]
    # windows: (N, Ho, Wo, C, k, k); the kernel's rows in the same (C, k, k) order.
    columns = windows.reshape(n * ho * wo, -1)
    return np.dot(columns, kernel.transpose(2, 0, 1, 3).reshape(-1, kernel.shape[3])).reshape(n, ho, wo, -1)


def conv2d_by_blocks(x: np.ndarray, kernel: np.ndarray, stride: int) -> np.ndarray:
    """conv2d for a stride s that divides the kernel's side k, m = k / s: x (N, H, W, C) float32, kernel (k, k, C, F)
    -> (N, Ho, Wo, F) float32.

    The image, cut into s x s blocks, is (N, H/s, W/s, s*s*C) by a reshape (space to depth), and a k x k window at
    stride s is m x m whole blocks. So one matrix product of every block with each of the kernel's m x m parts,
    (N*H/s*W/s, s*s*C) @ (s*s*C, m*m*F), and a sum of the m*m parts at their offsets give the convolution. im2col
    copies each pixel into m*m overlapping windows first (3.6x the floats of an 84x84 frame in the 8x8/4 layer): with
    it the Nature CNN's torso took 1.2-1.45x the time per image, and a Pong rollout 1.23x (benchmarks/README.md,
    section Pixels)."""
    k, _, channels, filters = kernel.shape
    m = k // stride
    n, height, width, _ = x.shape
    ho, wo = (height - k) // stride + 1, (width - k) // stride + 1
    hb, wb = ho + m - 1, wo + m - 1  # the blocks the windows cover; rows and columns past them are never read
    blocks = x[:, : hb * stride, : wb * stride].reshape(n, hb, stride, wb, stride, channels)
    blocks = blocks.transpose(0, 1, 3, 2, 4, 5).reshape(n * hb * wb, stride * stride * channels)
    # The kernel's rows in the blocks' (s, s, C) order, its columns the m x m parts' (m, m, F).
    parts = kernel.reshape(m, stride, m, stride, channels, filters).transpose(1, 3, 4, 0, 2, 5)
    products = np.dot(blocks, parts.reshape(stride * stride * channels, m * m * filters)).reshape(n, hb, wb, m, m, -1)
    out = products[:, :ho, :wo, 0, 0].copy()
    for a in range(m):
        for b in range(m):
            if a or b:
                out += products[:, a : a + ho, b : b + wo, a, b]
    return out


# Images per pass of numpy_cnn_forward. The Nature CNN's first layer makes 0.3 MB of blocks and products per 84x84x4
# image: a rollout's batched value call over 2,048 images at once would build (and fault in) 700 MB.
CNN_ROWS = 16


def numpy_cnn_torso(weights: list[np.ndarray], x: np.ndarray, obs: ObsSpec) -> np.ndarray:
    """The convolutional torso of build_cnn (its layers up to the ReLU dense layer) in numpy: x (N, H, W, C) uint8 ->
    (N, D) float32 features; weights [K0, b0, ..., W (flat, D), b (D,)] as in the torso's weights. Agrees with
    TensorFlow's to float32 round-off, not to the bit. Runs CNN_ROWS images at a time."""
    if len(x) > CNN_ROWS:
        return np.concatenate([numpy_cnn_torso(weights, x[i : i + CNN_ROWS], obs) for i in range(0, len(x), CNN_ROWS)])
    convs, _ = conv_layers(obs.shape)
    h = x.astype(np.float32)
    h *= np.float32(obs.scale)
    for i, (_, _, stride) in enumerate(convs):
        h = conv2d(h, weights[2 * i], stride)
        h += weights[2 * i + 1]
        np.maximum(h, 0.0, out=h)
    h = np.dot(h.reshape(len(h), -1), weights[-2])
    h += weights[-1]
    return np.maximum(h, 0.0, out=h)


def numpy_cnn_forward(weights: list[np.ndarray], x: np.ndarray, obs: ObsSpec) -> np.ndarray:
    """The function of build_cnn in numpy: x (N, H, W, C) uint8 -> (N, out_dim) float32; weights as in model.weights
    (the torso's, then the linear output's W (D, out_dim) and b (out_dim,))."""
    return linear(weights[-2:], numpy_cnn_torso(weights[:-2], x, obs))


def linear(weights: list[np.ndarray], features: np.ndarray) -> np.ndarray:
    """A linear output layer: features (N, D) float32, weights [W (D, out_dim), b (out_dim,)] -> (N, out_dim)."""
    out = np.dot(features, weights[0])
    out += weights[1]
    return out


def network_like(obs: ObsSpec, hidden: tuple[int, ...], out_dim: int | None) -> list[np.ndarray]:
    """Zero arrays of the shapes of one network's weights (build_mlp's or build_cnn's), float32; out_dim None: a CNN's
    torso alone (build_cnn_torso's), without the output layer."""
    arrays: list[np.ndarray] = []
    if obs.is_image:
        convs, dense = conv_layers(obs.shape)
        height, width, channels = obs.shape
        for filters, kernel, stride in convs:
            arrays += [np.zeros((kernel, kernel, channels, filters), np.float32), np.zeros(filters, np.float32)]
            height, width, channels = (height - kernel) // stride + 1, (width - kernel) // stride + 1, filters
        sizes = [height * width * channels, dense] + ([] if out_dim is None else [out_dim])
    else:
        sizes = [obs.shape[0], *hidden, out_dim]
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        arrays += [np.zeros((n_in, n_out), np.float32), np.zeros(n_out, np.float32)]
    return arrays


def actor_critic_state_like(obs: ObsSpec, action: ActionSpec, hidden: tuple[int, ...],
                            shared_torso: bool = False) -> list[np.ndarray]:
    """Arrays of the shapes and dtypes of ActorCritic.broadcast_state(), without TensorFlow: what a worker receives
    rank 0's learner state into. Two networks: pi_net's weights (network_like, action.n_outputs outputs), log_std
    (act_dim,) for a Box, v_net's weights (one output). One shared CNN torso (``shared_torso``): the torso's weights,
    the policy head [W (D, n_outputs), b], log_std for a Box, the value head [W (D, 1), b]. All float32; then obs_rms
    and ret_rms [mean, var, count] as RunningMeanStd holds them (obs_rms of one dimension for images, which it does
    not normalize). Values are placeholders until the broadcast."""
    log_std = [] if action.discrete else [np.zeros(action.n_outputs, np.float32)]
    obs_dim = 1 if obs.is_image else obs.shape[0]
    normalizers = [a.copy() for a in RunningMeanStd(obs_dim).arrays() + RunningMeanStd(1).arrays()]
    if shared_torso:
        width = conv_layers(obs.shape)[1]
        heads = [np.zeros((width, action.n_outputs), np.float32), np.zeros(action.n_outputs, np.float32), *log_std,
                 np.zeros((width, 1), np.float32), np.zeros(1, np.float32)]
        return network_like(obs, hidden, None) + heads + normalizers
    return network_like(obs, hidden, action.n_outputs) + log_std + network_like(obs, hidden, 1) + normalizers


POLICY_FORMAT = "mpi-batch-rl policy"
"""What a policy file's spec names itself (NumpyActor.save): one .npz of plain arrays and a JSON spec."""
POLICY_VERSION = 1


class NumpyActor:
    """A numpy snapshot of an ActorCritic: acts and evaluates values on RAW observations, without TensorFlow.

    Workers use it because one numpy forward pass of a small MLP takes microseconds, against milliseconds
    through TensorFlow per call. What it derives from its arguments (std, the observation scale) is computed once
    at construction: give it arrays that will not change (ActorCritic.numpy_actor() passes copies).

    Two networks: pi_weights and v_weights are whole networks (build_mlp's or build_cnn's), torso_weights None. One
    shared CNN torso: torso_weights are its weights (build_cnn_torso's), pi_weights and v_weights the linear heads on
    its features, and act_and_value_with_noise gives a step's actions and values from one pass of the torso.
    """

    def __init__(
        self,
        pi_weights: list[np.ndarray],
        log_std: np.ndarray | None,
        v_weights: list[np.ndarray],
        obs_rms: RunningMeanStd,
        ret_rms: RunningMeanStd,
        obs: ObsSpec,
        action: ActionSpec,
        torso_weights: list[np.ndarray] | None = None,
    ) -> None:
        self.torso_weights = torso_weights
        self.pi_weights = pi_weights
        self.log_std = log_std
        self.std = None if log_std is None else np.exp(log_std).astype(np.float32)
        self.v_weights = v_weights
        self.obs_rms = obs_rms
        self.ret_rms = ret_rms
        self.obs, self.action = obs, action
        # One categorical over the outputs (Discrete) takes the paths it always took, bit for bit.
        self._one_categorical = action.discrete and action.shape == ()
        # obs_rms.normalize's mean and sqrt(var + epsilon), computed once instead of at every step.
        self._obs_mean = obs_rms.mean.copy()
        self._obs_scale = np.sqrt(obs_rms.var + obs_rms.epsilon)
        self._obs_clip = obs_rms.clip

    @classmethod
    def from_ac_state(cls, ac_state: list[np.ndarray], hidden: tuple[int, ...], obs: ObsSpec,
                      action: ActionSpec, shared_torso: bool = False) -> NumpyActor:
        """The actor of a checkpoint's ``ac_state`` (ActorCritic.broadcast_state() as numpy arrays) in the layout of
        actor_critic_state_like(obs, action, hidden, shared_torso); ValueError when they do not fit."""
        layout = actor_critic_state_like(obs, action, hidden, shared_torso)
        arrays = [np.asarray(a) for a in ac_state]
        if [a.shape for a in arrays] != [a.shape for a in layout]:
            networks = "one shared CNN torso" if shared_torso else "separate policy and value networks"
            raise ValueError(f"checkpoint holds {len(arrays)} arrays that do not fit a policy for observations "
                             f"{obs.shape}, actions {action.shape}, hidden={hidden} and {networks}")
        torso = None
        if shared_torso:
            n_torso = len(network_like(obs, hidden, None))
            torso, arrays = arrays[:n_torso], arrays[n_torso:]
        n_net = 2 if shared_torso else len(network_like(obs, hidden, 1))
        pi_weights, rest = arrays[:n_net], arrays[n_net:]
        log_std = None if action.discrete else rest.pop(0)
        v_weights, rest = rest[:n_net], rest[n_net:]
        # The settings ActorCritic gives its normalizers; the statistics come from the checkpoint.
        obs_rms, ret_rms = RunningMeanStd(len(rest[0])), RunningMeanStd(1, clip=1e6)
        for dst, src in zip(obs_rms.arrays() + ret_rms.arrays(), rest, strict=True):
            np.copyto(dst, src)
        return cls(pi_weights, log_std, v_weights, obs_rms, ret_rms, obs, action, torso)

    def state_arrays(self) -> list[np.ndarray]:
        """The actor's arrays in the layout of actor_critic_state_like (what from_ac_state takes back)."""
        log_std = [] if self.log_std is None else [self.log_std]
        return [*(self.torso_weights or []), *self.pi_weights, *log_std, *self.v_weights, *self.obs_rms.arrays(),
                *self.ret_rms.arrays()]

    def save(self, file: str | Path | BinaryIO, about: dict[str, Any]) -> None:
        """Write this policy as one file that loads without pickle, TensorFlow or this project's trainer: an .npz of
        plain arrays (a0, a1, ... in state_arrays' order) and "spec", a JSON text of the observations, actions,
        network and normalizers, with ``about`` (JSON data: the env id, seed, algorithm, steps trained) beside
        them. NumpyActor.load reads it."""
        shared = self.torso_weights is not None
        mlp = not self.obs.is_image
        spec = {
            "format": POLICY_FORMAT, "version": POLICY_VERSION,
            "obs": {"shape": list(self.obs.shape), "scale": self.obs.scale},
            "action": {"shape": list(self.action.shape),
                       "nvec": None if self.action.nvec is None else list(self.action.nvec)},
            "network": {"kind": "mlp" if mlp else "cnn", "shared_torso": shared,
                        "hidden": [int(w.shape[1]) for w in self.pi_weights[:-2:2]] if mlp else [],
                        "cnn_layers": [] if mlp else [list(layer) for layer in conv_layers(self.obs.shape)[0]],
                        "activation": "tanh" if mlp else "relu"},
            "normalizers": {"obs": "vectors: (obs - mean) / sqrt(var + 1e-8), clipped to +-10; images: times scale",
                            "value": "outputs times sqrt(ret var + 1e-8) plus ret mean"},
            "arrays": [list(a.shape) for a in self.state_arrays()],
            **about,
        }
        arrays = {f"a{i}": np.asarray(a) for i, a in enumerate(self.state_arrays())}
        if not isinstance(file, (str, Path)):  # an open binary file
            np.savez(file, spec=np.array(json.dumps(spec)), **arrays)
            return
        with open(file, "wb") as f:  # np.savez would add ".npz" to a name without it
            np.savez(f, spec=np.array(json.dumps(spec)), **arrays)

    @classmethod
    def load(cls, path: str | Path) -> tuple[NumpyActor, dict[str, Any]]:
        """The policy NumpyActor.save wrote, and its spec (a dict of JSON data); ValueError with a one-line reason
        when the file is not one. Reads arrays only (np.load with allow_pickle=False): loading runs no code."""
        try:
            with np.load(path, allow_pickle=False) as data:
                spec = json.loads(str(data["spec"]))
                arrays = [data[f"a{i}"] for i in range(len(spec["arrays"]))]
            if spec.get("format") != POLICY_FORMAT or spec.get("version") != POLICY_VERSION:
                raise ValueError(f"its spec says format {spec.get('format')!r} version {spec.get('version')!r}")
            obs = ObsSpec(tuple(spec["obs"]["shape"]), float(spec["obs"]["scale"]))
            nvec = spec["action"]["nvec"]
            action = ActionSpec(tuple(spec["action"]["shape"]), None if nvec is None else tuple(nvec))
            network = spec["network"]
            actor = cls.from_ac_state(arrays, tuple(network["hidden"]) or (64, 64), obs, action,
                                      network["shared_torso"])
        except (OSError, KeyError, TypeError, ValueError, json.JSONDecodeError) as error:
            raise ValueError(f"{path} is not a policy file of train.py --export ({type(error).__name__}: "
                             f"{' '.join(str(error).split())})") from None
        return actor, spec

    def act(self, raw_obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False) -> np.ndarray:
        """Actions for raw_obs (N, *obs shape): (N, act_dim) float32 (Box, NOT clipped), (N,) int64 (Discrete) or
        (N, d) int64 (MultiDiscrete, MultiBinary). deterministic: the mean (Box) or the most likely choices instead
        of a sample."""
        if deterministic:
            out = self._forward(self.pi_weights, raw_obs)
            return out if self.std is not None else self._choices(out)
        return self.act_with_noise(raw_obs, self.exploration_noise(rng, len(raw_obs)))

    def exploration_noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """What act() adds to the policy's output for n actions, drawn from rng as act() draws it: (n, act_dim)
        float32 std * N(0, 1) (Box) or (n, n_logits) float64 Gumbel noise (categoricals; argmax(logits + Gumbel
        noise) is a sample of softmax(logits)). Drawing many rows in one call gives the same numbers as drawing them a
        few at a time, so a rollout can draw a whole batch's noise at once and act row by row with act_with_noise,
        bit for bit what act() would do."""
        if self.std is None:
            return rng.gumbel(size=(n, self.n_outputs))
        noise = rng.standard_normal((n, self.std.shape[0]), dtype=np.float32)
        noise *= self.std
        return noise

    def act_with_noise(self, raw_obs: np.ndarray, noise: np.ndarray, out: np.ndarray | None = None,
                       outputs: np.ndarray | None = None) -> np.ndarray:
        """act() with its noise given: raw_obs (N, *obs shape), noise (N, ...) rows of exploration_noise(). Writes
        the actions into out (act()'s shapes) when given, and returns them. outputs (N, n_outputs) float32, when
        given, receives the policy's outputs, from which log_prob_of() gives the actions' log-probabilities."""
        return self._sample(self._forward(self.pi_weights, raw_obs), noise, out, outputs)

    def act_and_value_with_noise(self, raw_obs: np.ndarray, noise: np.ndarray, out: np.ndarray | None = None,
                                 outputs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """act_with_noise() and value() of raw_obs (N, *obs shape) from one pass of the shared torso: (actions as
        act_with_noise gives them, (N,) float32 values in return units). Only for an actor with torso_weights."""
        features = numpy_cnn_torso(self.torso_weights, raw_obs, self.obs)
        actions = self._sample(linear(self.pi_weights, features), noise, out, outputs)
        return actions, self._return_units(linear(self.v_weights, features)[:, 0])

    @property
    def n_outputs(self) -> int:
        """The policy network's outputs per row: the Gaussian's means (act_dim) or every categorical's logits."""
        return self.pi_weights[-1].shape[0]

    def _sample(self, policy_out: np.ndarray, noise: np.ndarray, out: np.ndarray | None,
                outputs: np.ndarray | None = None) -> np.ndarray:
        """The actions of the policy's outputs (N, n_outputs) with noise from exploration_noise(); copies the outputs
        into ``outputs`` when given."""
        if outputs is not None:
            outputs[...] = policy_out
        if self.std is None:
            return self._choices(policy_out + noise, out)
        return np.add(policy_out, noise, out=out)

    def _choices(self, scores: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The argmax of each categorical's scores (N, n_logits): (N,) int64 for one, (N, d) int64 for d."""
        if self._one_categorical:
            if out is not None:
                return np.argmax(scores, axis=1, out=out)
            return np.argmax(scores, axis=1).astype(np.int64, copy=False)
        choices = np.stack([np.argmax(segment, axis=1) for segment in self._segments(scores)], axis=1).astype(np.int64)
        if out is not None:
            out[...] = choices
            return out
        return choices

    def _segments(self, scores: np.ndarray) -> list[np.ndarray]:
        """The columns of each categorical in scores (N, n_logits): (N, nvec[i]) for each i."""
        return np.split(scores, np.cumsum(self.action.nvec)[:-1], axis=1)

    def log_prob(self, raw_obs: np.ndarray, act: np.ndarray) -> np.ndarray:
        """log pi(act | raw_obs) under this snapshot, (N,) float64: raw_obs (N, *obs shape), act as act() returns
        it. The formula of ActorCritic.log_prob, in float64."""
        return self.log_prob_of(self._forward(self.pi_weights, raw_obs), act)

    def log_prob_of(self, policy_out: np.ndarray, act: np.ndarray) -> np.ndarray:
        """log_prob() from the policy's outputs (N, n_outputs), as act_with_noise() writes them: (N,) float64."""
        out = policy_out.astype(np.float64)
        if self.std is None:
            act = np.asarray(act).reshape(len(out), len(self.action.nvec))  # (N,) for one categorical
            total = np.zeros(len(out))
            for i, segment in enumerate(self._segments(out)):
                shifted = segment - segment.max(axis=1, keepdims=True)
                log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
                total += log_softmax[np.arange(len(act)), act[:, i]]
            return total
        log_std = self.log_std.astype(np.float64)
        z = (np.asarray(act, dtype=np.float64) - out) * np.exp(-log_std)
        return -0.5 * np.square(z).sum(axis=1) - (log_std.sum() + 0.5 * len(log_std) * math.log(2.0 * math.pi))

    def value(self, raw_obs: np.ndarray) -> np.ndarray:
        """Values of raw_obs (N, *obs shape), (N,) float32 in RETURN units (de-normalized with ret_rms)."""
        return self._return_units(self._forward(self.v_weights, raw_obs)[:, 0])

    def _return_units(self, v: np.ndarray) -> np.ndarray:
        """The value network's outputs (N,), of the normalized return, in return units (float32)."""
        scale = np.sqrt(self.ret_rms.var[0] + self.ret_rms.epsilon)
        return (v * scale + self.ret_rms.mean[0]).astype(np.float32)

    def _forward(self, weights: list[np.ndarray], raw_obs: np.ndarray) -> np.ndarray:
        """One network on raw observations: a head on the shared torso's features, images through the CNN (scaled
        inside), or vectors normalized, then through the MLP."""
        if self.torso_weights is not None:
            return linear(weights, numpy_cnn_torso(self.torso_weights, raw_obs, self.obs))
        if self.obs.is_image:
            return numpy_cnn_forward(weights, raw_obs, self.obs)
        return numpy_mlp_forward(weights, self._normalize(raw_obs))

    def _normalize(self, raw_obs: np.ndarray) -> np.ndarray:
        """self.obs_rms.normalize(raw_obs) as it was at construction, bit for bit: the same float64 operations in
        the same order, in place in one buffer, clipped with maximum/minimum (what np.clip computes) instead of
        np.clip, whose Python-level dispatch costs as much as a layer of the MLP at one row per call.
        raw_obs (N, obs_dim) -> (N, obs_dim) float32."""
        z = np.subtract(raw_obs, self._obs_mean, dtype=np.float64)
        z /= self._obs_scale
        np.maximum(z, -self._obs_clip, out=z)
        np.minimum(z, self._obs_clip, out=z)
        return z.astype(np.float32)
