"""RolloutWorker: reproducible, gymnasium's terminated/truncated semantics, returns that add up."""

import copy

import gymnasium
import numpy as np
import pytest
from conftest import TENSORFLOW_IN_PROCESS

from algos import NumpyActor, RolloutWorker, gae_advantages

pytestmark = TENSORFLOW_IN_PROCESS
GAMMA, LAM = 0.9, 0.8


class Recorder(gymnasium.Wrapper):
    """Records what each env.step received and returned, to check the worker against."""

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.actions, self.rewards, self.next_obs, self.terminated, self.truncated = [], [], [], [], []

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.actions.append(np.copy(action))
        self.rewards.append(float(reward))
        self.next_obs.append(np.asarray(obs, np.float32))
        self.terminated.append(terminated)
        self.truncated.append(truncated)
        return obs, reward, terminated, truncated, info


def make_actor(env: gymnasium.Env, init_log_std: float = 0.0) -> NumpyActor:
    """A freshly initialized actor whose values are far from 0 (ret_rms holds made-up statistics)."""
    import keras

    from algos import ActorCritic

    keras.utils.set_random_seed(0)
    ac = ActorCritic(env.observation_space.shape[0], env.action_space, hidden=(64, 64), init_log_std=init_log_std)
    ac.ret_rms.update(np.random.default_rng(0).normal(-5.0, 3.0, size=(50, 1)))
    return ac.numpy_actor()


def expected_adv_ret(rec: Recorder, first: int, obs: np.ndarray, actor: NumpyActor):
    """GAE recomputed step by step from what the env returned, for the steps first.. of one collect."""
    n = len(obs)
    rewards = np.array(rec.rewards[first : first + n])
    values = actor.value(obs).astype(np.float64)
    next_values = np.empty(n)
    ends = np.zeros(n, dtype=bool)
    for t in range(n):
        i = first + t
        ends[t] = rec.terminated[i] or rec.truncated[i] or t == n - 1
        if rec.terminated[i]:
            next_values[t] = 0.0
        elif ends[t]:
            next_values[t] = actor.value(rec.next_obs[i][None])[0]
        else:
            next_values[t] = values[t + 1]
    return gae_advantages(rewards, values, next_values, ends, GAMMA, LAM)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_same_seed_and_rng_give_identical_batches(env_id):
    env = gymnasium.make(env_id)
    actor = make_actor(env)
    results = []
    for _ in range(2):
        worker = RolloutWorker(gymnasium.make(env_id), seed=3, gamma=GAMMA, lam=LAM)
        rng = np.random.default_rng(7)
        results.append([worker.collect(150, actor, rng) for _ in range(2)])
    for (batch_a, eps_a), (batch_b, eps_b) in zip(results[0], results[1], strict=True):
        for key in batch_a:
            np.testing.assert_array_equal(batch_a[key], batch_b[key])
        for key in eps_a:
            np.testing.assert_array_equal(eps_a[key], eps_b[key])


def test_cartpole_discrete_terminations():
    rec = Recorder(gymnasium.make("CartPole-v1"))
    actor = make_actor(rec)
    worker = RolloutWorker(rec, seed=0, gamma=GAMMA, lam=LAM)
    first = 0
    for _ in range(3):
        batch, episodes = worker.collect(100, actor, np.random.default_rng(first))
        assert batch["obs"].shape == (100, 4) and batch["obs"].dtype == np.float32
        assert batch["act"].shape == (100,) and batch["act"].dtype == np.int64
        assert batch["adv"].dtype == batch["ret"].dtype == np.float32
        np.testing.assert_array_equal(batch["act"], rec.actions[first : first + 100])
        # The actions' log-probabilities under the actor that sampled them: PPO's update uses them as its own.
        assert batch["logp"].shape == (100,) and batch["logp"].dtype == np.float64
        np.testing.assert_allclose(batch["logp"], actor.log_prob(batch["obs"], batch["act"]), rtol=1e-6, atol=1e-6)
        adv, ret = expected_adv_ret(rec, first, batch["obs"], actor)
        np.testing.assert_allclose(batch["adv"], adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(batch["ret"], ret, rtol=1e-5, atol=1e-5)
        # A terminated step's return is its reward alone.
        terminated = np.array(rec.terminated[first : first + 100])
        assert terminated.any()
        np.testing.assert_allclose(batch["ret"][terminated], 1.0, rtol=1e-6)
        assert episodes["ep_length"].dtype == np.int64 and episodes["ep_return"].dtype == np.float64
        first += 100
    # CartPole pays 1 per step: each finished episode's return is its length.
    np.testing.assert_array_equal(episodes["ep_return"], episodes["ep_length"])


def test_pendulum_truncation_bootstraps_and_episodes_span_calls():
    rec = Recorder(gymnasium.make("Pendulum-v1"))  # a 200-step TimeLimit, never terminates
    actor = make_actor(rec, init_log_std=1.0)
    worker = RolloutWorker(rec, seed=1, gamma=GAMMA, lam=LAM)
    rng = np.random.default_rng(0)
    collected = [worker.collect(150, actor, rng) for _ in range(3)]
    obs = np.concatenate([batch["obs"] for batch, _ in collected])
    ret = np.concatenate([batch["ret"] for batch, _ in collected])
    act = np.concatenate([batch["act"] for batch, _ in collected])

    # Episodes finished in calls 2 and 3, each with steps from the call before.
    assert [list(eps["ep_length"]) for _, eps in collected] == [[], [200], [200]]
    for k, (_, eps) in enumerate(collected[1:]):
        np.testing.assert_allclose(eps["ep_return"], [sum(rec.rewards[200 * k : 200 * (k + 1)])], rtol=1e-12)

    # Step 199 (step 49 of the second call) was truncated: its return bootstraps from the value of the final
    # observation, which is not the next row of the batch (that is the reset observation).
    assert rec.truncated[199] and not rec.terminated[199]
    final_obs = rec.next_obs[199]
    assert not np.array_equal(final_obs, obs[200])
    expected = rec.rewards[199] + GAMMA * actor.value(final_obs[None])[0]
    np.testing.assert_allclose(ret[199], expected, rtol=1e-5)

    # The whole of each call matches GAE recomputed from the recorded steps (batch cuts at 149, 299, 449).
    for k, (batch, _) in enumerate(collected):
        adv, expected_ret = expected_adv_ret(rec, 150 * k, batch["obs"], actor)
        np.testing.assert_allclose(batch["adv"], adv, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(batch["ret"], expected_ret, rtol=1e-5, atol=1e-4)

    # Box actions are recorded unclipped and clipped only for env.step.
    assert act.shape == (450, 1) and act.dtype == np.float32
    assert np.abs(act).max() > 2.0
    np.testing.assert_array_equal(np.array(rec.actions), np.clip(act, -2.0, 2.0))


class NanReward(gymnasium.Wrapper):
    def __init__(self, env: gymnasium.Env, bad_step: int) -> None:
        super().__init__(env)
        self.bad_step, self.steps = bad_step, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return obs, np.nan if self.steps == self.bad_step + 1 else reward, terminated, truncated, info


def test_non_finite_reward_raises_naming_the_step():
    env = NanReward(gymnasium.make("Pendulum-v1"), bad_step=3)
    worker = RolloutWorker(env, seed=0, gamma=GAMMA, lam=LAM)
    with pytest.raises(ValueError, match="step 3 "):
        worker.collect(10, make_actor(env), np.random.default_rng(0))


def test_zero_steps_gives_empty_arrays_and_keeps_the_episode():
    env = gymnasium.make("Pendulum-v1")
    actor = make_actor(env)
    worker = RolloutWorker(env, seed=0, gamma=GAMMA, lam=LAM)
    worker.collect(5, actor, np.random.default_rng(0))
    batch, episodes = worker.collect(0, actor, np.random.default_rng(0))
    assert batch["obs"].shape == (0, 3) and batch["act"].shape == (0, 1)
    assert batch["adv"].shape == batch["ret"].shape == batch["logp"].shape == (0,)
    assert episodes["ep_length"].shape == (0,)
    worker.collect(194, actor, np.random.default_rng(0))
    _, episodes = worker.collect(1, actor, np.random.default_rng(0))
    assert list(episodes["ep_length"]) == [200]


@pytest.mark.parametrize("space", [gymnasium.spaces.Discrete(2), gymnasium.spaces.MultiDiscrete([2, 3])],
                         ids=["discrete", "multidiscrete"])
def test_zero_steps_of_categorical_actions_give_empty_arrays(space):
    # A rank whose share of a shared budget is 0 steps collects nothing, whatever the actions.
    env = gymnasium.make("CartPole-v1")
    env.action_space = space
    worker = RolloutWorker(env, seed=0, gamma=GAMMA, lam=LAM)
    batch, _ = worker.collect(0, make_actor(env), np.random.default_rng(0))
    assert batch["act"].shape == (0, *space.shape)
    assert batch["logp"].shape == (0,) and batch["logp"].dtype == np.float64


@pytest.mark.parametrize("n_envs", [1, 2])
def test_restored_episode_continues_exactly(n_envs):
    envs = [gymnasium.make("CartPole-v1") for _ in range(n_envs)]
    actor = make_actor(envs[0])
    worker = RolloutWorker(envs, seed=0, gamma=GAMMA, lam=LAM)
    rng = np.random.default_rng(0)
    worker.collect(30, actor, rng)
    saved_envs, saved_episode = copy.deepcopy(worker.envs), copy.deepcopy(worker.episode_state())
    saved_rng = copy.deepcopy(rng.bit_generator.state)
    expected = worker.collect(100, actor, rng)

    resumed = RolloutWorker([gymnasium.make("CartPole-v1") for _ in range(n_envs)], seed=99, gamma=GAMMA, lam=LAM)
    resumed.envs = saved_envs
    resumed.restore_episode(saved_episode)
    rng.bit_generator.state = saved_rng
    got = resumed.collect(100, actor, rng)
    for want, have in zip(expected, got, strict=True):
        for key in want:
            np.testing.assert_array_equal(want[key], have[key])


def test_several_envs_step_in_lockstep_and_each_gets_its_own_gae():
    recs = [Recorder(gymnasium.make("Pendulum-v1")) for _ in range(3)]
    actor = make_actor(recs[0], init_log_std=1.0)
    worker = RolloutWorker(recs, seed=1, gamma=GAMMA, lam=LAM)
    # Env 0 starts as a one-env worker with the same seed would; the others start elsewhere.
    alone = RolloutWorker(gymnasium.make("Pendulum-v1"), seed=1, gamma=GAMMA, lam=LAM)
    start = worker.episode_state()["obs"]
    np.testing.assert_array_equal(start[0], alone.episode_state()["obs"][0])
    assert len({tuple(row) for row in start}) == 3

    rng = np.random.default_rng(0)
    collected = [worker.collect(301, actor, rng) for _ in range(2)]  # 101, 100 and 100 steps per env per call
    first = [0, 0, 0]
    for batch, _ in collected:
        assert batch["obs"].shape == (301, 3) and batch["act"].shape == (301, 1)
        np.testing.assert_allclose(batch["logp"], actor.log_prob(batch["obs"], batch["act"]), rtol=1e-6, atol=1e-6)
        row = 0
        for k, n in enumerate([101, 100, 100]):  # env 0's rows first, then env 1's, then env 2's
            rows = slice(row, row + n)
            np.testing.assert_array_equal(np.clip(batch["act"][rows], -2.0, 2.0), recs[k].actions[first[k]:][:n])
            adv, ret = expected_adv_ret(recs[k], first[k], batch["obs"][rows], actor)
            np.testing.assert_allclose(batch["adv"][rows], adv, rtol=1e-5, atol=1e-4)
            np.testing.assert_allclose(batch["ret"][rows], ret, rtol=1e-5, atol=1e-4)
            first[k] += n
            row += n
    # Each env finished its first 200-step episode during the second call.
    episodes = collected[1][1]
    assert sorted(episodes["ep_length"]) == [200, 200, 200]
    assert sorted(episodes["ep_return"]) == pytest.approx(sorted(sum(rec.rewards[:200]) for rec in recs))


@pytest.mark.parametrize(("n_envs", "budget"), [(1, 100), (3, 37), (3, 48), (2, 0)])
def test_collect_from_a_shared_budget_equals_collecting_that_many_steps(n_envs, budget):
    """take() hands out steps in pieces (here from a plain counter standing in for mpi_util.SharedBudget): the
    batch is the one an even collect of the same number of steps gives, bit for bit."""
    def make_worker():
        return RolloutWorker([gymnasium.make("Pendulum-v1") for _ in range(n_envs)], seed=3, gamma=GAMMA, lam=LAM)

    actor = make_actor(gymnasium.make("Pendulum-v1"))
    left = [budget]
    asked = []

    def take(n: int) -> int:
        asked.append(n)
        got = min(n, left[0])
        left[0] -= got
        return got

    from_budget = make_worker().collect(500, actor, np.random.default_rng(0), take)
    even = make_worker().collect(budget, actor, np.random.default_rng(0))
    assert left[0] == 0 and len(asked) == budget // (16 * n_envs) + 1  # pieces of 16 lockstep steps
    for got, want in zip(from_budget, even, strict=True):
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
