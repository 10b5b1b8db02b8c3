"""mpi_util with PyTorch on a machine with GPUs: N ranks, each on ``cuda:gpu_for_rank()``, holding the CleanRL-style
Atari agent (peer_cleanrl_atari.py's Nature CNN torso under a policy and a value head) on its GPU.

Each iteration every rank runs the rollout's forward passes (128 steps of 8 frames of 84x84x4 uint8), rank 0 gathers
the ranks' rows with rank0_accum_batches and takes the PPO update's 16 gradient steps (4 epochs of 256 rows of
1,024) on its GPU, and rank0_bcast_wts sends the weights, read from the GPU, back to every rank's GPU. At the end
ranks_out_of_sync must name no rank. Rank 0 prints one line per rank: its GPU, the memory CUDA gave it (torch's
peak reserve) and the seconds of its parts, and writes them as JSON to ``--json``.

    python benchmarks/gpu_ranks_torch.py --nprocs 8 --json ranks8.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import mpi_util

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_cleanrl_atari import Agent  # noqa: E402  (the benchmarks' own directory, put on the path above)

OBS_SHAPE = (84, 84, 4)
ACTIONS = 6  # Pong's
ROWS_PER_RANK = 1024


def rollout_passes(agent: Agent, device: torch.device, generator: np.random.Generator) -> dict[str, np.ndarray]:
    """128 steps of 8 envs' forward passes on random frames; the rows as rank0_accum_batches takes them: obs
    (ROWS_PER_RANK, 84, 84, 4) uint8, act (ROWS_PER_RANK,) int64, logp and ret (ROWS_PER_RANK,) float32."""
    frames = generator.integers(0, 256, (ROWS_PER_RANK, *OBS_SHAPE), dtype=np.uint8)
    actions, logps = [], []
    with torch.no_grad():
        for step in range(0, ROWS_PER_RANK, 8):
            action, logp, _, _ = agent.get_action_and_value(torch.as_tensor(frames[step:step + 8], device=device))
            actions.append(action.cpu().numpy())
            logps.append(logp.cpu().numpy())
    return {"obs": frames, "act": np.concatenate(actions), "logp": np.concatenate(logps).astype(np.float32),
            "ret": generator.standard_normal(ROWS_PER_RANK).astype(np.float32)}


def gpu_memory_by_pid() -> dict[int, float]:
    """{pid: MiB} of every process on the GPUs, as nvidia-smi counts it (the CUDA context included); {} when
    nvidia-smi cannot say (no driver, or a container that hides other processes' pids)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    used = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().replace(".", "", 1).isdigit():
            used[int(pid)] = float(mib)
    return used


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued kernels, so that a span holds them (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def update(agent: Agent, optimizer: torch.optim.Optimizer, batch: dict[str, np.ndarray], device: torch.device) -> int:
    """The PPO update's shape of work on the first 1,024 rows: 4 epochs of 256-row clipped-surrogate steps."""
    obs = torch.as_tensor(batch["obs"][:1024], device=device)
    act, old_logp, ret = (torch.as_tensor(batch[key][:1024], device=device) for key in ("act", "logp", "ret"))
    steps = 0
    for _epoch in range(4):
        for rows in torch.randperm(1024, device=device).split(256):
            _, logp, entropy, value = agent.get_action_and_value(obs[rows], act[rows])
            ratio = (logp - old_logp[rows]).exp()
            advantage = ret[rows]
            pg_loss = torch.max(-advantage * ratio, -advantage * ratio.clamp(0.9, 1.1)).mean()
            loss = pg_loss - 0.01 * entropy.mean() + 0.5 * ((value.view(-1) - ret[rows]) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    synchronize(device)
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=8, help="MPI processes (default: %(default)s)")
    parser.add_argument("--iterations", type=int, default=5, help="iterations timed after one warm-up "
                        "(default: %(default)s)")
    parser.add_argument("--cpu", action="store_true", help="without a GPU, run it on the CPU (a check of the "
                        "script itself)")
    parser.add_argument("--json", default="", help="where rank 0 writes the per-rank record")
    args = parser.parse_args()
    fork = mpi_util.mpi_fork(args.nprocs)
    if fork == "parent":
        return fork.returncode
    gpu = mpi_util.gpu_for_rank(torch.cuda.device_count())
    if gpu is None and not args.cpu:
        mpi_util.print0("gpu_ranks_torch.py: torch sees no GPU here; nothing measured (--cpu runs it on the CPU)")
        return 2
    device = torch.device("cpu") if gpu is None else torch.device("cuda", gpu)
    if gpu is not None:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)  # the CPU's part (and --cpu's whole run): one core a rank
    mpi_util.set_global_seeds(0)
    generator = np.random.default_rng(mpi_util.rank_seed(0, mpi_util.rank))
    agent = Agent(OBS_SHAPE, ACTIONS).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    mpi_util.rank0_bcast_wts(agent)
    spans = {"rollout_s": 0.0, "gather_s": 0.0, "update_s": 0.0, "bcast_s": 0.0}
    for iteration in range(args.iterations + 1):
        started = time.perf_counter()
        batch = rollout_passes(agent, device, generator)
        rolled = time.perf_counter()
        batch = mpi_util.rank0_accum_batches(batch)
        gathered = time.perf_counter()
        if mpi_util.rank == 0:
            update(agent, optimizer, batch, device)
        updated = time.perf_counter()
        mpi_util.rank0_bcast_wts(agent)
        synchronize(device)
        ended = time.perf_counter()
        if iteration:  # the first is warm-up: CUDA's context, cuDNN's choice of kernels
            for key, span in zip(spans, (rolled - started, gathered - rolled, updated - gathered, ended - updated),
                                 strict=True):
                spans[key] += span / args.iterations
    out_of_sync = mpi_util.ranks_out_of_sync(agent)
    reserved = torch.cuda.max_memory_reserved(device) if gpu is not None else 0
    mine = {"rank": mpi_util.rank, "pid": os.getpid(), "device": str(device),
            "max_memory_reserved_mib": reserved / 2**20, **spans}
    records = mpi_util.gather_objects(mine)
    if mpi_util.rank == 0 and gpu is not None:  # every rank is alive, holding its context, until the broadcast below
        used = gpu_memory_by_pid()
        for record in records:
            record["nvidia_smi_mib"] = used.get(record["pid"], float("nan"))
    mpi_util.bcast_object(None)
    if mpi_util.rank == 0:
        for record in records:
            print(" ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                           for key, value in record.items()), flush=True)
        print(f"ranks {mpi_util.nworkers}, weights out of sync: {out_of_sync}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"nprocs": mpi_util.nworkers, "out_of_sync": out_of_sync,
                                                   "torch": torch.__version__, "ranks": records}, indent=1))
    return 1 if out_of_sync else 0


if __name__ == "__main__":
    raise SystemExit(main())
