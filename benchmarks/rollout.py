"""The rollout of one rank against the bare env.step loop: how much of the simulator's speed a rank keeps
(benchmarks/README.md, section rollout.py).

In one process, interleaved in chunks of ``--chunk`` steps in an order rotated from chunk to chunk: ``bare``
(env.step with random actions drawn beforehand), ``bare_sample`` (action_space.sample() per step), ``rollout``
(algos.RolloutWorker.collect, what every rank of train.py runs, with single-threaded BLAS as mpi_fork starts a rank),
``rollout_<K>envs`` (K envs per rank) and ``actor_only`` (the policy's forward passes alone). Ratios to ``bare`` pair
the variants of a round. Then two worker processes at once against one, and ``--oversub`` processes sharing two
processes' steps against two: the machine's ceiling for train.py's sampling efficiency. Writes rollout.csv,
parallel.csv and results.md to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness import RESULTS, load_average, machine_lines, table, write_csv

DEFAULT_OUT = RESULTS / "rollout"


def variants_of(envs_per_rank: Sequence[int]) -> tuple[str, ...]:
    """The measured variants, ``rollout_<K>envs`` for each K > 1 of envs_per_rank."""
    return ("bare", "bare_sample", "rollout", *(f"rollout_{k}envs" for k in envs_per_rank if k > 1), "actor_only")


TARGET_RATIO = 0.80
# What mpi_fork gives every rank. Without it OpenBLAS runs the end-of-rollout value pass on two threads, whose
# worker then spins for a while and is charged to (and competes with) whatever is measured next.
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def bare_loop(env_id: str, seed: int, steps: int, sample: bool) -> Callable[[], int]:
    """A prepared bare loop: each call runs the next ``steps`` env.step calls (episodes go on across calls) and
    returns the number of episodes that ended."""
    import gymnasium

    env = gymnasium.make(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    space = env.action_space
    actions = np.random.default_rng(seed).uniform(space.low, space.high, size=(steps, *space.shape)).astype(
        space.dtype)

    def run() -> int:
        ended = 0
        for t in range(steps):
            _, _, terminated, truncated, _ = env.step(space.sample() if sample else actions[t])
            if terminated or truncated:
                env.reset()
                ended += 1
        return ended

    return run


def rollout_loop(env_id: str, seed: int, steps: int, n_envs: int = 1) -> tuple[Callable[[], int], Callable[[], int]]:
    """(rollout, actor_only), prepared: each call runs the next ``steps`` steps (over n_envs envs stepped in
    lockstep) and returns the episodes ended (0 for actor_only). The actor is a fresh ActorCritic's numpy snapshot,
    as train.py's first iteration uses."""
    import gymnasium
    import keras

    from algos import ActorCritic, RolloutWorker

    env = gymnasium.make(env_id)
    keras.utils.set_random_seed(seed)
    ac = ActorCritic(env.observation_space.shape[0], env.action_space, hidden=(64, 64))
    actor = ac.numpy_actor()
    worker = RolloutWorker([env] + [gymnasium.make(env_id) for _ in range(n_envs - 1)], seed=seed, gamma=0.99,
                           lam=0.95)
    rng = np.random.default_rng(seed)
    obs_rows = np.random.default_rng(seed).normal(size=(steps, 1, env.observation_space.shape[0])).astype(np.float32)

    def rollout() -> int:
        _, episodes = worker.collect(steps, actor, rng)
        return len(episodes["ep_length"])

    def actor_only() -> int:
        noise = actor.exploration_noise(rng, steps)  # drawn for all rows at once, as RolloutWorker.collect does
        for t in range(steps):
            actor.act_with_noise(obs_rows[t], noise[t : t + 1])
        return 0

    return rollout, actor_only


def measure(run: Callable[[], int]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process, episodes ended) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    ended = run()
    return time.perf_counter() - wall, time.process_time() - cpu, ended


def summarize(records: list[dict[str, Any]], variants: Sequence[str]) -> tuple[list[list[str]], dict[str, float]]:
    """Table rows (median over rounds per variant) and the paired ratios rollout / bare (and rollout_<K>envs / bare
    as "wall_<variant>")."""
    rows = []
    best = {}
    multi = [v for v in variants if v.endswith("envs")]
    for variant in variants:
        mine = [r for r in records if r["variant"] == variant]
        sps = [r["steps_per_s"] for r in mine]
        best[variant] = max(r["best_chunk_steps_per_s"] for r in mine)
        rows.append([variant, f"{statistics.median(sps):,.0f}", f"{min(sps):,.0f}-{max(sps):,.0f}",
                     f"{statistics.median(r['steps_per_cpu_s'] for r in mine):,.0f}", f"{best[variant]:,.0f}",
                     f"{statistics.median(r['us_per_step'] for r in mine):.1f}",
                     f"{statistics.median(r['episodes'] for r in mine):.0f}"])
    ratios: dict[str, list[float]] = {"wall": [], "cpu": [], "wall_vs_sample": [], "actor_share": [],
                                      **{f"wall_{v}": [] for v in multi}}
    for k in sorted({r["round"] for r in records}):
        by = {r["variant"]: r for r in records if r["round"] == k}
        ratios["wall"].append(by["rollout"]["steps_per_s"] / by["bare"]["steps_per_s"])
        ratios["cpu"].append(by["rollout"]["steps_per_cpu_s"] / by["bare"]["steps_per_cpu_s"])
        ratios["wall_vs_sample"].append(by["rollout"]["steps_per_s"] / by["bare_sample"]["steps_per_s"])
        ratios["actor_share"].append(by["actor_only"]["cpu_s"] / by["rollout"]["cpu_s"])
        for v in multi:
            ratios[f"wall_{v}"].append(by[v]["steps_per_s"] / by["bare"]["steps_per_s"])
    summary = {}
    for key, values in ratios.items():
        summary[key] = statistics.median(values)
        summary[key + "_min"] = min(values)
        summary[key + "_max"] = max(values)
    summary["best"] = best["rollout"] / best["bare"]
    summary["best_vs_sample"] = best["rollout"] / best["bare_sample"]
    return rows, summary


# ----------------------------------------------------------------------------------------------------------------
# Two processes at once.
# ----------------------------------------------------------------------------------------------------------------


def parallel_worker(args: argparse.Namespace) -> int:
    """Worker mode: prepare a bare loop and a rollout of --par_steps steps, say "ready", then for each line
    "bare" or "rollout" on stdin run it and print {"wall_s": ...}; stop at "quit" or end of input."""
    seed = args.seed + args.par_worker_index
    rollout, _ = rollout_loop(args.env, seed, args.par_steps)
    loops = {"bare": bare_loop(args.env, seed, args.par_steps, sample=False), "rollout": rollout}
    for loop in loops.values():
        loop()  # warm: first calls allocate and fault pages in
    print("ready", flush=True)
    for line in sys.stdin:
        variant = line.strip()
        if variant not in loops:
            break
        wall, _, _ = measure(loops[variant])
        print(json.dumps({"wall_s": wall}), flush=True)
    return 0


class Workers:
    """``count`` parallel_worker processes of ``steps`` steps each, driven through pipes; every read is bounded by
    ``timeout_s``."""

    def __init__(self, args: argparse.Namespace, timeout_s: float, count: int = 2, steps: int | None = None) -> None:
        self.timeout_s = timeout_s
        self.procs = [
            subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--par_worker_index", str(i),
                              "--env", args.env, "--seed", str(args.seed),
                              "--par_steps", str(steps or args.par_steps)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
            for i in range(count)
        ]
        for proc in self.procs:
            if self._read(proc) != "ready":
                raise RuntimeError("a two-process worker did not start")

    def _read(self, proc: subprocess.Popen) -> str:
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
        if not ready:
            self.close()
            raise RuntimeError(f"a two-process worker gave no answer in {self.timeout_s:.0f} s")
        return proc.stdout.readline().strip()

    def run(self, variant: str, n: int) -> list[float]:
        """Start ``variant`` in the first n workers at once; their wall times."""
        for proc in self.procs[:n]:
            proc.stdin.write(variant + "\n")
            proc.stdin.flush()
        return [json.loads(self._read(proc))["wall_s"] for proc in self.procs[:n]]

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()


def measure_parallel(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Rounds of (one alone, both at once, and --oversub at once doing the same total work as two) for the bare
    loop and the rollout; rows and median efficiencies (two / 2 x one) and oversubscription ratios (N / two)."""
    rows: list[dict[str, Any]] = []
    workers = Workers(args, timeout_s=300.0)
    over_steps = 2 * args.par_steps // max(args.oversub, 1)
    crowd = Workers(args, timeout_s=300.0, count=args.oversub, steps=over_steps) if args.oversub > 2 else None
    try:
        for k in range(args.par_rounds):
            for variant in ("bare", "rollout"):
                rates = {}
                for n in ((1, 2) if k % 2 == 0 else (2, 1)):
                    load = load_average()
                    walls = workers.run(variant, n)
                    rates[n] = n * args.par_steps / max(walls)
                    rows.append({"round": k + 1, "variant": variant, "processes": n, "steps_each": args.par_steps,
                                 "slowest_wall_s": max(walls), "aggregate_steps_per_s": rates[n],
                                 "load_avg_1min": load})
                rows[-1]["efficiency"] = rows[-2]["efficiency"] = rates[2] / (2 * rates[1])
                if crowd is not None:
                    load = load_average()
                    walls = crowd.run(variant, args.oversub)
                    rate = args.oversub * over_steps / max(walls)
                    rows.append({"round": k + 1, "variant": variant, "processes": args.oversub,
                                 "steps_each": over_steps, "slowest_wall_s": max(walls),
                                 "aggregate_steps_per_s": rate, "load_avg_1min": load, "vs_two": rate / rates[2]})
            by = {(r["variant"], r["processes"]): r for r in rows if r["round"] == k + 1}
            print(f"two processes, round {k + 1}/{args.par_rounds}: " + ", ".join(
                f"{v} {by[(v, 1)]['aggregate_steps_per_s']:,.0f} -> {by[(v, 2)]['aggregate_steps_per_s']:,.0f} "
                f"({by[(v, 2)]['efficiency']:.0%})"
                + (f", {args.oversub} processes {by[(v, args.oversub)]['vs_two']:.2f}x two" if crowd else "")
                for v in ("bare", "rollout")), flush=True)
    finally:
        workers.close()
        if crowd is not None:
            crowd.close()
    summary = {}
    for variant in ("bare", "rollout"):
        eff = [r["efficiency"] for r in rows if r["variant"] == variant and r["processes"] == 2]
        summary[variant] = statistics.median(eff)
        summary[variant + "_min"], summary[variant + "_max"] = min(eff), max(eff)
        for n in (1, 2):
            summary[f"{variant}_{n}"] = statistics.median(
                r["aggregate_steps_per_s"] for r in rows if r["variant"] == variant and r["processes"] == n)
        if crowd is not None:
            over = [r["vs_two"] for r in rows if r["variant"] == variant and r["processes"] == args.oversub]
            summary[variant + "_over"] = statistics.median(over)
            summary[variant + "_over_min"], summary[variant + "_over_max"] = min(over), max(over)
            summary[variant + "_over_rate"] = statistics.median(
                r["aggregate_steps_per_s"] for r in rows if r["variant"] == variant and r["processes"] == args.oversub)
    return rows, summary


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Walker2d-v5", help="gymnasium env id (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=8192, help="steps per variant per round (default: %(default)s)")
    parser.add_argument("--chunk", type=int, default=1024,
                        help="steps of one variant before the next one runs (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env, the actions and the actor")
    parser.add_argument("--par_steps", type=int, default=4096,
                        help="two-process part: steps per process per measurement (default: %(default)s)")
    parser.add_argument("--par_rounds", type=int, default=10,
                        help="two-process part: rounds, 0 to skip it (default: %(default)s)")
    parser.add_argument("--oversub", type=int, default=8,
                        help="two-process part: also run this many processes at once, sharing the two processes' "
                             "total steps, against two (train.py --nprocs 8 on 2 cores); 0 to skip (default: "
                             "%(default)s)")
    parser.add_argument("--envs_per_rank", type=int, nargs="*", default=[2, 4],
                        help="also measure the rollout with these many envs per rank (default: %(default)s)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    parser.add_argument("--par_worker_index", type=int, default=None, help=argparse.SUPPRESS)  # internal
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    if any(os.environ.get(name) != value for name, value in SINGLE_THREADED.items()):
        # numpy reads these when it loads OpenBLAS: start again with them set, as a rank of train.py is.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **SINGLE_THREADED})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.par_worker_index is not None:
        return parallel_worker(args)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records: list[dict[str, Any]] = []
    chunks = max(1, args.steps // args.chunk)
    steps = chunks * args.chunk
    variants = variants_of(args.envs_per_rank)
    for k in range(args.rounds):
        rollout, actor_only = rollout_loop(args.env, args.seed, args.chunk)
        loops = {"bare": bare_loop(args.env, args.seed, args.chunk, sample=False),
                 "bare_sample": bare_loop(args.env, args.seed, args.chunk, sample=True),
                 "rollout": rollout, "actor_only": actor_only}
        for n_envs in args.envs_per_rank:
            if n_envs > 1:
                loops[f"rollout_{n_envs}envs"] = rollout_loop(args.env, args.seed, args.chunk, n_envs)[0]
        totals = {v: {"wall_s": 0.0, "cpu_s": 0.0, "episodes": 0, "best_s": math.inf} for v in variants}
        loads = [load_average()]
        for c in range(chunks):
            shift = (k + c) % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                wall, cpu, episodes = measure(loops[variant])
                total = totals[variant]
                total["wall_s"] += wall
                total["cpu_s"] += cpu
                total["episodes"] += episodes
                total["best_s"] = min(total["best_s"], wall)
            loads.append(load_average())
        load = statistics.median(loads)
        for variant, total in totals.items():
            records.append({"round": k + 1, "variant": variant, "steps": steps, "chunk": args.chunk,
                            "wall_s": total["wall_s"], "cpu_s": total["cpu_s"],
                            "steps_per_s": steps / total["wall_s"],
                            "steps_per_cpu_s": steps / total["cpu_s"] if total["cpu_s"] else math.nan,
                            "best_chunk_steps_per_s": args.chunk / total["best_s"],
                            "us_per_step": total["wall_s"] / steps * 1e6, "episodes": total["episodes"],
                            "load_avg_1min": load})
        by = {r["variant"]: r for r in records if r["round"] == k + 1}
        print(f"round {k + 1}/{args.rounds}: " + ", ".join(f"{v} {by[v]['steps_per_s']:,.0f}" for v in variants)
              + f" steps/s; rollout/bare {by['rollout']['steps_per_s'] / by['bare']['steps_per_s']:.2f} "
              f"(load {load:.2f})", flush=True)
    par_rows, par = measure_parallel(args) if args.par_rounds > 0 else ([], {})
    wall_s = time.perf_counter() - started

    rows, s = summarize(records, variants)
    write_csv(out / "rollout.csv", records)
    if par_rows:
        write_csv(out / "parallel.csv", par_rows)
    loads = [r["load_avg_1min"] for r in records]
    met = "met" if s["wall"] >= TARGET_RATIO else "missed"
    markdown = "\n".join([
        *machine_lines(wall_s, f"median {statistics.median(loads):.2f}, {min(loads):.2f}-{max(loads):.2f}", [
            f"- what: {args.env}, seed {args.seed}; {args.rounds} rounds of {steps} steps per variant, interleaved "
            f"in chunks of {args.chunk} steps (order rotated each chunk); one process"]),
        "",
        "Median over rounds:",
        "",
        table(["variant", "steps/s", "range over rounds", "steps per CPU-s", "fastest chunk steps/s", "us per step",
               "episodes ended per round"], rows),
        "",
        f"- rollout / bare (wall-clock steps/s, paired by round): **{s['wall']:.2f}** "
        f"(rounds {s['wall_min']:.2f}-{s['wall_max']:.2f}); target {TARGET_RATIO:.2f}: {met}",
        f"- rollout / bare per CPU-second: {s['cpu']:.2f} (rounds {s['cpu_min']:.2f}-{s['cpu_max']:.2f}); "
        f"fastest chunk / fastest chunk: {s['best']:.2f}",
        f"- rollout / bare_sample (action_space.sample()): {s['wall_vs_sample']:.2f} "
        f"(rounds {s['wall_vs_sample_min']:.2f}-{s['wall_vs_sample_max']:.2f}); fastest chunks "
        f"{s['best_vs_sample']:.2f}",
        f"- actor_only / rollout, CPU time: {s['actor_share']:.1%} (the policy's share of a rank's rollout)",
        *[f"- {v} / bare (`--envs_per_rank {v.split('_')[1][:-4]}`, paired by round): **{s['wall_' + v]:.2f}** "
          f"(rounds {s['wall_' + v + '_min']:.2f}-{s['wall_' + v + '_max']:.2f}); target {TARGET_RATIO:.2f}: "
          f"{'met' if s['wall_' + v] >= TARGET_RATIO else 'missed'}" for v in variants if v.endswith("envs")],
    ]) + "\n"
    if par:
        par_table = [[v, f"{par[v + '_1']:,.0f}", f"{par[v + '_2']:,.0f}", f"**{par[v]:.0%}**",
                      f"{par[v + '_min']:.0%}-{par[v + '_max']:.0%}"] for v in ("bare", "rollout")]
        markdown += "\n".join([
            "",
            f"Two processes at once ({args.par_rounds} rounds of {args.par_steps} steps per process; aggregate = all "
            "steps / the slowest process's time; efficiency = two / (2 x one), paired by round, median):",
            "",
            table(["loop", "one process steps/s", "two processes steps/s", "efficiency", "range over rounds"],
                  par_table),
            "",
        ])
        if "bare_over" in par:
            markdown += "\n".join([
                "",
                f"{args.oversub} processes at once doing the same total work as two "
                f"({2 * args.par_steps // args.oversub} steps each; aggregate over the slowest, paired with the "
                "two-process run of the round, median):",
                "",
                table(["loop", f"{args.oversub} processes steps/s", "/ two processes", "range over rounds"],
                      [[v, f"{par[v + '_over_rate']:,.0f}", f"**{par[v + '_over']:.2f}**",
                        f"{par[v + '_over_min']:.2f}-{par[v + '_over_max']:.2f}"] for v in ("bare", "rollout")]),
                "",
            ])
    (out / "results.md").write_text(markdown)
    print()
    print(markdown)
    print(f"wrote rollout.csv, {'parallel.csv, ' if par_rows else ''}results.md to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
