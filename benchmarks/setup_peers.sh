#!/usr/bin/env bash
# Creates benchmarks/.venv-rllib, RLlib for benchmarks/peers.py, apart from the project's environment (ray pins its
# own gymnasium); installs constraints-rllib.txt with --no-deps (a pip freeze: ray[rllib] asks for an older gymnasium
# than ours), or with --relock resolves afresh and rewrites it. PYTHON=python3.11 picks the interpreter.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/benchmarks/.venv-rllib"
lock="$repo/benchmarks/constraints-rllib.txt"
python="${PYTHON:-python3}"
ray_version="2.60.0"
torch_version="2.13.0"  # the CPU-only wheel from this project's package index, as in the sb3 extra

"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
if [[ "${1:-}" == "--relock" ]]; then
    # The environments must be the same code as ours: take gymnasium's and MuJoCo's versions from the project's
    # .venv when it exists. ray[rllib]'s extra asks for gymnasium==1.2.2: installing ours over it afterwards
    # overrides that (ray 2.60.0 ran with gymnasium 1.4.0), and peers.py records the versions each system ran with.
    gymnasium_version="1.4.0"
    mujoco_version="4.0.0"
    if [[ -x "$repo/.venv/bin/python" ]]; then
        read -r gymnasium_version mujoco_version < <("$repo/.venv/bin/python" -c \
            'import gymnasium, mujoco; print(gymnasium.__version__, mujoco.__version__)')
    fi
    "$venv/bin/pip" install --quiet "torch==$torch_version" "ray[rllib]==$ray_version"
    "$venv/bin/pip" install --quiet "gymnasium[mujoco]==$gymnasium_version" "mujoco==$mujoco_version"
    {
        echo "# Exact versions of benchmarks/.venv-rllib, the RLlib peer's environment (Python $("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'), Linux x86-64)."
        echo "# Made by benchmarks/setup_peers.sh --relock (pip freeze); installed by it with --no-deps. Do not edit by hand."
        "$venv/bin/pip" freeze --exclude-editable
    } > "$lock"
    echo "$lock: $(grep -c '==' "$lock") packages"
else
    "$venv/bin/pip" install --quiet --no-deps -r "$lock"
fi
"$venv/bin/python" -c 'import ray, torch, gymnasium, mujoco; from ray.rllib.algorithms.ppo import PPOConfig
print(f"benchmarks/.venv-rllib: ray {ray.__version__}, torch {torch.__version__}, gymnasium {gymnasium.__version__}, "
      f"mujoco {mujoco.__version__}")'
