"""Proximal policy optimization (Schulman et al. 2017) with the clipped surrogate, run by rank 0."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from algos.adam import FusedAdam
from algos.learner_batch import (
    batch_specs,
    epoch_means,
    graph_function,
    minibatch_loop,
    prepare_batch,
    weight_for_policy_lag,
)
from algos.policy import ActorCritic
from algos.registry import ADVANTAGE_NORMALIZATIONS, ALGORITHMS, VALUE_LOSSES, VALUE_TARGETS

if TYPE_CHECKING:
    from collections.abc import Mapping


_DEFAULTS = ALGORITHMS["ppo"].defaults  # train.py's options and this class share one set of defaults


@dataclass
class PPOConfig:
    """PPO hyperparameters."""

    lr: float = _DEFAULTS["lr"]
    """Adam learning rate for the policy, log_std and value function together."""
    epochs: int = _DEFAULTS["epochs"]
    """Passes over the batch per update (fewer when target_kl stops them early)."""
    minibatch_size: int = _DEFAULTS["minibatch_size"]
    """Rows per gradient step; the last minibatch of an epoch holds the remainder."""
    clip_ratio: float = _DEFAULTS["clip_ratio"]
    """The probability ratio is clipped to [1 - clip_ratio, 1 + clip_ratio] in the surrogate (set_clip_ratio changes
    it between updates)."""
    target_kl: float | None = _DEFAULTS["kl_targ"]
    """Early-stop epochs when an epoch's mean approx KL exceeds 1.5 * target_kl; None or 0 never stops early."""
    vf_coef: float = _DEFAULTS["vf_coef"]
    """Weight of the value loss (value_loss) in the total loss."""
    value_loss: str = _DEFAULTS["value_loss"]
    """"mse": the mean squared error of the values; "clipped": the mean of the larger of that squared error and the
    squared error of the workers' value moved at most clip_ratio toward the new one (baselines' ppo2, CleanRL)."""
    adv_norm: str = _DEFAULTS["adv_norm"]
    """"batch": advantages normalized to zero mean and unit standard deviation over the whole batch; "minibatch": each
    minibatch's again over its own rows, with the N - 1 standard deviation (baselines' ppo2, SB3, CleanRL)."""
    value_targets: str = _DEFAULTS["value_targets"]
    """"normalized": the value function learns the returns scaled by ac.ret_rms; "raw": the returns as they are."""
    ent_coef: float = _DEFAULTS["ent_coef"]
    """Weight of the entropy bonus subtracted from the total loss."""
    max_grad_norm: float = 0.5
    """Gradients are rescaled so their global norm is at most this."""


class PPO:
    """PPO learner for one ActorCritic: a single Adam on policy + log_std + value, minibatches shuffled by a
    np.random.Generator(seed) so an update is reproducible and resumable."""

    def __init__(self, ac: ActorCritic, cfg: PPOConfig, seed: int) -> None:
        for name, allowed in (("value_targets", VALUE_TARGETS), ("value_loss", VALUE_LOSSES),
                              ("adv_norm", ADVANTAGE_NORMALIZATIONS)):
            if getattr(cfg, name) not in allowed:
                raise ValueError(f"PPOConfig.{name} must be one of {', '.join(allowed)}, got {getattr(cfg, name)!r}")
        self.ac = ac
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self._variables = ac.variables()
        # Adam in float32 with the epsilon value of the PPO reference implementations (1e-5), in TensorFlow's form:
        # added to the uncorrected sqrt(v), as baselines' TensorFlow Adam does; torch's Adam (CleanRL's) adds it to the
        # bias-corrected one. Its slots exist from here on, so a resumed run can set them before its first update.
        self.optimizer = FusedAdam(self._variables, learning_rate=cfg.lr, epsilon=1e-5)
        # A variable, so that a schedule changes it between updates without tracing the steps again.
        self.clip_ratio = tf.Variable(cfg.clip_ratio, dtype=tf.float32, trainable=False, name="clip_ratio")
        obs_spec, act_spec = batch_specs(ac)
        self._old_log_prob = graph_function(self.ac.log_prob, input_signature=[obs_spec, act_spec])
        # A graph loop over up to STEPS_PER_CALL minibatch steps per call (learner_batch.minibatch_loop). Traced once
        # per length of the rows a call takes (a whole epoch's, or STEPS_PER_CALL minibatches' and the rest's).
        self._train_steps = graph_function(self._train_steps_fn)

    def set_learning_rate(self, lr: float) -> None:
        """Adam's learning rate for the next updates (a schedule sets it before each update)."""
        self.optimizer.learning_rate.assign(lr)

    def set_clip_ratio(self, clip_ratio: float) -> None:
        """The clip range of the next updates (a schedule sets it before each update)."""
        self.clip_ratio.assign(clip_ratio)

    def update(
        self, obs: np.ndarray, act: np.ndarray, adv: np.ndarray, ret: np.ndarray,
        behavior_logp: np.ndarray | None = None, old_logp: np.ndarray | None = None,
    ) -> dict[str, float]:
        """One PPO update on a gathered batch of N rows, then obs_rms merges obs (vectors).

        obs (N, obs_dim) float32 RAW observations; act (N, act_dim) float32 or (N,) int64; adv (N,) GAE
        advantages, not yet normalized; ret (N,) value targets in return units; behavior_logp (N,) float64: the
        log-probabilities of the policy that acted when it is older than the current one (weight_for_policy_lag);
        old_logp (N,) float64: the log-probabilities of act under the current policy, when the caller has them (the
        workers', which acted with it): the update then runs no pass of the batch to find them. Not both.
        Returns floats: pi_loss, v_loss, entropy, clip_frac (means over the gradient steps taken), kl (the last
        epoch's mean approximate KL(old || new), the figure target_kl is checked against), epochs (run),
        explained_var (of the workers' values), lr (the learning rate of this update).
        """
        batch = prepare_batch(self.ac, obs, act, adv, ret, normalize_returns=self.cfg.value_targets == "normalized")
        if old_logp is None:
            old_logp = self._old_log_prob(batch.obs, batch.act)
        elif behavior_logp is None:
            # The workers' float64 figures agree with this policy's to float32 rounding. Without this pass and the
            # one after the update (below), a Pong update took 1.53 s instead of 1.83 (benchmarks/README.md, "The
            # update's passes of the batch").
            old_logp = tf.constant(old_logp, dtype=tf.float32)
        else:
            raise ValueError("PPO.update: old_logp is the current policy's, behavior_logp an older one's; give one")
        batch, lag_stats = weight_for_policy_lag(batch, old_logp, behavior_logp)
        n = int(batch.obs.shape[0])
        sums = np.zeros(4)
        epochs = 0
        for _ in range(self.cfg.epochs):
            means = epoch_means(
                lambda rows, sums: self._train_steps(batch.obs, batch.act, batch.adv, batch.v_target, batch.old_value,
                                                     old_logp, rows, sums),
                self.rng.permutation(n), self.cfg.minibatch_size, tf.zeros(5))
            pi_loss, v_loss, entropy, approx_kl, clip_frac = means.numpy()
            sums += [pi_loss, v_loss, entropy, clip_frac]
            epochs += 1
            if self.cfg.target_kl and approx_kl > 1.5 * self.cfg.target_kl:
                break
        # After the update, so the next iteration's actors normalize with statistics that include this batch.
        self.ac.update_obs_stats(obs)
        # Every epoch has the same number of minibatches: the mean of epoch means is the mean over steps.
        pi_loss, v_loss, entropy, clip_frac = sums / epochs
        return {
            "pi_loss": float(pi_loss),
            "v_loss": float(v_loss),
            "entropy": float(entropy),
            # The estimate the early stop reads, not an exact KL from a pass of the batch after the update (the
            # peers' figure too; the pass cost as much as the one before it, above).
            "kl": float(approx_kl),
            "clip_frac": float(clip_frac),
            "epochs": float(epochs),
            "explained_var": batch.explained_var,
            "lr": float(self.optimizer.learning_rate.numpy()),
            **lag_stats,
        }

    def optimizer_state(self) -> list[np.ndarray]:
        """Copies of every Adam variable (step count, learning rate, moments), in a fixed order."""
        return [v.numpy() for v in self.optimizer.variables]

    def set_optimizer_state(self, arrays: list[np.ndarray]) -> None:
        """Restore what optimizer_state() returned."""
        for variable, array in zip(self.optimizer.variables, arrays, strict=True):
            variable.assign(array)

    def rng_state(self) -> dict:
        """The minibatch shuffling generator's state (a bit_generator.state dict)."""
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        """Restore what rng_state() returned."""
        self.rng.bit_generator.state = state

    def _train_steps_fn(
        self,
        obs: tf.Tensor,
        act: tf.Tensor,
        adv: tf.Tensor,
        v_target: tf.Tensor,
        old_value: tf.Tensor,
        old_logp: tf.Tensor,
        rows: tf.Tensor,
        sums: tf.Tensor,
    ) -> tf.Tensor:
        """An Adam step on each run of minibatch_size rows of ``rows`` (M,), a slice of an epoch's permutation;
        returns ``sums`` (5,) plus each step's [pi_loss, v_loss, entropy, approx_kl, clip_frac], added in order."""
        return minibatch_loop(lambda idx: self._minibatch_step(obs, act, adv, v_target, old_value, old_logp, idx),
                              rows, self.cfg.minibatch_size, sums)

    def _minibatch_step(
        self,
        obs: tf.Tensor,
        act: tf.Tensor,
        adv: tf.Tensor,
        v_target: tf.Tensor,
        old_value: tf.Tensor,
        old_logp: tf.Tensor,
        idx: tf.Tensor,
    ) -> tf.Tensor:
        """One Adam step on the rows idx (M,) of the full-batch tensors; returns the statistics
        [pi_loss, v_loss, entropy, approx_kl, clip_frac] (5,) measured before the step."""
        obs, act, adv, v_target, old_value, old_logp = (
            tf.gather(x, idx) for x in (obs, act, adv, v_target, old_value, old_logp))
        clip = self.clip_ratio
        if self.cfg.adv_norm == "minibatch":
            # The batch's normalized advantages again over these rows: the same as normalizing the raw ones here (up
            # to the 1e-8), with torch's unbiased standard deviation, as baselines' ppo2, SB3 and CleanRL do.
            centered = adv - tf.reduce_mean(adv)
            rows = tf.cast(tf.size(adv), tf.float32)
            adv = centered / (tf.sqrt(tf.reduce_sum(tf.square(centered)) / tf.maximum(rows - 1.0, 1.0)) + 1e-8)
        with tf.GradientTape() as tape:
            policy_out, value = self.ac.forward(obs)  # one pass of a shared torso for both heads
            log_ratio = self.ac.log_prob_of(policy_out, act) - old_logp
            ratio = tf.exp(log_ratio)
            surrogate = tf.minimum(ratio * adv, tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip) * adv)
            pi_loss = -tf.reduce_mean(surrogate)
            v_error = tf.square(value - v_target)
            if self.cfg.value_loss == "clipped":
                v_clipped = old_value + tf.clip_by_value(value - old_value, -clip, clip)
                v_error = tf.maximum(v_error, tf.square(v_clipped - v_target))
            v_loss = tf.reduce_mean(v_error)
            entropy = tf.reduce_mean(self.ac.entropy_of(policy_out))
            loss = pi_loss + self.cfg.vf_coef * v_loss - self.cfg.ent_coef * entropy
        grads = tape.gradient(loss, self._variables)
        grads, _ = tf.clip_by_global_norm(grads, self.cfg.max_grad_norm)
        self.optimizer.apply(grads)
        # The low-variance estimator E[(r - 1) - log r] of KL(old || new) (Schulman's "k3").
        approx_kl = tf.reduce_mean((ratio - 1.0) - log_ratio)
        clip_frac = tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > clip, tf.float32))
        return tf.stack([pi_loss, v_loss, entropy, approx_kl, clip_frac])


def from_config(ac: ActorCritic, settings: "Mapping[str, Any]") -> PPO:
    """train.py's PPO (algos.registry): --lr, --epochs, --minibatch_size, --kl_targ (target_kl), --clip_ratio,
    --ent_coef, --vf_coef, --value_loss, --adv_norm, --value_targets and --seed, by name in ``settings``."""
    return PPO(ac, PPOConfig(lr=settings["lr"], epochs=settings["epochs"], minibatch_size=settings["minibatch_size"],
                             clip_ratio=settings["clip_ratio"], target_kl=settings["kl_targ"],
                             vf_coef=settings["vf_coef"], value_loss=settings["value_loss"],
                             adv_norm=settings["adv_norm"], ent_coef=settings["ent_coef"],
                             value_targets=settings["value_targets"]), seed=settings["seed"])
