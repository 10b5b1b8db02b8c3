"""algos.registry: every algorithm in ALGORITHMS satisfies the Algorithm protocol and resumes bit for bit from its
saved state, and a third algorithm (tests/numpy_algo.py) runs in train.py from one registry entry, with no other
change: --algo's choices, the default --lr, the learner, the learning-rate schedule and the checkpoint all come from
the registry. A new algorithm gets these tests, and test_train.py's learning, resume and schedule runs, from its
registry line."""

from __future__ import annotations

import copy
import csv
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from conftest import REPO, TENSORFLOW_IN_PROCESS, run_bounded

from algos.registry import ALGORITHMS, Algorithm
from algos.rollout import RolloutWorker
from algos.spaces import obs_spec
from envs.make import make_env
from trainer.config import TrainConfig
from trainer.resume import as_numpy

if TYPE_CHECKING:  # TensorFlow's modules are imported by the tests that use them (conftest.TENSORFLOW_IN_PROCESS)
    from algos.policy import ActorCritic

pytestmark = TENSORFLOW_IN_PROCESS
TESTS = Path(__file__).resolve().parent
# train.py with one more registry line, added at run time: the entry a new algorithm's author adds to ALGORITHMS.
REGISTER = ("import sys, train, algos.registry as registry\n"
            "registry.ALGORITHMS['obsnorm'] = registry.AlgorithmSpec('numpy_algo:from_config', "
            "{'lr': 0.25, 'lr_schedule': 'linear'})\n"
            "sys.exit(train.main())\n")


def train_with_obsnorm(*args: str) -> tuple[int, str, str]:
    result = run_bounded([sys.executable, "-c", REGISTER, *args], timeout=120,
                         env={"PYTHONPATH": f"{REPO}:{TESTS}"})
    return result.returncode, result.stdout, result.stderr


def progress(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "progress.csv") as f:
        return list(csv.DictReader(f))


def test_every_entry_owns_the_defaults_of_the_settings_it_reads():
    # An algorithm's settings are TrainConfig fields whose default is the algorithm's: stated in its registry line
    # and nowhere else (TrainConfig holds None for them until build_config fills the algorithm's value in).
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    for name, spec in ALGORITHMS.items():
        assert ":" in spec.builder and "lr" in spec.defaults, name
        for setting, value in spec.defaults.items():
            assert setting in defaults and defaults[setting] is None and value is not None, (name, setting)
    assert (ALGORITHMS["ppo"].defaults["lr"], ALGORITHMS["trpo"].defaults["lr"]) == (3e-4, 1e-3)


def test_a_run_of_an_algorithm_no_longer_registered_is_refused_in_one_line():
    from trainer.config import check_config

    with pytest.raises(ValueError, match=r"^--algo gone is not one this train.py knows \(ppo, trpo"):
        check_config(TrainConfig(env_id="CartPole-v1", algo="gone", lr=1e-3))


def test_importing_the_registry_and_what_train_py_moved_out_imports_no_tensorflow():
    code = ("import sys, algos.registry, trainer.config, trainer.resume, trainer.run_dir; "
            "print('tensorflow' in sys.modules)")
    result = run_bounded([sys.executable, "-c", code], timeout=60)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def build(name: str, seed: int, env_id: str = "CartPole-v1") -> tuple[ActorCritic, Algorithm]:
    """ALGORITHMS[name] with its defaults on an actor-critic for ``env_id`` whose weights ``seed`` draws."""
    import keras

    from algos.policy import ActorCritic

    keras.utils.set_random_seed(seed)
    config = TrainConfig(env_id=env_id, algo=name, seed=seed, **ALGORITHMS[name].defaults)
    env = make_env(env_id)
    ac = ActorCritic(obs_spec(env.observation_space), env.action_space, hidden=config.hidden)
    return ac, ALGORITHMS[name].build(ac, {key: getattr(config, key) for key in (*ALGORITHMS[name].defaults, "seed")})


def learn(algo: Algorithm, batch: dict[str, np.ndarray]) -> dict[str, float]:
    return algo.update(batch["obs"], batch["act"], batch["adv"], batch["ret"])


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_builds_from_the_config_and_satisfies_the_protocol(name):
    _, algo = build(name, 0)
    assert isinstance(algo, Algorithm)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "MinAtar/Breakout-v1"], ids=["vector", "image"])
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_resumes_from_its_saved_state_bit_for_bit(name, env_id):
    # What a checkpoint keeps (the actor-critic's weights and normalizers, the optimizer's and the RNG's state),
    # put into a learner built with other weights and another seed, must give the same next update to the bit: with
    # an MLP on vectors and a CNN on images.
    ac, algo = build(name, 0, env_id)
    worker = RolloutWorker(make_env(env_id), seed=0, gamma=0.99, lam=0.95)
    rng = np.random.default_rng(0)
    first, second = [worker.collect(256, ac.numpy_actor(), rng)[0] for _ in range(2)]
    learn(algo, first)
    saved_state = [as_numpy(v) for v in ac.broadcast_state()]
    saved_optimizer, saved_rng = algo.optimizer_state(), copy.deepcopy(algo.rng_state())
    stats = learn(algo, second)

    resumed_ac, resumed = build(name, 1, env_id)
    for variable, value in zip(resumed_ac.broadcast_state(), saved_state, strict=True):
        if isinstance(variable, np.ndarray):
            variable[...] = value
        else:
            variable.assign(value)
    resumed.set_optimizer_state(saved_optimizer)
    resumed.set_rng_state(saved_rng)
    assert learn(resumed, second) == stats
    for a, b in zip(ac.broadcast_state(), resumed_ac.broadcast_state(), strict=True):
        np.testing.assert_array_equal(as_numpy(a), as_numpy(b))
    for a, b in zip(algo.optimizer_state(), resumed.optimizer_state(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_third_algorithm_runs_from_one_registry_line(tmp_path):
    code, out, err = train_with_obsnorm("--help")
    assert code == 0 and "--algo {ppo,trpo,obsnorm}" in " ".join(out.split()), out

    code, out, err = train_with_obsnorm("CartPole-v1", "--algo", "obsnorm", "--batch_size", "512", "--total_steps",
                                        "1024", "--checkpoint_every", "1", "--logdir", str(tmp_path))
    assert code == 0, err[-3000:]
    (run_dir,) = tmp_path.iterdir()
    assert "_obsnorm_s0_" in run_dir.name
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["algo"], config["lr"]) == ("obsnorm", 0.25)  # the registry's default lr
    rows = progress(run_dir)
    # The linear schedule (the entry reads lr_schedule): lr, then lr x (1 - 512 / 1024).
    assert [(float(r["lr"]), float(r["updates"])) for r in rows] == [(0.25, 1.0), (0.125, 2.0)]

    # --resume restores its optimizer state (the update count) and goes on with the schedule of the new budget.
    code, out, err = train_with_obsnorm("--resume", str(run_dir), "--total_steps", "2048")
    assert code == 0, err[-3000:]
    rows = progress(run_dir)
    assert [(float(r["lr"]), float(r["updates"])) for r in rows[2:]] == [(0.125, 3.0), (0.0625, 4.0)]
