"""Stable-Baselines3's PPO three ways at the same total steps, side by side (benchmarks/README.md, section
sb3_mpi.py): a plain script (one env), SB3's SubprocVecEnv with N envs, and the plain script on N MPI processes
through mpi_util.sb3.parallelize (one env per rank). Every configuration updates on 2,048 rows (n_steps = 2048 / N);
each run is a fresh subprocess, one at a time, in an order that reverses from repeat to repeat. Writes runs.csv,
results.md and sb3_mpi.png to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from harness import fmt, median, options, run_for_result, table, write_results

BATCH_STEPS = 2048  # rows per PPO update, over all envs and ranks


def run_one(kind: str, n: int, env_id: str, total_steps: int, seed: int, result_path: Path, device: str) -> None:
    """Train one configuration in this process (for ``mpi``: relaunched as n ranks); rank 0 writes result_path."""
    import mpi_util
    import mpi_util.sb3  # before stable_baselines3: keeps TensorFlow out of the process

    fork = mpi_util.mpi_fork(n if kind == "mpi" else 1)
    if fork == "parent":
        sys.exit(fork.returncode)

    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecNormalize

    torch.set_num_threads(1)
    n_envs = n if kind == "subproc" else 1
    vec_env_cls = SubprocVecEnv if kind == "subproc" else None
    env = VecNormalize(make_vec_env(env_id, n_envs=n_envs, seed=seed, vec_env_cls=vec_env_cls))
    n_steps = BATCH_STEPS // n  # the update sees BATCH_STEPS rows over all envs and ranks (plain: n is 1)
    model = PPO("MlpPolicy", env, n_steps=n_steps, batch_size=64, n_epochs=10, learning_rate=3e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, seed=seed, device=device, verbose=0)
    if kind == "mpi":
        model = mpi_util.sb3.parallelize(model)

    curve: list[tuple[int, float, float]] = []  # (steps, seconds into learn, mean return of the last 100 episodes)

    class Record(BaseCallback):
        """At the start of each rollout (after the previous update, when rank 0 holds every rank's episodes)."""

        def _on_rollout_start(self) -> None:
            self._record()

        def _on_training_end(self) -> None:
            self._record()

        def _record(self) -> None:
            episodes = [e["r"] for e in self.model.ep_info_buffer]
            mean = sum(episodes) / len(episodes) if episodes else float("nan")
            curve.append((self.model.num_timesteps, time.perf_counter() - start, mean))

        def _on_step(self) -> bool:
            return True

    start = time.perf_counter()
    model.learn(total_steps, callback=Record())
    learn_s = time.perf_counter() - start
    if mpi_util.rank == 0:
        result_path.write_text(json.dumps({
            "steps": model.num_timesteps, "learn_s": learn_s, "final_return": curve[-1][2],
            "episodes": len(model.ep_info_buffer), "curve": curve,
            "in_sync": mpi_util.ranks_out_of_sync(model.policy) == [],
        }))
    else:
        mpi_util.ranks_out_of_sync(model.policy)
    env.close()


def label(kind: str, n: int) -> str:
    return {"plain": "plain SB3, 1 env", "subproc": f"SB3 SubprocVecEnv, {n} envs",
            "mpi": f"mpi_util.sb3, {n} processes"}[kind]


def main() -> int:
    parser = options(__doc__, "sb3_mpi", env="Hopper-v5", total_steps=150_000, nprocs=[2, 8], repeats=1, seed=0,
                     timeout=1800.0)
    parser.add_argument("--device", default="cpu",
                        help="torch device of every process's policy, e.g. cuda: every rank on the GPU "
                             "(default: %(default)s)")
    parser.add_argument("--run", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)  # one run, internal
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_one(args.run[0], int(args.run[1]), args.env, args.total_steps, args.seed, args.result, args.device)
        return 0
    if BATCH_STEPS % max(args.nprocs) or min(args.nprocs) < 1:
        parser.error(f"--nprocs: each count must divide {BATCH_STEPS} (the rows per update)")

    configs = [("plain", 1)] + [(kind, n) for n in args.nprocs for kind in ("subproc", "mpi")]
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(1, args.repeats + 1):
            for kind, n in (configs if repeat % 2 else configs[::-1]):
                result_path = Path(scratch) / f"{kind}{n}_{repeat}.json"
                command = [sys.executable, __file__, "--run", kind, str(n), "--env", args.env,
                           "--total_steps", str(args.total_steps), "--seed", str(args.seed), "--device", args.device,
                           "--result", str(result_path)]
                result, wall, load = run_for_result(command, result_path, args.timeout, f"sb3_mpi: {label(kind, n)}")
                run = {"repeat": repeat, "system": label(kind, n), "kind": kind, "n": n,
                       "steps": result["steps"], "steps_per_s": result["steps"] / result["learn_s"],
                       "learn_s": result["learn_s"], "process_wall_s": wall, "final_return": result["final_return"],
                       "episodes": result["episodes"], "in_sync": result["in_sync"], "load_before": load}
                runs.append(run)
                curves += [{"repeat": repeat, "system": run["system"], "steps": s, "seconds": t, "mean_return": r}
                           for s, t, r in result["curve"]]
                print(f"{run['system']}: {fmt(run['steps_per_s'])} steps/s, final return {run['final_return']:.1f}, "
                      f"{wall:.0f} s", flush=True)
    wall_s = time.perf_counter() - began

    plain_rate = {r["repeat"]: r["steps_per_s"] for r in runs if r["kind"] == "plain"}
    for r in runs:
        r["vs_plain"] = r["steps_per_s"] / plain_rate[r["repeat"]]

    rows = [[r["repeat"], r["system"], fmt(r["steps_per_s"]), f"{r['vs_plain']:.2f}x", f"{r['final_return']:.1f}",
             r["episodes"], fmt(r["learn_s"]), fmt(r["process_wall_s"]), "yes" if r["in_sync"] else "NO",
             f"{r['load_before']:.2f}"] for r in runs]
    summary = [[label(kind, n), fmt(median([r["steps_per_s"] for r in runs if (r["kind"], r["n"]) == (kind, n)])),
                f"{median([r['vs_plain'] for r in runs if (r['kind'], r['n']) == (kind, n)]):.2f}x",
                f"{median([r['final_return'] for r in runs if (r['kind'], r['n']) == (kind, n)]):.1f}"]
               for kind, n in configs]
    about = [f"- budget: {args.total_steps} steps per run (rounded up to whole updates of {BATCH_STEPS} rows), seed "
             f"{args.seed}; stable_baselines3 {version('stable_baselines3')}, torch {version('torch')}, 1 torch "
             f"thread per process, policies on {args.device}"]
    body = "\n\n".join([
        "Median over repeats (vs plain = steps/s over plain SB3's in the same repeat):",
        table(["system", "steps/s", "vs plain", "final return"], summary), "Every run:",
        table(["repeat", "system", "steps/s", "vs plain", "final return (last 100 episodes)", "episodes in record",
               "learn s", "process wall s", "weights equal on all ranks", "load before"], rows)])
    write_results(args.out, runs, body, wall_s, ", ".join(f"{r['system']}: {r['load_before']:.2f}" for r in runs),
                  about, f"Stable-Baselines3 PPO on {args.env}: plain, SubprocVecEnv and mpi_util.sb3")
    plot(curves, args.out / "sb3_mpi.png", args.env)
    return 0


def plot(curves: list[dict[str, Any]], path: Path, env_id: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for system in dict.fromkeys(c["system"] for c in curves):
        for repeat in sorted({c["repeat"] for c in curves if c["system"] == system}):
            points = [c for c in curves if c["system"] == system and c["repeat"] == repeat]
            name = system if repeat == 1 else None
            by_steps.plot([p["steps"] for p in points], [p["mean_return"] for p in points], label=name)
            by_time.plot([p["seconds"] for p in points], [p["mean_return"] for p in points], label=name)
    by_steps.set_xlabel("environment steps")
    by_time.set_xlabel("seconds of learn()")
    for ax in (by_steps, by_time):
        ax.set_ylabel("mean return, last 100 episodes")
        ax.grid(alpha=0.3)
    by_steps.legend(fontsize=8)
    fig.suptitle(f"SB3 PPO on {env_id}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
