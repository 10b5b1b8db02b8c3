#!/usr/bin/env bash
# Pixels on a machine with an NVIDIA GPU, one prepared run (nothing in the project depends on it):
#   1. rank 0's PPO update of Pong's Nature CNN (the Atari work: 1,024 rows, 4 epochs of 256) on the GPU, and the same
#      update on the CPUs with the GPU hidden (update.py --kernels pong; its four thread/oneDNN variants);
#   2. train.py ALE/Pong-v5 with --gpu_pct 0.08 at 8 and 16 processes: steps/s and the parts of an iteration
#      (scaling.py);
#   3. the memory of each process at 16 processes, rank 0's (TensorFlow and CUDA) and a worker's (startup.py).
# Install first: .venv/bin/pip install -c constraints.txt -e '.[gpu,pixels,mpich]' (gpu instead of rl). Results go to
# benchmarks/results/gpu_pong_*; nvidia-smi's line for the GPU goes to gpu_pong_update_gpu/gpu.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-.venv/bin/python}"
out=benchmarks/results
if ! gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"; then
    echo "gpu_pong.sh: no NVIDIA GPU here (nvidia-smi found none); nothing measured" >&2
    exit 2
fi
"$python" benchmarks/update.py --kernels pong --repeats 2 --updates 5 --out "$out/gpu_pong_update_gpu"
echo "$gpu" > "$out/gpu_pong_update_gpu/gpu.txt"
CUDA_VISIBLE_DEVICES="" "$python" benchmarks/update.py --kernels pong --repeats 2 --updates 3 \
    --out "$out/gpu_pong_update_cpu"
"$python" benchmarks/scaling.py --env ALE/Pong-v5 --nprocs 8 16 --total_steps 20480 --warmup 2 --tail 2 \
    --repeats 1 --timeout 900 --train_args "--gpu_pct 0.08" --out "$out/gpu_pong_scaling"
"$python" benchmarks/startup.py gpu=. --env ALE/Pong-v5 --nprocs 16 --total_steps 10240 --repeats 1 \
    --train_args "--gpu_pct 0.08" --out "$out/gpu_pong_memory"
