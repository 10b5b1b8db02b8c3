"""examples/jax_pg.py on N MPI processes: the lines marked "# mpi_util" are all that changed.

Every rank collects its share of the batch with its own seed; rank 0 gathers the rows and takes the gradient step
with optax; the parameters (a nested dict of JAX arrays, which cannot be written in place) come back from
mpi_util.rank0_bcast_tree as rank 0's values, bit for bit, on every rank. At the end rank 0 prints which ranks hold
parameters that differ from its own (none).

    python examples/jax_pg_mpi.py --nprocs 2
"""

import argparse
import sys
from functools import partial

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

import mpi_util  # mpi_util


def init_policy(key: jax.Array) -> dict:
    """A 4-64-2 tanh MLP: {"hidden": {"w": (4, 64), "b": (64,)}, "out": {"w": (64, 2), "b": (2,)}}, float32."""
    hidden_key, out_key = jax.random.split(key)
    return {"hidden": {"w": jax.random.normal(hidden_key, (4, 64)) / 2.0, "b": jnp.zeros(64)},
            "out": {"w": jax.random.normal(out_key, (64, 2)) / 8.0, "b": jnp.zeros(2)}}


def logits(params: dict, obs: jax.Array) -> jax.Array:
    """Action logits (..., 2) for observations (..., 4)."""
    hidden = jnp.tanh(obs @ params["hidden"]["w"] + params["hidden"]["b"])
    return hidden @ params["out"]["w"] + params["out"]["b"]


@jax.jit
def act(params: dict, obs: np.ndarray, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """An action sampled from the policy for one observation (4,), and the key to use next."""
    key, sample_key = jax.random.split(key)
    return jax.random.categorical(sample_key, logits(params, obs)), key


def collect(env: gym.Env, obs: np.ndarray, params: dict, key: jax.Array, steps: int, gamma: float) -> tuple:
    """``steps`` environment steps with the current policy, from ``obs``. Returns (batch, episode returns, the next
    observation, the next key): batch {"obs": (steps, 4) float32, "act": (steps,) int32, "ret": (steps,) float32
    discounted reward-to-go within each episode (an episode cut off by the batch's end is cut there too)}, returns
    (episodes,)."""
    observations, actions, rewards, ends, episode_returns, episode_return = [], [], [], [], [], 0.0
    for _ in range(steps):
        action, key = act(params, obs, key)
        action = int(action)
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
    batch = {"obs": np.array(observations, dtype=np.float32), "act": np.array(actions, dtype=np.int32),
             "ret": reward_to_go}
    return batch, np.array(episode_returns, dtype=np.float64), obs, key


def loss_fn(params: dict, batch: dict) -> jax.Array:
    """REINFORCE's loss on the whole batch: minus the mean of log pi(act | obs) times the normalized return."""
    advantage = (batch["ret"] - batch["ret"].mean()) / (batch["ret"].std() + 1e-8)
    log_prob = jax.nn.log_softmax(logits(params, batch["obs"]))
    return -(jnp.take_along_axis(log_prob, batch["act"][:, None], axis=1)[:, 0] * advantage).mean()


@partial(jax.jit, static_argnums=0)
def update(optimizer: optax.GradientTransformation, params: dict, opt_state: optax.OptState, batch: dict) -> tuple:
    """One gradient step on the whole batch; returns (params, opt_state, loss)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--iterations", type=int, default=40, help="batches collected and learned (default: %(default)s)")
parser.add_argument("--batch_size", type=int, default=4000, help="steps per batch (default: %(default)s)")
parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
parser.add_argument("--nprocs", type=int, default=2, help="MPI processes (default: %(default)s)")  # mpi_util
args = parser.parse_args()
fork = mpi_util.mpi_fork(args.nprocs)  # mpi_util: relaunch this script as nprocs ranks
if fork == "parent":  # mpi_util
    sys.exit(fork.returncode)  # mpi_util: the job has ended

key = jax.random.key(mpi_util.rank_seed(args.seed, mpi_util.rank))  # mpi_util: each rank its own stream
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=mpi_util.rank_seed(args.seed, mpi_util.rank))  # mpi_util: each rank its own episodes
key, init_key = jax.random.split(key)
params = init_policy(init_key)
params = mpi_util.rank0_bcast_tree(params)  # mpi_util: every rank starts from rank 0's initial parameters
optimizer = optax.adam(1e-2)
opt_state = optimizer.init(params)

for iteration in range(args.iterations):
    batch, returns, obs, key = collect(env, obs, params, key, args.batch_size // mpi_util.nworkers,  # mpi_util
                                       gamma=0.99)  # mpi_util
    batch = mpi_util.rank0_accum_batches(batch)  # mpi_util: rank 0 gets every rank's rows
    returns = mpi_util.rank0_accum_batches({"ep_return": returns})["ep_return"]  # mpi_util
    if mpi_util.rank == 0:  # mpi_util: rank 0 alone learns
        params, opt_state, loss = update(optimizer, params, opt_state, batch)
        print(f"iteration {iteration}: {len(batch['obs'])} steps, mean return {returns.mean():.1f}, loss {loss:.3f}",
              flush=True)
    params = mpi_util.rank0_bcast_tree(params)  # mpi_util: every rank gets rank 0's new parameters (numpy arrays)
mpi_util.print0(f"ranks whose weights differ from rank 0's: {mpi_util.ranks_out_of_sync(params)}")  # mpi_util
