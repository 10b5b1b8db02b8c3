"""``python train.py --play RUN_DIR``: run a saved policy deterministically and print the episode returns."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np


def play(run_dir: Path, episodes: int, video_path: str | None) -> int:
    """Play ``episodes`` episodes with the newest good checkpoint of ``run_dir``; 0 on success, 2 on bad input."""
    import gymnasium

    from algos.checkpoint import CheckpointError, load_latest_checkpoint
    from algos.policy import ActorCritic

    if not (run_dir / "config.json").is_file():
        print(f"train.py: error: --play {run_dir}: not a run directory (no config.json)", file=sys.stderr)
        return 2
    if episodes < 1:
        print(f"train.py: error: --episodes must be at least 1, got {episodes}", file=sys.stderr)
        return 2
    config = json.loads((run_dir / "config.json").read_text())
    try:
        path, state, warnings = load_latest_checkpoint(run_dir / "checkpoints")
    except CheckpointError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"train.py: warning: {warning}", file=sys.stderr)

    render_mode = "rgb_array" if video_path else None
    if video_path and "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"  # headless: no X display for MuJoCo's default GLFW backend
    try:
        env = gymnasium.make(config["env_id"], render_mode=render_mode)
        env.reset(seed=config["seed"] + 10_000)
        if video_path:
            env.render()
    except Exception as error:  # MuJoCo's renderer raises several types when no GL backend is available
        print(f"train.py: error: cannot render {config['env_id']} offscreen with MUJOCO_GL="
              f"{os.environ.get('MUJOCO_GL', 'glfw')} ({type(error).__name__}: {error}); use MUJOCO_GL=egl on a "
              "machine with a GPU, or MUJOCO_GL=osmesa (software, needs the libosmesa6 package)", file=sys.stderr)
        return 2
    ac = ActorCritic(env.observation_space.shape[0], env.action_space, hidden=tuple(config["hidden"]))
    for var, value in zip(ac.broadcast_state(), state["ac_state"], strict=True):
        if isinstance(var, np.ndarray):
            var[...] = value
        else:
            var.assign(value)
    actor = ac.numpy_actor()
    rng = np.random.default_rng(0)
    frames = []
    print(f"playing {path} ({config['env_id']}, {config['algo']}, step {int(state['counters'][1])})")
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=config["seed"] + 10_000 + episode)
        done, total, length = False, 0.0, 0
        while not done:
            action = actor.act(np.asarray(obs, np.float32)[None], rng, deterministic=True)[0]
            if not ac.is_discrete:
                action = np.clip(action, env.action_space.low, env.action_space.high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, length, done = total + float(reward), length + 1, terminated or truncated
            if video_path:
                frames.append(env.render())
        returns.append(total)
        print(f"episode {episode}: return {total:.1f}, length {length}")
    print(f"mean return {np.mean(returns):.1f} over {episodes} episodes")
    if video_path:
        import imageio.v2 as imageio

        try:
            imageio.mimsave(video_path, frames, fps=int(env.metadata.get("render_fps", 30)))
        except Exception as error:  # imageio reports a missing ffmpeg backend in several ways
            print(f"train.py: error: cannot write {video_path} ({error}); `pip install imageio-ffmpeg`",
                  file=sys.stderr)
            return 2
        print(f"wrote {video_path} ({len(frames)} frames)")
    return 0
