"""examples/torch_pg.py on N MPI processes: the lines marked "# mpi_util" are all that changed.

Every rank collects its share of the batch with its own seed; rank 0 gathers the rows and takes the gradient step;
the policy (a torch.nn.Module) is broadcast back to every rank, bit for bit. At the end rank 0 prints which ranks
hold weights that differ from its own (none).

    python examples/torch_pg_mpi.py --nprocs 2
"""

import argparse
import sys

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import mpi_util  # mpi_util


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
parser.add_argument("--nprocs", type=int, default=2, help="MPI processes (default: %(default)s)")  # mpi_util
args = parser.parse_args()
fork = mpi_util.mpi_fork(args.nprocs)  # mpi_util: relaunch this script as nprocs ranks
if fork == "parent":  # mpi_util
    sys.exit(fork.returncode)  # mpi_util: the job has ended

mpi_util.set_global_seeds(args.seed)  # mpi_util: seeds torch, numpy, random; each rank its own stream
env = gym.make("CartPole-v1")
obs, _ = env.reset(seed=mpi_util.rank_seed(args.seed, mpi_util.rank))  # mpi_util: each rank its own episodes
policy = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
mpi_util.rank0_bcast_wts(policy)  # mpi_util: every rank starts from rank 0's initial weights

for iteration in range(args.iterations):
    batch, returns, obs = collect(env, obs, policy, args.batch_size // mpi_util.nworkers, gamma=0.99)  # mpi_util
    batch = mpi_util.rank0_accum_batches(batch)  # mpi_util: rank 0 gets every rank's rows
    returns = mpi_util.rank0_accum_batches({"ep_return": returns})["ep_return"]  # mpi_util
    if mpi_util.rank == 0:  # mpi_util: rank 0 alone learns
        loss = update(policy, optimizer, batch)
        print(f"iteration {iteration}: {len(batch['obs'])} steps, mean return {returns.mean():.1f}, loss {loss:.3f}",
              flush=True)
    mpi_util.rank0_bcast_wts(policy)  # mpi_util: every rank gets rank 0's new weights
mpi_util.print0(f"ranks whose weights differ from rank 0's: {mpi_util.ranks_out_of_sync(policy)}")  # mpi_util
