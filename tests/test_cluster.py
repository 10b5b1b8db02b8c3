"""What a first day on a cluster meets, on this machine: a resume that keeps the job's size, set-up errors that end
every rank at once, the CPUs a scheduler hands out (taskset, a cgroup quota), stop signals while rank 0 writes,
hyperparameters and updates that go non-finite, and run directories that fail part way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FEW_MINIBATCHES, REPO, USES_SMALL_RUN, JobOutput, launcher, run_bounded
from test_train import TRAIN

from trainer.checkpoint import load_checkpoint
from trainer.kernels import runs_avx2_kernels

FAULTY = "tests.faulty_env:FaultyPendulum-v0"


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("train.py: error: "), \
        (result.returncode, result.stderr[-3000:])
    return lines[0]


def test_set_up_error_on_rank_0_ends_every_rank_at_once(tmp_path):
    # Under an outside launcher rank 0 alone reads the run directory; the others learn of its error from it.
    command, settings = launcher("-n", "3", sys.executable, TRAIN, "--resume", str(tmp_path / "nothing"))
    started = time.monotonic()
    result = run_bounded(command, 60, settings)
    assert time.monotonic() - started < 30
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.count("train.py: error: ") == 1, result.stderr[-3000:]
    assert "not a run directory (no config.json)" in result.stderr


@USES_SMALL_RUN
def test_resume_of_what_is_not_a_resumable_run_is_one_line(tmp_path, small_run):
    not_a_run = tmp_path / "other"
    not_a_run.mkdir()
    (not_a_run / "config.json").write_text('{"lr": 0.1}')
    assert f"{not_a_run / 'config.json'} is not a train.py run's configuration (no env_id, algo, hidden)" in \
        one_error_line(run_bounded([sys.executable, TRAIN, "--resume", str(not_a_run)], 60))
    (not_a_run / "config.json").write_text("{not json")
    assert f"cannot read {not_a_run / 'config.json'}: Expecting property name" in \
        one_error_line(run_bounded([sys.executable, TRAIN, "--resume", str(not_a_run)], 60))

    checkpoints = sorted((small_run / "checkpoints").glob("ckpt_*.npz"))
    assert len(checkpoints) == 2
    for checkpoint in checkpoints:  # every checkpoint corrupt
        checkpoint.write_bytes(checkpoint.read_bytes()[:500])
    line = one_error_line(run_bounded([sys.executable, TRAIN, "--resume", str(small_run)], 60))
    assert "no usable checkpoint" in line and "ckpt_00000001.npz is truncated or corrupted" in line, line
    assert "ckpt_00000002.npz is truncated or corrupted" in line, line
    assert line.endswith("there is nothing to continue from: start a new run"), line
    for checkpoint in checkpoints:  # killed before its first checkpoint
        checkpoint.unlink()
    line = one_error_line(run_bounded([sys.executable, TRAIN, "--resume", str(small_run)], 60))
    assert "no usable checkpoint" in line and "(no ckpt_*.npz files)" in line, line


def test_an_update_that_makes_the_weights_non_finite_stops_the_job_and_keeps_the_last_checkpoint(tmp_path):
    # Rewards of 1e300 from step 1100 on: iteration 3 of 512 steps is the first to learn from them.
    result = run_bounded([sys.executable, TRAIN, FAULTY, "--nprocs", "2", "--batch_size", "512", "--total_steps",
                          "100000", "--checkpoint_every", "1", "--logdir", str(tmp_path)], 150,
                         {"FAULT_KIND": "huge", "FAULT_AT_STEP": "550"})
    assert result.returncode != 0
    assert "train.py: error: the update of iteration 3 made the weights non-finite (inf or NaN)" in result.stderr, \
        result.stderr[-3000:]
    run_dir = next(tmp_path.iterdir())
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert kept == ["ckpt_00000001.npz", "ckpt_00000002.npz"]
    assert "the job stops, and the last good checkpoint, ckpt_00000002.npz, is kept." in result.stderr
    import numpy as np

    assert all(np.isfinite(w).all() for w in load_checkpoint(run_dir / "checkpoints" / kept[-1])["ac_state"])


def test_logs_that_become_unwritable_name_the_checkpoint_to_resume_from(tmp_path):
    job = subprocess.Popen([sys.executable, TRAIN, "CartPole-v1", "--batch_size", "256", "--total_steps", "1000000",
                            "--checkpoint_every", "1", "--logdir", str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    output = JobOutput(job)
    try:  # rank 0 prints an iteration's line after writing its row
        output.wait_for(r"^\s*3\s", 120, "iteration 3's line")
        run_dir = next(tmp_path.iterdir())
        csv_path = run_dir / "progress.csv"
        csv_path.unlink()
        csv_path.mkdir()  # the next row cannot be written: as on a directory gone read-only, or a lost mount
        _, stderr = output.finish(timeout=60)
    finally:
        job.kill()
    assert job.returncode != 0
    assert f"train.py: error: cannot write the logs in {run_dir}" in stderr, stderr[-3000:]
    assert "; the last good checkpoint, " in stderr and f"continue with python train.py --resume {run_dir}" in stderr
    named = stderr.split("the last good checkpoint, ")[1].split(", is kept")[0]
    assert load_checkpoint(run_dir / "checkpoints" / named)["counters"][0] >= 3


def test_a_logdir_too_long_for_the_run_s_files_is_refused_and_leaves_nothing(tmp_path):
    # The run directory itself fits within PATH_MAX (4096); its TensorBoard file would not.
    base = tmp_path / "deep"
    depth = 4041 - len(str(base)) - 1
    logdir = base / "/".join(["d" * 200] * (depth // 201 + 1))[:depth].rstrip("/")
    line = one_error_line(run_bounded([sys.executable, TRAIN, "CartPole-v1", "--logdir", str(logdir)], 60))
    assert "the run's files would have paths too long for this system" in line, line[-300:]
    assert not base.exists()  # no stub run directory for --resume to mistake for a run


def test_repeated_stop_signals_while_rank_0_writes_never_break_its_output(tmp_path):
    # The old handler printed from inside the signal handler: a signal landing while rank 0 wrote its own line to the
    # same stream raised "reentrant call" RuntimeError. Each round below signals a process that does nothing but
    # write, then checks it saw the request and printed the announcement (from a thread of its own) whole.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from trainer.stop import StopRequest\n"
        "stop = StopRequest(grace_s=30.0, run_dir=Path('.'))\n"
        "print('ready', flush=True)\n"
        "line = 'x' * 4000\n"
        "while stop.signum is None:\n"
        "    sys.stdout.write(line + '\\n')\n"  # one write per line, as the logger's rows
        "    sys.stdout.flush()\n"
        "stop.take()\n"
    )
    for _ in range(12):
        job = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        try:
            assert job.stdout.readline() == "ready\n"
            for _ in range(20):  # the process is inside a write nearly all the time: let the signal land there
                job.stdout.readline()
            job.send_signal(signal.SIGTERM)
            stdout, stderr = job.communicate(timeout=30)
        finally:
            job.kill()
        assert job.returncode == 0 and stderr == "", stderr[-2000:]
        notice = ("received signal 15: stopping after this iteration with a checkpoint (a second Ctrl-C stops at "
                  "once, without one)")
        assert stdout.splitlines().count(notice) == 1, stdout[-300:]


def run_config(tmp_path: Path, prefix: list[str]) -> dict:
    result = run_bounded([*prefix, sys.executable, TRAIN, "CartPole-v1", "--nprocs", "2", "--total_steps", "1024",
                          "--batch_size", "1024", *FEW_MINIBATCHES, "--logdir", str(tmp_path)], 150)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((next(tmp_path.iterdir()) / "config.json").read_text())


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset is not installed")
def test_rank_0_threads_and_config_follow_the_cpus_taskset_gives(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs to give the job fewer")
    config = run_config(tmp_path, ["taskset", "-c", "0"])
    assert config["job_cpus"] == 1 and config["rank0_cpus"] == 1, config
    assert config["tf_intra_op_threads"] == 1 and config["tf_inter_op_threads"] == 1, config
    assert config["tf_enable_onednn_opts"] == "0", config  # an MLP: TensorFlow's own kernels (trainer.kernels)
    # ... whose matrix products (oneDNN's sgemm) are held to AVX2 on any x86-64 CPU that has it
    assert config["onednn_max_cpu_isa"] == ("AVX2" if runs_avx2_kernels() else "ALL"), config
    assert list(config["job_cpus_per_host"].values()) == [1], config
    assert config["worker_omp_threads"] == "1", config


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")


def test_rank_0_threads_follow_a_cgroup_cpu_quota(tmp_path):
    if os.geteuid() != 0 or not (CPU_CGROUP / "cgroup.procs").exists():
        pytest.skip("needs root and a cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu to set a CPU quota")
    group = CPU_CGROUP / f"mpibrl_test_{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")  # one CPU's worth, on every CPU the affinity allows
        config = run_config(tmp_path, ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh"])
    finally:
        group.rmdir()
    assert len(os.sched_getaffinity(0)) >= 2 and config["rank0_cpus"] == 1, config
    assert config["tf_inter_op_threads"] == 1 and config["job_cpus"] == 1, config
