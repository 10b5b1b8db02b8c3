"""train.py and its peers at equal work, side by side: stable-baselines3 PPO (peer_sb3_ppo.py), a CleanRL-style torch
PPO (peer_cleanrl_ppo.py; on an ALE game peer_cleanrl_atari.py) and RLlib PPO (peer_rllib_ppo.py, in
benchmarks/.venv-rllib from setup_peers.sh; skipped with a note without it). Every system runs the same env, budget and
seed with 2,048 steps and 10 epochs of 64-row minibatches per update (other work for train.py, stable-baselines3 and,
on an ALE game, the CleanRL-style PPO: --batch_size, --epochs, --minibatch_size, --lr); each run is a fresh
subprocess, one at a time (--concurrent: a repeat's runs at once, for learning curves), in an order that reverses
from repeat to repeat, and ratios pair runs of the same repeat (benchmarks/README.md, section peers.py). Writes
runs.csv, results.md (with --window W, a table of each system's mean return per W iterations) and a plot of the returns
to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness import (
    REPO,
    load_average,
    options,
    run_for_result,
    run_train,
    summarize_run,
    table,
    write_results,
)

from algos.registry import ALGORITHMS, ENVS_IN_ALL
from envs.atari import is_atari
from envs.make import env_family

WORK_DEFAULTS = {"batch_size": 2048, "epochs": 10, "minibatch_size": 64, "lr": 3e-4}  # train.py's PPO defaults
CLEANRL_ATARI_WORK = {"batch_size": "batch_steps", "epochs": "update_epochs", "minibatch_size": "minibatch_size",
                      "lr": "learning_rate"}  # train.py's work options -> peer_cleanrl_atari.py's
RLLIB_PYTHON = REPO / "benchmarks" / ".venv-rllib" / "bin" / "python"  # made by setup_peers.sh
SYSTEMS = ("ours", "sb3", "cleanrl", "rllib")
Episodes = list[tuple[int, float, int]]
"""A run's iterations: (steps so far, mean return of the episodes that ended in the iteration, those episodes)."""

NOTES = [
    "train.py: lr annealed linearly to 0; an update's epochs stop when an epoch's approx KL exceeds 1.5 x 0.02 "
    "(on an ALE game the Atari settings of algos.registry instead: no KL stop, clip 0.1 decayed to 0, entropy "
    "0.01, value loss clipped and weighed 0.25, advantages normalized per minibatch, value targets the returns as "
    "they are); vector observations "
    "normalized with running statistics (clip 10), value targets with running return statistics; rank 0's TF "
    "threads and kernels as trainer.kernels chooses them per network (an MLP: one thread, TensorFlow's own "
    "kernels; a CNN: oneDNN, a thread per CPU for Atari's).",
    "stable-baselines3: constant lr; target_kl 0.02 checked after every minibatch; VecNormalize of observations "
    "and rewards (clip 10); on an ALE game train.py's Atari settings, 8 envs (peer_sb3_ppo.py); torch threads as "
    "the system column says.",
    "CleanRL-style: lr annealed linearly to 0; epochs stop on approx KL > 1.5 x 0.02 (CleanRL's per-epoch check, "
    "train.py's threshold); per-env NormalizeObservation and NormalizeReward wrappers, each clipped at 10; clipped "
    "value loss; a time-limit truncation ends the return like a termination (CleanRL's choice, no bootstrap); torch "
    "on one thread.",
    "RLlib (new API stack, torch, one local learner in the driver, N env runner processes with one env each): lr "
    "annealed as train.py's by a schedule; cannot be made equal: no reward normalization (returns learned "
    "unscaled), the value loss clipped at vf_clip_param 10 instead of normalized targets, RLlib's own network "
    "initialization, no early stop on KL, and each learner batch carries one extra row per episode fragment (the "
    "bootstrap step, masked out of the loss) in full 64-row minibatches, so slightly more than 320 Adam steps. Its "
    "final mean return is RLlib's own mean of the last 100 episodes, its curve that running mean. Process wall time "
    "includes starting ray. Torch on one thread in the driver.",
    "On an image env (MinAtar, Atari) no system normalizes observations: train.py and stable-baselines3 both scale "
    "pixels to [0, 1] in train.py's CNNs (peer_sb3_ppo.py builds them in torch), one torso under the policy and value "
    "heads on Atari, two CNNs elsewhere; rewards are normalized as above.",
]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = options(__doc__, "peers", env="Walker2d-v5", nprocs=[2], total_steps=61_440, repeats=1, seed=0,
                     warmup=2, tail=10, timeout=900.0)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                        help="systems to run, in this order in the first repeat (default: all)")
    parser.add_argument("--cleanrl_envs", type=int, nargs="+", default=[1],
                        help="env counts of the CleanRL-style PPO's vector env (default: %(default)s)")
    parser.add_argument("--vary_seed", action="store_true",
                        help="repeat k runs seed SEED + k, a learning comparison over seeds (default: every repeat "
                             "runs SEED)")
    for name, default in WORK_DEFAULTS.items():
        parser.add_argument(f"--{name}", type=type(default), default=default,
                            help=f"train.py's --{name} for ours, stable-baselines3 and, on an ALE game, the "
                                 "CleanRL-style PPO (default: %(default)s)")
    parser.add_argument("--train_args", default="",
                        help="more train.py arguments for ours, one string (e.g. '--precision bfloat16')")
    parser.add_argument("--concurrent", action="store_true",
                        help="run a repeat's runs at the same time (learning curves: steps/s then share the cores)")
    parser.add_argument("--window", type=int, default=0, metavar="ITERATIONS",
                        help="also tabulate each run's mean return per window of this many iterations, over the "
                             "episodes that ended in it (RLlib's record has no episodes: left out) (default: none)")
    args = parser.parse_args(argv)
    takers = {"ours", "sb3", "cleanrl"} if is_atari(args.env) else {"ours", "sb3"}
    if any(getattr(args, k) != v for k, v in WORK_DEFAULTS.items()) and {*args.systems} - takers:
        parser.error("--batch_size, --epochs, --minibatch_size and --lr apply to ours, sb3 and, on an ALE game, "
                     "cleanrl only")
    iterations = args.total_steps // args.batch_size
    if args.window < 0 or args.window > iterations:
        parser.error(f"--window {args.window}: give 0 (no table) or at most the run's {iterations} iterations")
    if iterations <= args.warmup or iterations < args.tail:
        parser.error(f"--total_steps {args.total_steps} gives {iterations} iteration(s) of {args.batch_size} steps: "
                     f"need more than --warmup {args.warmup} and at least --tail {args.tail}")
    return args


def image_env(env_id: str) -> bool:
    """Whether train.py's policy reads ``env_id``'s observations as images (a CNN)."""
    from algos.spaces import obs_spec
    from envs.make import make_env

    env = make_env(env_id)
    try:
        return obs_spec(env.observation_space).is_image
    finally:
        env.close()


def summarize_peer(record: dict[str, Any], system: str, nprocs: int, warmup: int, tail: int) -> dict[str, Any]:
    """What summarize_ours gives, from a peer's per-iteration record (steps, wall_s, t_rollout,
    t_update, grad_steps, and either returns: the episodes ended that iteration, or episode_return_mean)."""
    its = record["iterations"]
    steady = its[warmup:]
    before = its[warmup - 1] if warmup else {"steps": 0, "wall_s": 0.0}
    wall = its[-1]["wall_s"] - before["wall_s"]
    t_rollout = statistics.fmean(r["t_rollout"] for r in steady)
    t_update = statistics.fmean(r["t_update"] for r in steady)
    if "returns" in its[0]:
        tail_returns = [x for r in its[-tail:] for x in r["returns"]]
        mean_return = statistics.fmean(tail_returns) if tail_returns else math.nan
        tail_episodes = len(tail_returns)
    else:  # RLlib: its own running mean of the last 100 episodes
        mean_return = its[-1]["episode_return_mean"]
        tail_episodes = min(100, sum(r["episodes"] for r in its))
    return {"system": system, "nprocs": nprocs, "iterations": len(its),
            "steps_per_s": (its[-1]["steps"] - before["steps"]) / wall,
            "steps_per_s_whole_loop": its[-1]["steps"] / its[-1]["wall_s"], "t_rollout": t_rollout,
            "t_update": t_update, "t_other": wall / len(steady) - t_rollout - t_update,
            "grad_steps_per_iter": statistics.fmean(r["grad_steps"] for r in steady), "mean_return": mean_return,
            "tail_episodes": tail_episodes, "process_wall_s": record["process_wall_s"],
            "load_before": record["load_before"]}


def summarize_ours(run: Any, args: argparse.Namespace) -> dict[str, Any]:
    """summarize_peer's figures for a train.py run: rollout = rollout + gather, update = update + broadcast."""
    s = summarize_run(run, args.warmup, args.tail, os.cpu_count() or 1)
    system = f"train.py --nprocs {run.nprocs}" + (f" {args.train_args}" if args.train_args else "")
    return {"system": system, "nprocs": run.nprocs, "iterations": s["iterations"],
            "steps_per_s": s["steps_per_s"], "steps_per_s_whole_loop": s["steps_per_s_whole_loop"],
            "t_rollout": s["t_sampling"], "t_update": s["t_update"] + s["t_bcast"], "t_other": s["t_other"],
            "grad_steps_per_iter": s["epochs_mean"] * math.ceil(args.batch_size / args.minibatch_size),
            "mean_return": s["mean_return"],
            "tail_episodes": s["tail_episodes"], "process_wall_s": s["process_wall_s"],
            "load_before": s["load_before"]}


def episodes_peer(record: dict[str, Any]) -> Episodes | None:
    """A peer's Episodes, from its per-iteration returns (None for RLlib, whose record holds a running mean)."""
    if "returns" not in record["iterations"][0]:
        return None
    return [(r["steps"], statistics.fmean(r["returns"]) if r["returns"] else math.nan, len(r["returns"]))
            for r in record["iterations"]]


def window_rows(episodes: Episodes, window: int) -> list[tuple[int, int, float, int]]:
    """(steps at the window's first iteration, at its last, mean return, episodes) for each whole window of
    ``window`` iterations; the mean weighs each iteration's mean by its episodes (NaN for a window without one). A last
    partial window is left out."""
    rows = []
    for start in range(0, len(episodes) - window + 1, window):
        its = episodes[start : start + window]
        count = sum(n for _, _, n in its)
        total = sum(mean * n for _, mean, n in its if n)
        rows.append((its[0][0], its[-1][0], total / count if count else math.nan, count))
    return rows


def window_table(runs: list[tuple[str, Episodes]], window: int) -> list[str]:
    """results.md's lines for --window: a paragraph and one table, a column per run (label, Episodes)."""
    columns = [window_rows(episodes, window) for _, episodes in runs]
    # zip stops at the shortest column: the runs have the same budget, so all have the same windows.
    rows = [[f"{windows[0][0]:,}-{windows[0][1]:,}", *(f"{w[2]:.2f} ({w[3]})" for w in windows)]
            for windows in zip(*columns, strict=False)]
    return [f"Mean return per {window}-iteration window (episodes that ended in it; each iteration's mean weighed by "
            "its episodes; a last partial window left out; steps of the first run's iterations, every system "
            "running the same steps per iteration):", "",
            table(["steps", *(f"{label} (episodes)" for label, _ in runs)], rows)]


def curves_peer(record: dict[str, Any], episodes: Episodes | None) -> tuple[list[float], list[float]]:
    """Mean return per iteration against steps: of the episodes ended in it (``episodes``, episodes_peer's), or for
    RLlib (None) its running mean; iterations without a value are left out."""
    if episodes is not None:
        points = [(steps, mean) for steps, mean, count in episodes if count]
    else:
        points = [(r["steps"], r["episode_return_mean"]) for r in record["iterations"]
                  if not math.isnan(r.get("episode_return_mean", math.nan))]
    return [steps for steps, _ in points], [mean for _, mean in points]


def jobs_of(args: argparse.Namespace, rllib_ready: bool) -> list[tuple[str, int]]:
    """(system, N) in the first repeat's order: N is train.py's nprocs, the CleanRL envs or RLlib's env runners."""
    jobs: list[tuple[str, int]] = []
    for system in args.systems:
        if system == "ours":
            jobs += [("ours", n) for n in args.nprocs]
        elif system == "sb3":
            jobs.append(("sb3", 1))
        elif system == "cleanrl":
            jobs += [("cleanrl", n) for n in args.cleanrl_envs]
        elif rllib_ready:
            jobs += [("rllib", n) for n in args.nprocs]
    return jobs


def run_job(args: argparse.Namespace, system: str, n: int, workdir: Path, seed: int
            ) -> tuple[dict[str, Any], tuple[list[float], list[float]], Episodes | None, dict[str, str]]:
    """One run: its summary, its return curve, its Episodes (None for RLlib) and the versions it ran with."""
    work = [f"--{name}={getattr(args, name)}" for name in WORK_DEFAULTS]
    if system == "ours":
        run = run_train(args.env, n, args.total_steps, workdir, args.timeout,
                        ["--seed", str(seed), *work, *shlex.split(args.train_args)])
        return (summarize_ours(run, args),
                ([r["total_steps"] for r in run.rows], [r["ep_return_mean"] for r in run.rows]),
                [(int(r["total_steps"]), r["ep_return_mean"], int(r["episodes"])) for r in run.rows], {})
    json_path = workdir / f"{system}.json"
    # An image env's CNN: the torch peers each on all the cores; an MLP on one thread.
    threads = (os.cpu_count() or 1) if system in ("sb3", "cleanrl") and image_env(args.env) else 1
    common = ["--total_steps", str(args.total_steps), "--seed", str(seed), "--torch_threads", str(threads),
              "--json", str(json_path)]
    if system == "sb3":
        command = [sys.executable, str(REPO / "benchmarks" / "peer_sb3_ppo.py"), "--env", args.env, *common, *work]
        envs = ALGORITHMS["ppo"].defaults_for(env_family(args.env)).get(ENVS_IN_ALL, 1)  # as peer_sb3_ppo.py
        label = f"stable-baselines3 PPO, {envs} env{'s' if envs > 1 else ''}, torch {threads} thread(s)"
    elif system == "cleanrl":
        atari = is_atari(args.env)
        script = "peer_cleanrl_atari.py" if atari else "peer_cleanrl_ppo.py"
        atari_work = [f"--{CLEANRL_ATARI_WORK[name]}={getattr(args, name)}" for name in WORK_DEFAULTS] if atari else []
        command = [sys.executable, str(REPO / "benchmarks" / script), "--env_id", args.env, "--num_envs", str(n),
                   *common, *atari_work]
        label = f"CleanRL-style PPO, {n} env{'s' if n > 1 else ''}, torch {threads} thread(s)"
    else:
        command = [str(RLLIB_PYTHON), str(REPO / "benchmarks" / "peer_rllib_ppo.py"), "--env", args.env,
                   "--num_env_runners", str(n), *common]
        label = f"RLlib PPO, {n} env runner{'s' if n > 1 else ''}"
    workdir.mkdir(parents=True)
    record, process_wall_s, load_before = run_for_result(command, json_path, args.timeout, system)
    record.update(process_wall_s=process_wall_s, load_before=load_before)
    versions = {f"{system} {k}": v for k, v in record["versions"].items()}
    episodes = episodes_peer(record)
    return summarize_peer(record, label, n, args.warmup, args.tail), curves_peer(record, episodes), episodes, versions


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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    notes: list[str] = []
    rllib_ready = RLLIB_PYTHON.exists()
    if "rllib" in args.systems and not rllib_ready:
        notes.append(f"RLlib skipped: {RLLIB_PYTHON} not found; make it with `bash benchmarks/setup_peers.sh`.")
        print(f"peers: {notes[-1]}", flush=True)
    if image_env(args.env) and {"sb3", "cleanrl"} & {*args.systems}:
        notes.append(f"{args.env} is an image env: stable-baselines3 and the CleanRL-style PPO run torch on all "
                     f"{os.cpu_count() or 1} cores, not one thread.")
    if is_atari(args.env) and "cleanrl" in args.systems:
        notes.append("CleanRL-style on an ALE game (peer_cleanrl_atari.py), not as above: train.py's Atari "
                     "preprocessing (envs.atari), one Nature CNN torso under both heads, rewards learned clipped to "
                     "their sign and a lost life ending the bootstrap (as train.py), no normalization; clip 0.1 and lr "
                     "both annealed linearly to 0, clipped value loss, entropy 0.01, no KL early stop.")
    jobs = jobs_of(args, rllib_ready)
    workroot = Path(tempfile.mkdtemp(prefix="bench_peers_", dir="/tmp"))
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    curves: list[tuple[str, list[float], list[float]]] = []
    windowed: list[tuple[str, Episodes]] = []  # the runs that --window tabulates, as their curves
    versions: dict[str, str] = {}
    try:
        for repeat in range(args.repeats):
            seed = args.seed + repeat if args.vary_seed else args.seed
            order = jobs if repeat % 2 == 0 else list(reversed(jobs))
            print(f"peers: repeat {repeat + 1}/{args.repeats}: {', '.join(f'{s} ({n})' for s, n in order)}, "
                  f"{args.total_steps} steps each (load {load_average():.2f}) ...", flush=True)
            with ThreadPoolExecutor(max_workers=len(order) if args.concurrent else 1) as pool:
                runs = [pool.submit(run_job, args, system, n, workroot / f"r{repeat}_{system}_{n}", seed)
                        for system, n in order]
            for (system, n), finished in zip(order, runs, strict=True):
                try:
                    summary, curve, episodes, run_versions = finished.result()
                except RuntimeError as error:  # one failed system must not cost the others' measurements
                    notes.append(f"repeat {repeat + 1}, {system} ({n}) failed: {str(error).splitlines()[0]}")
                    print(f"peers: {error}", flush=True)
                    continue
                versions.update(run_versions)
                results.append({"repeat": repeat + 1, "seed": seed, **summary})
                if repeat == 0 or args.vary_seed:  # one seed: one curve per system says what it learns
                    label = summary["system"] + (f", seed {seed}" if args.vary_seed else "")
                    curves.append((label, *curve))
                    if episodes is not None:
                        windowed.append((label, episodes))
                print(f"  {summary['steps_per_s']:,.0f} steps/s (whole loop {summary['steps_per_s_whole_loop']:,.0f}), "
                      f"rollout {summary['t_rollout']:.3f} s, update {summary['t_update']:.3f} s per iteration, "
                      f"{summary['grad_steps_per_iter']:.0f} Adam steps, mean return {summary['mean_return']:.1f}, "
                      f"process {summary['process_wall_s']:.0f} s", flush=True)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    if not results:
        print("peers: no run finished; nothing written", file=sys.stderr)
        return 1
    report(args, out, time.perf_counter() - started, results, versions, notes,
           window_table(windowed, args.window) if args.window and windowed else [])
    which = "one curve per run" if args.vary_seed else f"seed {args.seed}, one curve per system: the first repeat's"
    plot_curves(curves, out / "peers.png", f"{args.env}, {args.total_steps} steps ({which}; RLlib's is its running "
                "mean of the last 100 episodes)")
    return 1 if any(" failed: " in note for note in notes) else 0


def report(args: argparse.Namespace, out: Path, wall_s: float, results: list[dict[str, Any]],
           versions: dict[str, str], notes: list[str], windows: list[str]) -> None:
    """runs.csv and results.md: every run, the ratios of the first system (train.py by default) to the others, then
    ``windows`` (window_table's lines, or none)."""
    baseline = results[0]["system"]
    rows, ratios = [], {}
    for repeat in range(1, args.repeats + 1):
        mine = [r for r in results if r["repeat"] == repeat]
        base = next((r["steps_per_s"] for r in mine if r["system"] == baseline), math.nan)
        for r in mine:
            ratios.setdefault(r["system"], []).append(base / r["steps_per_s"])
            rows.append([repeat, r["seed"], r["system"], f"{r['steps_per_s']:,.0f}",
                         f"{r['steps_per_s_whole_loop']:,.0f}", f"{r['steps_per_s'] / base:.2f}x",
                         f"{r['t_rollout']:.3f}", f"{r['t_update']:.3f}",
                         f"{r['t_other']:.3f}", f"{r['grad_steps_per_iter']:.0f}",
                         f"{r['mean_return']:.1f} ({r['tail_episodes']})", f"{r['process_wall_s']:.0f}",
                         f"{r['load_before']:.2f}"])
    returns: dict[str, list[float]] = {}
    for r in results:
        returns.setdefault(r["system"], []).append(r["mean_return"])
    return_lines = [f"- {system}: final mean return {statistics.mean(xs):.2f} over {len(xs)} run(s) "
                    f"({', '.join(f'{x:.2f}' for x in xs)})" for system, xs in returns.items()]
    ratio_lines = [f"- {baseline} / {system}, steps/s after the warm-up: median **{statistics.median(xs):.2f}x** over "
                   f"{len(xs)} repeat(s) ({', '.join(f'{x:.2f}x' for x in xs)})"
                   for system, xs in ratios.items() if system != baseline]
    seeds = f"seeds {args.seed}-{args.seed + args.repeats - 1}" if args.vary_seed else f"seed {args.seed}"
    about = [f"- budget: {args.total_steps} steps per run on {args.env}, {seeds}; warm-up {args.warmup} "
             f"iteration(s) left out of steps/s; final mean return over the episodes of the last {args.tail} "
             f"iterations; per iteration {args.batch_size} steps, {args.epochs} epochs of {args.minibatch_size}-row "
             f"minibatches, lr {args.lr}; "
             + ("a repeat's runs at the same time (--concurrent), sharing the cores; " if args.concurrent else "")
             + ", ".join(f"{k} {v}" for k, v in versions.items())]
    loads = ", ".join(f"r{r['repeat']} {r['system'].split(', torch')[0]}: {r['load_before']:.2f}" for r in results)
    body = "\n".join([
        f"Per run (seconds per iteration; ours: rollout = rollout + gather, update = update + broadcast; RLlib: "
        f"update = its learner update, rollout = the rest of train(); ratio = steps/s over {baseline}'s in the same "
        "repeat):", "",
        table(["repeat", "seed", "system", "steps/s", "steps/s whole loop", "ratio", "rollout s", "update s", "other s",
               "Adam steps / iter", "final mean return (episodes)", "process wall s", "load before"], rows),
        "", *ratio_lines, *return_lines, "",
        "What each system does (the work per iteration is the same; these are the differences):", "",
        *(f"- {note}" for note in NOTES),
        *(["", *(f"- {note}" for note in notes)] if notes else []),
        *(["", *windows] if windows else []),
    ])
    write_results(out, results, body, wall_s, loads, about)


if __name__ == "__main__":
    raise SystemExit(main())
