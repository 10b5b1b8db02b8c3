"""Checkpoints are found by their exact names and ordered by iteration, a --run_dir that is not a run is refused
untouched, no file a run writes follows a link planted at its name, and no file of a received run runs code when it is
read."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import FEW_MINIBATCHES, REPO, run_bounded
from test_train import progress, train

from trainer.checkpoint import (
    KEY_FILE_VARIABLE,
    CheckpointError,
    SignedPickle,
    list_checkpoints,
    load_checkpoint,
    remove_temporary_files,
    save_checkpoint,
    user_key,
    write_atomic,
)
from trainer.run_dir import LOCK_FILE

TRAIN = str(REPO / "train.py")
# 3 iterations of 512 steps, a checkpoint after each (the newest 3 kept).
CARTPOLE = ["CartPole-v1", "--nprocs", "2", "--batch_size", "512", *FEW_MINIBATCHES, "--checkpoint_every", "1"]
# Names beside the real checkpoints that are not checkpoints: a copy that sorted last by whole name, a backup, a
# number of other digits, a directory.
ODD_NAMES = ["copy_of_ckpt_00000009.npz", "ckpt_00000009.npz.bak", "ckpt_0000009.npz", "old_ckpt_00000099.npz"]
pytestmark = pytest.mark.xdist_group("run_names")  # one worker, so the trained run below is made once


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CartPole run of 2 iterations at 2 processes, a checkpoint after each; tests that change it take a copy."""
    run_dir, _ = train(*CARTPOLE, "--total_steps", "1024", "--logdir", str(tmp_path_factory.mktemp("trained")))
    return run_dir


def copy_of(run_dir: Path, where: Path) -> Path:
    return Path(shutil.copytree(run_dir, where / run_dir.name))


def test_odd_names_beside_the_checkpoints_are_neither_resumed_from_nor_pruned(tmp_path, trained):
    run_dir = copy_of(trained, tmp_path)
    checkpoints = run_dir / "checkpoints"
    first = (checkpoints / "ckpt_00000001.npz").read_bytes()
    for name in ODD_NAMES:
        (checkpoints / name).write_bytes(first)  # each a valid checkpoint of iteration 1 under another name
    (checkpoints / "ckpt_00000098.npz").mkdir()
    resumed, out = train("--resume", str(run_dir), "--total_steps", "3072")
    assert "from ckpt_00000002.npz: iteration 2, step 1024" in out  # the highest iteration, not the last name
    assert [row["iteration"] for row in progress(resumed)] == [str(i) for i in range(1, 7)]
    assert [p.name for p in list_checkpoints(checkpoints)] == ["ckpt_00000004.npz", "ckpt_00000005.npz",
                                                               "ckpt_00000006.npz"]
    assert all((checkpoints / name).read_bytes() == first for name in ODD_NAMES)  # pruning left them alone


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    # A run resumed from iteration 2 (its newer checkpoints were corrupt) saves iteration 3 beside 8 and 9: the new
    # one and the newest earlier ones stay, the later ones wait to be overwritten.
    for iteration in (1, 2, 8, 9):
        save_checkpoint(tmp_path, iteration, {"iteration": iteration}, keep=10)
    save_checkpoint(tmp_path, 3, {"iteration": 3}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_00000002.npz", "ckpt_00000003.npz",
                                                            "ckpt_00000008.npz", "ckpt_00000009.npz"]
    save_checkpoint(tmp_path, 100_000_000, {"iteration": 0}, keep=1)  # nine digits still sort by number
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt_100000000.npz"]


def test_a_run_dir_holding_other_files_is_refused_untouched(tmp_path, trained):
    project = tmp_path / "project"
    project.mkdir()
    files = {"config.json": '{"name": "my project"}\n', "progress.csv": "a,b\n1,2\n", ".notes.tmp": "mine\n",
             ".config.json.tmp": "mine too\n"}
    for name, text in files.items():
        (project / name).write_text(text)
    result = run_bounded([sys.executable, TRAIN, "CartPole-v1", "--run_dir", str(project), "--total_steps", "512"],
                         timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        f"train.py: error: --run_dir {project} holds files of something other than a train.py run (.config.json.tmp, "
        ".notes.tmp, config.json, ...) and no run's config.json: name a new directory or a run's; nothing in it was "
        "touched"]
    assert {p.name: p.read_text() for p in project.iterdir()} == files
    # A run's directory with no checkpoint yet (a job that restarts names the same --run_dir) is taken.
    run_dir = copy_of(trained, tmp_path)
    shutil.rmtree(run_dir / "checkpoints")
    again, _ = train(*CARTPOLE, "--total_steps", "512", "--run_dir", str(run_dir))
    assert again == run_dir and len(progress(run_dir)) == 1


def test_no_write_follows_a_link_planted_at_a_temporary_or_lock_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / ".config.json.tmp").symlink_to(victim)
    write_atomic(run_dir / "config.json", b"{}\n")
    assert victim.read_text() == "precious\n" and (run_dir / "config.json").read_bytes() == b"{}\n"
    assert not (run_dir / ".config.json.tmp").exists()
    # Clean-up takes this project's temporary names only, links included, and never what they point to.
    (run_dir / "checkpoints" / ".ckpt_00000004.npz.tmp").symlink_to(victim)
    (run_dir / "checkpoints" / ".mine.tmp").write_text("not ours\n")
    assert [p.name for p in remove_temporary_files(run_dir / "checkpoints")] == [".ckpt_00000004.npz.tmp"]
    assert victim.read_text() == "precious\n" and (run_dir / "checkpoints" / ".mine.tmp").exists()
    # The lock: a link at its name is refused in one line, before the run starts.
    new_run = tmp_path / "new_run"
    new_run.mkdir()
    (new_run / LOCK_FILE).symlink_to(victim)
    result = run_bounded([sys.executable, TRAIN, "CartPole-v1", "--run_dir", str(new_run), "--total_steps", "512"],
                         timeout=60)
    assert result.returncode == 2 and victim.read_text() == "precious\n"
    assert result.stderr.splitlines() == [f"train.py: error: {new_run / LOCK_FILE} is a symbolic link, which train.py "
                                          "does not follow: remove it (the run's lock is a plain file)"]
    assert os.path.islink(new_run / LOCK_FILE) and Path(os.readlink(new_run / LOCK_FILE)) == victim


PAYLOAD = "from pathlib import Path\nPath(__file__).with_name('imported').write_text('payload ran')\n"


def test_a_module_named_by_a_received_config_json_is_imported_only_when_the_user_names_it(tmp_path, trained):
    run_dir = copy_of(trained, tmp_path)
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "payload.py").write_text(PAYLOAD)
    config = run_dir / "config.json"
    config.write_text(config.read_text().replace('"env_id": "CartPole-v1"', '"env_id": "payload:CartPole-v1"'))
    env = {"PYTHONPATH": f"{REPO}:{modules}"}  # importable, as a module beside a received run would be
    for option in ("--play", "--resume"):
        result = run_bounded([sys.executable, TRAIN, option, str(run_dir), *(["--total_steps", "1024"]
                              if option == "--resume" else [])], timeout=60, env=env)
        assert result.returncode == 2 and not (modules / "imported").exists(), result.stderr[-2000:]
        assert result.stderr.splitlines() == [
            f"train.py: error: {option} {run_dir}: its config.json names the env payload:CartPole-v1, which would "
            "import the module payload; train.py imports a module a run names only when you name it as well: python "
            f"train.py payload:CartPole-v1 {option} {run_dir}"]
    played = run_bounded([sys.executable, TRAIN, "payload:CartPole-v1", "--play", str(run_dir), "--episodes", "1"],
                         timeout=60, env=env)
    assert played.returncode == 0 and (modules / "imported").read_text() == "payload ran", played.stderr[-2000:]


LOAD_ALONE = """
import json, sys
import numpy as np
from algos.numpy_actor import NumpyActor
actor, spec = NumpyActor.load(sys.argv[1])
obs = np.random.default_rng(0).normal(size=(16, *actor.obs.shape)).astype(np.float32)
print(json.dumps({"actions": actor.act(obs, None, deterministic=True).tolist(), "values": actor.value(obs).tolist(),
                  "env_id": spec["env_id"], "loaded": sorted(m for m in sys.modules
                                                            if m.split(".")[0] in ("tensorflow", "trainer", "keras"))}))
"""


def test_an_exported_policy_is_one_file_of_data_that_plays_without_tensorflow_or_the_trainer(tmp_path, trained):
    import json

    import numpy as np

    from algos.numpy_actor import NumpyActor
    from algos.spaces import ActionSpec, ObsSpec
    from trainer.checkpoint import load_latest_checkpoint

    run_dir = trained
    policy = tmp_path / "cartpole.policy"
    exported = run_bounded([sys.executable, TRAIN, "--export", str(run_dir), str(policy)], timeout=60)
    assert exported.returncode == 0 and exported.stderr == "", exported.stderr[-2000:]
    assert exported.stdout.startswith(f"wrote {policy}: the policy of ckpt_00000002.npz (CartPole-v1, ppo, step 1024)")
    # A fresh process that imports numpy and algos.numpy_actor alone acts as the checkpoint's actor does, bit for bit.
    alone = run_bounded([sys.executable, "-c", LOAD_ALONE, str(policy)], timeout=60, env={"PYTHONPATH": str(REPO)})
    assert alone.returncode == 0, alone.stderr[-2000:]
    result = json.loads(alone.stdout)
    assert result["loaded"] == [] and result["env_id"] == "CartPole-v1"
    state = load_latest_checkpoint(run_dir / "checkpoints")[1]
    actor = NumpyActor.from_ac_state(state["ac_state"], (64, 64), ObsSpec((4,)), ActionSpec((), (2,)))
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    assert result["actions"] == actor.act(obs, None, deterministic=True).tolist()
    assert result["values"] == actor.value(obs).tolist()
    played = run_bounded([sys.executable, TRAIN, "--play", str(policy), "--episodes", "1"], timeout=60)
    assert played.returncode == 0 and re.search(r"^mean return \S+ over 1 episode$", played.stdout, re.M), \
        (played.stdout[-2000:], played.stderr[-2000:])
    example = run_bounded([sys.executable, str(REPO / "examples" / "play_policy_file.py"), str(policy)], timeout=60,
                          env={"PYTHONPATH": str(REPO)})
    assert example.returncode == 0 and example.stderr == "", example.stderr[-2000:]
    assert re.fullmatch(r"CartPole-v1: return \d+\.0 with the policy of 1024 steps\n", example.stdout), example.stdout
    # A file with an object array (a pickle inside) is refused in one line, and nothing in it is unpickled.
    with np.load(policy) as data:
        arrays = dict(data)
    np.savez(tmp_path / "bad.npz", **{**arrays, "a0": np.array([object()], dtype=object)})
    refused = run_bounded([sys.executable, TRAIN, "--play", str(tmp_path / "bad.npz")], timeout=60)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert refused.stderr.startswith(f"train.py: error: {tmp_path / 'bad.npz'} is not a policy file of train.py "
                                     "--export (ValueError: Object arrays cannot be loaded when allow_pickle=False")


class Payload:
    """A pickle that makes a directory when it is loaded: proof that a reader ran a file's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.mkdir, (str(self.marker),)


def test_no_file_of_a_received_run_runs_code_on_play_export_or_resume(tmp_path, trained):
    run_dir, marker = copy_of(trained, tmp_path), tmp_path / "payload_ran"
    checkpoints = run_dir / "checkpoints"
    state = load_checkpoint(checkpoints / "ckpt_00000002.npz")
    evil = zlib.compress(pickle.dumps(Payload(marker)))
    # Rank 1's snapshot replaced under its old tag, rank 0's signed with a key that is not this user's.
    state["ranks"][1]["envs"][0] = SignedPickle(evil, state["ranks"][1]["envs"][0].tag)
    state["ranks"][0]["envs"][0] = SignedPickle.sign(evil, b"k" * 32)
    save_checkpoint(checkpoints, 2, state)
    # A pickled checkpoint as versions before 0.2 wrote them, beside the others.
    old = pickle.dumps(Payload(marker))
    (checkpoints / "ckpt_00000009.pkl").write_bytes(b"MPIBRL-CKPT-1\n" + hashlib.sha256(old).hexdigest().encode()
                                                     + b"\n" + old)

    assert "mean return" in run_bounded([sys.executable, TRAIN, "--play", str(run_dir), "--episodes", "1"], 60).stdout
    assert run_bounded([sys.executable, TRAIN, "--export", str(run_dir), str(tmp_path / "p.npz")], 60).returncode == 0
    resumed, out = train("--resume", str(run_dir), "--total_steps", "1536")
    assert ("train.py: warning: the environments' snapshots in ckpt_00000002.npz are not loaded (not signed with the "
            "key ") in out and out.count("resuming with fresh episodes") == 1, out
    assert [row["iteration"] for row in progress(resumed)] == ["1", "2", "3"]
    for path in list_checkpoints(checkpoints):
        path.unlink()
    line = run_bounded([sys.executable, TRAIN, "--resume", str(run_dir)], 60).stderr.strip()
    assert line == (f"train.py: error: --resume {run_dir}: {checkpoints} holds only checkpoints of versions before "
                    "0.2 (ckpt_*.pkl, pickles), which this version does not read, since loading a pickle can run "
                    "code: finish that run with the version that wrote it, or start a new one; there is nothing to "
                    "continue from: start a new run"), line
    assert not marker.exists()


def test_a_checkpoint_is_arrays_numpy_reads_without_pickle_and_nothing_else_is_taken(tmp_path, trained):
    newest = trained / "checkpoints" / "ckpt_00000002.npz"
    with np.load(newest, allow_pickle=False) as data:
        assert {"state", "a0", "p0"} <= set(data.files) and data["state"].dtype == np.uint8
    entries = zipfile.ZipFile(newest).infolist()
    compressed = tmp_path / "ckpt_00000002.npz"
    with zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as archive:  # could unpack to far more than its size
        for info in entries:
            archive.writestr(info.filename, zipfile.ZipFile(newest).read(info))
        archive.comment = zipfile.ZipFile(newest).comment
    with pytest.raises(CheckpointError, match="not a checkpoint of this program .compressed entries."):
        load_checkpoint(compressed)
    flipped = bytearray(newest.read_bytes())
    flipped[len(flipped) // 2] ^= 1
    compressed.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(compressed)


def test_the_checkpoint_key_is_made_private_and_used_only_while_it_is(tmp_path, monkeypatch):
    key_file = tmp_path / "keys" / "checkpoint.key"
    monkeypatch.setenv(KEY_FILE_VARIABLE, str(key_file))
    assert user_key(create=False) == (None, f"there is no checkpoint key at {key_file}")
    key, reason = user_key(create=True)
    assert len(key) == 32 and not reason and key_file.stat().st_mode & 0o777 == 0o600
    assert user_key(create=True) == (key, "")  # made once
    blob = SignedPickle.sign(b"snapshot", key)
    assert blob.verified(key) and not blob.verified(b"x" * 32) and not SignedPickle(b"snapshot", b"").verified(key)
    key_file.chmod(0o644)  # readable by others: anyone could sign with it
    assert user_key(create=True)[0] is None and "mode 0600" in user_key(create=True)[1]
    key_file.unlink()
    key_file.symlink_to(tmp_path / "elsewhere")
    assert user_key(create=True)[0] is None and not (tmp_path / "elsewhere").exists()
