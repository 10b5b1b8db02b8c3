"""PPO with continuous actions in one file, CleanRL style, one process: the kind of script you did not write.

A gymnasium vector env with observation and reward normalization; each iteration fills rollout storage tensors of
(num_steps, num_envs), computes GAE advantages, and runs the PPO update inline. examples/cleanrl_ppo_mpi.py is this
script on N MPI processes; the difference between the two files is mpi_util's recipe (docs/mpi_util.md,
"CleanRL-style scripts").

    python examples/cleanrl_ppo.py
"""

import argparse
import random
import time
from collections import deque
from dataclasses import dataclass, fields

import gymnasium as gym
import numpy as np
import torch
from torch import nn, optim
from torch.distributions.normal import Normal


@dataclass
class Args:
    env_id: str = "InvertedPendulum-v5"
    """the id of the environment"""
    total_timesteps: int = 100_000
    """total timesteps of the experiment"""
    seed: int = 1
    """seed of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer, annealed linearly to 0"""
    num_envs: int = 4
    """the number of parallel game environments"""
    num_steps: int = 512
    """the number of steps to run in each environment per policy rollout"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in fields(Args):
        parser.add_argument(f"--{field.name}", type=type(field.default), default=field.default)
    return Args(**vars(parser.parse_args()))


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None) -> tuple:
        """x: (batch, obs_dim). Returns action (batch, act_dim), its log-probability, the entropy and the value,
        each (batch,)."""
        action_mean = self.actor_mean(x)
        probs = Normal(action_mean, torch.exp(self.actor_logstd.expand_as(action_mean)))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x).flatten()


args = parse_args()
num_iterations = args.total_timesteps // (args.num_envs * args.num_steps)

random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)

envs = gym.make_vec(args.env_id, num_envs=args.num_envs, vectorization_mode="sync")
envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
envs = gym.wrappers.vector.ClipAction(envs)
envs = gym.wrappers.vector.NormalizeObservation(envs)
envs = gym.wrappers.vector.TransformObservation(envs, lambda obs: np.clip(obs, -10, 10))
envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
envs = gym.wrappers.vector.ClipReward(envs, -10, 10)
obs_shape, act_shape = envs.single_observation_space.shape, envs.single_action_space.shape

agent = Agent(int(np.prod(obs_shape)), int(np.prod(act_shape)))
optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

# Rollout storage: (num_steps, num_envs, ...)
obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape))
actions = torch.zeros((args.num_steps, args.num_envs, *act_shape))
logprobs = torch.zeros((args.num_steps, args.num_envs))
rewards = torch.zeros((args.num_steps, args.num_envs))
dones = torch.zeros((args.num_steps, args.num_envs))
values = torch.zeros((args.num_steps, args.num_envs))

global_step = 0
start_time = time.time()
recent_returns = deque(maxlen=20)
next_obs, _ = envs.reset(seed=args.seed)
next_obs = torch.Tensor(next_obs)
next_done = torch.zeros(args.num_envs)

for iteration in range(1, num_iterations + 1):
    optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate
    episodic_returns = []
    for step in range(args.num_steps):
        global_step += args.num_envs
        obs[step] = next_obs
        dones[step] = next_done
        with torch.no_grad():
            action, logprob, _, value = agent.get_action_and_value(next_obs)
        values[step] = value
        actions[step] = action
        logprobs[step] = logprob
        next_obs, reward, terminations, truncations, infos = envs.step(action.numpy())
        rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
        next_obs = torch.Tensor(next_obs)
        next_done = torch.Tensor(np.logical_or(terminations, truncations))
        if "episode" in infos:
            episodic_returns.extend(infos["episode"]["r"][infos["_episode"]])

    with torch.no_grad():  # GAE, bootstrapping from the value of the observation after the last step
        next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(args.num_steps)):
            if t == args.num_steps - 1:
                nextnonterminal, nextvalues = 1.0 - next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
            delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values

    # gymnasium's vector envs reset a finished env in the step after its end (obs: the final one, action ignored,
    # reward 0): those steps are left out.
    valid = dones.reshape(-1) == 0
    b_obs = obs.reshape((-1, *obs_shape))[valid]
    b_logprobs = logprobs.reshape(-1)[valid]
    b_actions = actions.reshape((-1, *act_shape))[valid]
    b_advantages = advantages.reshape(-1)[valid]
    b_returns = returns.reshape(-1)[valid]

    b_inds = np.arange(len(b_obs))
    for _ in range(args.update_epochs):
        np.random.shuffle(b_inds)
        for mb_inds in np.array_split(b_inds, args.num_minibatches):
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
            ratio = (newlogprob - b_logprobs[mb_inds]).exp()
            mb_advantages = b_advantages[mb_inds]
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()
            loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()

    recent_returns.extend(episodic_returns)
    print(f"iteration {iteration}: global_step={global_step}, episodic_return={np.mean(recent_returns):.1f} "
          f"(last {len(recent_returns)} episodes), SPS={int(global_step / (time.time() - start_time))}", flush=True)
envs.close()
