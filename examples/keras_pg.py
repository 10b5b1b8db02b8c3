"""A batch policy gradient in Keras (TensorFlow 2) on CartPole-v1, one process: the kind of script you did not write.

Each iteration collects a batch of steps with the current policy, then takes one gradient step on the whole batch
(REINFORCE with discounted rewards-to-go, normalized). examples/keras_pg_mpi.py is this script on N MPI
processes; the difference between the two files is mpi_util's recipe (see the README).

    python examples/keras_pg.py
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf


def collect(env: gym.Env, obs: np.ndarray, logits_of: tf.types.experimental.GenericFunction, steps: int,
            gamma: float, rng: np.random.Generator) -> tuple:
    """``steps`` environment steps with the current policy, from ``obs``. Returns (batch, episode returns, the next
    observation): batch {"obs": (steps, 4) float32, "act": (steps,) int64, "ret": (steps,) float32 discounted
    reward-to-go within each episode (an episode cut off by the batch's end is cut there too)}, returns (episodes,)."""
    observations, actions, rewards, ends, episode_returns, episode_return = [], [], [], [], [], 0.0
    for _ in range(steps):
        logits = logits_of(obs[None].astype(np.float32)).numpy()[0]
        action = int(np.argmax(logits + rng.gumbel(size=2)))  # a sample of softmax(logits)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(reward)
        ends.append(terminated or truncated)
        episode_return += reward
        obs = next_obs
        if terminated or truncated:
            episode_returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
    reward_to_go, running = np.zeros(steps, dtype=np.float32), 0.0
    for t in reversed(range(steps)):
        running = rewards[t] + gamma * running * (not ends[t])
        reward_to_go[t] = running
    batch = {"obs": np.array(observations, dtype=np.float32), "act": np.array(actions, dtype=np.int64),
             "ret": reward_to_go}
    return batch, np.array(episode_returns, dtype=np.float64), obs


def update(model: keras.Model, optimizer: keras.optimizers.Optimizer, batch: dict) -> float:
    """One gradient step of REINFORCE on the whole batch; returns the loss."""
    advantage = (batch["ret"] - batch["ret"].mean()) / (batch["ret"].std() + 1e-8)
    with tf.GradientTape() as tape:
        log_probs = tf.nn.log_softmax(model(batch["obs"]))
        log_prob = tf.gather(log_probs, batch["act"], batch_dims=1)
        loss = -tf.reduce_mean(log_prob * advantage)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                  strict=True))
    return float(loss)


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--iterations", type=int, default=40, help="batches collected and learned (default: %(default)s)")
parser.add_argument("--batch_size", type=int, default=4000, help="steps per batch (default: %(default)s)")
parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
args = parser.parse_args()

keras.utils.set_random_seed(args.seed)
rng = np.random.default_rng(args.seed)
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=args.seed)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(64, activation="tanh"), keras.layers.Dense(2)])
optimizer = keras.optimizers.Adam(1e-2)
logits_of = tf.function(model)

for iteration in range(args.iterations):
    batch, returns, obs = collect(env, obs, logits_of, args.batch_size, gamma=0.99, rng=rng)
    loss = update(model, optimizer, batch)
    print(f"iteration {iteration}: {len(batch['obs'])} steps, mean return {returns.mean():.1f}, loss {loss:.3f}",
          flush=True)
