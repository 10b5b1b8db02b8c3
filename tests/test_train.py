"""train.py end to end: real MPI (mpi_fork under mpiexec), real gymnasium envs, real TensorFlow, small budgets."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import FEW_MINIBATCHES, REPO, USES_SMALL_RUN, run_bounded

from algos.numpy_actor import NumpyActor
from algos.registry import ALGORITHMS

TRAIN = str(REPO / "train.py")
# Columns that depend on the wall clock; every other logged value must be reproducible.
TIMING_COLUMNS = {"steps_per_s", "wall_s", "t_rollout", "t_gather", "t_update", "t_bcast", "t_eval"}


def train(*args: str, timeout: float = 240) -> tuple[Path, str]:
    """Run train.py, expect success, return (run directory, stdout)."""
    result = run_bounded([sys.executable, TRAIN, *args], timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    match = re.search(r"done: .* run directory (\S+)", result.stdout)
    assert match, result.stdout[-3000:]
    return Path(match.group(1)), result.stdout


def progress(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "progress.csv", newline="") as f:
        return list(csv.DictReader(f))


def reproducible_part(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in rows]


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


# Every algorithm in the registry learns each of these at 2 processes: (env, steps, threshold on the mean return of
# the last two iterations; random play gets about 22 and 8).
LEARNING_ENVS = [("CartPole-v1", 30720, 400.0), ("InvertedPendulum-v5", 30720, 500.0)]
LEARNING = [(env_id, algo, steps, threshold) for algo in ALGORITHMS for env_id, steps, threshold in LEARNING_ENVS]
SEEDS = {("CartPole-v1", "ppo"): 1}


@pytest.fixture(scope="module")
def learned_runs(runs_dir) -> dict[tuple[str, str], Path]:
    runs = {}
    for env_id, algo, steps, _ in LEARNING:
        run_dir, _ = train(env_id, "--algo", algo, "--nprocs", "2", "--total_steps", str(steps), "--check_sync",
                           "--seed", str(SEEDS.get((env_id, algo), 0)), "--logdir", str(runs_dir / f"{env_id}_{algo}"))
        runs[(env_id, algo)] = run_dir
    return runs


@pytest.mark.xdist_group("learned_runs")
@pytest.mark.parametrize(("env_id", "algo", "steps", "threshold"), LEARNING)
def test_learns_at_two_processes(learned_runs, env_id, algo, steps, threshold):
    rows = progress(learned_runs[(env_id, algo)])
    assert int(rows[-1]["total_steps"]) == steps  # stopped at its budget
    first = float(rows[0]["ep_return_mean"])
    last = [float(r["ep_return_mean"]) for r in rows[-2:]]
    assert sum(last) / 2 >= threshold, (first, last)
    assert all(r["sync_ok"] == "1.0" for r in rows)  # all ranks bit-identical after every broadcast


@pytest.mark.xdist_group("learned_runs")
def test_run_directory_has_config_csv_tensorboard_checkpoints_plot(learned_runs):
    run_dir = learned_runs[("CartPole-v1", "ppo")]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env_id"] == "CartPole-v1" and config["algo"] == "ppo" and config["nprocs"] == 2
    header = progress(run_dir)[0].keys()
    for column in ("iteration", "total_steps", "total_episodes", "ep_return_mean", "ep_return_min", "ep_return_max",
                   "steps_per_s", "kl", "entropy", "pi_loss", "v_loss", "t_rollout", "t_gather", "t_update",
                   "t_bcast"):
        assert column in header
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert [p.name for p in sorted((run_dir / "checkpoints").glob("ckpt_*.npz"))] == [
        "ckpt_00000010.npz", "ckpt_00000015.npz"]
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.xdist_group("learned_runs")
def test_tensorboard_reads_every_logged_value(learned_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = learned_runs[("CartPole-v1", "ppo")]
    rows = progress(run_dir)
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0}).Reload()
    for tag in ("ep_return_mean", "kl", "lr", "t_update", "total_episodes"):
        logged = events.Scalars(tag)
        assert [e.step for e in logged] == [int(r["total_steps"]) for r in rows]
        # Event files hold float32.
        assert [e.value for e in logged] == pytest.approx([float(r[tag]) for r in rows], rel=1e-6)


@pytest.mark.xdist_group("learned_runs")
@pytest.mark.parametrize("algo", [name for name, spec in ALGORITHMS.items() if "lr_schedule" in spec.defaults])
def test_learning_rate_decays_linearly_over_the_step_budget(learned_runs, algo):
    rows = progress(learned_runs[("CartPole-v1", algo)])
    lrs = [float(r["lr"]) for r in rows]
    # Update i (from 0) sees the budget with i batches already spent: lr * (1 - i * 2048 / 30720).
    lr = ALGORITHMS[algo].defaults["lr"]
    assert lrs == pytest.approx([lr * (1 - i / 15) for i in range(15)], rel=1e-6)


@pytest.mark.xdist_group("learned_runs")
def test_play_runs_saved_policy(learned_runs):
    run_dir = learned_runs[("InvertedPendulum-v5", "ppo")]
    result = run_bounded([sys.executable, TRAIN, "--play", str(run_dir), "--episodes", "2"], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    returns = [float(x) for x in re.findall(r"episode \d: return ([\d.]+)", result.stdout)]
    assert len(returns) == 2 and min(returns) >= 500, result.stdout


@pytest.mark.xdist_group("learned_runs")
def test_play_needs_no_tensorflow_and_writes_an_image_strip(learned_runs, tmp_path):
    run_dir = learned_runs[("InvertedPendulum-v5", "ppo")]
    strip = tmp_path / "strip.png"
    code = ("import sys, train; rc = train.main(); "
            "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(rc)")
    result = run_bounded([sys.executable, "-c", code, "--play", str(run_dir), "--episodes", "1", "--video",
                          str(strip)], timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tensorflow imported: False" in result.stdout
    assert strip.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import imageio.v2 as imageio

    image = imageio.imread(strip)
    assert image.shape == (480, 8 * 480, 3)  # 8 frames of gymnasium's default 480 x 480 side by side
    assert image.std() > 10  # a rendered scene, not a blank image


def test_strip_frames_are_evenly_spaced_over_an_episode_of_any_length_without_rendering_every_step():
    # The strip's recorder does not know the episode's length; each frame here is its step number.
    from trainer.play import STRIP_FRAMES, StripRecorder

    class Screen:
        renders, step = 0, 0

        def render(self) -> int:
            self.renders += 1
            return self.step

    for length in (0, 3, 31, 32, 100, 1000, 27000):
        screen = Screen()
        recorder = StripRecorder(screen)
        for screen.step in range(length + 1):
            recorder(screen.step)
        steps = recorder.strip()
        assert len(steps) == STRIP_FRAMES and steps[0] == 0 and steps == sorted(steps), (length, steps)
        assert steps[-1] > length - max(1, length / 16), (length, steps)  # the episode's end is in the strip
        gaps = np.diff(steps)
        assert gaps.max() - gaps.min() <= recorder.stride, (length, steps)  # evenly spaced, to within a stride
        assert screen.renders <= 4 * STRIP_FRAMES + 16 * np.log2(max(length, 16) / 16), (length, screen.renders)


@pytest.mark.xdist_group("learned_runs")
def test_resume_of_another_env_is_refused(learned_runs):
    run_dir = learned_runs[("CartPole-v1", "ppo")]
    result = run_bounded([sys.executable, TRAIN, "Walker2d", "--resume", str(run_dir)], timeout=60)
    assert result.returncode == 2
    assert f"--resume {run_dir} is a CartPole-v1 run, not Walker2d-v5" in result.stderr


@pytest.mark.xdist_group("learned_runs")
def test_video_says_what_to_install_before_any_episode_is_played(learned_runs, tmp_path):
    import importlib.util

    if importlib.util.find_spec("imageio_ffmpeg") or importlib.util.find_spec("pygame"):
        pytest.skip("imageio-ffmpeg or pygame is installed here: nothing is missing")
    mp4 = tmp_path / "walk.mp4"
    result = run_bounded([sys.executable, TRAIN, "--play", str(learned_runs[("InvertedPendulum-v5", "ppo")]),
                          "--video", str(mp4)], timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr.splitlines() == [f"train.py: error: --video {mp4}: .mp4 needs imageio-ffmpeg (pip install "
                                          "imageio-ffmpeg), or write a .gif or .png"]
    # CartPole renders with pygame, which gymnasium's classic-control extra brings: its own message says so.
    cartpole = learned_runs[("CartPole-v1", "ppo")]
    result = run_bounded([sys.executable, TRAIN, "--play", str(cartpole), "--video", str(tmp_path / "cart.gif")],
                         timeout=120)
    assert result.returncode == 2 and "episode" not in result.stdout, result.stdout
    (line,) = result.stderr.splitlines()
    assert line.startswith("train.py: error: cannot render CartPole-v1: ") and "classic-control" in line, line


def test_shared_batch_split_fills_every_batch_and_keeps_ranks_in_sync(runs_dir):
    # 3 ranks on 2 cores draw a 2000-step batch from one budget: train.py checks that rank 0 gathers exactly
    # 2000 steps every iteration, and --check_sync that every rank holds the same weights afterwards.
    run_dir, _ = train("Pendulum-v1", "--nprocs", "3", "--batch_split", "shared", "--total_steps", "6000",
                       "--batch_size", "2000", *FEW_MINIBATCHES, "--check_sync",
                       "--logdir", str(runs_dir / "shared_split"))
    rows = progress(run_dir)
    assert [int(r["total_steps"]) for r in rows] == [2000, 4000, 6000]
    assert all(r["sync_ok"] == "1.0" for r in rows)
    # Pendulum's episodes last 200 steps: of 6000 steps on 3 envs, each env leaves at most 199 in an unfinished one.
    assert 28 <= int(rows[-1]["total_episodes"]) <= 30
    assert json.loads((run_dir / "config.json").read_text())["batch_split"] == "shared"


# Every algorithm: the first with two envs per rank, the others with one.
RESUMES = [(algo, 2, 12) if i == 0 else (algo, 1, 14) for i, algo in enumerate(ALGORITHMS)]


@pytest.mark.parametrize(("algo", "envs_per_rank", "episodes_by_iteration_3"), RESUMES)
def test_resume_continues_exactly_like_an_uninterrupted_run_and_the_seed_decides_the_results(
        runs_dir, algo, envs_per_rank, episodes_by_iteration_3):
    # The same step budget for both, so the linear learning-rate schedule is the same: the first part stops
    # on an episode budget instead (Pendulum's episodes all last 200 steps; after iteration 3 each of the 2 x 1
    # envs has run 1536 steps, 7 episodes (5 after iteration 2), and each of the 2 x 2 envs 768 steps, 3 episodes
    # (2)). Evaluations at iterations 2, 4 and 6 continue too, with the best so far.
    common = ["Pendulum-v1", "--algo", algo, "--nprocs", "2", "--envs_per_rank", str(envs_per_rank),
              "--batch_size", "1024", "--checkpoint_every", "3", "--total_steps", "6144", "--eval_every", "2",
              "--eval_episodes", "3", *FEW_MINIBATCHES]
    whole, _ = train(*common, "--logdir", str(runs_dir / f"whole_{algo}{envs_per_rank}"))
    part, _ = train(*common, "--num_episodes", str(episodes_by_iteration_3),
                    "--logdir", str(runs_dir / f"part_{algo}{envs_per_rank}"))
    # Same seed, same results: another process logged the whole run's first three rows; another seed differs from
    # the first iteration on (once: the seed reaches the rollouts the same way whatever the algorithm).
    assert reproducible_part(progress(part)) == reproducible_part(progress(whole))[:3]
    if envs_per_rank == 2:
        other, _ = train(*common, "--seed", "1", "--num_episodes", "1",
                         "--logdir", str(runs_dir / f"other_seed_{algo}{envs_per_rank}"))
        assert reproducible_part(progress(other))[0] != reproducible_part(progress(whole))[0]
    resumed, out = train("--resume", str(part), "--nprocs", "2", "--num_episodes", "1000")
    assert resumed == part
    assert "from ckpt_00000003.npz: iteration 3, step 3072" in out
    assert reproducible_part(progress(resumed)) == reproducible_part(progress(whole))
    assert in_documented_order(list(progress(whole)[0]))
    best = [NumpyActor.load(run / "best_policy.npz") for run in (resumed, whole)]
    assert best[0][1] == best[1][1] and all(np.array_equal(a, b) for a, b in
                                            zip(best[0][0].state_arrays(), best[1][0].state_arrays(), strict=True))


def documented_columns() -> list[str]:
    """progress.csv's columns as docs/training.md lists them, in its order."""
    text = (REPO / "docs" / "training.md").read_text().split("### progress.csv", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE)


def in_documented_order(header: list[str]) -> bool:
    documented = documented_columns()
    return set(header) <= set(documented) and header == sorted(header, key=documented.index)


def test_evaluation_scores_the_policy_keeps_the_best_and_changes_nothing_of_the_training(runs_dir):
    common = ["CartPole-v1", "--nprocs", "2", "--batch_size", "512", "--total_steps", "2048", *FEW_MINIBATCHES]
    evaluated, shown = train(*common, "--eval_every", "2", "--eval_episodes", "3", "--logdir", str(runs_dir / "eval"))
    plain, plain_shown = train(*common, "--logdir", str(runs_dir / "no_eval"))
    rows = progress(evaluated)
    assert list(rows[0]) == [c for c in documented_columns() if c not in ("backtracks", "lag_weight_max")]
    scores = [row["eval_return_mean"] for row in rows]
    assert scores[0] == scores[2] == "nan" and "nan" not in (scores[1], scores[3]), scores
    # The console shows each evaluation's score beside the training episodes' (a run that does not evaluate has no
    # such column).
    header, *lines = [line.split() for line in shown.splitlines() if line.split()[:2] in (["iter", "steps"],
                                                                                          ["2", "1024"])]
    assert header[6] == "eval" and lines[0][6] == f"{float(scores[1]):.1f}", shown
    assert "eval" not in next(line for line in plain_shown.splitlines() if line.split()[:1] == ["iter"])
    assert [{k: v for k, v in row.items() if not k.startswith("eval_")} for row in reproducible_part(rows)] == \
        reproducible_part(progress(plain))
    assert b"eval_return_mean" in next((evaluated / "tb").iterdir()).read_bytes()
    # --play plays the very episodes that scored the best policy (the same seeds, the deterministic policy).
    actor, spec = NumpyActor.load(evaluated / "best_policy.npz")
    assert spec["eval_return_mean"] == max(float(s) for s in scores if s != "nan") and spec["eval_episodes"] == 3
    played = run_bounded([sys.executable, TRAIN, "--play", str(evaluated / "best_policy.npz"), "--episodes", "3"], 60)
    assert f"mean return {spec['eval_return_mean']:.1f} over 3 episodes" in played.stdout, played.stdout


@USES_SMALL_RUN
def test_resume_with_other_nprocs_keeps_counters_other_versions_are_named_and_a_resume_without_nprocs_keeps_them(
        small_run):
    from trainer.checkpoint import load_latest_checkpoint, save_checkpoint

    part = small_run  # 2 processes, 2 iterations of 1,536 steps
    versions = json.loads((part / "config.json").read_text())["versions"]
    assert {"python", "numpy", "tensorflow", "gymnasium", "mujoco", "mpi4py", "mpi_library", "cpu_model",
            "openblas_coretype"} <= set(versions), versions
    # The checkpoint as another numpy would have written it: --resume names the difference in one line.
    path, state, _ = load_latest_checkpoint(part / "checkpoints")
    assert state["versions"] == versions
    state["versions"] = {**versions, "numpy": "1.0.0"}
    save_checkpoint(part / "checkpoints", int(path.stem.split("_")[1]), state)
    resumed, out = train("--resume", str(part), "--nprocs", "3", "--total_steps", "6144", "--check_sync")
    assert "(was 2 processes: fresh episodes)" in out
    warnings = [line for line in out.splitlines() if "other versions" in line]
    assert warnings == [f"train.py: warning: {path.name} was written with other versions (numpy 1.0.0 -> "
                        f"{versions['numpy']}); the run continues, but not bit for bit as it would have"], out
    # The 3 ranks hold bit-identical weights after every broadcast (--check_sync, given at the resume).
    assert [(int(r["total_steps"]), r["sync_ok"]) for r in progress(resumed)] == \
        [(1536, "nan"), (3072, "nan"), (4608, "1.0"), (6144, "1.0")]
    assert json.loads((resumed / "config.json").read_text())["nprocs"] == 3
    # Without --nprocs a resume keeps the run's count, and with it every rank's episodes.
    resumed, out = train("--resume", str(part), "--total_steps", "7680")
    assert "PPO on CartPole-v1: 3 processes" in out, out
    assert "fresh episodes" not in out and "other versions" not in out, out
    assert json.loads((resumed / "config.json").read_text())["nprocs"] == 3
    assert [int(r["total_steps"]) for r in progress(resumed)][-2:] == [6144, 7680]


def test_bare_env_name_resolves_to_newest_version():
    from trainer.config import resolve_env_id

    assert resolve_env_id("Walker2d") == "Walker2d-v5"
    assert resolve_env_id("CartPole") == "CartPole-v1"
    assert resolve_env_id("Hopper-v4") == "Hopper-v4"
    # Again in a process of its own, where looking at CartPole-v0 (the form of ale-py's older ids) is what first
    # registers ale-py's envs, in the middle of the lookup.
    code = "from trainer.config import resolve_env_id; print(resolve_env_id('CartPole'))"
    fresh = run_bounded([sys.executable, "-c", code], timeout=60)
    assert (fresh.returncode, fresh.stdout) == (0, "CartPole-v1\n"), fresh.stderr[-2000:]


def test_help_explains_every_option():
    result = run_bounded([sys.executable, TRAIN, "--help"], timeout=60)
    assert result.returncode == 0
    for option in ("--algo", "--nprocs", "--gpu_pct", "--total_steps", "--num_episodes", "--batch_size", "--gamma",
                   "--lam", "--kl_targ", "--hidden", "--seed", "--logdir", "--resume", "--play", "--video",
                   "--check_sync", "--checkpoint_every", "--hostfile", "--mpiexec_args", "--policy_lag"):
        assert option in result.stdout
    one_line = " ".join(result.stdout.split())  # argparse wraps the help at the terminal's width
    assert "(default: 2048, Atari 1024)" in one_line and "(default: ppo)" in one_line


BAD_INPUTS = [
    (["Walker2dd"], "unknown environment 'Walker2dd'; closest registered: Walker2d"),
    (["Breakout"], "unknown environment 'Breakout'; did you mean ALE/Breakout-v5 or MinAtar/Breakout-v1?"),
    (["minatar/breakout"], "unknown environment 'minatar/breakout'; did you mean MinAtar/Breakout-v1?"),
    (["Blackjack-v1"], "Blackjack-v1: observation space Tuple(Discrete(32), Discrete(11), Discrete(2)) is not "
                       "supported; supported: observations: a Box of one dimension"),
    (["CartPole-v1", "--nprocs", "two"], "--nprocs must be an integer >= 1, got 'two'"),
    (["CartPole-v1", "--nprocs", "0"], "--nprocs must be an integer >= 1, got '0'"),
    (["CartPole-v1", "--gpu_pct", "1.5"], "--gpu_pct must be in [0, 1]"),
    (["CartPole-v1", "--gpu_pct", "-0.1"], "--gpu_pct must be in [0, 1]"),
    (["CartPole-v1", "--nprocs", "4", "--batch_size", "3"], "--batch_size 3 is smaller than --nprocs 4"),
    (["CartPole-v1", "--nprocs", "2", "--envs_per_rank", "3", "--batch_size", "5"],
     "--batch_size 5 is smaller than --nprocs x --envs_per_rank (2 x 3)"),
    (["CartPole-v1", "--envs_per_rank", "0"], "--envs_per_rank must be at least 1, got 0"),
    (["CartPole-v1", "--total_steps", "0"], "--total_steps must be at least 1"),
    (["CartPole-v1", "--num_episodes", "-5"], "--num_episodes must be at least 1"),
    (["CartPole-v1", "--gamma", "1.5"], "--gamma must be in (0, 1]"),
    (["CartPole-v1", "--lam", "0"], "--lam must be in (0, 1]"),
    (["CartPole-v1", "--hidden", "64,x"], "--hidden must be comma-separated layer sizes"),
    (["CartPole-v1", "--lr", "inf"], "--lr must be a finite number, got inf"),
    (["CartPole-v1", "--kl_targ", "nan"], "--kl_targ must be a finite number, got nan"),
    (["CartPole-v1", "--seed", "-1"], "--seed must be a non-negative integer, got -1"),
    (["CartPole-v1", "--stop_grace", "0"], "--stop_grace must be > 0 seconds, got 0.0"),
    (["CartPole-v1", "--stall_timeout", "10m"], "--stall_timeout must be 'auto', a number of seconds, or 0 to wait "
                                                "forever, got '10m'"),
    (["CartPole-v1", "--stall_timeout", "-1"], "--stall_timeout must be 'auto', a number of seconds, or 0"),
    (["CartPole-v1", "--eval_every", "-1"], "--eval_every must be >= 0 iterations (0: never), got -1"),
    (["CartPole-v1", "--eval_every", "2", "--eval_episodes", "0"], "--eval_episodes must be at least 1, got 0"),
    (["--resume", "/nonexistent/run"], "not a run directory (no config.json)"),
    (["CartPole-v1", "--nprocs", "2", "--hostfile", "/no/hosts"], "--hostfile /no/hosts: no such file"),
    (["CartPole-v1", "--hostfile", __file__], "--hostfile needs --nprocs N with N >= 2"),
    (["CartPole-v1", "--nprocs", "2", "--mpiexec_args=-genv X 'unclosed"], "--mpiexec_args '-genv X 'unclosed': "
                                                                           "No closing quotation"),
    ([], "name an environment"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_is_one_clear_line_before_any_work(tmp_path, args, message):
    result = run_bounded([sys.executable, TRAIN, *args, "--logdir", str(tmp_path)], timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: "), result.stderr
    assert message in lines[0], lines[0]
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_first_command_prints_only_our_own_lines(tmp_path):
    # The README's first command, shortened: no TensorFlow start-up lines, no library warnings, on any rank.
    result = run_bounded([sys.executable, TRAIN, "Walker2d", "--nprocs", "2", "--total_steps", "4096",
                          "--logdir", str(tmp_path)], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""
    ours = [r"PPO on Walker2d-v5: 2 processes, batch 2048 steps, budget 4096 steps; run directory \S+",
            r" iter +steps +eps .*", r" +[12] +(2048|4096) .*", r"done: 4096 steps, \d+ episodes in \d+ s; .*"]
    for line in result.stdout.splitlines():
        assert any(re.fullmatch(pattern, line) for pattern in ours), line


def test_workers_import_no_tensorflow_and_a_budget_below_one_batch_says_what_runs(tmp_path):
    env = {"FAULT_KIND": "report_modules", "FAULT_REPORT_DIR": str(tmp_path)}
    result = run_bounded([sys.executable, TRAIN, "tests.faulty_env:FaultyPendulum-v0", "--nprocs", "3",
                          "--batch_size", "1536", "--total_steps", "1000", *FEW_MINIBATCHES,
                          "--logdir", str(tmp_path / "runs")],
                         timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("train.py: note: the budget is spent in whole batches: --total_steps 1000 runs one iteration of "
            "--batch_size 1536 steps") in result.stdout, result.stdout
    reports = [json.loads((tmp_path / f"modules_{r}.json").read_text()) for r in range(3)]
    assert "tensorflow" in reports[0]["modules"]  # rank 0 learns
    assert reports[1]["modules"] == reports[2]["modules"] == [], reports
    assert max(reports[1]["resident_mb"], reports[2]["resident_mb"]) < 250, reports  # TensorFlow alone is ~580 MB


@USES_SMALL_RUN
def test_resume_honours_changes_however_spelled_and_refuses_the_rest(small_run):
    run_dir = small_run  # 2 iterations of 1,536 steps
    train("--resume", str(run_dir), "--total_steps=4608")  # "=" form
    assert len(progress(run_dir)) == 3
    train("--resume", str(run_dir), "--total", "6144")  # an abbreviation argparse accepts
    assert len(progress(run_dir)) == 4
    for args, message in [(["--algo=trpo"], f"--resume {run_dir} is a ppo run, not trpo"),
                          (["--algo", "trpo"], f"--resume {run_dir} is a ppo run, not trpo"),
                          (["--lr", "0.001"], "--lr is 0.0003 in this run and cannot be changed when resuming"),
                          (["--hidden", "32"], "--hidden is (64, 64) in this run and cannot be changed")]:
        result = run_bounded([sys.executable, TRAIN, "--resume", str(run_dir), *args], timeout=60)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
    assert len(progress(run_dir)) == 4


def test_lr_sets_trpo_value_function_learning_rate_and_config_records_it(tmp_path):
    # Learner is what train() runs on rank 0; run in a fresh process (TensorFlow's threads are set once per process).
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from algos.spaces import ActionSpec, ObsSpec\n"
        "from trainer.config import build_config\n"
        "from trainer.learner import Learner\n"
        "from trainer.options import parse_args\n"
        "for argv in (['CartPole-v1', '--algo', 'trpo'], ['CartPole-v1', '--algo', 'trpo', '--lr', '0.02'],\n"
        "             ['CartPole-v1']):\n"
        "    config, _, _ = build_config(parse_args(argv))\n"
        "    learner = Learner(config, Path(sys.argv[1]), ObsSpec((4,)), ActionSpec((), (2,)), False, 1)\n"
        "    optimizer = getattr(learner.algo, 'vf_optimizer', None) or learner.algo.optimizer\n"
        "    print(json.dumps([config.lr, float(optimizer.learning_rate.numpy())]))\n"
    )
    result = run_bounded([sys.executable, "-c", code, str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("[")]
    assert lines == [[1e-3, pytest.approx(1e-3)], [0.02, pytest.approx(0.02)], [3e-4, pytest.approx(3e-4)]]


def test_every_train_option_the_docs_mention_is_in_help():
    # docs/training.md is train.py's manual: each `--option` it names, and each option of a train.py command in the
    # README or docs, must be one that --help lists (a renamed or removed option fails here, not on a user).
    help_text = run_bounded([sys.executable, TRAIN, "--help"], timeout=60).stdout
    listed = set(re.findall(r"(--[a-z_]+)", help_text))
    mentioned = set(re.findall(r"`(--[a-z_]+)", (REPO / "docs" / "training.md").read_text()))
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for command in re.findall(r"train\.py[^`|\n]*", doc.read_text()):
            mentioned |= set(re.findall(r"\s(--[a-z_]+)", command))
    assert len(mentioned) > 20
    assert sorted(mentioned - listed) == []


def test_track_logs_every_iteration_to_weights_and_biases_offline_from_rank_0(tmp_path):
    pytest.importorskip("wandb", reason="wandb not installed (pip install -e '.[test]' brings it)")
    result = run_bounded([sys.executable, TRAIN, "CartPole-v1", "--nprocs", "2", "--batch_size", "512",
                          "--total_steps", "1024", *FEW_MINIBATCHES, "--track", "--logdir", str(tmp_path)], 120,
                         {"WANDB_MODE": "offline"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = next(tmp_path.iterdir())
    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{run_dir.name}")
    assert (f"tracking with Weights & Biases: project mpi-batch-rl, run {run_dir.name}, offline in {offline} "
            "(wandb sync it later)") in result.stdout.splitlines()
    assert "wandb:" not in result.stdout + result.stderr  # W&B's own start-up lines held back
    log = (offline / f"run-{run_dir.name}.wandb").read_bytes()
    assert all(key in log for key in (b"ep_return_mean", b"steps_per_s", b"wandb_project", b"CartPole-v1"))
