"""A CleanRL-style single-file PPO for continuous actions (torch), the peer peers.py measures, written after the
shape of CleanRL's ppo_continuous_action.py: a vector env with CleanRL's normalizing wrappers, separate 64-64 tanh
actor and critic, GAE, clipped surrogate and value losses, lr annealed to 0; for equal work with train.py the epochs
stop when an epoch's approx KL exceeds 1.5 x ``--target_kl``. ``--json PATH`` writes the record peers.py reads.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.normal import Normal


@dataclass
class Args:
    """The settings, each a command-line option of the same name; json: where the per-iteration record goes."""

    env_id: str = "Walker2d-v5"
    total_steps: int = 61_440
    seed: int = 0
    num_envs: int = 1
    batch_steps: int = 2048
    minibatch_size: int = 64
    update_epochs: int = 10
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float = 0.02
    torch_threads: int = 1
    json: str = ""


def make_env(env_id: str, gamma: float) -> Callable[[], gym.Env]:
    def thunk() -> gym.Env:
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)  # outermost statistic: the raw return, before any scaling
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        return gym.wrappers.TransformReward(env, lambda reward: float(np.clip(reward, -10, 10)))

    return thunk


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Critic and actor, separate 64-64 tanh MLPs; the action's log std is a parameter, not a network output."""

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
        """x: (B, obs_dim) -> (B, 1)."""
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (B, obs_dim); action: (B, act_dim) or None to sample one -> action (B, act_dim), log prob (B,),
        entropy (B,), value (B, 1)."""
        mean = self.actor_mean(x)
        std = torch.exp(self.actor_logstd.expand_as(mean))
        dist = Normal(mean, std)
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action).sum(1), dist.entropy().sum(1), self.critic(x)


def parse_args(argv: Sequence[str] | None = None) -> Args:
    defaults = Args()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=type(value), default=value, help=f"(default: {value})")
    args = Args(**vars(parser.parse_args(argv)))
    if args.num_envs < 1 or args.batch_steps % args.num_envs or args.batch_steps % args.minibatch_size:
        parser.error(f"--num_envs and --minibatch_size must divide --batch_steps {args.batch_steps}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    process_started = time.perf_counter()
    args = parse_args(argv)
    num_steps = args.batch_steps // args.num_envs
    num_iterations = args.total_steps // args.batch_steps
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)

    # SAME_STEP: a finished sub-env is reset inside the step that ended it (gymnasium 0.29's behaviour, which
    # CleanRL's loop assumes): every step is a real step, and the episode's statistics arrive in "final_info".
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id, args.gamma) for _ in range(args.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    agent = Agent(obs_dim, act_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((num_steps, args.num_envs, obs_dim))
    actions = torch.zeros((num_steps, args.num_envs, act_dim))
    logprobs = torch.zeros((num_steps, args.num_envs))
    rewards = torch.zeros((num_steps, args.num_envs))
    dones = torch.zeros((num_steps, args.num_envs))
    values = torch.zeros((num_steps, args.num_envs))

    global_step = 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
    next_done = torch.zeros(args.num_envs)
    iterations: list[dict[str, float | int | list[float]]] = []
    learn_started = time.perf_counter()
    for iteration in range(1, num_iterations + 1):
        t_start = time.perf_counter()
        optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * args.learning_rate

        episode_returns: list[float] = []
        for step in range(num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            next_obs_np, reward, terminations, truncations, infos = envs.step(action.numpy())
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32)
            next_done = torch.as_tensor(np.logical_or(terminations, truncations), dtype=torch.float32)
            if "final_info" in infos and "episode" in infos["final_info"]:
                finished = infos["final_info"]["_episode"]
                episode_returns.extend(float(r) for r in infos["final_info"]["episode"]["r"][finished])
        t_rollout_end = time.perf_counter()

        with torch.no_grad():  # GAE over (num_steps, num_envs)
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros(args.num_envs)
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1, obs_dim))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1, act_dim))
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        grad_steps = 0
        for _epoch in range(args.update_epochs):
            b_inds = np.random.permutation(args.batch_steps)
            approx_kls = []
            for start in range(0, args.batch_steps, args.minibatch_size):
                mb_inds = b_inds[start:start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    approx_kls.append(((ratio - 1) - logratio).mean().item())

                mb_advantages = b_advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss = torch.max(-mb_advantages * ratio,
                                    -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()

                newvalue = newvalue.view(-1)
                v_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -args.clip_coef,
                                                            args.clip_coef)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb_inds]) ** 2).mean()

                loss = pg_loss + v_loss * args.vf_coef  # entropy coefficient 0, as train.py's and SB3's MuJoCo PPO
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                grad_steps += 1
            if args.target_kl and float(np.mean(approx_kls)) > 1.5 * args.target_kl:
                break
        t_end = time.perf_counter()

        record = {"steps": global_step, "t_rollout": t_rollout_end - t_start, "t_update": t_end - t_rollout_end,
                  "wall_s": t_end - learn_started, "grad_steps": grad_steps, "returns": episode_returns}
        iterations.append(record)
        mean_return = f"{np.mean(episode_returns):.1f}" if episode_returns else "-"
        print(f"iteration {iteration}/{num_iterations} steps {global_step} "
              f"steps/s {args.batch_steps / (t_end - t_start):.0f} rollout_s {record['t_rollout']:.3f} "
              f"update_s {record['t_update']:.3f} grad_steps {grad_steps} episodes {len(episode_returns)} "
              f"mean_return {mean_return}", flush=True)
    envs.close()

    if args.json:
        Path(args.json).write_text(json.dumps({
            "setup_s": learn_started - process_started, "iterations": iterations, "config": asdict(args),
            "torch_threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__, "gymnasium": gym.__version__},
        }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
