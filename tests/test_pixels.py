"""Image observations (MinAtar's boards, a CNN per network), the other action and observation spaces train.py takes,
and the one line for a space it does not."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from conftest import REPO, run_bounded
from test_train import TRAIN, progress, reproducible_part, train

from algos.numpy_actor import NumpyActor, actor_critic_state_like
from algos.rollout import RolloutWorker
from algos.spaces import action_spec, obs_spec
from envs.atari import is_atari
from envs.make import make_env
from mpi_util import cpus_available
from trainer.checkpoint import load_latest_checkpoint
from trainer.config import resolve_env_id

TESTS = Path(__file__).resolve().parent
MINATAR = "MinAtar/Breakout-v1"
# The budget of the resume test: 4 iterations of 512 steps; PPO's learning rate constant, so that a run stopped at
# half the budget and resumed with the whole one is the same run (TRPO has no schedule).
COMMON = [MINATAR, "--nprocs", "2", "--batch_size", "512", "--minibatch_size", "128", "--checkpoint_every", "2"]
CONSTANT_LR = {"ppo": ["--lr_schedule", "constant"], "trpo": []}


def test_images_travel_as_uint8_from_the_rollout():
    env = make_env(MINATAR)
    spec = obs_spec(env.observation_space)
    assert spec.is_image and spec.shape == (10, 10, 4) and spec.scale == 1.0  # MinAtar's 0/1 planes
    worker = RolloutWorker([env, make_env(MINATAR)], seed=0, gamma=0.99, lam=0.95)
    state = actor_critic_state_like(spec, action_spec(env.action_space), (64, 64))
    rng = np.random.default_rng(0)
    for array in state[:-6]:
        array[...] = rng.normal(0.0, 0.1, array.shape)
    actor = NumpyActor.from_ac_state(state, (64, 64), spec, action_spec(env.action_space))
    batch, _ = worker.collect(64, actor, np.random.default_rng(1))
    assert batch["obs"].dtype == np.uint8 and batch["obs"].shape == (64, 10, 10, 4)
    assert batch["act"].dtype == np.int64 and batch["act"].shape == (64,)
    assert batch["obs"].max() == 1 and np.isfinite(batch["adv"]).all()
    np.testing.assert_allclose(batch["logp"], actor.log_prob(batch["obs"], batch["act"]), rtol=1e-6, atol=1e-6)


# PPO end to end; every algorithm's image update resumes bit for bit in test_algos_registry.
@pytest.mark.parametrize("algo", ["ppo"])
def test_minatar_trains_on_two_processes_resumes_bit_for_bit_and_plays(tmp_path, algo):
    common = [*COMMON, "--algo", algo, *CONSTANT_LR[algo]]
    whole, _ = train(*common, "--total_steps", "2048", "--logdir", str(tmp_path / "whole"))
    part = tmp_path / "part"  # a copy of the whole run as its checkpoint of iteration 2 left it
    shutil.copytree(whole, part)
    (part / "checkpoints" / "ckpt_00000004.npz").unlink()
    resumed, out = train("--resume", str(part))
    assert whole.name.startswith("MinAtar-Breakout-v1_") and resumed == part
    assert "from ckpt_00000002.npz: iteration 2, step 1024" in out
    assert reproducible_part(progress(resumed)) == reproducible_part(progress(whole))
    ac_state = load_latest_checkpoint(whole / "checkpoints")[1]["ac_state"]
    for mine, theirs in zip(load_latest_checkpoint(resumed / "checkpoints")[1]["ac_state"], ac_state, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # Two CNNs, not one torso: PPO shares it on Atari only (algos.registry), and MinAtar learned better with two.
    env = make_env(MINATAR)
    two_cnns = actor_critic_state_like(obs_spec(env.observation_space), action_spec(env.action_space), (64, 64))
    assert [array.shape for array in ac_state] == [array.shape for array in two_cnns]
    config = json.loads((whole / "config.json").read_text())
    assert config["env_id"] == MINATAR
    # MinAtar's one-layer CNN: oneDNN's kernels, one thread (trainer.kernels); the checkpoints record them
    assert (config["tf_intra_op_threads"], config["tf_enable_onednn_opts"]) == (1, "1"), config
    assert config["versions"]["tf_enable_onednn_opts"] == "1"
    played = run_bounded([sys.executable, TRAIN, "--play", str(whole), "--episodes", "2"], timeout=120)
    assert played.returncode == 0 and "over 2 episodes" in played.stdout, played.stderr[-3000:]


@pytest.mark.parametrize("env_id", ["spaces_env:SteerDict-v0", "spaces_env:SteerTuple-v0"])
def test_dict_and_tuple_observations_and_multi_actions_train_and_learn(tmp_path, env_id):
    # Dict/Tuple observations are flattened; MultiDiscrete and MultiBinary actions are independent categoricals.
    # A random policy drifts: the mean return of the first iteration is far below the last's.
    env = {"PYTHONPATH": f"{REPO}:{TESTS}"}
    result = run_bounded([sys.executable, TRAIN, env_id, "--nprocs", "2", "--total_steps", "12288",
                          "--batch_size", "1024", "--check_sync", "--logdir", str(tmp_path)], timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    rows = progress(run_dir)
    assert all(row["sync_ok"] == "1.0" for row in rows)
    first, last = float(rows[0]["ep_return_mean"]), float(rows[-1]["ep_return_mean"])
    assert last > 0.5 * first, (first, last)  # returns are negative: less than half the distance


def test_a_space_no_policy_reads_is_one_line_that_lists_what_is_supported(tmp_path):
    result = run_bounded([sys.executable, TRAIN, "spaces_env:Plane-v0", "--logdir", str(tmp_path)], timeout=60,
                         env={"PYTHONPATH": f"{REPO}:{TESTS}"})
    assert result.returncode == 2 and list(tmp_path.iterdir()) == []
    (line,) = result.stderr.splitlines()
    assert line.startswith("train.py: error: spaces_env:Plane-v0: observation space Box(-1.0, 1.0, (4, 4), float32) "
                           "is not supported; supported: observations: a Box of one dimension"), line
    assert "MultiDiscrete" in line and "Dict or Tuple" in line


def test_gymnasium_spaces_map_to_what_the_policy_reads_and_produces():
    assert action_spec(gymnasium.spaces.MultiBinary(3)).nvec == (2, 2, 2)
    assert action_spec(gymnasium.spaces.MultiDiscrete([4, 2])).n_outputs == 6
    assert action_spec(gymnasium.spaces.Discrete(5)).shape == ()
    camera = obs_spec(gymnasium.spaces.Box(0, 255, (84, 84, 4), np.uint8))
    assert camera.is_image and camera.dtype == np.uint8 and camera.scale == pytest.approx(1 / 255)
    with pytest.raises(ValueError, match="image observations must be uint8 or bool"):
        obs_spec(gymnasium.spaces.Box(0.0, 1.0, (8, 8, 3), np.float32))
    with pytest.raises(ValueError, match="action space .* is not supported"):
        action_spec(gymnasium.spaces.MultiDiscrete([[2, 2], [2, 2]]))


ATARI = "ALE/Breakout-v5"  # five lives, so a random policy loses some within a few hundred steps


def random_actor(env: gymnasium.Env, seed: int = 0) -> NumpyActor:
    spec, action = obs_spec(env.observation_space), action_spec(env.action_space)
    state = actor_critic_state_like(spec, action, (64, 64))
    rng = np.random.default_rng(seed)
    for array in state[:-6]:
        array[...] = rng.normal(0.0, 0.01, array.shape)
    return NumpyActor.from_ac_state(state, (64, 64), spec, action)


def test_atari_is_preprocessed_and_its_snapshot_continues_exactly():
    from envs.snapshot import restore_env

    env = make_env(ATARI)
    assert obs_spec(env.observation_space).shape == (84, 84, 4) and env.observation_space.dtype == np.uint8
    # Snapshots of Pong made in another process, as a resume reads them, each after 32 random steps; that process then
    # plays 40 more, and so must the copies here. The emulator's state, its RNG and the sticky action's last action
    # come back (ALE's own saved state forgets that action: so restored, the third game here acted differently from
    # its first step).
    code = """
import pickle, sys
import numpy as np
from envs.make import make_env
from envs.snapshot import snapshot_env
runs = []
for seed in range(8):  # ale-py's older ids (no sticky actions) snapshot as its ALE/ ids do
    env, rng = make_env("ALE/Pong-v5" if seed < 4 else "PongNoFrameskip-v4"), np.random.default_rng(seed)
    env.reset(seed=seed)
    for _ in range(32):
        env.step(int(rng.integers(env.action_space.n)))
    blob, actions = snapshot_env(env), [int(a) for a in rng.integers(env.action_space.n, size=40)]
    runs.append((blob, actions, [env.step(a)[:4] for a in actions]))
sys.stdout.buffer.write(pickle.dumps(runs))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, check=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    for seed, (blob, actions, theirs) in enumerate(pickle.loads(result.stdout)):
        copy = restore_env(blob)
        for step, (action, (obs, *rest)) in enumerate(zip(actions, theirs, strict=True)):
            mine = copy.step(action)
            assert np.array_equal(mine[0], obs) and list(mine[1:4]) == rest, (seed, step)


def test_the_older_ids_of_ale_py_are_atari_with_their_own_sticky_actions():
    assert all(map(is_atari, ["ALE/Pong-v5", "PongNoFrameskip-v4", "Breakout-v4", "Pong-v0"]))
    assert not any(map(is_atari, ["MountainCar-v0", "Walker2d-v4", "Humanoid-v4", "MinAtar/Breakout-v1", "Pong"]))
    # A bare name resolves within its namespace, never to an older id, whatever this process registered before.
    assert (resolve_env_id("ALE/Pong"), resolve_env_id("MountainCar")) == ("ALE/Pong-v5", "MountainCar-v0")
    with pytest.raises(ValueError, match=r"^unknown environment 'Pong'; did you mean ALE/Pong-v5\?$"):
        resolve_env_id("Pong")
    # A name that differs from an id only in case, or lacks its namespace, names that id.
    for name, meant in [("pong", "ALE/Pong-v5"), ("Pong-v5", "ALE/Pong-v5"), ("ALE/pong", "ALE/Pong-v5"),
                        ("Breakout-v1", "MinAtar/Breakout-v1"), ("cartpole-v1", "CartPole-v1"),
                        ("walker2d", "Walker2d-v5"), ("breakout", "ALE/Breakout-v5 or MinAtar/Breakout-v1")]:
        with pytest.raises(ValueError, match=rf"^unknown environment '{name}'; did you mean {meant}\?$"):
            resolve_env_id(name)

    def sticky(env: gymnasium.Env) -> float:
        while not isinstance(env, gymnasium.wrappers.StickyAction):
            if not isinstance(env, gymnasium.Wrapper):
                return 0.0
            env = env.env
        return env.repeat_action_probability

    older = make_env("BreakoutNoFrameskip-v4")
    assert older.observation_space == make_env(ATARI).observation_space
    assert older.unwrapped._frameskip == 1  # the preprocessing skips the frames, for every id
    assert (sticky(make_env(ATARI)), sticky(older), sticky(make_env("Breakout-v4"))) == (0.25, 0.0, 0.0)


def test_atari_rollouts_end_the_value_at_a_lost_life_clip_rewards_and_report_the_game_score():
    env = make_env(ATARI)
    worker = RolloutWorker([env], seed=0, gamma=0.99, lam=0.95, atari=True)
    steps = worker._step_envs(600, random_actor(env), np.random.default_rng(1), None)
    lives_lost = 5 - env.unwrapped.ale.lives() + 5 * len(steps.ep_returns)
    ends = steps.episode_ends[: steps.steps_of_env[0], 0]
    assert lives_lost >= 2 and ends.sum() == lives_lost  # every life lost ends the value, game over included
    assert set(np.unique(steps.rewards)) <= {-1.0, 0.0, 1.0}
    # The episode's return goes on through lost lives: the raw score of the game so far (Breakout's bricks are
    # worth 1 to 7, so clipped and raw differ once a high row is hit; here at least they are not fewer).
    assert steps.ep_return[0] + sum(steps.ep_returns) >= steps.rewards.sum()


def test_atari_trains_on_two_processes_quietly_resumes_bit_for_bit_and_plays_the_whole_game(tmp_path):
    pong = ["ALE/Pong-v5", "--nprocs", "2", "--batch_size", "256", "--minibatch_size", "128", "--checkpoint_every", "1"]
    result = run_bounded([sys.executable, TRAIN, *pong, "--total_steps", "512", "--logdir", str(tmp_path / "whole")],
                         timeout=240)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]  # no ALE banner, no warning
    (run_dir,) = (tmp_path / "whole").iterdir()
    assert run_dir.name.startswith("ALE-Pong-v5_ppo_s0_") and len(progress(run_dir)) == 2
    # The Atari settings where none was given, 8 envs over the 2 processes; the Nature CNN's update on every CPU
    # rank 0 may use, with oneDNN's kernels, one torso under both heads (the checkpoint's arrays).
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["batch_size"], config["minibatch_size"], config["envs_per_rank"], config["epochs"],
            config["clip_ratio"], config["clip_schedule"], config["ent_coef"], config["kl_targ"]) == \
        (256, 128, 4, 4, 0.1, "linear", 0.01, 0.0), config
    assert config["tf_intra_op_threads"] == config["rank0_cpus"] == cpus_available(), config
    assert config["tf_enable_onednn_opts"] == "1", config
    ac_state = load_latest_checkpoint(run_dir / "checkpoints")[1]["ac_state"]
    assert [a.shape for a in ac_state[-8:-6]] == [(512, 1), (1,)]  # the value head on the torso's 512 features
    # Resumed from its first iteration's checkpoint (in a copy of the run), the run ends bit for bit where the whole
    # one did: oneDNN's kernels on as many threads as before give the same numbers on the same CPU.
    part = tmp_path / "part"
    shutil.copytree(run_dir, part)
    (part / "checkpoints" / "ckpt_00000002.npz").unlink()
    resumed, out = train("--resume", str(part))
    assert "from ckpt_00000001.npz: iteration 1, step 256" in out
    for mine, theirs in zip(load_latest_checkpoint(resumed / "checkpoints")[1]["ac_state"], ac_state, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    # Exported, the shared torso's policy is one file of arrays that acts as the checkpoint's actor does.
    exported = run_bounded([sys.executable, TRAIN, "--export", str(run_dir), str(tmp_path / "pong.npz")], timeout=120)
    assert exported.returncode == 0, exported.stderr[-2000:]
    loaded, spec = NumpyActor.load(tmp_path / "pong.npz")
    assert spec["network"]["shared_torso"] and spec["network"]["cnn_layers"] == [[32, 8, 4], [64, 4, 2], [64, 3, 1]]
    frames = np.random.default_rng(3).integers(0, 256, (4, 84, 84, 4), dtype=np.uint8)
    actor = NumpyActor.from_ac_state(ac_state, (64, 64), loaded.obs, loaded.action, shared_torso=True)
    np.testing.assert_array_equal(loaded.value(frames), actor.value(frames))
    played = run_bounded([sys.executable, TRAIN, "--play", str(run_dir), "--episodes", "1"], timeout=240)
    assert played.returncode == 0 and played.stderr == "", played.stderr[-3000:]
    # A whole game of Pong: one side reaches 21, so the score is between -21 and 21 and not 0 points in all.
    (score,) = re.findall(r"episode 0: return (-?[\d.]+)", played.stdout)
    assert -21 <= float(score) <= 21 and float(score) != 0, played.stdout
