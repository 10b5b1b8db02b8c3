"""What the workers act with: the policy and value MLPs in numpy, with the observation and return normalizers.

Numpy only (no TensorFlow), so that rollouts and ``train.py --play`` work without importing it.
"""

from __future__ import annotations

import math

import numpy as np

from algos.normalizer import RunningMeanStd


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


def actor_critic_state_like(obs_dim: int, act_dim: int, hidden: tuple[int, ...], discrete: bool) -> list[np.ndarray]:
    """Arrays of the shapes and dtypes of ActorCritic.broadcast_state(), without TensorFlow: what a worker receives
    rank 0's learner state into. pi_net [W0 (obs_dim, h0), b0 (h0,), ..., W (h_last, act_dim), b (act_dim,)] float32,
    log_std (act_dim,) float32 unless discrete, v_net [W0, b0, ..., W (h_last, 1), b (1,)] float32, then obs_rms and
    ret_rms [mean, var, count] as RunningMeanStd holds them. Values are placeholders until the broadcast."""

    def mlp(out_dim: int) -> list[np.ndarray]:
        sizes = [obs_dim, *hidden, out_dim]
        return [a for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True)
                for a in (np.zeros((n_in, n_out), np.float32), np.zeros(n_out, np.float32))]

    log_std = [] if discrete else [np.zeros(act_dim, np.float32)]
    normalizers = [a.copy() for a in RunningMeanStd(obs_dim).arrays() + RunningMeanStd(1).arrays()]
    return mlp(act_dim) + log_std + mlp(1) + normalizers


class NumpyActor:
    """A numpy snapshot of an ActorCritic: acts and evaluates values on RAW observations, without TensorFlow.

    Workers use it because one numpy forward pass of a small MLP takes microseconds, against milliseconds
    through TensorFlow per call. What it derives from its arguments (std, the observation scale) is computed once
    at construction: give it arrays that will not change (ActorCritic.numpy_actor() passes copies).
    """

    def __init__(
        self,
        pi_weights: list[np.ndarray],
        log_std: np.ndarray | None,
        v_weights: list[np.ndarray],
        obs_rms: RunningMeanStd,
        ret_rms: RunningMeanStd,
    ) -> None:
        self.pi_weights = pi_weights
        self.log_std = log_std
        self.std = None if log_std is None else np.exp(log_std).astype(np.float32)
        self.v_weights = v_weights
        self.obs_rms = obs_rms
        self.ret_rms = ret_rms
        # obs_rms.normalize's mean and sqrt(var + epsilon), computed once instead of at every step.
        self._obs_mean = obs_rms.mean.copy()
        self._obs_scale = np.sqrt(obs_rms.var + obs_rms.epsilon)
        self._obs_clip = obs_rms.clip

    @classmethod
    def from_ac_state(cls, ac_state: list[np.ndarray], hidden: tuple[int, ...], discrete: bool) -> NumpyActor:
        """The actor of a checkpoint's ``ac_state`` (ActorCritic.broadcast_state() as numpy arrays): pi_net
        [W0, b0, ...], log_std (act_dim,) if not discrete, v_net [W0, b0, ...], obs_rms [mean, var, count],
        ret_rms [mean, var, count]; each MLP has len(hidden) + 1 layers."""
        n_mlp = 2 * (len(hidden) + 1)
        expected = 2 * n_mlp + (0 if discrete else 1) + 6
        if len(ac_state) != expected:
            raise ValueError(f"checkpoint holds {len(ac_state)} arrays, expected {expected} for hidden={hidden}")
        arrays = [np.asarray(a) for a in ac_state]
        pi_weights, rest = arrays[:n_mlp], arrays[n_mlp:]
        log_std = None if discrete else rest.pop(0)
        v_weights, rest = rest[:n_mlp], rest[n_mlp:]
        obs_dim = pi_weights[0].shape[0]
        # The settings ActorCritic gives its normalizers; the statistics come from the checkpoint.
        obs_rms, ret_rms = RunningMeanStd(obs_dim), RunningMeanStd(1, clip=1e6)
        for dst, src in zip(obs_rms.arrays() + ret_rms.arrays(), rest, strict=True):
            np.copyto(dst, src)
        return cls(pi_weights, log_std, v_weights, obs_rms, ret_rms)

    def act(self, raw_obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False) -> np.ndarray:
        """Actions for raw_obs (N, obs_dim): (N, act_dim) float32 (Box, NOT clipped) or (N,) int64.
        deterministic: the mean (Box) or the most likely action (Discrete) instead of a sample.
        """
        if deterministic:
            out = numpy_mlp_forward(self.pi_weights, self._normalize(raw_obs))
            return out if self.std is not None else np.argmax(out, axis=1).astype(np.int64)
        return self.act_with_noise(raw_obs, self.exploration_noise(rng, len(raw_obs)))

    def exploration_noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """What act() adds to the policy's output for n actions, drawn from rng as act() draws it: (n, act_dim)
        float32 std * N(0, 1) (Box) or (n, n_actions) float64 Gumbel noise (Discrete; argmax(logits + Gumbel noise)
        is a sample of softmax(logits)). Drawing many rows in one call gives the same numbers as drawing them a few
        at a time, so a rollout can draw a whole batch's noise at once and act row by row with act_with_noise,
        bit for bit what act() would do."""
        if self.std is None:
            return rng.gumbel(size=(n, self.pi_weights[-1].shape[0]))
        noise = rng.standard_normal((n, self.std.shape[0]), dtype=np.float32)
        noise *= self.std
        return noise

    def act_with_noise(self, raw_obs: np.ndarray, noise: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """act() with its noise given: raw_obs (N, obs_dim), noise (N, ...) rows of exploration_noise(). Writes the
        actions into out ((N, act_dim) float32 or (N,) int64) when given, and returns them."""
        policy_out = numpy_mlp_forward(self.pi_weights, self._normalize(raw_obs))
        if self.std is None:
            policy_out = policy_out + noise
            if out is not None:
                return np.argmax(policy_out, axis=1, out=out)
            return np.argmax(policy_out, axis=1).astype(np.int64, copy=False)
        return np.add(policy_out, noise, out=out)

    def log_prob(self, raw_obs: np.ndarray, act: np.ndarray) -> np.ndarray:
        """log pi(act | raw_obs) under this snapshot, (N,) float64: raw_obs (N, obs_dim), act (N, act_dim) float32
        unclipped (Box) or (N,) int64 (Discrete). The formula of ActorCritic.log_prob, in float64."""
        out = numpy_mlp_forward(self.pi_weights, self._normalize(raw_obs)).astype(np.float64)
        if self.std is None:
            shifted = out - out.max(axis=1, keepdims=True)
            log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
            return log_softmax[np.arange(len(act)), act]
        log_std = self.log_std.astype(np.float64)
        z = (np.asarray(act, dtype=np.float64) - out) * np.exp(-log_std)
        return -0.5 * np.square(z).sum(axis=1) - (log_std.sum() + 0.5 * len(log_std) * math.log(2.0 * math.pi))

    def value(self, raw_obs: np.ndarray) -> np.ndarray:
        """Values of raw_obs (N, obs_dim), (N,) float32 in RETURN units (de-normalized with ret_rms)."""
        v = numpy_mlp_forward(self.v_weights, self._normalize(raw_obs))[:, 0]
        scale = np.sqrt(self.ret_rms.var[0] + self.ret_rms.epsilon)
        return (v * scale + self.ret_rms.mean[0]).astype(np.float32)

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
