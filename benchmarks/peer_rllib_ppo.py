"""RLlib's PPO (ray[rllib], new API stack, torch) at train.py's work per iteration, the peer peers.py runs, in
benchmarks/.venv-rllib (made by setup_peers.sh), never in the project's environment: 2,048 env steps per update over
the env runners, 10 epochs of 64-row minibatches, lr 3e-4 annealed as train.py's, a local learner. What cannot be
made equal is in peers.py's notes. ``--json PATH`` writes the per-iteration record peers.py reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BATCH = 2048
MINIBATCH = 64
EPOCHS = 10


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Walker2d-v5", help="gymnasium env id (default: %(default)s)")
    parser.add_argument("--total_steps", type=int, default=61_440, help="env steps to train for (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="RLlib's seed (default: %(default)s)")
    parser.add_argument("--num_env_runners", type=int, default=2,
                        help="remote env runners, one env each; 0: the driver samples itself (default: %(default)s)")
    parser.add_argument("--torch_threads", type=int, default=1,
                        help="torch.set_num_threads of the driver, where the learner runs (default: %(default)s)")
    parser.add_argument("--json", default="", help="write the per-iteration record to this path")
    return parser.parse_args(argv)


def lr_schedule(total_steps: int) -> list[list[float]]:
    """train.py's linear schedule as RLlib's [[env steps, lr], ...]: RLlib looks it up at the steps sampled so far,
    this batch included, so the first update gets 3e-4 and the last 3e-4 / iterations, as in train.py."""
    return [[0, 3e-4], [BATCH, 3e-4], [total_steps + BATCH, 0.0]]


def build_config(args: argparse.Namespace) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.connectors.env_to_module import MeanStdFilter
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        PPOConfig()
        .environment(args.env)
        .env_runners(num_env_runners=args.num_env_runners, num_envs_per_env_runner=1,
                     rollout_fragment_length="auto",
                     env_to_module_connector=lambda env=None, spaces=None, device=None: MeanStdFilter())
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=BATCH, minibatch_size=MINIBATCH, num_epochs=EPOCHS,
                  lr=lr_schedule(args.total_steps), clip_param=0.2, gamma=0.99, lambda_=0.95,
                  grad_clip=0.5, grad_clip_by="global_norm", vf_loss_coeff=0.5, entropy_coeff=0.0,
                  use_kl_loss=False)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                   vf_share_layers=False, free_log_std=True))
        .debugging(seed=args.seed, log_level="ERROR")
    )


def time_learner_updates(algo: Any) -> list[float]:
    """Wrap algo.learner_group.update so that each call appends its wall time (s) to the list returned."""
    update = algo.learner_group.update
    durations: list[float] = []

    def timed_update(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return update(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - started)

    algo.learner_group.update = timed_update
    return durations


def main(argv: Sequence[str] | None = None) -> int:
    process_started = time.perf_counter()
    args = parse_args(argv)
    import gymnasium
    import ray
    import torch

    torch.set_num_threads(args.torch_threads)
    # One CPU per env runner even when they outnumber the cores, as train.py --nprocs N oversubscribes.
    ray.init(num_cpus=max(args.num_env_runners, os.cpu_count() or 1), include_dashboard=False,
             logging_level="ERROR", log_to_driver=True)
    try:
        algo = build_config(args).build_algo()
        learner_s = time_learner_updates(algo)
        iterations: list[dict[str, Any]] = []
        steps = 0
        learn_started = time.perf_counter()
        while steps < args.total_steps:
            t_start = time.perf_counter()
            learner_s.clear()
            result = algo.train()
            t_end = time.perf_counter()
            runners = result.get("env_runners", {})
            steps = int(runners.get("num_env_steps_sampled_lifetime", steps))
            record = {
                "steps": steps, "iteration_s": t_end - t_start, "wall_s": t_end - learn_started,
                "steps_this_iteration": int(runners.get("num_env_steps_sampled", 0)),
                "t_update": sum(learner_s),
                # RLlib counts rows trained; its minibatches are always full (64), so rows / 64 is the Adam steps.
                "grad_steps": int(result.get("learners", {}).get("__all_modules__", {})
                                  .get("num_module_steps_trained", 0)) // MINIBATCH,
                "episodes": int(runners.get("num_episodes", 0)),
                "episode_return_mean": float(runners.get("episode_return_mean", float("nan"))),
            }
            iterations.append(record)
            record["t_rollout"] = record["iteration_s"] - record["t_update"]
            print(f"iteration {len(iterations)} steps {steps} steps/s "
                  f"{record['steps_this_iteration'] / record['iteration_s']:.0f} "
                  f"rollout_s {record['t_rollout']:.3f} update_s {record['t_update']:.3f} "
                  f"grad_steps {record['grad_steps']} episodes {record['episodes']} "
                  f"return_mean_100 {record['episode_return_mean']:.1f}", flush=True)
        algo.stop()
    finally:
        ray.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps({
            "setup_s": learn_started - process_started, "iterations": iterations, "config": vars(args),
            "torch_threads": torch.get_num_threads(),
            "versions": {"ray": ray.__version__, "torch": torch.__version__, "gymnasium": gymnasium.__version__},
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
