"""A batch policy gradient in JAX with optax on CartPole-v1, one process: the kind of script you did not write.

Each iteration collects a batch of steps with the current policy, then takes one gradient step on the whole batch
(REINFORCE with discounted rewards-to-go, normalized). The policy's parameters are a nested dict of arrays, as flax
holds them, and the optimizer's state is optax's. examples/jax_pg_mpi.py is this script on N MPI processes; the
difference between the two files is mpi_util's recipe (see docs/mpi_util.md).

    python examples/jax_pg.py
"""

import argparse
from functools import partial

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax


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
args = parser.parse_args()

key = jax.random.key(args.seed)
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=args.seed)
key, init_key = jax.random.split(key)
params = init_policy(init_key)
optimizer = optax.adam(1e-2)
opt_state = optimizer.init(params)

for iteration in range(args.iterations):
    batch, returns, obs, key = collect(env, obs, params, key, args.batch_size, gamma=0.99)
    params, opt_state, loss = update(optimizer, params, opt_state, batch)
    print(f"iteration {iteration}: {len(batch['obs'])} steps, mean return {returns.mean():.1f}, loss {loss:.3f}",
          flush=True)
