"""A CleanRL-style single-file PPO for Atari (torch), the peer peers.py measures on an ALE game, written after the
shape of CleanRL's ppo_atari.py: train.py's Atari preprocessing (envs.atari), one Nature CNN torso under categorical
policy and value heads, GAE, clipped surrogate and value losses, an entropy bonus; by default the PPO paper's Atari
work (8 envs x 128 steps, 4 epochs of 256 rows), lr and clip range annealed linearly to 0 as rl-baselines3-zoo has
them. As train.py's Atari rollout: rewards learned clipped to their sign (the returns reported are the game's score),
and a lost life ends the value bootstrap, not the game. ``--json PATH`` writes the record peers.py reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

from envs.atari import make_atari


@dataclass
class Args:
    """The settings, each a command-line option of the same name; json: where the per-iteration record goes."""

    env_id: str = "ALE/Pong-v5"
    total_steps: int = 10_000_000
    seed: int = 0
    num_envs: int = 8
    batch_steps: int = 1024  # num_envs x 128 steps
    minibatch_size: int = 256
    update_epochs: int = 4
    learning_rate: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.1
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float = 0.0  # 0: no early stop, as the PPO paper's Atari runs
    torch_threads: int = os.cpu_count() or 1
    device: str = "cpu"  # "cuda": the network, the batch and the update on the GPU, as CleanRL's --cuda
    json: str = ""


Layer = TypeVar("Layer", nn.Linear, nn.Conv2d)


def layer_init(layer: Layer, std: float = np.sqrt(2), bias_const: float = 0.0) -> Layer:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature CNN (Mnih et al. 2015) torso, shared by a categorical policy head and a value head."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int) -> None:
        super().__init__()
        height, width, channels = obs_shape
        convs = nn.Sequential(
            layer_init(nn.Conv2d(channels, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():  # the flattened width: 64 x 7 x 7 for 84x84 frames
            flat = convs(torch.zeros(1, channels, height, width)).shape[1]
        self.network = nn.Sequential(convs, layer_init(nn.Linear(flat, 512)), nn.ReLU())
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, H, W, C) uint8 frames, channels last as envs.atari stacks them -> (B, 512)."""
        return self.network(x.permute(0, 3, 1, 2).float() / 255.0)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, H, W, C) uint8 -> (B, 1)."""
        return self.critic(self.hidden(x))

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (B, H, W, C) uint8; action: (B,) int64 or None to sample one -> action (B,), log prob (B,),
        entropy (B,), value (B, 1)."""
        hidden = self.hidden(x)
        dist = Categorical(logits=self.actor(hidden))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(hidden)


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
    device = torch.device(args.device)

    # SAME_STEP: a finished sub-env is reset inside the step that ended it (gymnasium 0.29's behaviour, which
    # CleanRL's loop assumes): every step is a real step, and the episode's statistics arrive in "final_info".
    # RecordEpisodeStatistics outermost: the game's score, summed over the skipped frames, before any clipping.
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.RecordEpisodeStatistics(make_atari(args.env_id)) for _ in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_shape = envs.single_observation_space.shape
    agent = Agent(obs_shape, int(envs.single_action_space.n)).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # Frames stay uint8 (a quarter of float32's bytes); the network scales them.
    obs = torch.zeros((num_steps, args.num_envs, *obs_shape), dtype=torch.uint8, device=device)
    actions = torch.zeros((num_steps, args.num_envs), dtype=torch.int64, device=device)
    logprobs = torch.zeros((num_steps, args.num_envs), device=device)
    rewards = torch.zeros((num_steps, args.num_envs), device=device)
    dones = torch.zeros((num_steps, args.num_envs), device=device)
    values = torch.zeros((num_steps, args.num_envs), device=device)

    global_step = 0
    next_obs_np, infos = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs_np, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    lives = np.asarray(infos["lives"])
    iterations: list[dict[str, float | int | list[float]]] = []
    learn_started = time.perf_counter()
    for iteration in range(1, num_iterations + 1):
        t_start = time.perf_counter()
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        clip_coef = frac * args.clip_coef

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
            next_obs_np, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # learned: the reward's sign
            rewards[step] = torch.as_tensor(np.sign(reward), dtype=torch.float32, device=device)
            next_obs = torch.as_tensor(next_obs_np, device=device)
            ended = np.logical_or(terminations, truncations)
            # A lost life ends the value bootstrap, the game goes on; a reset env's "lives" are its new game's.
            life_lost = (np.asarray(infos["lives"]) < lives) & ~ended
            lives = np.asarray(infos["lives"])
            next_done = torch.as_tensor(ended | life_lost, dtype=torch.float32, device=device)
            if "final_info" in infos and "episode" in infos["final_info"]:
                finished = infos["final_info"]["_episode"]
                episode_returns.extend(float(r) for r in infos["final_info"]["episode"]["r"][finished])
        t_rollout_end = time.perf_counter()

        with torch.no_grad():  # GAE over (num_steps, num_envs)
            nextvalues = torch.cat((values[1:], agent.get_value(next_obs).reshape(1, -1)))
            nextnonterminals = 1.0 - torch.cat((dones[1:], next_done[None]))  # 0 after an ended episode or life
            advantages = torch.zeros_like(rewards)
            lastgaelam = torch.zeros(args.num_envs, device=device)
            for t in reversed(range(num_steps)):
                nextnonterminal = nextnonterminals[t]
                delta = rewards[t] + args.gamma * nextvalues[t] * nextnonterminal - values[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1, *obs_shape))
        b_logprobs, b_actions, b_advantages, b_returns, b_values = (
            x.reshape(-1) for x in (logprobs, actions, advantages, returns, values))

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
                                    -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()

                newvalue = newvalue.view(-1)
                v_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -clip_coef, clip_coef)
                v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb_inds]) ** 2).mean()

                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                grad_steps += 1
            if args.target_kl and float(np.mean(approx_kls)) > 1.5 * args.target_kl:
                break
        if device.type == "cuda":
            torch.cuda.synchronize()  # the update's kernels finish inside its span
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
            "cuda_max_memory_reserved": torch.cuda.max_memory_reserved() if device.type == "cuda" else 0,
            "versions": {"torch": torch.__version__, "gymnasium": gym.__version__, "ale_py": version("ale-py")},
        }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
