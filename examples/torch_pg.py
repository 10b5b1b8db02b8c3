"""A batch policy gradient in PyTorch on CartPole-v1, one process: the kind of script you did not write.

Each iteration collects a batch of steps with the current policy, then takes one gradient step on the whole batch
(REINFORCE with discounted rewards-to-go, normalized). examples/torch_pg_mpi.py is this script on N MPI
processes; the difference between the two files is mpi_util's recipe (see the README).

    python examples/torch_pg.py
"""

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def collect(env: gym.Env, obs: np.ndarray, policy: nn.Module, steps: int, gamma: float) -> tuple:
    """``steps`` environment steps with the current policy, from ``obs``. Returns (batch, episode returns, the next
    observation): batch {"obs": (steps, 4) float32, "act": (steps,) int64, "ret": (steps,) float32 discounted
    reward-to-go within each episode (an episode cut off by the batch's end is cut there too)}, returns (episodes,)."""
    observations, actions, rewards, ends, episode_returns, episode_return = [], [], [], [], [], 0.0
    for _ in range(steps):
        with torch.no_grad():
            logits = policy(torch.as_tensor(obs, dtype=torch.float32))
        action = int(torch.distributions.Categorical(logits=logits).sample())
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


def update(policy: nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> float:
    """One gradient step of REINFORCE on the whole batch; returns the loss."""
    advantage = torch.as_tensor(batch["ret"])
    advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    log_prob = torch.distributions.Categorical(logits=policy(torch.as_tensor(batch["obs"]))).log_prob(
        torch.as_tensor(batch["act"]))
    loss = -(log_prob * advantage).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--iterations", type=int, default=40, help="batches collected and learned (default: %(default)s)")
parser.add_argument("--batch_size", type=int, default=4000, help="steps per batch (default: %(default)s)")
parser.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
args = parser.parse_args()

torch.manual_seed(args.seed)
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=args.seed)
policy = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

for iteration in range(args.iterations):
    batch, returns, obs = collect(env, obs, policy, args.batch_size, gamma=0.99)
    loss = update(policy, optimizer, batch)
    print(f"iteration {iteration}: {len(batch['obs'])} steps, mean return {returns.mean():.1f}, loss {loss:.3f}",
          flush=True)
