"""The learner's actor-critic (TensorFlow) and the numpy snapshot of it that workers act with."""

import math

import gymnasium
import numpy as np
import tensorflow as tf

from algos.networks import build_mlp, numpy_mlp_forward
from algos.normalizer import RunningMeanStd

_LOG_2PI = math.log(2.0 * math.pi)


class ActorCritic:
    """The learner's networks, built identically on every rank (call keras.utils.set_random_seed before).

    Attributes:
        is_discrete: True for a Discrete action space (categorical policy), False for Box (diagonal Gaussian).
        act_dim: action dimension (Box) or number of actions (Discrete).
        pi_net: normalized obs (N, obs_dim) -> mean (Box) or logits (Discrete) (N, act_dim); output gain
            0.01 so the initial policy is near uniform / centred.
        log_std: (act_dim,) state-independent log standard deviation (Box), None for Discrete.
        v_net: normalized obs (N, obs_dim) -> (N, 1) value of the NORMALIZED return (see ret_rms).
        obs_rms: (obs_dim,) observation statistics, owned by rank 0.
        ret_rms: (1,) statistics of the gathered returns; value targets are (ret - mean) / sqrt(var + eps).

    The TF helpers below take normalized observations (N, obs_dim) float32 tensors and are meant to run
    inside tf.function.
    """

    def __init__(
        self,
        obs_dim: int,
        action_space: gymnasium.spaces.Box | gymnasium.spaces.Discrete,
        hidden: tuple[int, ...] = (64, 64),
        init_log_std: float = 0.0,
    ) -> None:
        if isinstance(action_space, gymnasium.spaces.Discrete):
            self.is_discrete = True
            self.act_dim = int(action_space.n)
        elif isinstance(action_space, gymnasium.spaces.Box) and len(action_space.shape) == 1:
            self.is_discrete = False
            self.act_dim = int(action_space.shape[0])
        else:
            raise TypeError(f"unsupported action space {action_space}: need Discrete or a 1-D Box")
        self.obs_dim = obs_dim
        self.pi_net = build_mlp(obs_dim, self.act_dim, hidden, output_gain=0.01)
        self.log_std = (
            None
            if self.is_discrete
            else tf.Variable(np.full(self.act_dim, init_log_std, dtype=np.float32), name="log_std")
        )
        self.v_net = build_mlp(obs_dim, 1, hidden, output_gain=1.0)
        self.obs_rms = RunningMeanStd(obs_dim)
        # The clip only guards against overflow: a return 1e6 standard deviations out is not a real sample.
        self.ret_rms = RunningMeanStd(1, clip=1e6)

    def policy_variables(self) -> list[tf.Variable]:
        """pi_net weights [W0, b0, ...] then log_std (Box only)."""
        # Keras 3 weights wrap a tf.Variable; handing out the wrapped object gives callers a real tf.Variable
        # whose assign() changes the model itself.
        variables = [w.value for w in self.pi_net.weights]
        if self.log_std is not None:
            variables.append(self.log_std)
        return variables

    def value_variables(self) -> list[tf.Variable]:
        """v_net weights [W0, b0, ...]."""
        return [w.value for w in self.v_net.weights]

    def variables(self) -> list[tf.Variable]:
        """pi_net.weights + [log_std] (if Box) + v_net.weights, in this fixed order."""
        return self.policy_variables() + self.value_variables()

    def broadcast_state(self) -> list:
        """What rank 0 broadcasts each iteration: variables() + obs_rms.arrays() + ret_rms.arrays()."""
        return self.variables() + self.obs_rms.arrays() + self.ret_rms.arrays()

    def numpy_actor(self) -> "NumpyActor":
        """A snapshot copy of the current weights and of both normalizers, for acting in numpy."""
        return NumpyActor(
            pi_weights=[w.numpy() for w in self.pi_net.weights],
            log_std=None if self.log_std is None else self.log_std.numpy(),
            v_weights=[w.numpy() for w in self.v_net.weights],
            obs_rms=self.obs_rms.copy(),
            ret_rms=self.ret_rms.copy(),
        )

    def dist_params(self, obs: tf.Tensor) -> tf.Tensor:
        """Parameters of the action distribution, (N, P): logits (N, act_dim) for Discrete,
        [mean, log_std] concatenated (N, 2 * act_dim) for Box."""
        out = self.pi_net(obs)
        if self.log_std is None:
            return out
        return tf.concat([out, tf.zeros_like(out) + self.log_std], axis=1)

    def log_prob(self, obs: tf.Tensor, act: tf.Tensor) -> tf.Tensor:
        """log pi(act | obs), (N,); act (N, act_dim) float32 (Box) or (N,) int64 (Discrete)."""
        out = self.pi_net(obs)
        if self.log_std is None:
            return tf.gather(tf.nn.log_softmax(out), act, batch_dims=1)
        z = (act - out) * tf.exp(-self.log_std)
        log_norm = tf.reduce_sum(self.log_std) + 0.5 * self.act_dim * _LOG_2PI
        return -0.5 * tf.reduce_sum(tf.square(z), axis=1) - log_norm

    def entropy(self, obs: tf.Tensor) -> tf.Tensor:
        """Entropy of pi(. | obs), (N,)."""
        if self.log_std is None:
            logp = tf.nn.log_softmax(self.pi_net(obs))
            return -tf.reduce_sum(tf.exp(logp) * logp, axis=1)
        per_state = tf.reduce_sum(self.log_std) + 0.5 * self.act_dim * (1.0 + _LOG_2PI)
        return tf.fill([tf.shape(obs)[0]], per_state)

    def kl(self, old_params: tf.Tensor, obs: tf.Tensor) -> tf.Tensor:
        """Mean over the batch of KL(old || new), a scalar; old_params (N, P) from dist_params."""
        new_params = self.dist_params(obs)
        if self.log_std is None:
            old_logp = tf.nn.log_softmax(old_params)
            new_logp = tf.nn.log_softmax(new_params)
            return tf.reduce_mean(tf.reduce_sum(tf.exp(old_logp) * (old_logp - new_logp), axis=1))
        old_mean, old_log_std = tf.split(old_params, 2, axis=1)
        new_mean, new_log_std = tf.split(new_params, 2, axis=1)
        per_dim = (
            new_log_std
            - old_log_std
            + (tf.exp(2.0 * old_log_std) + tf.square(old_mean - new_mean)) / (2.0 * tf.exp(2.0 * new_log_std))
            - 0.5
        )
        return tf.reduce_mean(tf.reduce_sum(per_dim, axis=1))

    def value(self, obs: tf.Tensor) -> tf.Tensor:
        """Value of the normalized return, (N,)."""
        return self.v_net(obs)[:, 0]


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

    def act(self, raw_obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False) -> np.ndarray:
        """Actions for raw_obs (N, obs_dim): (N, act_dim) float32 (Box, NOT clipped) or (N,) int64.

        deterministic: the mean (Box) or the most likely action (Discrete) instead of a sample.
        """
        out = numpy_mlp_forward(self.pi_weights, self._normalize(raw_obs))
        if self.std is None:
            if deterministic:
                return np.argmax(out, axis=1).astype(np.int64)
            # Gumbel-max trick: argmax(logits + Gumbel noise) is a sample of softmax(logits).
            return np.argmax(out + rng.gumbel(size=out.shape), axis=1).astype(np.int64)
        if deterministic:
            return out
        # In place, bit for bit out + std * noise (IEEE multiplication and addition commute).
        sample = rng.standard_normal(out.shape, dtype=np.float32)
        sample *= self.std
        sample += out
        return sample

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
