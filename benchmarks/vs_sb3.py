"""train.py (MPI, numpy workers, TF2 learner on rank 0) against stable-baselines3 PPO, side by side.

What it measures: the same env, step budget and seed for both, each a fresh subprocess bounded in time, run one
after the other in an order that alternates from repeat to repeat (never at the same time: they would share the
cores). For each run: environment steps per second of the training loop (after ``--warmup`` iterations, and over the
whole loop), the time split per iteration (rollout vs update), the gradient steps per iteration, the final mean
return (the mean over the episodes that finished in the last ``--tail`` iterations), and the wall time of the whole
process (imports and start-up included).

The two configurations (PPO defaults for MuJoCo on both sides; the work per iteration is the same):

- ours: ``train.py ENV --nprocs N --total_steps B`` with train.py's defaults: batch 2048 steps per iteration
  (over all ranks), 10 epochs of 64-row minibatches (32 Adam steps per epoch, lr 3e-4, eps 1e-5), clip 0.2,
  gamma 0.99, lambda 0.95, grad-norm clip 0.5, epochs stopped early when an epoch's approx KL exceeds 1.5 x 0.02,
  separate 64-64 tanh policy and value MLPs, observations normalized with running statistics (clip 10), value
  targets normalized with running return statistics. Rank 0's TF update: one thread per op, two at a time.
- stable-baselines3: ``PPO("MlpPolicy", VecNormalize(DummyVecEnv([Monitor(gym.make(ENV))]), norm_obs=True,
  norm_reward=True, clip_obs=10), n_steps=2048, batch_size=64, n_epochs=10, learning_rate=3e-4, clip_range=0.2,
  gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5, target_kl=0.02, device="cpu")``: one env, 64-64 tanh MLPs
  for policy and value (SB3's default), Adam eps 1e-5 (SB3's default), ``torch.set_num_threads(--torch_threads)``
  (default 1: on this 2-core machine SB3's update is several times slower with 2 threads when the machine is
  busy). SB3 checks target_kl after every minibatch, ours after every epoch; the gradient steps actually taken
  are reported for both.

Run from the repository root, after installing the ``bench`` extra (torch CPU-only first, see
benchmarks/README.md); about 4-6 minutes on 2 cores with the defaults::

    .venv/bin/python benchmarks/vs_sb3.py
    .venv/bin/python benchmarks/vs_sb3.py --nprocs 1 2 --total_steps 1000000 --timeout 3600    # the long run

Writes runs.csv, curves.csv, results.md (tables with the command, the configurations, machine, date and load
averages) and vs_sb3.png (mean return against steps) to benchmarks/results/vs_sb3/ (``--out``); prints the
tables. Our run directories go to /tmp and are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scaling import (
    load_average,
    machine_lines,
    pretty_command,
    run_train,
    table,
    tail_mean_return,
    write_csv,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "vs_sb3"
BATCH = 2048
MINIBATCH = 64
TARGET_RATIO = 4.0


# ----------------------------------------------------------------------------------------------------------------
# stable-baselines3 side: runs in its own subprocess (``--sb3_worker``), writes a JSON.
# ----------------------------------------------------------------------------------------------------------------


def sb3_worker(env_id: str, total_steps: int, seed: int, torch_threads: int, json_path: Path) -> int:
    """Train SB3 PPO; write {learn_s, rollout_start/rollout_end marks, episodes, grad steps, versions}."""
    process_started = time.perf_counter()
    import gymnasium
    import stable_baselines3
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(torch_threads)

    class Recorder(BaseCallback):
        """Marks each iteration's rollout start and end, and every finished episode (Monitor's raw return)."""

        def __init__(self) -> None:
            super().__init__()
            self.rollout_start: list[float] = []
            self.rollout_end: list[float] = []
            self.episodes: list[tuple[int, float, int]] = []  # (steps so far, return, length)
            self.grad_steps_marks: list[int] = []
            self.grad_steps = 0

        def _on_rollout_start(self) -> None:
            self.rollout_start.append(time.perf_counter())
            self.grad_steps_marks.append(self.grad_steps)

        def _on_rollout_end(self) -> None:
            self.rollout_end.append(time.perf_counter())

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.episodes.append((self.num_timesteps, float(info["episode"]["r"]), int(info["episode"]["l"])))
            return True

    def make_env() -> gymnasium.Env:
        return Monitor(gymnasium.make(env_id))

    env = VecNormalize(DummyVecEnv([make_env]), norm_obs=True, norm_reward=True, clip_obs=10.0, gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=BATCH, batch_size=MINIBATCH, n_epochs=10, learning_rate=3e-4,
                clip_range=0.2, gamma=0.99, gae_lambda=0.95, max_grad_norm=0.5, ent_coef=0.0, vf_coef=0.5,
                target_kl=0.02, seed=seed, device="cpu", verbose=0)
    recorder = Recorder()

    def count_step(*_: Any) -> None:
        recorder.grad_steps += 1

    model.policy.optimizer.register_step_post_hook(count_step)
    started = time.perf_counter()
    model.learn(total_timesteps=total_steps, callback=recorder)
    ended = time.perf_counter()
    recorder.grad_steps_marks.append(recorder.grad_steps)
    json_path.write_text(json.dumps({
        "learn_s": ended - started, "learn_started": started, "learn_ended": ended,
        "setup_s": started - process_started, "total_steps": int(model.num_timesteps),
        "rollout_start": recorder.rollout_start, "rollout_end": recorder.rollout_end,
        "grad_steps_marks": recorder.grad_steps_marks, "episodes": recorder.episodes,
        "versions": {"stable_baselines3": stable_baselines3.__version__, "torch": torch.__version__,
                     "gymnasium": gymnasium.__version__},
        "torch_threads": torch.get_num_threads(),
        "policy": str(model.policy.mlp_extractor).replace("\n", " "),
    }))
    return 0


def run_sb3(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Run sb3_worker in a subprocess of this script, bounded by args.timeout; return its JSON plus wall times."""
    workdir.mkdir(parents=True)
    json_path = workdir / "sb3.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--sb3_worker", str(json_path), "--env", args.env,
               "--total_steps", str(args.total_steps), "--seed", str(args.seed),
               "--torch_threads", str(args.torch_threads)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    load_before = load_average()
    started = time.perf_counter()
    with open(workdir / "sb3.log", "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RuntimeError(f"stable-baselines3: no result after {args.timeout:.0f} s: {shlex.join(command)}") \
                from None
    if returncode != 0:
        tail = (workdir / "sb3.log").read_text().splitlines()[-15:]
        raise RuntimeError(f"stable-baselines3: exit status {returncode}: {shlex.join(command)}\n" + "\n".join(tail))
    result = json.loads(json_path.read_text())
    result.update(process_wall_s=time.perf_counter() - started, load_before=load_before, load_after=load_average())
    return result


# ----------------------------------------------------------------------------------------------------------------
# Summaries, side by side.
# ----------------------------------------------------------------------------------------------------------------


def summarize_sb3(result: dict[str, Any], warmup: int, tail: int) -> dict[str, Any]:
    starts, ends = result["rollout_start"], result["rollout_end"]
    iterations = len(starts)
    next_starts = [*starts[1:], result["learn_ended"]]
    rollout = [e - s for s, e in zip(starts, ends, strict=True)]
    update = [n - e for e, n in zip(ends, next_starts, strict=True)]
    marks = result["grad_steps_marks"]
    grad_steps = [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]
    total = result["total_steps"]
    last_steps = total - tail * BATCH
    tail_returns = [r for steps, r, _ in result["episodes"] if steps > last_steps]
    return {
        "system": f"stable-baselines3 PPO, 1 env, torch {result['torch_threads']} thread(s)",
        "nprocs": 1,
        "iterations": iterations,
        "steps_per_s": (iterations - warmup) * BATCH / (result["learn_ended"] - starts[warmup]),
        "steps_per_s_whole_loop": total / result["learn_s"],
        "t_rollout": statistics.fmean(rollout[warmup:]),
        "t_update": statistics.fmean(update[warmup:]),
        "t_other": 0.0,
        "grad_steps_per_iter": statistics.fmean(grad_steps[warmup:]),
        "mean_return": statistics.fmean(tail_returns) if tail_returns else math.nan,
        "tail_episodes": len(tail_returns),
        "process_wall_s": result["process_wall_s"],
        "load_before": result["load_before"],
        "load_after": result["load_after"],
    }


def summarize_ours(run: Any, warmup: int, tail: int) -> dict[str, Any]:
    rows = run.rows
    steady = rows[warmup:]
    wall = rows[-1]["wall_s"] - rows[warmup - 1]["wall_s"] if warmup else rows[-1]["wall_s"]
    steps = rows[-1]["total_steps"] - (rows[warmup - 1]["total_steps"] if warmup else 0.0)
    split = {key: statistics.fmean(r[key] for r in steady) for key in ("t_rollout", "t_gather", "t_update", "t_bcast")}
    t_iteration = wall / len(steady)
    minibatches = math.ceil(BATCH / MINIBATCH)
    return {
        "system": f"train.py --nprocs {run.nprocs}",
        "nprocs": run.nprocs,
        "iterations": len(rows),
        "steps_per_s": steps / wall,
        "steps_per_s_whole_loop": rows[-1]["total_steps"] / rows[-1]["wall_s"],
        "t_rollout": split["t_rollout"] + split["t_gather"],
        "t_update": split["t_update"] + split["t_bcast"],
        "t_other": t_iteration - sum(split.values()),
        "grad_steps_per_iter": statistics.fmean(r["epochs"] for r in steady) * minibatches,
        "mean_return": tail_mean_return(rows, tail),
        "tail_episodes": int(sum(r["episodes"] for r in rows[-tail:])),
        "process_wall_s": run.process_wall_s,
        "load_before": run.load_before,
        "load_after": run.load_after,
    }


def curves_ours(run: Any) -> tuple[list[float], list[float]]:
    return [r["total_steps"] for r in run.rows], [r["ep_return_mean"] for r in run.rows]


def curves_sb3(result: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Mean return of the episodes that ended in each iteration, against the steps at its end."""
    xs, ys = [], []
    for k in range(len(result["rollout_start"])):
        lo, hi = k * BATCH, (k + 1) * BATCH
        returns = [r for steps, r, _ in result["episodes"] if lo < steps <= hi]
        if returns:
            xs.append(hi)
            ys.append(statistics.fmean(returns))
    return xs, ys


def plot_curves(curves: list[tuple[str, list[float], list[float]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, xs, ys in curves:
        ax.plot(xs, ys, label=label, alpha=0.8)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("mean return of the episodes ended per iteration")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Walker2d-v5", help="gymnasium env id (default: %(default)s)")
    parser.add_argument("--nprocs", type=int, nargs="+", default=[2],
                        help="train.py process counts to run (default: %(default)s)")
    parser.add_argument("--total_steps", type=int, default=61_440,
                        help="step budget of every run (default: %(default)s = 30 iterations of 2048)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each system (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of both (default: %(default)s)")
    parser.add_argument("--torch_threads", type=int, default=1, help="torch.set_num_threads for SB3 (default: 1)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="first iterations left out of the steady rates (default: %(default)s)")
    parser.add_argument("--tail", type=int, default=10,
                        help="iterations at the end whose episodes give the final mean return (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds one run may take before it is killed (default: %(default)s)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    parser.add_argument("--sb3_worker", metavar="JSON", help=argparse.SUPPRESS)  # internal: the SB3 subprocess
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.sb3_worker:
        return sb3_worker(args.env, args.total_steps, args.seed, args.torch_threads, Path(args.sb3_worker))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = pretty_command()
    workroot = Path(tempfile.mkdtemp(prefix="bench_vs_sb3_", dir="/tmp"))
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    curves: list[tuple[str, list[float], list[float]]] = []
    versions: dict[str, str] = {}
    try:
        for repeat in range(args.repeats):
            jobs = [*(("ours", n) for n in args.nprocs), ("sb3", 1)]
            for system, nprocs in jobs if repeat % 2 == 0 else list(reversed(jobs)):
                print(f"vs_sb3: repeat {repeat + 1}/{args.repeats}: {system} (nprocs {nprocs}), {args.total_steps} "
                      f"steps (load {load_average():.2f}) ...", flush=True)
                workdir = workroot / f"r{repeat}_{system}_{nprocs}"
                if system == "ours":
                    run = run_train(args.env, nprocs, args.total_steps, workdir, args.timeout)
                    summary = summarize_ours(run, args.warmup, args.tail)
                    if repeat == 0:  # same seed, same nprocs: every repeat learns exactly the same
                        curves.append((summary["system"], *curves_ours(run)))
                else:
                    result = run_sb3(args, workdir)
                    versions = result["versions"]
                    summary = summarize_sb3(result, args.warmup, args.tail)
                    if repeat == 0:
                        curves.append(("stable-baselines3 PPO", *curves_sb3(result)))
                results.append({"repeat": repeat + 1, **summary})
                print(f"  {summary['steps_per_s']:,.0f} steps/s (whole loop {summary['steps_per_s_whole_loop']:,.0f}), "
                      f"rollout {summary['t_rollout']:.3f} s, update {summary['t_update']:.3f} s per iteration, "
                      f"mean return {summary['mean_return']:.1f}, process {summary['process_wall_s']:.0f} s",
                      flush=True)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    wall_s = time.perf_counter() - started

    write_csv(out / "runs.csv", results)
    write_csv(out / "curves.csv", [{"system": label, "steps": x, "mean_return": y}
                                   for label, xs, ys in curves for x, y in zip(xs, ys, strict=True)])
    rows, ratio_lines = [], []
    for repeat in range(1, args.repeats + 1):
        mine = [r for r in results if r["repeat"] == repeat]
        sb3 = next(r for r in mine if r["system"].startswith("stable"))
        for r in mine:
            rows.append([repeat, r["system"], f"{r['steps_per_s']:,.0f}", f"{r['steps_per_s_whole_loop']:,.0f}",
                         f"{r['steps_per_s'] / sb3['steps_per_s']:.2f}x", f"{r['t_rollout']:.3f}",
                         f"{r['t_update']:.3f}", f"{r['t_other']:.3f}", f"{r['grad_steps_per_iter']:.0f}",
                         f"{r['mean_return']:.1f} ({r['tail_episodes']})", f"{r['process_wall_s']:.0f}",
                         f"{r['load_before']:.2f}"])
    for n in args.nprocs:
        ratios = []
        for repeat in range(1, args.repeats + 1):
            mine = {r["system"]: r for r in results if r["repeat"] == repeat}
            sb3 = next(v for k, v in mine.items() if k.startswith("stable"))
            ratios.append(mine[f"train.py --nprocs {n}"]["steps_per_s"] / sb3["steps_per_s"])
        met = "met" if statistics.median(ratios) >= TARGET_RATIO else "missed"
        ratio_lines.append(f"- train.py --nprocs {n} / SB3 PPO, steps/s after the warm-up: median "
                           f"**{statistics.median(ratios):.2f}x** over {len(ratios)} repeat(s) "
                           f"({', '.join(f'{x:.2f}x' for x in ratios)})"
                           + (f"; target {TARGET_RATIO:.0f}x: {met}" if n == 2 else ""))
    loads = ", ".join(f"r{r['repeat']} {r['system'].split(',')[0]}: {r['load_before']:.2f}" for r in results)
    header = machine_lines(command, wall_s, loads)
    header.insert(1, f"- budget: {args.total_steps} steps per run on {args.env}, seed {args.seed}; warm-up "
                  f"{args.warmup} iteration(s) left out of steps/s; final mean return over the episodes of the last "
                  f"{args.tail} iterations; " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    markdown = "\n".join([
        *header, "",
        "Per run (seconds per iteration; ours: rollout = rollout + gather, update = update + broadcast, other = "
        "logging and checkpoints; ratio = steps/s over SB3's in the same repeat):", "",
        table(["repeat", "system", "steps/s", "steps/s whole loop", "vs SB3", "rollout s", "update s", "other s",
               "grad steps / iter", "final mean return (episodes)", "process wall s", "load before"], rows),
        "", *ratio_lines,
    ]) + "\n"
    (out / "results.md").write_text(markdown)
    plot_curves(curves, out / "vs_sb3.png", f"{args.env}, {args.total_steps} steps, seed {args.seed} (repeats with the "
                "same seed learn identically: one curve per system)")
    print()
    print(markdown)
    print(f"wrote runs.csv, curves.csv, results.md, vs_sb3.png to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
