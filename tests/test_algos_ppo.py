"""PPO: an update runs, learns CartPole quickly, and matches a plain Keras update (resuming: test_algos_registry)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import gymnasium
import numpy as np
import pytest
from conftest import TENSORFLOW_IN_PROCESS

from algos import RolloutWorker

if TYPE_CHECKING:  # TensorFlow's modules are imported by the tests that use them (conftest.TENSORFLOW_IN_PROCESS)
    from algos import PPO, ActorCritic, PPOConfig

pytestmark = TENSORFLOW_IN_PROCESS
STAT_KEYS = {"pi_loss", "v_loss", "entropy", "kl", "clip_frac", "epochs", "explained_var", "lr"}


def make_learner(seed: int, cfg: PPOConfig | None = None) -> tuple[ActorCritic, PPO]:
    import keras

    from algos import PPO, ActorCritic, PPOConfig

    keras.utils.set_random_seed(seed)
    ac = ActorCritic(4, gymnasium.make("CartPole-v1").action_space, hidden=(64, 64))
    return ac, PPO(ac, cfg or PPOConfig(), seed=seed)


def cartpole_batches(ac: ActorCritic, n_batches: int, n_steps: int = 512) -> list[dict[str, np.ndarray]]:
    worker = RolloutWorker(gymnasium.make("CartPole-v1"), seed=0, gamma=0.99, lam=0.95)
    rng = np.random.default_rng(0)
    return [worker.collect(n_steps, ac.numpy_actor(), rng)[0] for _ in range(n_batches)]


def update(ppo: PPO, batch: dict[str, np.ndarray]) -> dict[str, float]:
    return ppo.update(batch["obs"], batch["act"], batch["adv"], batch["ret"])


def test_one_update_returns_finite_stats_and_updates_normalizers():
    ac, ppo = make_learner(0)
    (batch,) = cartpole_batches(ac, 1)
    before = [v.numpy().copy() for v in ac.variables()]
    stats = update(ppo, batch)
    assert set(stats) == STAT_KEYS
    assert all(isinstance(v, float) and np.isfinite(v) for v in stats.values()), stats
    assert 1 <= stats["epochs"] <= 10 and stats["kl"] >= 0.0
    assert stats["lr"] == np.float32(3e-4)
    ppo.set_learning_rate(1e-4)
    assert update(ppo, batch)["lr"] == np.float32(1e-4)
    assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, ac.variables(), strict=True))
    np.testing.assert_allclose(ac.obs_rms.mean, batch["obs"].mean(axis=0), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(ac.ret_rms.mean, [batch["ret"].mean()], rtol=1e-3)


def test_raw_value_targets_are_the_returns_and_leave_the_return_statistics_at_their_start():
    # Atari's default: the value function learns the returns as they are (this CartPole batch's are 1 to 16), and the
    # actors' values, de-normalized with ret_rms, stay in return units because ret_rms stays at mean 0, variance 1.
    from algos import PPOConfig
    from algos.learner_batch import prepare_batch

    ac, ppo = make_learner(0, PPOConfig(value_targets="raw"))
    (batch,) = cartpole_batches(ac, 1)
    prepared = prepare_batch(ac, batch["obs"], batch["act"], batch["adv"], batch["ret"], normalize_returns=False)
    np.testing.assert_array_equal(prepared.v_target.numpy(), batch["ret"].astype(np.float32))
    start = [array.copy() for array in ac.ret_rms.arrays()]
    stats = update(ppo, batch)
    assert stats["v_loss"] > 10.0, stats  # 83 here; 0.92 on the same batch normalized
    for now, then in zip(ac.ret_rms.arrays(), start, strict=True):
        np.testing.assert_array_equal(now, then)
    with pytest.raises(ValueError, match="value_targets must be one of normalized, raw, got 'Raw'"):
        make_learner(0, PPOConfig(value_targets="Raw"))
    with pytest.raises(ValueError, match="value_loss must be one of mse, clipped, got 'clip'"):
        make_learner(0, PPOConfig(value_loss="clip"))


def test_target_kl_stops_epochs_early():
    from algos import PPOConfig

    ac, ppo = make_learner(0, PPOConfig(lr=3e-3, target_kl=1e-4))
    (batch,) = cartpole_batches(ac, 1)
    assert update(ppo, batch)["epochs"] < 10


def test_an_update_given_the_workers_log_probabilities_runs_no_pass_of_its_own_and_learns_the_same():
    # train.py's synchronous loop hands PPO the log-probabilities the workers found while acting with the policy
    # about to learn; the update must not run its own pass of the batch for them, and must take the same steps to
    # float32 rounding. Given an older policy's (--policy_lag 1) as well, it refuses.
    ac, ppo = make_learner(0)
    (batch,) = cartpole_batches(ac, 1)
    twin_ac, twin = make_learner(0)
    given = ppo.update(batch["obs"], batch["act"], batch["adv"], batch["ret"], old_logp=batch["logp"])
    assert ppo._old_log_prob.experimental_get_tracing_count() == 0
    found = update(twin, batch)
    assert twin._old_log_prob.experimental_get_tracing_count() == 1
    assert given["epochs"] == found["epochs"]
    for key in ("pi_loss", "v_loss", "entropy", "kl", "clip_frac"):
        np.testing.assert_allclose(given[key], found[key], rtol=1e-3, atol=1e-6, err_msg=key)
    for a, b in zip(ac.variables(), twin_ac.variables(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="give one"):
        ppo.update(batch["obs"], batch["act"], batch["adv"], batch["ret"], batch["logp"], old_logp=batch["logp"])


def test_learns_cartpole():
    start = time.monotonic()
    ac, ppo = make_learner(0)
    worker = RolloutWorker(gymnasium.make("CartPole-v1"), seed=0, gamma=0.99, lam=0.95)
    rng = np.random.default_rng(0)
    mean_returns = []
    for _ in range(4):
        batch, episodes = worker.collect(2048, ac.numpy_actor(), rng)
        mean_returns.append(episodes["ep_return"].mean())
        update(ppo, batch)
    _, episodes = worker.collect(2048, ac.numpy_actor(), rng)
    mean_returns.append(episodes["ep_return"].mean())
    assert mean_returns[0] < 40 and mean_returns[-1] > 100, mean_returns
    assert time.monotonic() - start < 60, "the learning check must stay short"


def keras_reference_update(ac: ActorCritic, cfg: PPOConfig, seed: int, batch: dict[str, np.ndarray]) -> list[float]:
    """PPO's update written plainly: the Keras models called eagerly, keras.optimizers.Adam, one minibatch at a
    time, the permutations drawn as PPO draws them, the value loss and advantages as cfg says (the clipped loss and
    per-minibatch advantages as CleanRL's ppo_atari.py writes them). Returns [pi_loss, v_loss] averaged over the
    steps."""
    import keras
    import tensorflow as tf

    from algos.learner_batch import prepare_batch

    prepared = prepare_batch(ac, batch["obs"], batch["act"], batch["adv"], batch["ret"])
    obs, act, adv, v_target = prepared.obs, prepared.act, prepared.adv, prepared.v_target
    old_value = tf.constant(batch["ret"] - batch["adv"], tf.float32)  # the normalizers are at their start

    def log_prob(o: tf.Tensor, a: tf.Tensor) -> tf.Tensor:
        z = (a - ac.pi_net(o)) * tf.exp(-ac.log_std)
        return -0.5 * tf.reduce_sum(tf.square(z), axis=1) - tf.reduce_sum(ac.log_std) - 0.5 * ac.act_dim * np.log(
            2 * np.pi)

    old_logp = log_prob(obs, act)
    variables = ac.variables()
    optimizer = keras.optimizers.Adam(learning_rate=cfg.lr, epsilon=1e-5)
    rng = np.random.default_rng(seed)
    n = int(obs.shape[0])
    losses = []
    for _ in range(cfg.epochs):
        perm = rng.permutation(n)
        for start in range(0, n, cfg.minibatch_size):
            idx = perm[start : start + cfg.minibatch_size]
            o, a, ad, vt, ov, olp = (tf.gather(x, idx) for x in (obs, act, adv, v_target, old_value, old_logp))
            if cfg.adv_norm == "minibatch":
                ad = (ad - np.mean(ad)) / (np.std(ad, ddof=1) + 1e-8)
            with tf.GradientTape() as tape:
                ratio = tf.exp(log_prob(o, a) - olp)
                clipped = tf.clip_by_value(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
                pi_loss = -tf.reduce_mean(tf.minimum(ratio * ad, clipped * ad))
                value = ac.v_net(o)[:, 0]
                v_loss = tf.square(value - vt)
                if cfg.value_loss == "clipped":
                    v_clipped = ov + tf.clip_by_value(value - ov, -cfg.clip_ratio, cfg.clip_ratio)
                    v_loss = tf.maximum(v_loss, tf.square(v_clipped - vt))
                v_loss = tf.reduce_mean(v_loss)
                loss = pi_loss + cfg.vf_coef * v_loss
            grads, _ = tf.clip_by_global_norm(tape.gradient(loss, variables), cfg.max_grad_norm)
            optimizer.apply_gradients(zip(grads, variables, strict=True))
            losses.append([float(pi_loss), float(v_loss)])
    return list(np.mean(losses, axis=0))


@pytest.mark.parametrize(("value_loss", "adv_norm"), [("mse", "batch"), ("clipped", "minibatch")])
def test_update_matches_a_plain_keras_update_on_a_fixed_batch(value_loss, adv_norm):
    # The update's graph is built for speed (layers as raw ops, one fused Adam kernel per variable, a graph loop
    # over the minibatches); its results must be those of the plain formulation within float32 round-off. 250 rows:
    # the last minibatch of each epoch holds the remainder, 58 rows. The returns and advantages are drawn apart, so
    # the workers' values (ret - adv) lie far from the network's and the clipped value loss takes both branches.
    import keras

    from algos import PPO, ActorCritic, PPOConfig

    cfg = PPOConfig(epochs=4, target_kl=None, value_loss=value_loss, adv_norm=adv_norm)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (6,), np.float32)
    rng = np.random.default_rng(3)
    batch = {"obs": rng.normal(size=(250, 17)).astype(np.float32), "act": rng.normal(size=(250, 6)).astype(np.float32),
             "adv": rng.normal(size=250), "ret": rng.normal(size=250)}
    learners = []
    for _ in range(2):
        keras.utils.set_random_seed(0)
        learners.append(ActorCritic(17, action_space, hidden=(64, 64)))
    fast, plain = learners
    initial = [v.numpy() for v in fast.variables()]
    stats = PPO(fast, cfg, seed=5).update(**{k: batch[k] for k in ("obs", "act", "adv", "ret")})
    pi_loss, v_loss = keras_reference_update(plain, cfg, 5, batch)
    for a, b in zip(fast.variables(), plain.variables(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
    changes = [np.abs(a - v.numpy()).max() for a, v in zip(initial, fast.variables(), strict=True)]
    assert min(changes) > 0 and max(changes) > 1e-3, changes  # the update moved every variable, by far more than
    # the tolerance above
    assert stats["pi_loss"] == pytest.approx(pi_loss, rel=1e-4, abs=1e-6)
    assert stats["v_loss"] == pytest.approx(v_loss, rel=1e-4)


@pytest.mark.parametrize("algo", ["ppo", "trpo"])
def test_an_epoch_split_over_several_calls_updates_the_weights_exactly_as_one_call(monkeypatch, algo):
    # At most STEPS_PER_CALL minibatch steps run in one call of the traced loop (rank 0 beats its heart between
    # calls); an epoch of more runs as several calls. 250 rows of 64: 4 minibatches, one call at the default cap,
    # calls of 3 and 1 (the 58-row remainder) at a cap of 3. The weights must not tell them apart.
    import keras

    import algos.learner_batch
    from algos import PPO, TRPO, ActorCritic, PPOConfig, TRPOConfig

    rng = np.random.default_rng(4)
    batch = {"obs": rng.normal(size=(250, 4)).astype(np.float32), "act": rng.integers(0, 2, size=250),
             "adv": rng.normal(size=250), "ret": rng.normal(size=250)}
    results = []
    for cap in (algos.learner_batch.STEPS_PER_CALL, 3):
        monkeypatch.setattr(algos.learner_batch, "STEPS_PER_CALL", cap)
        keras.utils.set_random_seed(0)
        ac = ActorCritic(4, gymnasium.make("CartPole-v1").action_space, hidden=(64, 64))
        learner = (PPO(ac, PPOConfig(epochs=3, target_kl=None), seed=5) if algo == "ppo"
                   else TRPO(ac, TRPOConfig(vf_minibatch_size=64), seed=5))
        stats = learner.update(batch["obs"], batch["act"], batch["adv"], batch["ret"])
        results.append(([v.numpy() for v in ac.variables()], stats))
    (one_call, one_stats), (split, split_stats) = results
    for a, b in zip(one_call, split, strict=True):
        np.testing.assert_array_equal(a, b)
    assert split_stats == pytest.approx(one_stats, rel=1e-6)


def test_each_minibatch_step_of_the_graph_loop_is_traced_with_its_static_shape():
    # The loop's step runs with shapes known when traced (a shapeless minibatch made Walker2d's update 1.05-1.21x
    # slower on a Zen 3): full runs of 64 rows inside the loop, the 58-row remainder after it, and every row taken
    # once, in order.
    import tensorflow as tf

    from algos.learner_batch import minibatch_loop

    traced_shapes = []

    def step(idx: tf.Tensor) -> tf.Tensor:
        traced_shapes.append(idx.shape.as_list())
        return tf.stack([tf.reduce_sum(tf.cast(idx, tf.float32)), tf.cast(idx[0], tf.float32)])

    rows = tf.constant(np.arange(250, dtype=np.int32)[::-1].copy())
    sums = tf.function(lambda rows: minibatch_loop(step, rows, 64, tf.zeros(2)), autograph=False)(rows)
    assert traced_shapes == [[64], [58]]
    assert sums.numpy().tolist() == [sum(range(250)), 249 + 185 + 121 + 57]  # each run's first row
