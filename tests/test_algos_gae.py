"""GAE advantages and returns against values worked out by hand.

The hand examples use gamma = lam = 0.5 (so gamma * lam = 0.25) and
delta_t = r_t + gamma * next_values[t] - values[t],  A_t = delta_t + 0.25 * A_{t+1} (0 after an episode end).
"""

import numpy as np
import pytest

from algos import gae_advantages

REWARDS = [1.0, 2.0, 3.0]
VALUES = [0.5, 1.0, 1.5]


def check(next_values, episode_ends, expected_adv, rewards=REWARDS, values=VALUES):
    adv, ret = gae_advantages(
        np.array(rewards), np.array(values), np.array(next_values), np.array(episode_ends), 0.5, 0.5
    )
    assert adv.dtype == np.float32 and ret.dtype == np.float32
    np.testing.assert_allclose(adv, expected_adv, rtol=1e-6)
    np.testing.assert_allclose(ret, np.array(expected_adv) + np.array(values), rtol=1e-6)


def test_no_episode_end():
    # delta = [1 + 0.5*1.0 - 0.5, 2 + 0.5*1.5 - 1.0, 3 + 0.5*2.0 - 1.5] = [1.0, 1.75, 2.5]
    # A2 = 2.5; A1 = 1.75 + 0.25*2.5 = 2.375; A0 = 1.0 + 0.25*2.375 = 1.59375
    check([1.0, 1.5, 2.0], [False, False, False], [1.59375, 2.375, 2.5])


def test_terminated():
    # Terminated at step 2: next value 0. delta2 = 3 + 0 - 1.5 = 1.5
    # A2 = 1.5; A1 = 1.75 + 0.25*1.5 = 2.125; A0 = 1.0 + 0.25*2.125 = 1.53125
    check([1.0, 1.5, 0.0], [False, False, True], [1.53125, 2.125, 1.5])


def test_truncated_bootstraps_from_final_observation():
    # Truncated at step 2, V(final observation) = 4: delta2 = 3 + 0.5*4 - 1.5 = 3.5
    # A2 = 3.5; A1 = 1.75 + 0.25*3.5 = 2.625; A0 = 1.0 + 0.25*2.625 = 1.65625; returns = A + V
    check([1.0, 1.5, 4.0], [False, False, True], [1.65625, 2.625, 3.5])
    # Returns at the truncated step: 3.5 + 1.5 = 5.0 = r2 + gamma * V(final observation).


def test_batch_cut_mid_episode():
    # The batch ends while the episode goes on: bootstrap V(s3) = 2.0 and mark the end; same numbers as
    # test_no_episode_end, since the recursion starts from 0 at the batch's end either way.
    check([1.0, 1.5, 2.0], [False, False, True], [1.59375, 2.375, 2.5])


def test_two_episodes_in_one_batch():
    # Episode A: steps 0-1, terminated at 1. Episode B: steps 2-4, cut by the batch at 4 with V(s5) = 2.
    # delta = [1 + 0.5*2 - 1, 1 + 0 - 2, 2 + 0.5*1 - 1, 2 + 0.5*1 - 1, 2 + 0.5*2 - 1] = [1, -1, 1.5, 1.5, 2]
    # A4 = 2; A3 = 1.5 + 0.25*2 = 2; A2 = 1.5 + 0.25*2 = 2; A1 = -1 (B's advantages do not leak into A);
    # A0 = 1 + 0.25*(-1) = 0.75
    check(
        next_values=[2.0, 0.0, 1.0, 1.0, 2.0],
        episode_ends=[False, True, False, False, True],
        expected_adv=[0.75, -1.0, 2.0, 2.0, 2.0],
        rewards=[1.0, 1.0, 2.0, 2.0, 2.0],
        values=[1.0, 2.0, 1.0, 1.0, 1.0],
    )


def test_lambda_one_gives_discounted_reward_to_go():
    rewards = np.array([1.0, -2.0, 0.5, 3.0])
    values = np.array([0.3, -0.7, 2.0, 1.1])
    next_values = np.append(values[1:], 0.0)
    _, ret = gae_advantages(rewards, values, next_values, np.array([False, False, False, True]), 0.9, 1.0)
    expected = [1 - 2 * 0.9 + 0.5 * 0.81 + 3 * 0.729, -2 + 0.5 * 0.9 + 3 * 0.81, 0.5 + 3 * 0.9, 3.0]
    np.testing.assert_allclose(ret, expected, rtol=1e-6)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="next_values"):
        gae_advantages(np.zeros(3), np.zeros(3), np.zeros(2), np.zeros(3, bool), 0.99, 0.95)
