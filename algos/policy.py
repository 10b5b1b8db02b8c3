"""The learner's actor-critic (TensorFlow) and the numpy snapshot of it that workers act with."""

import math

import gymnasium
import numpy as np
import tensorflow as tf

from algos.networks import build_mlp
from algos.normalizer import RunningMeanStd
from algos.numpy_actor import NumpyActor

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
        hidden: tuple[int, ...],
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

    def numpy_actor(self) -> NumpyActor:
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
