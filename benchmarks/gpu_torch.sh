#!/usr/bin/env bash
# PyTorch on a machine with an NVIDIA GPU, one prepared run (nothing in the project depends on it). gpu_pong.sh
# measures train.py, whose rank 0 learns with TensorFlow; this one measures what a PyTorch user of mpi_util gets:
#   1. the CleanRL-style Atari PPO (peer_cleanrl_atari.py, Nature CNN torso shared by both heads, the Atari work) on
#      ALE/Pong-v5: its update on the GPU against the same update on all the CPUs and on 2 of them;
#   2. mpi_util's ranks on the GPU (gpu_ranks_torch.py) at 8 and 16 processes: every rank's device from
#      gpu_for_rank, weights broadcast from and to GPU memory, the memory CUDA gives each process, the parts of an
#      iteration.
# Install first: pip install -c constraints.txt -e '.[pixels,mpich]' and a CUDA build of torch. Results go to
# ${OUT_DIR:-benchmarks/results/gpu_torch}: the JSON records, gpu.txt (nvidia-smi's line), results.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python="${PYTHON:-.venv/bin/python}"
out="${OUT_DIR:-benchmarks/results/gpu_torch}"
if ! gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"; then
    echo "gpu_torch.sh: no NVIDIA GPU here (nvidia-smi found none); nothing measured" >&2
    exit 2
fi
mkdir -p "$out"
cpu="$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
echo "$gpu; $cpu; $(date -u +%F)" > "$out/gpu.txt"
peer=benchmarks/peer_cleanrl_atari.py
"$python" "$peer" --device cuda --total_steps 10240 --json "$out/peer_cuda.json"
"$python" "$peer" --device cpu --torch_threads "$(nproc)" --total_steps 5120 --json "$out/peer_cpu_all.json"
"$python" "$peer" --device cpu --torch_threads 2 --total_steps 3072 --json "$out/peer_cpu_2.json"
for n in 8 16; do
    "$python" benchmarks/gpu_ranks_torch.py --nprocs "$n" --json "$out/ranks_$n.json"
done
"$python" - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = [f"Machine: {(out / 'gpu.txt').read_text().strip()}. Command: bash benchmarks/gpu_torch.sh", "",
         "| peer_cleanrl_atari.py on ALE/Pong-v5 | update s (median, first dropped) | rollout s | steps/s |",
         "| --- | --- | --- | --- |"]
for name, label in (("peer_cuda", "GPU"), ("peer_cpu_all", "all CPUs"), ("peer_cpu_2", "2 CPUs")):
    record = json.loads((out / f"{name}.json").read_text())
    its = record["iterations"][1:]
    update = statistics.median(i["t_update"] for i in its)
    rollout = statistics.median(i["t_rollout"] for i in its)
    threads = record["torch_threads"]
    lines.append(f"| {label} ({threads} threads) | {update:.3f} | {rollout:.3f} | {1024 / (update + rollout):.0f} |")
lines += ["", "| ranks | memory torch reserved per rank, MiB (min-max) | GPU memory per process, nvidia-smi, MiB "
          "(min-max) | rollout s | gather s | rank 0's update s | rank 0's bcast s | out of sync |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
for n in (8, 16):
    record = json.loads((out / f"ranks_{n}.json").read_text())
    ranks = record["ranks"]
    memory = [r["max_memory_reserved_mib"] for r in ranks]
    smi = [r.get("nvidia_smi_mib", float("nan")) for r in ranks]
    worst = {key: max(r[key] for r in ranks) for key in ("rollout_s", "gather_s")}
    lines.append(f"| {n} | {min(memory):.0f}-{max(memory):.0f} | {min(smi):.0f}-{max(smi):.0f} "
                 f"| {worst['rollout_s']:.3f} | {worst['gather_s']:.3f} "
                 f"| {ranks[0]['update_s']:.3f} | {ranks[0]['bcast_s']:.3f} | {record['out_of_sync']} |")
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
