"""Stable-Baselines3's PPO and A2C on MPI ranks through mpi_util.sb3, SB3 unmodified, under a real mpiexec.

SB3 and torch run in subprocesses only: the pytest process imports TensorFlow in other tests.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time

import numpy as np
import pytest
from conftest import REPO, mpiexec, run_bounded

pytestmark = pytest.mark.skipif(importlib.util.find_spec("stable_baselines3") is None,
                                reason="stable-baselines3 not installed (pip install -e '.[test]')")
CASES = str(REPO / "tests" / "mpi_scripts" / "sb3_cases.py")
ROLLOUT_ARRAYS = ("observations", "actions", "rewards", "returns", "advantages", "log_probs")


def test_one_process_gives_plain_sb3_results_bit_for_bit(tmp_path):
    result = run_bounded([sys.executable, CASES, "one_process", str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ppo: 19 arrays, differ from plain SB3: []; steps 640 640" in result.stdout, result.stdout
    assert "a2c: 19 arrays, differ from plain SB3: []; steps 160 160" in result.stdout, result.stdout


# Tests that read one job's output (made by the first of them to run, in the worker's temporary directory) share an
# xdist_group: one worker runs them, and the job runs once.
@pytest.mark.xdist_group("sb3_two_ranks")
@pytest.mark.parametrize(("algo", "n_steps"), [("ppo", 64), ("a2c", 16)])
def test_two_ranks_rank0_trains_on_both_ranks_rollouts_in_rank_order(tmp_path_factory, algo, n_steps):
    out = tmp_path_factory.getbasetemp() / "sb3_two_ranks"
    if not (out / f"two_ranks_{algo}_rank1.npz").exists():  # one job runs both algorithms
        out.mkdir(exist_ok=True)
        result = mpiexec(2, "sb3_cases.py", "two_ranks", str(out), timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "ppo: ranks out of sync: []" in result.stdout and "a2c: ranks out of sync: []" in result.stdout
        lines = result.stdout.splitlines()
        assert ("mpi_util.sb3: PPO on 2 ranks learns from 64 steps x 3 envs = 192 steps per update, 1.5x one "
                    "process's 128; parallelize(model, split_n_steps=True) keeps the model's batch instead" in lines
                and "mpi_util.sb3: PPO on 2 ranks learns from 32 steps x 2 envs = 64 steps per update (n_steps 64 "
                    "split over the ranks: the batch the model was built for)" in lines
                and "split: n_steps 32, rank 0's buffer (64, 3), steps 64" in lines  # 32 steps x 2 envs
                and "refused: parallelize: split_n_steps: n_steps 63 does not split evenly over 2 ranks; build the "
                    "model with an n_steps that is a multiple of 2, or leave split_n_steps off" in lines), lines
    rank0, rank1 = (np.load(out / f"two_ranks_{algo}_rank{r}.npz") for r in (0, 1))
    for name in ROLLOUT_ARRAYS:
        mine, theirs, trained = rank0[f"local/{name}"], rank1[f"local/{name}"], rank0[f"trained/{name}"]
        assert mine.shape[:2] == (n_steps, 2) and theirs.shape[:2] == (n_steps, 1)  # rank 0: 2 envs, rank 1: 1
        if trained.shape[:2] == (n_steps, 3):  # arrays SB3's get() leaves as they are: (steps, envs)
            expected = np.concatenate([mine, theirs], axis=1)
        else:  # flattened by get(): env 0's steps, then env 1's, ... rank 0's envs first
            expected = np.concatenate([a.swapaxes(0, 1).reshape(-1, *a.shape[2:]) for a in (mine, theirs)])
        assert np.array_equal(trained.reshape(expected.shape), expected), name
    for rank in (rank0, rank1):
        assert int(rank["num_timesteps"]) == 2 * 3 * n_steps  # both ranks count every rank's steps
        # VecNormalize statistics: SB3's initial count (1e-4), the 3 envs' first observations, every step's
        assert float(rank["obs_rms/count"]) == pytest.approx(1e-4 + 3 + 2 * 3 * n_steps, abs=1e-9)


def test_ppo_example_learns_on_two_ranks_with_identical_weights_and_quiet_stderr_and_evaluates_in_one_process(
        tmp_path):
    saved = tmp_path / "ppo"
    result = run_bounded([sys.executable, str(REPO / "examples" / "sb3_ppo_mpi.py"), "--nprocs", "2",
                          "--total_steps", "12288", "--save", str(saved)], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"12288 steps, mean return of the last (\d+) episodes ([\d.]+)", result.stdout)
    assert found, result.stdout
    # Random play scores about 22; seen at this budget, seeds 0-1: 89-91 (162-166 at 20480 steps, in 1.7x the time).
    assert int(found.group(1)) == 100 and float(found.group(2)) > 50, result.stdout
    assert "ranks whose weights differ from rank 0's: []" in result.stdout
    assert result.stderr == ""  # no TensorFlow start-up lines: tensorboard did not import it
    # rank 0 saved the model and the VecNormalize statistics; a plain process (no MPI) loads both, frozen
    evaluation = run_bounded([sys.executable, str(REPO / "examples" / "sb3_evaluate.py"), str(saved),
                              "--episodes", "5"], timeout=120)
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    found = re.search(r"mean return over 5 episodes ([\d.]+)", evaluation.stdout)
    assert found and float(found.group(1)) > 100, evaluation.stdout  # seen, seeds 0-1: 404, 500 (the most)


LOGS_WITHOUT_TENSORFLOW = """
import sys
import mpi_util.sb3
import gymnasium as gym
from stable_baselines3 import PPO
model = mpi_util.sb3.parallelize(PPO("MlpPolicy", gym.make("CartPole-v1"), n_steps=64, batch_size=32, device="cpu",
                                     tensorboard_log=sys.argv[1]))
model.learn(128)
print("tensorflow imported:", "tensorflow" in sys.modules)
"""


def test_sb3_tensorboard_logs_are_written_without_importing_tensorflow(tmp_path):
    # TensorFlow loaded before torch's triton aborts the process (LLVM ERROR: inconsistency in registered
    # CommandLine options); this checks its cause, TensorFlow in the process, is absent.
    result = run_bounded([sys.executable, "-c", LOGS_WITHOUT_TENSORFLOW, str(tmp_path)], timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tensorflow imported: False" in result.stdout
    events = list(tmp_path.glob("PPO_1/events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 100
    assert result.stderr == ""


def test_importing_the_adapter_after_sb3_with_tensorflow_loaded_says_what_to_do():
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow not installed: SB3's logger cannot load it")
    code = "import stable_baselines3, sys; assert 'tensorflow' in sys.modules; import mpi_util.sb3"
    result = run_bounded([sys.executable, "-c", code], timeout=120, cwd=REPO)
    assert result.returncode == 1
    assert "ImportError: mpi_util.sb3: import it before stable_baselines3" in result.stderr.splitlines()[-1]


def test_parallelize_failing_on_rank_0_fails_on_every_rank(tmp_path):
    started = time.monotonic()
    result = mpiexec(2, "sb3_cases.py", "rank0_fails", str(tmp_path), timeout=60, check=False)
    assert result.returncode != 0
    assert "rank 0 raised ValueError: parallelize: the model has no env" in result.stdout, result.stdout
    assert ("rank 1 raised RuntimeError: parallelize failed on rank 0: ValueError: parallelize: the model has no env; "
            "pass this rank's env when building it; every rank stops here") in result.stdout, result.stdout
    assert time.monotonic() - started < 60


REFUSALS = """
import mpi_util.sb3, gymnasium as gym
from stable_baselines3 import DQN, PPO, SAC
for model in (SAC("MlpPolicy", gym.make("Pendulum-v1"), device="cpu"),
              DQN("MlpPolicy", gym.make("CartPole-v1"), device="cpu"),
              PPO("MlpPolicy", gym.make("CartPole-v1"), device="cpu").policy):  # the policy instead of the model
    try:
        mpi_util.sb3.parallelize(model)
    except TypeError as error:
        print(error)
"""


def test_parallelize_refuses_what_is_not_an_on_policy_model_or_ars_and_says_what_it_is():
    result = run_bounded([sys.executable, "-c", REFUSALS], timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    takes = "parallelize takes on-policy algorithms (PPO, A2C, TRPO, MaskablePPO, RecurrentPPO) and ARS"
    assert result.stdout.splitlines() == [
        f"parallelize: SAC is an off-policy algorithm: it learns between steps from a replay buffer, not from batches "
        f"of rollouts; {takes}",
        f"parallelize: DQN is an off-policy algorithm: it learns between steps from a replay buffer, not from batches "
        f"of rollouts; {takes}",
        "parallelize: ActorCriticPolicy is not an on-policy or ARS algorithm; parallelize takes Stable-Baselines3's "
        "and sb3-contrib's on-policy algorithms (PPO, A2C, TRPO, MaskablePPO, RecurrentPPO, other subclasses of "
        "OnPolicyAlgorithm) and ARS"]


needs_contrib = pytest.mark.skipif(importlib.util.find_spec("sb3_contrib") is None,
                                   reason="sb3-contrib not installed (pip install -e '.[test]')")
CONTRIB_CASES = str(REPO / "tests" / "mpi_scripts" / "sb3_contrib_cases.py")


@needs_contrib
def test_sb3_contrib_at_one_process_gives_plain_sb3_contrib_results_bit_for_bit(tmp_path):
    result = run_bounded([sys.executable, CONTRIB_CASES, "one_process", str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for algo, arrays in (("trpo", 19), ("mask", 12), ("rec", 23)):
        assert f"{algo}: {arrays} arrays, differ from plain sb3-contrib: []; steps 128 128" in result.stdout, \
            result.stdout


# What random play scores (TRPO on CartPole about 22, MaskablePPO 5 of 20, RecurrentPPO's memory task 0.5 of 1) and
# the threshold; seen at 2 ranks: 105, 18.4, 1.0.
LEARNED = {"trpo": 60.0, "mask": 12.0, "rec": 0.9}


@needs_contrib
@pytest.mark.xdist_group("sb3_contrib_two_ranks")
@pytest.mark.parametrize("algo", ["trpo", "mask", "rec"])
def test_sb3_contrib_at_two_ranks_learns_on_both_ranks_rows_in_rank_order(tmp_path_factory, algo):
    out = tmp_path_factory.getbasetemp() / "sb3_contrib_two_ranks"
    if not (out / f"{algo}_rank1.npz").exists():  # one job runs the three algorithms
        out.mkdir(exist_ok=True)
        result = mpiexec(2, "sb3_contrib_cases.py", "two_ranks", str(out), timeout=120)
        assert all(f"{a}: {steps} steps, ranks out of sync: []" in result.stdout
                   for a, steps in (("trpo", 12288), ("mask", 6144), ("rec", 6144))), result.stdout
    rank0, rank1 = (np.load(out / f"{algo}_rank{r}.npz") for r in (0, 1))
    names = [key.removeprefix("local/") for key in rank0.files if key.startswith("local/")]
    expected_names = {"trpo": 8, "mask": 9, "rec": 12}[algo]  # SB3's 8, action_masks, the 4 LSTM states
    assert len(names) == expected_names and {"action_masks", "hidden_states_pi"} & set(names) == (
        {"trpo": set(), "mask": {"action_masks"}, "rec": {"hidden_states_pi"}}[algo])
    for name in names:
        axis = int(rank0[f"axis/{name}"])
        mine, theirs, trained = rank0[f"local/{name}"], rank1[f"local/{name}"], rank0[f"trained/{name}"]
        assert mine.shape[axis] == 2 and theirs.shape[axis] == 1  # rank 0: 2 envs, rank 1: 1
        if trained.shape[axis] == 3 and trained.ndim == mine.ndim:  # arrays get() leaves as they are
            expected = np.concatenate([mine, theirs], axis=axis)
        else:  # flattened by get(), keeping each env's sequence: env 0's steps, then env 1's, ... rank 0's envs first
            expected = np.concatenate([np.moveaxis(a, axis, 0).reshape(-1, *np.delete(a.shape, [0, axis]))
                                       for a in (mine, theirs)])
        assert np.array_equal(trained.reshape(expected.shape), expected), name
        if name.endswith("_states_pi"):  # the LSTM carries its state across rollouts: rank 1's first row is not 0
            assert np.abs(theirs[0]).max() > 0, name
    assert float(rank0["mean_return"]) > LEARNED[algo]


@needs_contrib
def test_a_buffer_with_an_array_nobody_named_is_refused_on_every_rank_then_gathered_when_named(tmp_path):
    result = mpiexec(2, "sb3_contrib_cases.py", "unknown_array", str(tmp_path), timeout=60)
    for rank in (0, 1):
        assert (f"rank {rank} refused: parallelize: the rollout buffer CostBuffer holds arrays mpi_util.sb3 does not "
                "know how to gather: costs; name the axis that indexes envs of each, for example "
                "parallelize(model, env_axes={'costs': 1})") in result.stdout, result.stdout
    assert "with env_axes: trained rows 64" in result.stdout


def test_callbacks_run_on_rank_0_alone_with_every_ranks_steps_and_its_stop_ends_every_rank(tmp_path):
    # rank 0 steps 2 envs and rank 1 one: 3 steps over all ranks per step, 96 per 32-step iteration
    started = time.monotonic()
    result = mpiexec(2, "sb3_cases.py", "callbacks", str(tmp_path), timeout=60)
    record = json.loads((tmp_path / "record_rank0.json").read_text())
    assert record == {"start": 1, "steps": list(range(3, 3 * 96 + 1, 3)), "end": 1}
    assert not (tmp_path / "record_rank1.json").exists()  # rank 1's copy was never called, not even at the start
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "rank0_192_steps.zip", "rank0_288_steps.zip", "rank0_96_steps.zip"]  # every 32 calls, named by global steps
    assert [p.name for p in tmp_path.glob("eval_rank*")] == ["eval_rank0"]
    assert np.load(tmp_path / "eval_rank0" / "evaluations.npz")["timesteps"].tolist() == [192]  # after 64 calls
    # rank 0's callback stopped its 40th step (120 steps in all): both ranks leave learn with rank 0's count
    assert re.search(r"rank 0: stopped after [\d.]+ s at num_timesteps 120, env 0 stepped 136 times", result.stdout)
    assert re.search(r"rank 1: stopped after [\d.]+ s at num_timesteps 120, env 0 stepped 160 times", result.stdout)
    assert time.monotonic() - started < 60


def test_subproc_vec_env_in_every_rank_by_every_start_method_gives_the_dummy_vec_envs_results_bit_for_bit(tmp_path):
    # forkserver and spawn import sb3_cases.py again in each env's process, `import mpi_util` first: without MPI there
    result = mpiexec(2, "sb3_cases.py", "vec_envs", str(tmp_path), timeout=120)
    assert result.stderr == ""  # no "PMI_Init returned -1"
    for kind in ("dummy", "fork", "forkserver", "spawn"):
        assert f"{kind}: ranks out of sync: []" in result.stdout, result.stdout
    dummy = {rank: np.load(tmp_path / f"vec_envs_dummy_rank{rank}.npz") for rank in (0, 1)}
    for method in ("fork", "forkserver", "spawn"):
        for rank in (0, 1):
            subproc = np.load(tmp_path / f"vec_envs_{method}_rank{rank}.npz")
            assert int(subproc["num_timesteps"]) == 2 * 2 * 2 * 32  # two iterations of 2 ranks x 2 envs x 32 steps
            # SB3 seeds a SubprocVecEnv's envs as a DummyVecEnv's: the same rollouts, the same weights, bit for bit
            assert [k for k in subproc.files if not np.array_equal(subproc[k], dummy[rank][k])] == [], (method, rank)


ARS_CASES = str(REPO / "tests" / "mpi_scripts" / "ars_cases.py")


@needs_contrib
def test_ars_at_one_process_gives_plain_ars_results_bit_for_bit(tmp_path):
    result = run_bounded([sys.executable, ARS_CASES, "one_process", str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    # weights, policy, every candidate's episode returns (and VecNormalize's statistics): a linear policy on Pendulum
    # behind VecNormalize with 2 envs; an MLP from random weights on CartPole, 2 episodes per candidate; and the linear
    # policy with its candidates evaluated by an AsyncEval of 2 worker processes
    for line in ("linear: 9 arrays, differ from plain ARS: []; steps 6400 6400; updates 2 2",
                 "mlp: 6 arrays, differ from plain ARS: []; steps 1664 1664; updates 8 8",
                 "async_eval: 9 arrays, differ from plain ARS: []; steps 3200 3200; updates 2 2",
                 "env_axes refused: parallelize: env_axes and split_n_steps concern a rollout buffer, and ARS has "
                 "none; leave them out"):
        assert line in result.stdout, result.stdout


def ars_two_ranks(tmp_path_factory) -> tuple[dict[str, list[dict]], str]:
    """The records and output of one 2-rank job of ars_cases.py, run by the first test that asks:
    ({case: [rank 0's record, rank 1's]}, stdout)."""
    out = tmp_path_factory.getbasetemp() / "ars_two_ranks"
    if not (out / "stdout.txt").exists():
        out.mkdir(exist_ok=True)
        result = mpiexec(2, "ars_cases.py", "two_ranks", str(out), timeout=120)
        (out / "stdout.txt").write_text(result.stdout)
    records = {case: [json.loads((out / f"{case}_rank{r}.json").read_text()) for r in (0, 1)]
               for case in ("shares", "learns", "async_eval")}
    return records, (out / "stdout.txt").read_text()


@needs_contrib
@pytest.mark.xdist_group("ars_two_ranks")
def test_ars_at_two_ranks_shares_each_updates_candidates_and_every_rank_ends_with_rank_0s_weights_and_all_steps(
        tmp_path_factory):
    records, stdout = ars_two_ranks(tmp_path_factory)
    assert "shares: ranks out of sync: []" in stdout, stdout  # policy, weights, VecNormalize statistics
    rank0, rank1 = records["shares"]
    # 2 updates of 6 candidates, one 200-step Pendulum episode each: each rank evaluated 3 candidates per update
    assert rank0["env_steps"] == rank1["env_steps"] == 2 * 3 * 200
    assert rank0["num_timesteps"] == rank1["num_timesteps"] == 2 * 6 * 200  # learn(2000) counted both ranks' steps
    assert rank0["updates"] == rank1["updates"] == 2
    assert (rank0["episodes"], rank1["episodes"]) == (6, 3)  # rank 0 logs every candidate's episode
    assert (rank0["callback_calls"], rank1["callback_calls"]) == (1200, 0)  # callbacks: rank 0's steps, rank 0 only
    for rank in (rank0, rank1):
        # VecNormalize's observation count: SB3's 1e-4, each rank's reset at learn's start, each candidate's first
        # observation (evaluate_policy resets the env), each step's: every rank's additions merged
        assert rank["obs_count"] == pytest.approx(1e-4 + 2 + 12 + 2400, abs=1e-9)
        assert rank["ret_count"] == pytest.approx(1e-4 + 2400, abs=1e-9)
    # each rank's AsyncEval (2 workers) evaluated its 4 of 8 candidates
    assert "async_eval: ranks out of sync: []" in stdout, stdout
    assert [r["num_timesteps"] for r in records["async_eval"]] == [2 * 8 * 200] * 2
    assert [r["episodes"] for r in records["async_eval"]] == [8, 4]


@needs_contrib
@pytest.mark.xdist_group("ars_two_ranks")
def test_ars_at_two_ranks_takes_the_steps_of_one_process_when_a_return_depends_on_the_weights_alone(
        tmp_path_factory):
    _, stdout = ars_two_ranks(tmp_path_factory)
    # every episode starts from the same state: the same candidates, returns and weights as one process, bit for bit
    found = re.search(r"as_in_one_process: 3 arrays, differ from plain ARS in one process: \[\]; steps (\d+) (\d+); "
                      r"updates (\d+) (\d+)", stdout)
    assert found and found.group(1) == found.group(2) and found.group(3) == found.group(4), stdout
    assert int(found.group(3)) >= 2


@needs_contrib
@pytest.mark.xdist_group("ars_two_ranks")
def test_ars_at_two_ranks_learns_cartpole(tmp_path_factory):
    records, stdout = ars_two_ranks(tmp_path_factory)
    assert "learns: ranks out of sync: []" in stdout, stdout
    rank0, rank1 = records["learns"]
    assert rank0["num_timesteps"] == rank1["num_timesteps"] >= 12_000
    # The zero policy scores about 9 and random play about 22; seen after 12k steps: 486 (of 500).
    assert rank0["mean_return"] > 200
