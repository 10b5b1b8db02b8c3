"""examples/keras_pg.py on N MPI processes: the lines marked "# mpi_util" are all that changed.

Every rank collects its share of the batch with its own seed, acting with its Keras model; rank 0 gathers the rows
and takes the gradient step; the model's weights are broadcast back to every rank, bit for bit. At the end rank 0
prints which ranks hold weights that differ from its own (none).

    python examples/keras_pg_mpi.py --nprocs 2
"""

from __future__ import annotations

import argparse
import sys

import gymnasium as gym
import numpy as np

import mpi_util  # mpi_util


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
parser.add_argument("--nprocs", type=int, default=2, help="MPI processes (default: %(default)s)")  # mpi_util
args = parser.parse_args()
fork = mpi_util.mpi_fork(args.nprocs)  # mpi_util: relaunch this script as nprocs ranks
if fork == "parent":  # mpi_util
    sys.exit(fork.returncode)  # mpi_util: the job has ended
mpi_util.setup_gpu()  # mpi_util: this rank's GPU and memory cap; imports TensorFlow without its start-up lines
import keras  # noqa: E402 # mpi_util: TensorFlow after the fork, so the launching process never imports it
import tensorflow as tf  # noqa: E402 # mpi_util

mpi_util.set_global_seeds(args.seed)  # mpi_util: seeds keras, TensorFlow, numpy; each rank its own stream
rng = np.random.default_rng(mpi_util.rank_seed(args.seed, mpi_util.rank))  # mpi_util
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=mpi_util.rank_seed(args.seed, mpi_util.rank))  # mpi_util: each rank its own episodes
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(64, activation="tanh"), keras.layers.Dense(2)])
optimizer = keras.optimizers.Adam(1e-2)
logits_of = tf.function(model)
mpi_util.rank0_bcast_wts(model)  # mpi_util: every rank starts from rank 0's initial weights
my_steps = args.batch_size // mpi_util.nworkers  # mpi_util: this rank's share of the batch

for iteration in range(args.iterations):
    batch, returns, obs = collect(env, obs, logits_of, my_steps, gamma=0.99, rng=rng)  # mpi_util
    batch = mpi_util.rank0_accum_batches(batch)  # mpi_util: rank 0 gets every rank's rows
    returns = mpi_util.rank0_accum_batches({"ep_return": returns})["ep_return"]  # mpi_util
    if mpi_util.rank == 0:  # mpi_util: rank 0 alone learns
        loss = update(model, optimizer, batch)
        print(f"iteration {iteration}: {len(batch['obs'])} steps, mean return {returns.mean():.1f}, loss {loss:.3f}",
              flush=True)
    mpi_util.rank0_bcast_wts(model)  # mpi_util: every rank gets rank 0's new weights
mpi_util.print0(f"ranks whose weights differ from rank 0's: {mpi_util.ranks_out_of_sync(model)}")  # mpi_util
