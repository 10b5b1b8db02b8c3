"""Trust region policy optimization (Schulman et al. 2015), run by rank 0 on the gathered batch."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from algos.adam import FusedAdam
from algos.learner_batch import (
    LearnerBatch,
    batch_specs,
    epoch_means,
    graph_function,
    minibatch_loop,
    prepare_batch,
    weight_for_policy_lag,
)
from algos.policy import ActorCritic
from algos.registry import ALGORITHMS
from mpi_util import heartbeat

if TYPE_CHECKING:
    from collections.abc import Mapping


_DEFAULTS = ALGORITHMS["trpo"].defaults  # train.py's options and this class share one set of defaults
# The Fisher matrix from a fifth of the batch, as baselines' trpo_mpi estimates it for every network: for a CNN its
# eleven products per update are most of the update's arithmetic (benchmarks/README.md, section Pixels), and the
# line search still holds the step to the trust region on the whole batch. MLPs keep the whole batch: their update
# is a small part of an iteration, and TRPO's MuJoCo learning figures were measured with it.
IMAGE_FISHER_EVERY = 5


@dataclass
class TRPOConfig:
    """TRPO hyperparameters."""

    max_kl: float = _DEFAULTS["kl_targ"]
    """Trust region: the largest mean KL(old || new) over the batch a policy step may have."""
    cg_iters: int = 10
    """Conjugate gradient iterations solving F x = g for the natural gradient direction."""
    cg_damping: float = 0.1
    """Added to the Fisher matrix's diagonal (F + damping I) so conjugate gradient stays well conditioned."""
    fisher_every: int = 1
    """Conjugate gradient's Fisher-vector products, and the step length they give, read every fisher_every-th row
    of the batch (the gradient and the line search's surrogate and KL check read all of them). train.py takes 5
    for image networks (IMAGE_FISHER_EVERY), 1 for MLPs."""
    backtrack_iters: int = 10
    """Line search tries at most this many step sizes before keeping the old policy."""
    backtrack_coef: float = 0.8
    """Each line search try shrinks the step by this factor."""
    vf_lr: float = _DEFAULTS["lr"]
    """Adam learning rate of the value function."""
    vf_epochs: int = 5
    """Passes over the batch fitting the value function per update."""
    vf_minibatch_size: int = _DEFAULTS["minibatch_size"]
    """Rows per value function gradient step; the last minibatch of an epoch holds the remainder."""


class TRPO:
    """TRPO learner for one ActorCritic: a natural gradient policy step inside a KL trust region, then a value
    function fitted with Adam on minibatches shuffled by a np.random.Generator(seed)."""

    def __init__(self, ac: ActorCritic, cfg: TRPOConfig, seed: int) -> None:
        self.ac = ac
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self._pi_variables = ac.policy_variables()
        self._v_variables = ac.value_variables()
        # Its slots exist from here on, so a resumed run can set them before its first update.
        self.vf_optimizer = FusedAdam(self._v_variables, learning_rate=cfg.vf_lr)
        obs_spec, act_spec = batch_specs(ac)
        row_spec = tf.TensorSpec([None], tf.float32)
        params_spec = tf.TensorSpec([None, None], tf.float32)
        flat_spec = tf.TensorSpec([None], tf.float32)
        self._old_policy = graph_function(self.ac.params_and_log_prob, input_signature=[obs_spec, act_spec])
        self._surrogate_grad = graph_function(
            self._surrogate_grad_fn, input_signature=[obs_spec, act_spec, row_spec, row_spec]
        )
        self._fisher_vector_product = graph_function(
            self._fisher_vector_product_fn, input_signature=[obs_spec, params_spec, flat_spec]
        )
        self._policy_stats = graph_function(
            self._policy_stats_fn, input_signature=[obs_spec, act_spec, row_spec, row_spec, params_spec]
        )
        # A graph loop over up to STEPS_PER_CALL minibatch steps per call (see PPO).
        self._vf_steps = graph_function(self._vf_steps_fn)

    def update(
        self, obs: np.ndarray, act: np.ndarray, adv: np.ndarray, ret: np.ndarray,
        behavior_logp: np.ndarray | None = None, old_logp: np.ndarray | None = None,
    ) -> dict[str, float]:
        """One TRPO update on a gathered batch of N rows, then obs_rms merges obs (vectors).

        obs (N, obs_dim) float32 RAW observations; act (N, act_dim) float32 or (N,) int64; adv (N,) GAE
        advantages, not yet normalized; ret (N,) value targets in return units; behavior_logp (N,) float64: the
        log-probabilities of the policy that acted when it is older than the current one (weight_for_policy_lag).
        old_logp is not used: the KL of the trust region needs the policy's parameters over the batch, and the
        pass that finds them gives the log-probabilities too.
        Returns floats: pi_loss (-surrogate after the step), v_loss (mean over value steps), entropy and kl
        (mean KL(old || new)) over the batch after the step, backtracks (line search shrinks; backtrack_iters
        when no step was accepted), explained_var (of the workers' values).
        """
        batch = prepare_batch(self.ac, obs, act, adv, ret)
        old_params, old_logp = self._old_policy(batch.obs, batch.act)
        batch, lag_stats = weight_for_policy_lag(batch, old_logp, behavior_logp)
        backtracks = self._policy_step(batch, old_params, old_logp)
        surrogate, kl, entropy = (
            float(x) for x in self._policy_stats(batch.obs, batch.act, batch.adv, old_logp, old_params)
        )
        v_loss = self._fit_value(batch)
        # After the update, so the next iteration's actors normalize with statistics that include this batch.
        self.ac.update_obs_stats(obs)
        return {
            "pi_loss": -surrogate,
            "v_loss": v_loss,
            "entropy": entropy,
            "kl": kl,
            "backtracks": float(backtracks),
            "explained_var": batch.explained_var,
            **lag_stats,
        }

    def set_learning_rate(self, lr: float) -> None:
        """The value function's Adam learning rate for the next updates (the policy step has none)."""
        self.vf_optimizer.learning_rate.assign(lr)

    def optimizer_state(self) -> list[np.ndarray]:
        """Copies of every value-function Adam variable (step count, learning rate, moments), fixed order."""
        return [v.numpy() for v in self.vf_optimizer.variables]

    def set_optimizer_state(self, arrays: list[np.ndarray]) -> None:
        """Restore what optimizer_state() returned."""
        for variable, array in zip(self.vf_optimizer.variables, arrays, strict=True):
            variable.assign(array)

    def rng_state(self) -> dict:
        """The minibatch shuffling generator's state (a bit_generator.state dict)."""
        return self.rng.bit_generator.state

    def set_rng_state(self, state: dict) -> None:
        """Restore what rng_state() returned."""
        self.rng.bit_generator.state = state

    def _policy_step(self, batch: LearnerBatch, old_params: tf.Tensor, old_logp: tf.Tensor) -> int:
        """Natural gradient step with backtracking line search; returns the number of shrinks
        (backtrack_iters when every try failed and the old policy was kept)."""
        surrogate_old, grad = self._surrogate_grad(batch.obs, batch.act, batch.adv, old_logp)
        grad = grad.numpy().astype(np.float64)
        fisher_obs = batch.obs[:: self.cfg.fisher_every]
        fisher_params = old_params[:: self.cfg.fisher_every]

        def fisher_vector_product(vec: np.ndarray) -> np.ndarray:
            heartbeat()  # once per conjugate-gradient step: the workers waiting for the weights see rank 0 advance
            product = self._fisher_vector_product(fisher_obs, fisher_params, tf.constant(vec, dtype=tf.float32))
            return product.numpy().astype(np.float64)

        direction = _conjugate_gradient(fisher_vector_product, grad, self.cfg.cg_iters)
        shs = float(direction @ fisher_vector_product(direction))
        # A zero gradient (e.g. constant advantages) gives no direction to step in.
        if not shs > 0.0:
            return self.cfg.backtrack_iters
        # Largest step along the direction whose quadratic KL model 0.5 s^T F s equals max_kl.
        full_step = np.sqrt(2.0 * self.cfg.max_kl / shs) * direction
        old_flat = np.concatenate([v.numpy().ravel() for v in self._pi_variables]).astype(np.float64)
        for shrinks in range(self.cfg.backtrack_iters):
            heartbeat()
            self._assign_policy(old_flat + self.cfg.backtrack_coef**shrinks * full_step)
            surrogate, kl, _ = self._policy_stats(batch.obs, batch.act, batch.adv, old_logp, old_params)
            if float(kl) <= self.cfg.max_kl and float(surrogate) > float(surrogate_old):
                return shrinks
        self._assign_policy(old_flat)
        return self.cfg.backtrack_iters

    def _assign_policy(self, flat: np.ndarray) -> None:
        """Set the policy variables from one flat vector, in policy_variables() order."""
        offset = 0
        for variable in self._pi_variables:
            size = int(np.prod(variable.shape))
            variable.assign(flat[offset : offset + size].reshape(variable.shape).astype(np.float32))
            offset += size

    def _fit_value(self, batch: LearnerBatch) -> float:
        """vf_epochs of Adam minibatch steps on the value loss; returns the mean minibatch loss."""
        n = int(batch.obs.shape[0])
        losses = []
        for _ in range(self.cfg.vf_epochs):
            mean = epoch_means(lambda rows, total: self._vf_steps(batch.obs, batch.v_target, rows, total),
                               self.rng.permutation(n), self.cfg.vf_minibatch_size, tf.constant(0.0))
            losses.append(float(mean))
        # Every epoch has the same number of minibatches: the mean of epoch means is the mean over steps.
        return float(np.mean(losses))

    def _surrogate(self, obs: tf.Tensor, act: tf.Tensor, adv: tf.Tensor, old_logp: tf.Tensor) -> tf.Tensor:
        """Importance-weighted advantage mean(pi(a|s) / pi_old(a|s) * adv), the quantity TRPO maximizes."""
        return tf.reduce_mean(tf.exp(self.ac.log_prob(obs, act) - old_logp) * adv)

    def _surrogate_grad_fn(
        self, obs: tf.Tensor, act: tf.Tensor, adv: tf.Tensor, old_logp: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The surrogate (scalar) and its gradient with respect to the policy variables, flat (n_params,)."""
        with tf.GradientTape() as tape:
            surrogate = self._surrogate(obs, act, adv, old_logp)
        return surrogate, _flat(tape.gradient(surrogate, self._pi_variables))

    def _fisher_vector_product_fn(self, obs: tf.Tensor, old_params: tf.Tensor, vec: tf.Tensor) -> tf.Tensor:
        """(F + cg_damping I) vec, (n_params,), with F the Hessian of the mean KL(old || new) at new = old.

        By double backprop: the gradient of (grad KL . vec), so F is never formed.
        """
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                kl = self.ac.kl(old_params, obs)
            grad_dot_vec = tf.reduce_sum(_flat(inner.gradient(kl, self._pi_variables)) * vec)
        return _flat(outer.gradient(grad_dot_vec, self._pi_variables)) + self.cfg.cg_damping * vec

    def _policy_stats_fn(
        self, obs: tf.Tensor, act: tf.Tensor, adv: tf.Tensor, old_logp: tf.Tensor, old_params: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Surrogate, mean KL(old || new) and mean entropy of the current policy on the batch (scalars), from one pass
        of the policy network."""
        out = self.ac.pi_net(obs)
        return (
            tf.reduce_mean(tf.exp(self.ac.log_prob_of(out, act) - old_logp) * adv),
            self.ac.kl_of(old_params, self.ac.params_of(out)),
            tf.reduce_mean(self.ac.entropy_of(out)),
        )

    def _vf_steps_fn(self, obs: tf.Tensor, v_target: tf.Tensor, rows: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
        """A value step on each run of vf_minibatch_size rows of ``rows`` (M,), a slice of an epoch's permutation;
        returns ``total`` (a scalar) plus each step's loss, added in order."""
        return minibatch_loop(lambda idx: self._vf_step(obs, v_target, idx), rows, self.cfg.vf_minibatch_size, total)

    def _vf_step(self, obs: tf.Tensor, v_target: tf.Tensor, idx: tf.Tensor) -> tf.Tensor:
        """One Adam step on the value loss of the rows idx (M,); returns the loss before the step."""
        obs, v_target = tf.gather(obs, idx), tf.gather(v_target, idx)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.ac.value(obs) - v_target))
        grads = tape.gradient(loss, self._v_variables)
        self.vf_optimizer.apply(grads)
        return loss


def from_config(ac: ActorCritic, settings: "Mapping[str, Any]") -> TRPO:
    """train.py's TRPO (algos.registry): --kl_targ (max_kl), --lr (vf_lr), --minibatch_size (vf_minibatch_size) and
    --seed, by name in ``settings``; the Fisher matrix from every IMAGE_FISHER_EVERY-th row for image networks."""
    return TRPO(ac, TRPOConfig(max_kl=settings["kl_targ"], vf_lr=settings["lr"],
                               vf_minibatch_size=settings["minibatch_size"],
                               fisher_every=IMAGE_FISHER_EVERY if ac.obs.is_image else 1), seed=settings["seed"])


def _flat(tensors: list[tf.Tensor]) -> tf.Tensor:
    """Concatenate tensors into one vector, (sum of sizes,)."""
    return tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)


def _conjugate_gradient(
    matvec: Callable[[np.ndarray], np.ndarray], b: np.ndarray, iters: int, tol: float = 1e-10
) -> np.ndarray:
    """Approximate solution x (n,) of A x = b for a symmetric positive definite A (n, n) given as
    matvec(x) = A x; stops early once the squared residual is below tol."""
    x = np.zeros_like(b)
    r = b.copy()
    p = b.copy()
    rr = r @ r
    for _ in range(iters):
        if rr < tol:
            break
        ap = matvec(p)
        alpha = rr / (p @ ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = r @ r
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x
