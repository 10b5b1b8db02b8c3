"""TRPO: an update stays inside the trust region (resuming: test_algos_registry)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import gymnasium
import numpy as np
from conftest import TENSORFLOW_IN_PROCESS

from algos import RolloutWorker

if TYPE_CHECKING:  # TensorFlow's modules are imported by the tests that use them (conftest.TENSORFLOW_IN_PROCESS)
    from algos import TRPO, ActorCritic, TRPOConfig

pytestmark = TENSORFLOW_IN_PROCESS
STAT_KEYS = {"pi_loss", "v_loss", "entropy", "kl", "backtracks", "explained_var"}


def make_learner(env_id: str, seed: int, cfg: TRPOConfig | None = None) -> tuple[ActorCritic, TRPO]:
    import keras

    from algos import TRPO, ActorCritic, TRPOConfig

    keras.utils.set_random_seed(seed)
    env = gymnasium.make(env_id)
    ac = ActorCritic(env.observation_space.shape[0], env.action_space, hidden=(64, 64))
    return ac, TRPO(ac, cfg or TRPOConfig(), seed=seed)


def batches(env_id: str, ac: ActorCritic, n_batches: int, n_steps: int = 512) -> list[dict[str, np.ndarray]]:
    worker = RolloutWorker(gymnasium.make(env_id), seed=0, gamma=0.99, lam=0.95)
    rng = np.random.default_rng(0)
    return [worker.collect(n_steps, ac.numpy_actor(), rng)[0] for _ in range(n_batches)]


def update(trpo: TRPO, batch: dict[str, np.ndarray]) -> dict[str, float]:
    return trpo.update(batch["obs"], batch["act"], batch["adv"], batch["ret"])


def test_conjugate_gradient_solves_spd_system():
    from algos.trpo import _conjugate_gradient

    rng = np.random.default_rng(0)
    m = rng.normal(size=(6, 6))
    a = m @ m.T + 0.5 * np.eye(6)
    b = rng.normal(size=6)
    x = _conjugate_gradient(lambda v: a @ v, b, iters=20)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-6)


def check_update(env_id: str) -> None:
    from algos import TRPOConfig

    cfg = TRPOConfig(vf_epochs=2)
    ac, trpo = make_learner(env_id, 0, cfg)
    (batch,) = batches(env_id, ac, 1)
    pi_before = [v.numpy().copy() for v in ac.policy_variables()]
    stats = update(trpo, batch)
    assert set(stats) == STAT_KEYS
    assert all(isinstance(v, float) and np.isfinite(v) for v in stats.values()), stats
    # The step was accepted, inside the trust region and near its edge (the quadratic model is good there).
    assert stats["backtracks"] < cfg.backtrack_iters
    assert 0.0 < stats["kl"] <= cfg.max_kl
    assert stats["kl"] > 0.2 * cfg.max_kl
    pi_after = [v.numpy() for v in ac.policy_variables()]
    assert any(not np.array_equal(b, a) for b, a in zip(pi_before, pi_after, strict=True))
    np.testing.assert_allclose(ac.obs_rms.mean, batch["obs"].mean(axis=0), rtol=1e-3, atol=1e-6)


def test_one_update_cartpole():
    check_update("CartPole-v1")


def test_one_update_pendulum():
    check_update("Pendulum-v1")


def test_image_networks_take_the_fisher_matrix_from_every_fifth_row_and_stay_in_the_trust_region():
    import keras

    from algos import ActorCritic
    from algos.registry import ALGORITHMS
    from algos.spaces import ObsSpec
    from algos.trpo import IMAGE_FISHER_EVERY, from_config

    settings = {**ALGORITHMS["trpo"].defaults, "seed": 0}
    keras.utils.set_random_seed(0)
    mlp = ActorCritic(4, gymnasium.spaces.Discrete(2), hidden=(64, 64))
    cnn = ActorCritic(ObsSpec((10, 10, 4)), gymnasium.spaces.Discrete(3), hidden=(64, 64))
    assert from_config(mlp, settings).cfg.fisher_every == 1  # MLPs keep the whole batch, and their results
    trpo = from_config(cnn, settings)
    assert trpo.cfg.fisher_every == IMAGE_FISHER_EVERY == 5
    rng = np.random.default_rng(0)
    n = 256
    obs = rng.integers(0, 2, size=(n, 10, 10, 4), dtype=np.uint8)
    act = rng.integers(0, 3, size=n)
    # Advantages that favour action 0 wherever the first plane's corner is set: a direction the policy can take.
    adv = np.where((obs[:, 0, 0, 0] == 1) == (act == 0), 1.0, -1.0).astype(np.float32)
    stats = trpo.update(obs, act, adv, rng.normal(size=n).astype(np.float32))
    # The line search holds the step to the trust region on the whole batch, whatever rows the Fisher matrix read.
    assert stats["backtracks"] < trpo.cfg.backtrack_iters
    assert 0.0 < stats["kl"] <= trpo.cfg.max_kl
