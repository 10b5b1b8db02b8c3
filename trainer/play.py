"""``python train.py --play RUN_DIR [--video FILE]``: run a saved policy deterministically, print the episode
returns, and optionally record the episodes as an animation (.mp4, .gif) or an image strip (.png).

Numpy only: the policy is rebuilt from the checkpoint as a NumpyActor, without TensorFlow, which is faster to start
and keeps MuJoCo's EGL renderer away from TensorFlow's libraries (the two in one process crashed in rendering).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np


def play(run_dir: Path, episodes: int, video_path: str | None) -> int:
    """Play ``episodes`` episodes with the newest good checkpoint of ``run_dir``; 0 on success, 2 on bad input."""
    import gymnasium

    from algos.numpy_actor import NumpyActor
    from trainer.checkpoint import CheckpointError, load_latest_checkpoint

    if not (run_dir / "config.json").is_file():
        print(f"train.py: error: --play {run_dir}: not a run directory (no config.json)", file=sys.stderr)
        return 2
    if episodes < 1:
        print(f"train.py: error: --episodes must be at least 1, got {episodes}", file=sys.stderr)
        return 2
    if video_path and Path(video_path).suffix.lower() not in VIDEO_SUFFIXES:
        print(f"train.py: error: --video {video_path}: name a file ending in {', '.join(VIDEO_SUFFIXES)} "
              "(.png writes an image strip of the first episode)", file=sys.stderr)
        return 2
    if video_path and not Path(video_path).resolve().parent.is_dir():
        print(f"train.py: error: --video {video_path}: directory {Path(video_path).resolve().parent} does not exist",
              file=sys.stderr)
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
        if video_path and has_tracking_camera(env):
            # The default free camera stays where the episode started, and a walker leaves the picture.
            env.close()
            env = gymnasium.make(config["env_id"], render_mode=render_mode, camera_name="track")
        env.reset(seed=config["seed"] + 10_000)
        if video_path:
            env.render()
    except Exception as error:  # MuJoCo's renderer raises several types when no GL backend is available
        print(f"train.py: error: cannot render {config['env_id']} offscreen with MUJOCO_GL="
              f"{os.environ.get('MUJOCO_GL', 'glfw')} ({type(error).__name__}: {error}); "
              "try MUJOCO_GL=egl (needs libEGL, the libegl1 package) or MUJOCO_GL=osmesa (needs libosmesa6)",
              file=sys.stderr)
        return 2
    discrete = isinstance(env.action_space, gymnasium.spaces.Discrete)
    try:
        actor = NumpyActor.from_ac_state(state["ac_state"], tuple(config["hidden"]), discrete)
    except (KeyError, ValueError) as error:
        print(f"train.py: error: {path} does not hold a policy for {config['env_id']}: {error}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    frames = []  # (H, W, 3) uint8, one every render_every steps: rendering costs more than the step itself
    fps = float(env.metadata.get("render_fps", 30))
    render_every = 1 if not video_path or video_path.lower().endswith(".mp4") else math.ceil(fps / GIF_MAX_FPS)
    print(f"playing {path} ({config['env_id']}, {config['algo']}, step {int(state['counters'][1])})")
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=config["seed"] + 10_000 + episode)
        done, total, length = False, 0.0, 0
        if video_path:
            frames.append(env.render())
        while not done:
            action = actor.act(np.asarray(obs, np.float32)[None], rng, deterministic=True)[0]
            if not discrete:
                action = np.clip(action, env.action_space.low, env.action_space.high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, length, done = total + float(reward), length + 1, terminated or truncated
            if video_path and length % render_every == 0:
                frames.append(env.render())
        returns.append(total)
        if episode == 0:
            first_episode_frames = len(frames)
        print(f"episode {episode}: return {total:.1f}, length {length}")
    print(f"mean return {np.mean(returns):.1f} over {episodes} episodes")
    if video_path:
        try:
            write_video(Path(video_path), frames, first_episode_frames, fps / render_every)
        except Exception as error:  # imageio reports a missing ffmpeg backend in several ways
            print(f"train.py: error: cannot write {video_path} ({type(error).__name__}: {error}); for .mp4 "
                  "`pip install imageio-ffmpeg`, or write a .gif", file=sys.stderr)
            return 2
        print(f"wrote {video_path}")
    return 0


VIDEO_SUFFIXES = (".mp4", ".gif", ".png")
GIF_MAX_FPS = 25.0  # browsers slow down GIF frames shorter than 20 ms: .gif and .png keep every k-th frame
STRIP_FRAMES = 8


def write_video(path: Path, frames: list[np.ndarray], first_episode_frames: int, fps: float) -> None:
    """Write frames (each (H, W, 3) uint8) to path, shown at ``fps``: .mp4 and .gif as animations, .png as a strip
    of STRIP_FRAMES frames evenly spaced over the first episode (its first ``first_episode_frames``), left to right."""
    import imageio.v2 as imageio

    suffix = path.suffix.lower()
    if suffix == ".png":
        picks = np.linspace(0, first_episode_frames - 1, STRIP_FRAMES).round().astype(int)
        imageio.imwrite(path, np.concatenate([frames[i] for i in picks], axis=1))
    elif suffix == ".gif":
        imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps)


def has_tracking_camera(env: Any) -> bool:
    """Whether env is a MuJoCo env whose model has a camera named "track" (gymnasium's locomotion envs do)."""
    model = getattr(env.unwrapped, "model", None)
    if model is None:
        return False
    import mujoco

    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "track") >= 0
