"""The normalization steps that PPO and TRPO both apply to a gathered batch before learning from it."""

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import tensorflow as tf

from algos.policy import ActorCritic
from mpi_util import heartbeat


@dataclass
class LearnerBatch:
    """A gathered batch ready for the learner, as TF tensors of N rows."""

    obs: tf.Tensor
    """(N, obs_dim) float32 observations normalized with the statistics the workers acted with, or (N, H, W, C)
    uint8 images (the network scales them)."""
    act: tf.Tensor
    """(N, act_dim) float32 (Box), (N,) int64 (Discrete) or (N, d) int64 (MultiDiscrete, MultiBinary) actions, as
    sampled (unclipped)."""
    adv: tf.Tensor
    """(N,) float32 advantages normalized to zero mean and unit standard deviation over the batch."""
    v_target: tf.Tensor
    """(N,) float32 value targets: the returns normalized with ret_rms after it merged this batch, or the returns as
    they are."""
    old_value: tf.Tensor
    """(N,) float32 the values the workers used (ret - adv), in the value network's units (normalized with ret_rms as
    it was before this batch merged): where PPO's clipped value loss is centred."""
    explained_var: float
    """1 - Var(ret - V) / Var(ret) of the values the workers used (NaN when the returns are constant)."""


def prepare_batch(
    ac: ActorCritic, obs: np.ndarray, act: np.ndarray, adv: np.ndarray, ret: np.ndarray, normalize_returns: bool = True
) -> LearnerBatch:
    """Normalize a batch for learning; merges ret into ac.ret_rms (but leaves ac.obs_rms alone) when
    ``normalize_returns``, else leaves ac.ret_rms at its start (mean 0, variance 1: the value function learns the
    returns as they are, and the actor reads its values unscaled).

    obs (N, obs_dim) RAW observations or (N, H, W, C) uint8 images; act as LearnerBatch.act; adv (N,) GAE advantages;
    ret (N,) value targets in return units.
    """
    adv = np.asarray(adv, dtype=np.float64)
    ret = np.asarray(ret, dtype=np.float64)
    # The workers computed ret = adv + V(s), so ret - adv are the values they used: no forward pass needed.
    ret_var = ret.var()
    explained_var = float(1.0 - np.var(adv) / ret_var) if ret_var > 0 else float("nan")
    adv_n = (adv - adv.mean()) / (adv.std() + 1e-8)
    old_value = ac.ret_rms.normalize((ret - adv)[:, None])[:, 0]
    if normalize_returns:
        ac.ret_rms.update(ret[:, None])
        v_target = ac.ret_rms.normalize(ret[:, None])[:, 0]
    else:
        v_target = ret.astype(np.float32)
    return LearnerBatch(
        obs=tf.constant(ac.normalize_obs(obs)),
        act=tf.constant(act, dtype=tf.int64 if ac.is_discrete else tf.float32),
        adv=tf.constant(adv_n, dtype=tf.float32),
        v_target=tf.constant(v_target),
        old_value=tf.constant(old_value),
        explained_var=explained_var,
    )


STEPS_PER_CALL = 32
"""Minibatch steps per call of a traced epoch loop; an epoch of more minibatches runs as several calls, so that rank 0
calls heartbeat() between them (the waiting ranks see it advance) however long the epoch."""


def epoch_means(steps: Callable[[tf.Tensor, tf.Tensor], tf.Tensor], perm: np.ndarray, minibatch_size: int,
                zeros: tf.Tensor) -> tf.Tensor:
    """One epoch: ``steps(rows, sums)``, a traced minibatch_loop, called on the epoch's permutation perm (N,) in runs of
    at most STEPS_PER_CALL minibatches, with a heartbeat before each call; returns the sums it adds up from ``zeros``
    divided by the epoch's number of minibatches (the last may be short): the means over the epoch's steps."""
    n = len(perm)
    rows_per_call = STEPS_PER_CALL * minibatch_size
    perm = tf.constant(perm)
    sums = zeros
    for start in range(0, n, rows_per_call):
        heartbeat()  # the workers waiting for the weights see rank 0 advance
        sums = steps(perm[start : start + rows_per_call], sums)
    return sums / float(-(-n // minibatch_size))


def minibatch_loop(step: Callable[[tf.Tensor], tf.Tensor], rows: tf.Tensor, minibatch_size: int,
                   sums: tf.Tensor) -> tf.Tensor:
    """``sums`` plus ``step(idx)`` for each run idx of minibatch_size rows of ``rows`` (M,), in order (the last run may
    be short); call it while a graph_function is traced, with M known (a call's rows are a constant).

    The full runs are a graph loop, one step after the other (parallel_iterations=1: each step reads the weights the
    one before wrote); a short last run is one more step after it. Unrolled, the steps ran the same ops in the same
    order, bit for bit, but each traced step cost a tenth of a second or more, once per process: a Walker2d run reached
    its first iteration after 10.5 s, against 5.5 s with the loop. Each run is cut by tf.slice, whose size is a
    constant, so the step inside the loop has the static shapes of the unrolled one (a slice rows[start:start + size]
    would have none, and TensorFlow's graph optimizations fold shape work away only where shapes are known: with it
    Walker2d's update took 1.05-1.21x the time on a Zen 3; benchmarks/README.md, section update.py).
    """
    count = int(rows.shape[0])
    full_rows = count - count % minibatch_size

    def body(start: tf.Tensor, sums: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return start + minibatch_size, sums + step(tf.slice(rows, [start], [minibatch_size]))

    _, sums = tf.while_loop(lambda start, _: start < full_rows, body, [tf.constant(0), sums], parallel_iterations=1)
    if full_rows < count:
        sums = sums + step(rows[full_rows:])
    return sums


def graph_function(fn: Callable, input_signature: list[tf.TensorSpec] | None = None) -> Callable:
    """``fn`` as a TensorFlow graph, traced on its first call (and once per input signature).

    Without AutoGraph: the update's code has no control flow on tensors (its loops run over Python ints while it is
    traced), so AutoGraph would trace the same ops, after first converting the source of every function it calls. That
    conversion cost 1.8 of the 7.5 s of a Walker2d PPO run's first update, and half of a 2-step CartPole update's
    (2-core AMD EPYC, 2026-11-27); the results are the same bit for bit."""
    return tf.function(fn, input_signature=input_signature, autograph=False)


def batch_specs(ac: ActorCritic) -> tuple[tf.TensorSpec, tf.TensorSpec]:
    """TensorSpecs (obs, act) with a free batch size, so each tf.function is traced once for any N."""
    obs_spec = tf.TensorSpec([None, *ac.obs.shape], tf.uint8 if ac.obs.is_image else tf.float32)
    if ac.is_discrete:
        return obs_spec, tf.TensorSpec([None, *ac.action.shape], tf.int64)
    return obs_spec, tf.TensorSpec([None, ac.act_dim], tf.float32)


def weight_for_policy_lag(
    batch: LearnerBatch, old_logp: tf.Tensor, behavior_logp: np.ndarray | None
) -> tuple[LearnerBatch, dict[str, float]]:
    """The batch an update learns from when the policy that sampled it is one update older than the one being
    updated (train.py --policy_lag 1), and the weights' largest value as a statistic ({} when behavior_logp is None:
    the batch comes back unchanged).

    Decoupled PPO (Hilton et al., 2021, "Batch size-invariance for policy optimization"): the clip (PPO) and the KL
    trust region (TRPO) stay around the current policy, whose log-probabilities are old_logp (N,), and each row's
    normalized advantage is multiplied by pi_current(a | s) / pi_behavior(a | s), from behavior_logp (N,), the
    log-probabilities of the policy that acted. Both surrogates are linear in the advantage and PPO's min() commutes
    with a positive factor, so this is their importance-weighted form. The states still come from the older policy.
    """
    if behavior_logp is None:
        return batch, {}
    weights = np.exp(old_logp.numpy().astype(np.float64) - behavior_logp)
    weighted = tf.constant(batch.adv.numpy() * weights, dtype=tf.float32)
    return replace(batch, adv=weighted), {"lag_weight_max": float(weights.max()) if len(weights) else 1.0}
