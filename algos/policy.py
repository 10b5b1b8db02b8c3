"""The learner's actor-critic (TensorFlow) and the numpy snapshot of it that workers act with."""

import math

import gymnasium
import keras
import numpy as np
import tensorflow as tf

from algos.networks import build_cnn, build_cnn_torso, build_head, build_mlp
from algos.normalizer import RunningMeanStd
from algos.numpy_actor import NumpyActor
from algos.spaces import PRECISIONS, ActionSpec, ObsSpec, action_spec

_LOG_2PI = math.log(2.0 * math.pi)


class ActorCritic:
    """The learner's networks, built identically on every rank (call keras.utils.set_random_seed before).

    Attributes:
        obs: what the networks read (algos.spaces.ObsSpec): vectors (an MLP each) or images (a CNN each, or one CNN
            torso that both heads share: ``shared_torso``).
        shared_torso: images only: pi_net and v_net are linear heads (pi_head, v_head) on one CNN torso (torso), as
            in the PPO paper's Atari networks; forward() runs the torso once for both.
        precision: images only: what the CNN layers compute in, "float32" or "bfloat16" (float32 weights either
            way; algos.networks.build_cnn_torso).
        action: how the policy acts (algos.spaces.ActionSpec).
        is_discrete: True for categorical actions (Discrete, MultiDiscrete, MultiBinary), False for a Box (diagonal
            Gaussian).
        act_dim: the policy's outputs: the action dimension (Box) or the logits of every categorical.
        pi_net: normalize_obs(obs) (N, ...) -> mean (Box) or logits (N, act_dim); output gain 0.01 so the initial
            policy is near uniform / centred. With a shared torso, the torso then pi_head.
        log_std: (act_dim,) state-independent log standard deviation (Box), None for categoricals.
        v_net: normalize_obs(obs) (N, ...) -> (N, 1) value of the NORMALIZED return (see ret_rms).
        obs_rms: (obs_dim,) observation statistics, owned by rank 0 (one placeholder dimension for images).
        ret_rms: (1,) statistics of the gathered returns; value targets are (ret - mean) / sqrt(var + eps), or, under
            PPO's value_targets "raw", ret itself while ret_rms stays at its start (mean 0, variance 1).

    The TF helpers below take what normalize_obs returns, as tensors, and are meant to run inside tf.function.
    """

    def __init__(
        self,
        observation: int | ObsSpec,
        action_space: gymnasium.spaces.Space | ActionSpec,
        hidden: tuple[int, ...],
        init_log_std: float = 0.0,
        shared_torso: bool = False,
        precision: str = PRECISIONS[0],
    ) -> None:
        self.obs = observation if isinstance(observation, ObsSpec) else ObsSpec((int(observation),))
        try:
            self.action = action_space if isinstance(action_space, ActionSpec) else action_spec(action_space)
        except ValueError as error:
            raise TypeError(str(error)) from None
        self.is_discrete = self.action.discrete
        self.act_dim = self.action.n_outputs
        # Images are scaled inside the network, not normalized: their statistics would cost a float per pixel.
        self.obs_dim = 1 if self.obs.is_image else self.obs.shape[0]
        if shared_torso and not self.obs.is_image:
            raise ValueError("a shared torso is a CNN's: observations must be images")
        self.shared_torso = shared_torso
        if shared_torso:
            self.torso = build_cnn_torso(self.obs, precision)
            self.pi_head, self.v_head = build_head(self.act_dim, output_gain=0.01), build_head(1, output_gain=1.0)
            inputs = keras.Input(shape=self.obs.shape, dtype="uint8")
            features = self.torso(inputs)
            self.pi_net = keras.Model(inputs, self.pi_head(features))
            self.v_net = keras.Model(inputs, self.v_head(features))
        elif self.obs.is_image:
            self.pi_net = build_cnn(self.obs, self.act_dim, output_gain=0.01, precision=precision)
            self.v_net = build_cnn(self.obs, 1, output_gain=1.0, precision=precision)
        elif precision != PRECISIONS[0]:
            raise ValueError(f"precision {precision} is for CNN torsos: observations must be images")
        else:
            self.pi_net = build_mlp(self.obs_dim, self.act_dim, hidden, output_gain=0.01)
            self.v_net = build_mlp(self.obs_dim, 1, hidden, output_gain=1.0)
        self.log_std = (
            None
            if self.is_discrete
            else tf.Variable(np.full(self.act_dim, init_log_std, dtype=np.float32), name="log_std")
        )
        self.obs_rms = RunningMeanStd(self.obs_dim)
        # The clip only guards against overflow: a return 1e6 standard deviations out is not a real sample.
        self.ret_rms = RunningMeanStd(1, clip=1e6)
        # Several categoricals (MultiDiscrete, MultiBinary): the logits' split; one (Discrete) keeps its own path.
        self._splits = None if not self.is_discrete or self.action.shape == () else list(self.action.nvec)

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        """What the networks take: vectors (N, obs_dim) normalized with obs_rms, float32; images (N, H, W, C) as
        uint8, which the network scales."""
        return obs.astype(np.uint8, copy=False) if self.obs.is_image else self.obs_rms.normalize(obs)

    def update_obs_stats(self, obs: np.ndarray) -> None:
        """Merge a batch's raw vectors (N, obs_dim) into obs_rms; images have no statistics."""
        if not self.obs.is_image:
            self.obs_rms.update(obs)

    def policy_variables(self) -> list[tf.Variable]:
        """pi_net weights [W0, b0, ...] then log_std (Box only); with a shared torso they include the torso's."""
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
        """Every trained variable once, in this fixed order: pi_net.weights + [log_std] (if Box) + v_net.weights; with
        a shared torso, torso.weights + pi_head.weights + [log_std] + v_head.weights."""
        if not self.shared_torso:
            return self.policy_variables() + self.value_variables()
        log_std = [] if self.log_std is None else [self.log_std]
        torso_and_pi = [w.value for w in self.torso.weights + self.pi_head.weights]
        return torso_and_pi + log_std + [w.value for w in self.v_head.weights]

    def broadcast_state(self) -> list:
        """What rank 0 broadcasts each iteration: variables() + obs_rms.arrays() + ret_rms.arrays()."""
        return self.variables() + self.obs_rms.arrays() + self.ret_rms.arrays()

    def numpy_actor(self) -> NumpyActor:
        """A snapshot copy of the current weights and of both normalizers, for acting in numpy."""
        pi_net, v_net = (self.pi_head, self.v_head) if self.shared_torso else (self.pi_net, self.v_net)
        return NumpyActor(
            pi_weights=[w.numpy() for w in pi_net.weights],
            log_std=None if self.log_std is None else self.log_std.numpy(),
            v_weights=[w.numpy() for w in v_net.weights],
            obs_rms=self.obs_rms.copy(),
            ret_rms=self.ret_rms.copy(),
            obs=self.obs,
            action=self.action,
            torso_weights=[w.numpy() for w in self.torso.weights] if self.shared_torso else None,
        )

    def forward(self, obs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The policy's outputs (N, act_dim), means or logits, and the values (N,) of the normalized return, with one
        pass of the torso when it is shared."""
        if not self.shared_torso:
            return self.pi_net(obs), self.v_net(obs)[:, 0]
        features = self.torso(obs)
        return self.pi_head(features), self.v_head(features)[:, 0]

    def dist_params(self, obs: tf.Tensor) -> tf.Tensor:
        """Parameters of the action distribution, (N, P): logits (N, act_dim) for Discrete,
        [mean, log_std] concatenated (N, 2 * act_dim) for Box."""
        return self.params_of(self.pi_net(obs))

    def params_of(self, out: tf.Tensor) -> tf.Tensor:
        """dist_params() from the policy's outputs out (N, act_dim), as forward() gives them."""
        if self.log_std is None:
            return out
        return tf.concat([out, tf.zeros_like(out) + self.log_std], axis=1)

    def params_and_log_prob(self, obs: tf.Tensor, act: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """dist_params(obs) (N, P) and log_prob(obs, act) (N,) from one pass of the policy network (two passes
        were 0.21 s of a 1.8 s Pong update, where one is 0.11)."""
        out = self.pi_net(obs)
        return self.params_of(out), self.log_prob_of(out, act)

    def log_prob(self, obs: tf.Tensor, act: tf.Tensor) -> tf.Tensor:
        """log pi(act | obs), (N,); act (N, act_dim) float32 (Box) or (N,) int64 (Discrete)."""
        return self.log_prob_of(self.pi_net(obs), act)

    def log_prob_of(self, out: tf.Tensor, act: tf.Tensor) -> tf.Tensor:
        """log_prob() from the policy's outputs out (N, act_dim), as forward() gives them."""
        if self._splits is not None:
            return tf.add_n([tf.gather(tf.nn.log_softmax(logits), act[:, i], batch_dims=1)
                             for i, logits in enumerate(tf.split(out, self._splits, axis=1))])
        if self.log_std is None:
            return tf.gather(tf.nn.log_softmax(out), act, batch_dims=1)
        z = (act - out) * tf.exp(-self.log_std)
        log_norm = tf.reduce_sum(self.log_std) + 0.5 * self.act_dim * _LOG_2PI
        return -0.5 * tf.reduce_sum(tf.square(z), axis=1) - log_norm

    def _categoricals(self, logits: tf.Tensor) -> list[tf.Tensor]:
        """The logits of each categorical in logits (N, act_dim): one for Discrete, one per dimension else."""
        return [logits] if self._splits is None else tf.split(logits, self._splits, axis=1)

    def entropy(self, obs: tf.Tensor) -> tf.Tensor:
        """Entropy of pi(. | obs), (N,)."""
        return self.entropy_of(self.pi_net(obs) if self.log_std is None else obs)

    def entropy_of(self, out: tf.Tensor) -> tf.Tensor:
        """entropy() from the policy's outputs out (N, act_dim), as forward() gives them (for a Box, any tensor of N
        rows: a Gaussian's entropy does not depend on the state)."""
        if self.log_std is None:
            logps = [tf.nn.log_softmax(logits) for logits in self._categoricals(out)]
            return tf.add_n([-tf.reduce_sum(tf.exp(logp) * logp, axis=1) for logp in logps])
        per_state = tf.reduce_sum(self.log_std) + 0.5 * self.act_dim * (1.0 + _LOG_2PI)
        return tf.fill([tf.shape(out)[0]], per_state)

    def kl(self, old_params: tf.Tensor, obs: tf.Tensor) -> tf.Tensor:
        """Mean over the batch of KL(old || new), a scalar; old_params (N, P) from dist_params."""
        return self.kl_of(old_params, self.dist_params(obs))

    def kl_of(self, old_params: tf.Tensor, new_params: tf.Tensor) -> tf.Tensor:
        """kl() from both policies' parameters (N, P), as dist_params() gives them."""
        if self.log_std is None:
            per_state = []
            for old, new in zip(self._categoricals(old_params), self._categoricals(new_params), strict=True):
                old_logp, new_logp = tf.nn.log_softmax(old), tf.nn.log_softmax(new)
                per_state.append(tf.reduce_sum(tf.exp(old_logp) * (old_logp - new_logp), axis=1))
            return tf.reduce_mean(tf.add_n(per_state))
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
