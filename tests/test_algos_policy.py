"""The numpy twin of the networks and the NumpyActor agree with the Keras/TF learner."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import gymnasium
import numpy as np
import pytest
from conftest import TENSORFLOW_IN_PROCESS

from algos import NumpyActor, numpy_mlp_forward
from algos.numpy_actor import actor_critic_state_like, conv2d
from algos.spaces import ObsSpec, action_spec

if TYPE_CHECKING:  # TensorFlow's modules are imported by the tests that use them (conftest.TENSORFLOW_IN_PROCESS)
    from algos import ActorCritic

pytestmark = TENSORFLOW_IN_PROCESS
BOX = gymnasium.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
DISCRETE = gymnasium.spaces.Discrete(4)
MULTI = gymnasium.spaces.MultiDiscrete([3, 2, 4])
BINARY = gymnasium.spaces.MultiBinary(3)
SPACES = [BOX, DISCRETE, MULTI, BINARY]
SPACE_IDS = ["box", "discrete", "multidiscrete", "multibinary"]


def actor_critic(space, seed: int = 0, init_log_std: float = -0.5) -> ActorCritic:
    """An ActorCritic whose normalizers hold non-trivial statistics, so the tests see them used."""
    import keras

    from algos import ActorCritic

    keras.utils.set_random_seed(seed)
    ac = ActorCritic(5, space, hidden=(16, 16), init_log_std=init_log_std)
    rng = np.random.default_rng(seed)
    ac.obs_rms.update(rng.normal(2.0, 3.0, size=(100, 5)))
    ac.ret_rms.update(rng.normal(-40.0, 7.0, size=(100, 1)))
    return ac


def test_build_mlp_layout_and_init():
    import keras

    from algos import build_mlp

    keras.utils.set_random_seed(0)
    model = build_mlp(5, 3, (16, 8), output_gain=0.01)
    assert [tuple(w.shape) for w in model.weights] == [(5, 16), (16,), (16, 8), (8,), (8, 3), (3,)]
    weights = [w.numpy() for w in model.weights]
    for bias in weights[1::2]:
        np.testing.assert_array_equal(bias, 0.0)
    # Orthogonal with gain g: the shorter side's vectors are orthogonal with squared norm g^2.
    np.testing.assert_allclose(weights[0] @ weights[0].T, 2.0 * np.eye(5), atol=1e-5)
    np.testing.assert_allclose(weights[4].T @ weights[4], 1e-4 * np.eye(3), atol=1e-8)


def test_numpy_forward_equals_keras():
    import keras

    from algos import build_mlp

    keras.utils.set_random_seed(1)
    model = build_mlp(5, 3, (16, 8), output_gain=1.0)
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    out = numpy_mlp_forward([w.numpy() for w in model.weights], x)
    assert out.dtype == np.float32 and out.shape == (32, 3)
    np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_variables_and_broadcast_state():
    import tensorflow as tf

    from algos import ActorCritic

    ac = actor_critic(BOX)
    variables = ac.variables()
    assert all(isinstance(v, tf.Variable) for v in variables)
    assert len(variables) == 6 + 1 + 6
    assert variables[6] is ac.log_std
    # Assigning to what variables() hands out changes the model itself (what a broadcast relies on).
    variables[0].assign(np.zeros((5, 16), np.float32))
    np.testing.assert_array_equal(ac.pi_net.weights[0].numpy(), 0.0)
    state = ac.broadcast_state()
    assert len(state) == len(variables) + 6
    assert state[-6] is ac.obs_rms.mean and state[-1] is ac.ret_rms.count
    discrete_ac = ActorCritic(5, DISCRETE, (64, 64))
    assert discrete_ac.log_std is None and len(discrete_ac.variables()) == 12


def test_numpy_actor_matches_tf_box():
    ac = actor_critic(BOX)
    actor = ac.numpy_actor()
    raw = np.random.default_rng(2).normal(2.0, 3.0, size=(20, 5)).astype(np.float32)
    obs_n = ac.obs_rms.normalize(raw)
    mean = ac.pi_net(obs_n).numpy()
    act = actor.act(raw, np.random.default_rng(0), deterministic=True)
    assert act.dtype == np.float32 and act.shape == (20, 3)
    np.testing.assert_allclose(act, mean, rtol=1e-5, atol=1e-6)
    value = actor.value(raw)
    expected = ac.v_net(obs_n).numpy()[:, 0] * np.sqrt(ac.ret_rms.var[0] + 1e-8) + ac.ret_rms.mean[0]
    assert value.dtype == np.float32 and value.shape == (20,)
    np.testing.assert_allclose(value, expected, rtol=1e-5)
    np.testing.assert_allclose(ac.value(obs_n).numpy(), ac.v_net(obs_n).numpy()[:, 0])


def test_numpy_actor_samples_box():
    ac = actor_critic(BOX, init_log_std=0.3)
    raw = np.tile(np.array([[1.0, 2.0, 3.0, 4.0, 5.0]], np.float32), (20000, 1))
    actor = ac.numpy_actor()
    samples = actor.act(raw, np.random.default_rng(0))
    mean = actor.act(raw[:1], np.random.default_rng(0), deterministic=True)[0]
    np.testing.assert_allclose(samples.mean(axis=0), mean, atol=0.05)
    np.testing.assert_allclose(samples.std(axis=0), math.exp(0.3), rtol=0.03)


def test_numpy_actor_matches_tf_discrete():
    ac = actor_critic(DISCRETE)
    actor = ac.numpy_actor()
    raw = np.random.default_rng(3).normal(2.0, 3.0, size=(20, 5)).astype(np.float32)
    logits = ac.pi_net(ac.obs_rms.normalize(raw)).numpy()
    act = actor.act(raw, np.random.default_rng(0), deterministic=True)
    assert act.dtype == np.int64 and act.shape == (20,)
    np.testing.assert_array_equal(act, logits.argmax(axis=1))
    # Sampled frequencies follow softmax(logits) (large logits so the distribution is far from uniform).
    weights = [w.numpy() for w in ac.pi_net.weights]
    weights[-1] = weights[-1] + np.array([0.0, 1.0, -1.0, 0.5], np.float32)
    actor.pi_weights = weights
    samples = actor.act(np.repeat(raw[:1], 40000, axis=0), np.random.default_rng(1))
    probs = np.exp(numpy_mlp_forward(weights, ac.obs_rms.normalize(raw[:1]))[0])
    np.testing.assert_allclose(np.bincount(samples, minlength=4) / 40000, probs / probs.sum(), atol=0.01)


def test_numpy_actor_is_a_snapshot():
    ac = actor_critic(BOX)
    actor = ac.numpy_actor()
    raw = np.ones((1, 5), np.float32)
    before = actor.act(raw, np.random.default_rng(0), deterministic=True), actor.value(raw)
    for v in ac.variables():
        v.assign(v + 1.0)
    ac.obs_rms.update(np.full((10, 5), 100.0))
    after = actor.act(raw, np.random.default_rng(0), deterministic=True), actor.value(raw)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])


@pytest.mark.parametrize("space", [BOX, DISCRETE], ids=["box", "discrete"])
def test_noise_drawn_for_a_block_acts_as_act_row_by_row(space):
    # The rollout draws a whole batch's exploration noise in one call and acts row by row with it; that must be
    # act() with one draw per row, bit for bit, and leave the generator where act() leaves it.
    actor = actor_critic(space).numpy_actor()
    raw = np.random.default_rng(6).normal(2.0, 3.0, size=(30, 5)).astype(np.float32)
    row_rng, block_rng = np.random.default_rng(9), np.random.default_rng(9)
    one_per_row = np.concatenate([actor.act(raw[i : i + 3], row_rng) for i in range(0, 30, 3)])
    noise = actor.exploration_noise(block_rng, 30)
    written = np.empty_like(one_per_row)
    from_block = np.concatenate([actor.act_with_noise(raw[i : i + 3], noise[i : i + 3], out=written[i : i + 3])
                                 for i in range(0, 30, 3)])
    assert from_block.dtype == one_per_row.dtype == (np.int64 if space is DISCRETE else np.float32)
    np.testing.assert_array_equal(from_block, one_per_row)
    np.testing.assert_array_equal(written, one_per_row)
    assert row_rng.random() == block_rng.random()


@pytest.mark.parametrize("space", SPACES, ids=SPACE_IDS)
def test_numpy_actor_from_checkpoint_state_equals_snapshot(space):
    # --play rebuilds the actor from a checkpoint's ac_state without TensorFlow; it must act as the learner's own.
    ac = actor_critic(space)
    ac_state = [v.numpy() if hasattr(v, "numpy") else np.array(v) for v in ac.broadcast_state()]
    rebuilt = NumpyActor.from_ac_state(ac_state, (16, 16), ObsSpec((5,)), action_spec(space))
    snapshot = ac.numpy_actor()
    raw = np.random.default_rng(6).normal(2.0, 3.0, size=(50, 5)).astype(np.float32)
    for deterministic in (True, False):
        np.testing.assert_array_equal(rebuilt.act(raw, np.random.default_rng(0), deterministic),
                                      snapshot.act(raw, np.random.default_rng(0), deterministic))
    np.testing.assert_array_equal(rebuilt.value(raw), snapshot.value(raw))
    with pytest.raises(ValueError, match="do not fit a policy"):
        NumpyActor.from_ac_state(ac_state, (16, 16, 16), ObsSpec((5,)), action_spec(space))


@pytest.mark.parametrize("space", SPACES, ids=SPACE_IDS)
def test_numpy_actor_log_prob_equals_the_learners(space):
    # --policy_lag 1 weights each row by pi_current / pi_behavior, the behavior's log-probabilities from the numpy
    # actor that acted: on the same weights the two must agree, so that the weight is 1 up to round-off.
    import tensorflow as tf

    ac = actor_critic(space)
    actor = ac.numpy_actor()
    raw = np.random.default_rng(6).normal(2.0, 3.0, size=(50, 5)).astype(np.float32)
    act = actor.act(raw, np.random.default_rng(7))
    from_tf = ac.log_prob(tf.constant(ac.obs_rms.normalize(raw)), tf.constant(act)).numpy()
    from_numpy = actor.log_prob(raw, act)
    assert from_numpy.shape == (50,) and from_numpy.dtype == np.float64
    np.testing.assert_allclose(from_numpy, from_tf, rtol=1e-5, atol=1e-5)
    # A rollout's form: the policy's outputs kept while acting give the same log-probabilities, without a pass.
    outputs = np.empty((50, actor.n_outputs), np.float32)
    sampled = actor.act_with_noise(raw, actor.exploration_noise(np.random.default_rng(7), 50), outputs=outputs)
    np.testing.assert_array_equal(actor.log_prob_of(outputs, sampled), actor.log_prob(raw, sampled))


def test_log_prob_entropy_kl_box():
    import tensorflow as tf

    ac = actor_critic(BOX)
    obs = tf.constant(np.random.default_rng(4).normal(size=(10, 5)).astype(np.float32))
    act = np.random.default_rng(5).normal(size=(10, 3)).astype(np.float32)
    mean = ac.pi_net(obs).numpy()
    std = np.exp(ac.log_std.numpy())
    expected = (-0.5 * ((act - mean) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)).sum(axis=1)
    np.testing.assert_allclose(ac.log_prob(obs, tf.constant(act)).numpy(), expected, rtol=1e-5)
    entropy = (np.log(std) + 0.5 * math.log(2 * math.pi * math.e)).sum()
    np.testing.assert_allclose(ac.entropy(obs).numpy(), np.full(10, entropy), rtol=1e-6)
    old = ac.dist_params(obs)
    assert old.shape == (10, 6)
    assert abs(float(ac.kl(old, obs))) < 1e-7
    # Shift every mean by 0.1 and double the std: KL per dimension = log 2 + (1 + 0.01 / std_old^2) / 8 - 0.5.
    ac.pi_net.weights[-1].assign(ac.pi_net.weights[-1] + 0.1)
    ac.log_std.assign(ac.log_std + math.log(2.0))
    expected_kl = (math.log(2.0) + (1.0 + 0.01 / std**2) / 8.0 - 0.5).sum()
    np.testing.assert_allclose(float(ac.kl(old, obs)), expected_kl, rtol=1e-5)


def test_log_prob_entropy_kl_discrete():
    import tensorflow as tf

    ac = actor_critic(DISCRETE)
    obs = tf.constant(np.random.default_rng(6).normal(size=(10, 5)).astype(np.float32))
    act = np.arange(10, dtype=np.int64) % 4
    logits = ac.pi_net(obs).numpy().astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    expected = logp[np.arange(10), act]
    np.testing.assert_allclose(ac.log_prob(obs, tf.constant(act)).numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(ac.entropy(obs).numpy(), -(np.exp(logp) * logp).sum(axis=1), rtol=1e-5)
    old = ac.dist_params(obs)
    ac.pi_net.weights[-1].assign([0.3, 0.0, -0.2, 0.0])
    new_logits = ac.pi_net(obs).numpy().astype(np.float64)
    new_logp = new_logits - np.log(np.exp(new_logits).sum(axis=1, keepdims=True))
    expected_kl = (np.exp(logp) * (logp - new_logp)).sum(axis=1).mean()
    np.testing.assert_allclose(float(ac.kl(old, obs)), expected_kl, rtol=1e-4)


@pytest.mark.parametrize("space", [BOX, DISCRETE, MULTI], ids=["box", "discrete", "multidiscrete"])
def test_one_pass_helpers_equal_the_per_quantity_ones_bit_for_bit(space: gymnasium.spaces.Space):
    # The updates' one-pass forms (the pre-update policy, TRPO's statistics) must not change a run's numbers.
    import tensorflow as tf

    ac = actor_critic(space)
    obs = tf.constant(np.random.default_rng(7).normal(size=(10, 5)).astype(np.float32))
    space.seed(7)
    act = tf.constant(np.stack([space.sample() for _ in range(10)]).astype(
        np.int64 if ac.is_discrete else np.float32))
    params, logp = ac.params_and_log_prob(obs, act)
    np.testing.assert_array_equal(params.numpy(), ac.dist_params(obs).numpy())
    np.testing.assert_array_equal(logp.numpy(), ac.log_prob(obs, act).numpy())
    ac.pi_net.weights[-1].assign(ac.pi_net.weights[-1] + 0.1)
    out = ac.pi_net(obs)
    np.testing.assert_array_equal(ac.kl_of(params, ac.params_of(out)).numpy(), ac.kl(params, obs).numpy())
    np.testing.assert_array_equal(ac.entropy_of(out).numpy(), ac.entropy(obs).numpy())


@pytest.mark.parametrize("space", SPACES, ids=SPACE_IDS)
@pytest.mark.parametrize("hidden", [(16, 16), (7,), (8, 5, 3)])
def test_worker_state_has_the_learner_state_shapes_and_dtypes(space, hidden):
    # Workers receive rank 0's learner state into these arrays without building the TensorFlow model.
    from algos import ActorCritic

    learner = [np.asarray(v) for v in ActorCritic(5, space, hidden=hidden).broadcast_state()]
    worker = actor_critic_state_like(ObsSpec((5,)), action_spec(space), hidden)
    assert [(a.shape, a.dtype) for a in worker] == [(a.shape, a.dtype) for a in learner]


# Atari's stacked 84x84 frames take the Nature CNN; MinAtar's 10x10 boards the one-layer torso.
IMAGES = [ObsSpec((84, 84, 4), scale=1 / 255), ObsSpec((10, 10, 6), scale=1.0)]


@pytest.mark.parametrize("obs", IMAGES, ids=["nature", "minatar"])
def test_numpy_cnn_agrees_with_tensorflow_on_uint8_images(obs):
    import keras

    from algos.networks import build_cnn, numpy_cnn_forward

    keras.utils.set_random_seed(0)
    model = build_cnn(obs, 6, output_gain=1.0)
    high = int(round(1 / obs.scale))
    images = np.random.default_rng(0).integers(0, high + 1, size=(5, *obs.shape), dtype=np.uint8)
    expected = model(images).numpy()
    got = numpy_cnn_forward([w.numpy() for w in model.weights], images, obs)
    assert got.dtype == np.float32 and got.shape == (5, 6)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(expected).max() > 1e-2  # not all zeros by dead units


# (H, W, C, k, stride, F): the Nature CNN's strided layers, and sides that leave rows and columns past the last window.
STRIDED = [(84, 84, 4, 8, 4, 32), (20, 20, 32, 4, 2, 64), (85, 83, 3, 6, 3, 5), (21, 22, 4, 8, 4, 7),
           (9, 11, 2, 2, 2, 3)]


@pytest.mark.parametrize(("height", "width", "channels", "k", "stride", "filters"), STRIDED)
def test_a_strided_convolution_by_blocks_is_tensorflows(height, width, channels, k, stride, filters):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, height, width, channels)).astype(np.float32)
    kernel = rng.standard_normal((k, k, channels, filters)).astype(np.float32)
    got = conv2d(x, kernel, stride)
    expected = tf.nn.conv2d(x, kernel, stride, "VALID").numpy()
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


# One torso (PPO's) on every action space; two CNNs (TRPO's, whose layers are the same) on two of them.
@pytest.mark.parametrize(("space", "shared_torso"), [
    *((space, True) for space in SPACES), (BOX, False), (DISCRETE, False)],
    ids=[*(f"{name}-shared" for name in SPACE_IDS), "box-separate", "discrete-separate"])
@pytest.mark.parametrize("obs", IMAGES, ids=["nature", "minatar"])
def test_image_policies_worker_state_and_actor_agree_with_the_learner(obs, space, shared_torso):
    import keras
    import tensorflow as tf

    from algos import ActorCritic

    keras.utils.set_random_seed(1)
    ac = ActorCritic(obs, space, hidden=(64, 64), shared_torso=shared_torso)
    learner = [np.asarray(v) for v in ac.broadcast_state()]
    worker = actor_critic_state_like(obs, action_spec(space), (64, 64), shared_torso)
    assert [(a.shape, a.dtype) for a in worker] == [(a.shape, a.dtype) for a in learner]
    # One torso: each variable once, the update's single Adam over them all.
    assert len({id(v) for v in ac.variables()}) == len(ac.variables())
    images = np.random.default_rng(1).integers(0, 2, size=(7, *obs.shape), dtype=np.uint8)
    actor = NumpyActor.from_ac_state(learner, (64, 64), obs, action_spec(space), shared_torso)
    act = actor.act(images, np.random.default_rng(0))
    np.testing.assert_allclose(actor.log_prob(images, act), ac.log_prob(tf.constant(images), tf.constant(act)).numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(actor.value(images), ac.value(tf.constant(images)).numpy(), rtol=1e-4, atol=1e-4)
    policy_out, value = ac.forward(tf.constant(images))  # the update's one pass gives what the two nets give
    np.testing.assert_allclose(value.numpy(), ac.value(tf.constant(images)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(ac.log_prob_of(policy_out, tf.constant(act)).numpy(),
                               ac.log_prob(tf.constant(images), tf.constant(act)).numpy(), rtol=1e-6)
    if shared_torso:  # a rollout's step: actions and values from one pass of the torso, as the two calls give them
        noise = actor.exploration_noise(np.random.default_rng(2), 7)
        outputs = np.empty((7, actor.n_outputs), np.float32)
        actions, values = actor.act_and_value_with_noise(images, noise, outputs=outputs)
        np.testing.assert_array_equal(actions, actor.act_with_noise(images, noise))
        np.testing.assert_array_equal(values, actor.value(images))
        np.testing.assert_array_equal(actor.log_prob_of(outputs, actions), actor.log_prob(images, actions))
    other_layout = "separate" if shared_torso else "one shared"
    with pytest.raises(ValueError, match=f"do not fit a policy .* and {other_layout}"):
        NumpyActor.from_ac_state(learner, (64, 64), obs, action_spec(space), not shared_torso)


@pytest.mark.parametrize("shared_torso", [True, False], ids=["shared", "separate"])
def test_a_bfloat16_cnn_starts_from_the_same_float32_weights_computes_in_bfloat16_and_its_update_trains_them(
        shared_torso):
    import keras
    import tensorflow as tf

    from algos import PPO, ActorCritic, PPOConfig

    obs = IMAGES[0]
    nets = {}
    for precision in ("float32", "bfloat16"):
        keras.utils.set_random_seed(3)
        nets[precision] = ActorCritic(obs, DISCRETE, hidden=(64, 64), shared_torso=shared_torso, precision=precision)
    full, half = nets["float32"], nets["bfloat16"]
    for mine, theirs in zip(half.variables(), full.variables(), strict=True):
        assert mine.dtype == tf.float32
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    images = tf.constant(np.random.default_rng(3).integers(0, 256, size=(16, *obs.shape), dtype=np.uint8))
    (logits_half, value_half), (logits_full, value_full) = half.forward(images), full.forward(images)
    assert logits_half.dtype == value_half.dtype == tf.float32
    for got, expected in ((logits_half, logits_full), (value_half, value_full)):
        error = np.abs(got.numpy() - expected.numpy()).max()
        # bfloat16 keeps 8 bits of mantissa: off by more than float32's rounding, by less than 3% of the outputs.
        assert 1e-5 * np.abs(expected.numpy()).max() < error < 0.03 * np.abs(expected.numpy()).max(), error
    rng = np.random.default_rng(4)
    batch = (images.numpy(), rng.integers(0, 4, 16), rng.normal(size=16), rng.normal(size=16))
    before = [v.numpy() for v in half.variables()]
    stats = PPO(half, PPOConfig(epochs=2, minibatch_size=8), seed=0).update(*batch)
    assert all(math.isfinite(value) for value in stats.values()), stats
    after = half.variables()
    assert all(v.dtype == tf.float32 for v in after)
    assert all(not np.array_equal(b, a.numpy()) for b, a in zip(before, after, strict=True))
    # The same seed, threads and CPU: the same weights, to the last bit.
    keras.utils.set_random_seed(3)
    again = ActorCritic(obs, DISCRETE, hidden=(64, 64), shared_torso=shared_torso, precision="bfloat16")
    PPO(again, PPOConfig(epochs=2, minibatch_size=8), seed=0).update(*batch)
    for mine, theirs in zip(again.variables(), after, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    with pytest.raises(ValueError, match="^precision bfloat16 is for CNN torsos: observations must be images$"):
        ActorCritic(5, DISCRETE, hidden=(16, 16), precision="bfloat16")


def test_log_prob_entropy_kl_of_several_categoricals_are_sums_over_them():
    # MultiDiscrete([3, 2, 4]): three independent categoricals over the logits' three slices.
    import tensorflow as tf

    ac = actor_critic(MULTI)
    obs = tf.constant(np.random.default_rng(4).normal(size=(10, 5)).astype(np.float32))
    act = np.stack([np.random.default_rng(i).integers(0, n, 10) for i, n in enumerate((3, 2, 4))], axis=1)

    def log_softmaxes(logits: np.ndarray) -> list[np.ndarray]:
        return [s - np.log(np.exp(s).sum(axis=1, keepdims=True)) for s in np.split(logits, [3, 5], axis=1)]

    logps = log_softmaxes(ac.pi_net(obs).numpy().astype(np.float64))
    expected_logp = sum(logp[np.arange(10), act[:, i]] for i, logp in enumerate(logps))
    np.testing.assert_allclose(ac.log_prob(obs, tf.constant(act)).numpy(), expected_logp, rtol=1e-5)
    expected_entropy = sum(-(np.exp(logp) * logp).sum(axis=1) for logp in logps)
    np.testing.assert_allclose(ac.entropy(obs).numpy(), expected_entropy, rtol=1e-5)
    old = ac.dist_params(obs)
    ac.pi_net.weights[-1].assign(np.linspace(-0.3, 0.3, 9, dtype=np.float32))
    new_logps = log_softmaxes(ac.pi_net(obs).numpy().astype(np.float64))
    expected_kl = sum((np.exp(a) * (a - b)).sum(axis=1) for a, b in zip(logps, new_logps, strict=True)).mean()
    np.testing.assert_allclose(float(ac.kl(old, obs)), expected_kl, rtol=1e-4)
