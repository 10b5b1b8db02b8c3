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


def play(run_dir: Path, episodes: int, video_path: str | None, env_name: str | None = None) -> int:
    """Play ``episodes`` episodes with the newest good checkpoint of ``run_dir``, or with the policy file
    ``run_dir`` names (train.py --export's); 0 on success, 2 on bad input. ``env_name``: the env train.py was given
    beside --play; a run or file whose env id imports a module is played only when it names that id
    (trainer.config.check_named_module)."""
    from trainer.checkpoint import CheckpointError, load_latest_checkpoint
    from trainer.config import check_named_module

    problem = check_play_inputs(run_dir, episodes, video_path)
    if problem:
        print(f"train.py: error: {problem}", file=sys.stderr)
        return 2
    if run_dir.is_file():
        return play_file(run_dir, episodes, video_path, env_name)
    config = json.loads((run_dir / "config.json").read_text())
    try:
        check_named_module(str(config.get("env_id", "")), env_name, "--play", run_dir)
    except ValueError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    try:
        path, state, warnings = load_latest_checkpoint(run_dir / "checkpoints")
    except CheckpointError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"train.py: warning: {warning}", file=sys.stderr)
    try:
        env = make_env(config, video_path)
    except PlayError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    try:
        actor = checkpoint_actor(config, state, env)
    except (KeyError, ValueError) as error:
        print(f"train.py: error: {path} does not hold a policy for {config['env_id']}: {error}", file=sys.stderr)
        return 2
    print(f"playing {path} ({config['env_id']}, {config['algo']}, step {int(state['counters'][1])})")
    return play_and_record(env, actor, config["seed"], episodes, video_path)


def play_file(path: Path, episodes: int, video_path: str | None, env_name: str | None) -> int:
    """--play FILE: the policy file train.py --export wrote (NumpyActor.load: arrays and JSON, no pickle)."""
    from algos.numpy_actor import NumpyActor
    from algos.spaces import action_spec, obs_spec
    from trainer.config import check_named_module

    try:
        actor, spec = NumpyActor.load(path)
        check_named_module(spec["env_id"], env_name, "--play", path)
        env = make_env(spec, video_path)
    except (ValueError, PlayError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    if (obs_spec(env.observation_space), action_spec(env.action_space)) != (actor.obs, actor.action):
        print(f"train.py: error: {path} holds a policy for other spaces than {spec['env_id']} has now",
              file=sys.stderr)
        return 2
    print(f"playing {path} ({spec['env_id']}, {spec['algo']}, step {spec['total_steps']})")
    return play_and_record(env, actor, spec["seed"], episodes, video_path)


def export(run_dir: Path, path: Path, env_name: str | None = None) -> int:
    """train.py --export RUN_DIR FILE: the newest good checkpoint's policy as one file NumpyActor.load reads (arrays
    and a JSON spec, no pickle); 0 on success, 2 on bad input. Reads the checkpoint's arrays only (never its
    environments' snapshots). ``env_name`` as for play."""
    from trainer.checkpoint import CheckpointError, load_latest_checkpoint
    from trainer.config import check_named_module
    from trainer.evaluate import write_policy_file

    if not (run_dir / "config.json").is_file():
        print(f"train.py: error: --export {run_dir}: not a run directory (no config.json)", file=sys.stderr)
        return 2
    config = json.loads((run_dir / "config.json").read_text())
    try:
        check_named_module(str(config.get("env_id", "")), env_name, "--export", run_dir)
        checkpoint, state, warnings = load_latest_checkpoint(run_dir / "checkpoints")
        actor = checkpoint_actor(config, state, make_env(config, None))
    except (CheckpointError, PlayError, KeyError, ValueError) as error:
        print(f"train.py: error: --export {run_dir}: {error}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"train.py: warning: {warning}", file=sys.stderr)
    about = {"env_id": config["env_id"], "algo": config["algo"], "seed": config["seed"],
             "total_steps": int(state["counters"][1]), "checkpoint": checkpoint.name}
    try:
        write_policy_file(path, actor, about)
    except OSError as error:
        print(f"train.py: error: cannot write {path}: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}: the policy of {checkpoint.name} ({config['env_id']}, {config['algo']}, step "
          f"{about['total_steps']}); play it with python train.py --play {path}")
    return 0


def checkpoint_actor(config: dict, state: dict, env: Any) -> Any:
    """The NumpyActor of a checkpoint's ``state`` for the run of ``config`` (its config.json) on ``env``, whose
    spaces give the layout; ValueError (or KeyError) when the checkpoint does not hold such a policy."""
    from algos.numpy_actor import NumpyActor
    from algos.registry import shares_torso
    from algos.spaces import action_spec, obs_spec

    obs = obs_spec(env.observation_space)
    return NumpyActor.from_ac_state(state["ac_state"], tuple(config["hidden"]), obs, action_spec(env.action_space),
                                    shares_torso(config["algo"], config["env_id"], obs.is_image))


def play_and_record(env: Any, actor: Any, seed: int, episodes: int, video_path: str | None) -> int:
    """The episodes of --play with ``actor`` on ``env`` (seeded from the run's ``seed``), their returns printed, and
    the video written when asked; 0 on success, 2 when the video cannot be written."""
    fps = float(env.metadata.get("render_fps", 30))
    suffix = Path(video_path).suffix.lower() if video_path else ""
    recorder = StripRecorder(env) if suffix == ".png" else None
    # The frames of an animation: every one for .mp4, every k-th for .gif (GIF_MAX_FPS); none otherwise.
    render_every = 1 if suffix == ".mp4" else math.ceil(fps / GIF_MAX_FPS) if suffix == ".gif" else 0
    returns, frames = play_episodes(env, actor, seed, episodes, render_every, recorder)
    print(f"mean return {np.mean(returns):.1f} over {episodes} episode{'s' * (episodes != 1)}")
    if recorder is not None:
        frames = recorder.strip()
    if video_path:
        try:
            write_video(Path(video_path), frames, fps / max(render_every, 1))
        except Exception as error:  # imageio reports a missing ffmpeg backend in several ways
            print(f"train.py: error: cannot write {video_path} ({type(error).__name__}: {error}); for .mp4 "
                  "`pip install imageio-ffmpeg`, or write a .gif", file=sys.stderr)
            return 2
        print(f"wrote {video_path}")
    return 0


def check_play_inputs(run_dir: Path, episodes: int, video_path: str | None) -> str | None:
    """A one-line reason why --play cannot run as asked, found before any episode is played; None when it can."""
    import importlib.util

    if not run_dir.is_file() and not (run_dir / "config.json").is_file():
        return f"--play {run_dir}: not a run directory (no config.json) nor a policy file of train.py --export"
    if episodes < 1:
        return f"--episodes must be at least 1, got {episodes}"
    if not video_path:
        return None
    suffix = Path(video_path).suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        return (f"--video {video_path}: name a file ending in {', '.join(VIDEO_SUFFIXES)} (.png writes an image strip "
                "of the first episode)")
    if not Path(video_path).resolve().parent.is_dir():
        return f"--video {video_path}: directory {Path(video_path).resolve().parent} does not exist"
    if importlib.util.find_spec("imageio") is None:
        return f"--video {video_path} needs imageio: pip install imageio"
    if suffix == ".mp4" and importlib.util.find_spec("imageio_ffmpeg") is None:
        return f"--video {video_path}: .mp4 needs imageio-ffmpeg (pip install imageio-ffmpeg), or write a .gif or .png"
    return None


class PlayError(Exception):
    """Why --play cannot go on, in one line."""


def make_env(config: dict, video_path: str | None) -> Any:
    """The run's env, reset once, rendering offscreen when a video is recorded (its first frame is rendered here,
    so that a renderer that cannot start fails before any episode is played). PlayError says what went wrong."""
    from envs.make import make_env as make_flat_env

    env_id = config["env_id"]
    render_mode = "rgb_array" if video_path else None
    if video_path and "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"  # headless: no X display for MuJoCo's default GLFW backend
    try:
        env = make_flat_env(env_id, render_mode=render_mode)
        if video_path and has_tracking_camera(env):
            # The default free camera stays where the episode started, and a walker leaves the picture.
            env.close()
            env = make_flat_env(env_id, render_mode=render_mode, camera_name="track")
        env.reset(seed=config["seed"] + 10_000)
    except Exception as error:  # whatever the env's own code raises
        hint = ("; is the module that registers it importable here (PYTHONPATH)?" if isinstance(error, ImportError)
                else "; for --video its constructor must take render_mode" if video_path else "")
        raise PlayError(f"cannot make {env_id}{' with render_mode=rgb_array' if video_path else ''} "
                        f"({type(error).__name__}: {error}){hint}") from None
    if video_path:
        try:
            env.render()
        except Exception as error:  # a renderer that cannot start raises any of several types
            raise PlayError(render_problem(env_id, error)) from None
    return env


def render_problem(env_id: str, error: Exception) -> str:
    """What to do when ``env_id`` cannot render offscreen, in one line."""
    import gymnasium

    if isinstance(error, gymnasium.error.DependencyNotInstalled):
        return f"cannot render {env_id}: {error}"  # gymnasium's message names the extra to install
    return (f"cannot render {env_id} offscreen with MUJOCO_GL={os.environ.get('MUJOCO_GL', 'glfw')} "
            f"({type(error).__name__}: {error}); try MUJOCO_GL=egl (needs libEGL, the libegl1 package) or "
            "MUJOCO_GL=osmesa (needs libosmesa6)")


def play_episodes(env: Any, actor: Any, seed: int, episodes: int, render_every: int,
                  recorder: StripRecorder | None = None) -> tuple[list[float], list[np.ndarray]]:
    """Play ``episodes`` deterministic episodes (seeds seed + 10000 + episode, as evaluation while training does),
    printing each return. With render_every > 0, keep a frame ((H, W, 3) uint8) every render_every steps: rendering
    costs more than the step. A ``recorder`` sees the first episode's steps. Returns (the episodes' returns, the
    frames)."""
    from trainer.evaluate import FIRST_SEED, run_episode

    returns, frames = [], []

    def keep_frame(length: int) -> None:
        if length % render_every == 0:
            frames.append(env.render())

    for episode in range(episodes):
        on_step = None
        if recorder is not None and episode == 0:
            on_step = recorder
        elif render_every:
            on_step = keep_frame
        total, length = run_episode(env, actor, seed + FIRST_SEED + episode, on_step)
        returns.append(total)
        print(f"episode {episode}: return {total:.1f}, length {length}")
    return returns, frames


class StripRecorder:
    """The frames of a .png strip: STRIP_FRAMES frames ((H, W, 3) uint8) evenly spaced over an episode whose length
    is not known in advance, without rendering every step (a 1,000-step MuJoCo episode rendered at every step took 8
    of --play's 9 s). Called with each step number (0 after the reset), it renders every ``stride`` steps; when it
    holds 4 * STRIP_FRAMES frames it drops every other one and doubles the stride. So it renders about
    16 * log2(length / 16) frames, and what it holds covers the episode at an even stride to within 1/16 of its
    length."""

    def __init__(self, env: Any) -> None:
        self.env, self.stride, self.kept = env, 1, []

    def __call__(self, step: int) -> None:
        if step % self.stride == 0:
            self.kept.append(self.env.render())
            if len(self.kept) == 4 * STRIP_FRAMES:
                self.kept, self.stride = self.kept[::2], 2 * self.stride

    def strip(self) -> list[np.ndarray]:
        """STRIP_FRAMES of the kept frames, evenly spaced, the first frame first (repeats for very short episodes)."""
        return [self.kept[i] for i in np.linspace(0, len(self.kept) - 1, STRIP_FRAMES).round().astype(int)]


VIDEO_SUFFIXES = (".mp4", ".gif", ".png")
GIF_MAX_FPS = 25.0  # browsers slow down GIF frames shorter than 20 ms: .gif and .png keep every k-th frame
STRIP_FRAMES = 8


def write_video(path: Path, frames: list[np.ndarray], fps: float) -> None:
    """Write frames (each (H, W, 3) uint8) to path, shown at ``fps``: .mp4 and .gif as animations, .png as the
    frames side by side, left to right."""
    import imageio.v2 as imageio

    suffix = path.suffix.lower()
    if suffix == ".png":
        imageio.imwrite(path, np.concatenate(frames, axis=1))
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
