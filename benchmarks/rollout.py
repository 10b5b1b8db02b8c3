"""The rollout of one rank against the bare env.step loop: how much of the simulator's speed a rank keeps
(benchmarks/README.md, section rollout.py).

In one process, interleaved in chunks of CHUNK steps in an order rotated from chunk to chunk: ``bare`` (env.step with
random actions drawn beforehand), ``bare_sample`` (action_space.sample() per step), ``rollout``
(algos.RolloutWorker.collect, what every rank of train.py runs, with single-threaded BLAS as mpi_fork starts a rank),
``rollout_<K>envs`` (K envs per rank) and ``actor_only`` (the policy's forward passes alone). Ratios to ``bare`` pair
the variants of a round. Then two worker processes at once against one, and OVERSUB processes sharing two processes'
steps against two: the machine's ceiling for train.py's sampling efficiency. Writes rollout.csv, parallel.csv and
results.md to ``--out``; ``--quick`` (one round, no two-process part) is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import RESULTS, load_average, machine_lines, table, write_csv

ENV_ID = "Walker2d-v5"  # the default of --env
SEED = 0
ROUNDS, STEPS, CHUNK = 9, 8192, 1024  # per variant: ROUNDS rounds of STEPS steps, in chunks of CHUNK
ENVS_PER_RANK = (2, 4)  # the rollout_<K>envs variants
PAR_ROUNDS, PAR_STEPS = 10, 4096  # two processes at once: rounds, steps per process per measurement
OVERSUB = 8  # processes sharing two processes' steps (train.py --nprocs 8 on 2 cores)
VARIANTS = ("bare", "bare_sample", "rollout", *(f"rollout_{k}envs" for k in ENVS_PER_RANK), "actor_only")
TARGET_RATIO = 0.80
# What mpi_fork gives every rank. Without it OpenBLAS runs the end-of-rollout value pass on two threads, whose
# worker then spins for a while and is charged to (and competes with) whatever is measured next.
SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def bare_loop(env_id: str, seed: int, steps: int, sample: bool) -> Callable[[], None]:
    """A prepared bare loop: each call runs the next ``steps`` env.step calls (episodes go on across calls)."""
    from envs.make import make_env

    env = make_env(env_id)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    space = env.action_space
    actions = [space.sample() for _ in range(steps)]

    def run() -> None:
        for t in range(steps):
            _, _, terminated, truncated, _ = env.step(space.sample() if sample else actions[t])
            if terminated or truncated:
                env.reset()

    return run


def rollout_loop(env_id: str, seed: int, steps: int, n_envs: int = 1
                 ) -> tuple[Callable[[], None], Callable[[], None]]:
    """(rollout, actor_only), prepared: each call runs the next ``steps`` steps (over n_envs envs stepped in
    lockstep). The actor is a fresh ActorCritic's numpy snapshot in the layout train.py's PPO builds for the env (one
    CNN torso under both heads on Atari: algos.registry.shares_torso), as train.py's first iteration uses."""
    import keras

    from algos import ActorCritic, RolloutWorker
    from algos.registry import shares_torso
    from algos.spaces import action_spec, obs_spec
    from envs.atari import is_atari
    from envs.make import make_env

    envs = [make_env(env_id) for _ in range(n_envs)]
    keras.utils.set_random_seed(seed)
    obs = obs_spec(envs[0].observation_space)
    ac = ActorCritic(obs, action_spec(envs[0].action_space), hidden=(64, 64),
                     shared_torso=shares_torso("ppo", env_id, obs.is_image))
    actor = ac.numpy_actor()
    worker = RolloutWorker(envs, seed=seed, gamma=0.99, lam=0.95, atari=is_atari(env_id))
    rng = np.random.default_rng(seed)
    obs_rows = np.stack([envs[0].observation_space.sample() for _ in range(steps)])[:, None]  # (steps, 1, *obs)

    def rollout() -> None:
        worker.collect(steps, actor, rng)

    def actor_only() -> None:
        noise = actor.exploration_noise(rng, steps)  # drawn for all rows at once, as RolloutWorker.collect does
        for t in range(steps):
            actor.act_with_noise(obs_rows[t], noise[t : t + 1])

    return rollout, actor_only


def measure(run: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure_rounds(env_id: str, rounds: int, chunks: int) -> list[dict[str, Any]]:
    """One record per round and variant: the variants' chunks interleaved, the order rotated every chunk."""
    records: list[dict[str, Any]] = []
    steps = chunks * CHUNK
    for k in range(rounds):
        rollout, actor_only = rollout_loop(env_id, SEED, CHUNK)
        loops = {"bare": bare_loop(env_id, SEED, CHUNK, sample=False),
                 "bare_sample": bare_loop(env_id, SEED, CHUNK, sample=True), "rollout": rollout,
                 "actor_only": actor_only, **{f"rollout_{n}envs": rollout_loop(env_id, SEED, CHUNK, n)[0]
                                              for n in ENVS_PER_RANK}}
        totals = {v: [0.0, 0.0] for v in VARIANTS}  # wall s, CPU s
        loads = [load_average()]
        for c in range(chunks):
            shift = (k + c) % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                wall, cpu = measure(loops[variant])
                totals[variant][0] += wall
                totals[variant][1] += cpu
            loads.append(load_average())
        load = statistics.median(loads)
        records += [{"round": k + 1, "variant": v, "steps": steps, "chunk": CHUNK, "wall_s": wall, "cpu_s": cpu,
                     "steps_per_s": steps / wall, "us_per_step": wall / steps * 1e6, "load_avg_1min": load}
                    for v, (wall, cpu) in totals.items()]
        by = {r["variant"]: r for r in records if r["round"] == k + 1}
        print(f"round {k + 1}/{rounds}: " + ", ".join(f"{v} {by[v]['steps_per_s']:,.0f}" for v in VARIANTS)
              + f" steps/s; rollout/bare {by['rollout']['steps_per_s'] / by['bare']['steps_per_s']:.2f} "
              f"(load {load:.2f})", flush=True)
    return records


def summarize(records: list[dict[str, Any]]) -> tuple[list[list[str]], dict[str, float]]:
    """Table rows (median over rounds per variant) and the medians of the ratios paired by round: "wall_<variant>"
    (steps/s over bare's) for rollout and each rollout_<K>envs, and "actor_share" (actor_only's CPU over rollout's)."""
    rows = []
    for variant in VARIANTS:
        mine = [r for r in records if r["variant"] == variant]
        rows.append([variant, f"{statistics.median(r['steps_per_s'] for r in mine):,.0f}",
                     f"{statistics.median(r['us_per_step'] for r in mine):.1f}"])
    ratios: dict[str, list[float]] = {"actor_share": []}
    for k in sorted({r["round"] for r in records}):
        by = {r["variant"]: r for r in records if r["round"] == k}
        ratios["actor_share"].append(by["actor_only"]["cpu_s"] / by["rollout"]["cpu_s"])
        for v in VARIANTS:
            if v.startswith("rollout"):
                ratios.setdefault(f"wall_{v}", []).append(by[v]["steps_per_s"] / by["bare"]["steps_per_s"])
    return rows, {key: statistics.median(values) for key, values in ratios.items()}


def parallel_worker(env_id: str, index: int, steps: int) -> int:
    """Worker mode: prepare a bare loop and a rollout of ``steps`` steps, say "ready", then for each line "bare" or
    "rollout" on stdin run it and print {"wall_s": ...}; stop at "quit" or end of input."""
    rollout, _ = rollout_loop(env_id, SEED + index, steps)
    loops = {"bare": bare_loop(env_id, SEED + index, steps, sample=False), "rollout": rollout}
    for loop in loops.values():
        loop()  # warm: first calls allocate and fault pages in
    print("ready", flush=True)
    for line in sys.stdin:
        variant = line.strip()
        if variant not in loops:
            break
        wall, _ = measure(loops[variant])
        print(json.dumps({"wall_s": wall}), flush=True)
    return 0


class Workers:
    """``count`` parallel_worker processes of ``steps`` steps each, driven through pipes; every read is bounded by
    ``timeout_s``."""

    def __init__(self, env_id: str, count: int, steps: int, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s
        self.procs = [
            subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--par_worker", str(i), str(steps),
                              "--env", env_id],
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


def measure_parallel(env_id: str, rounds: int, steps: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Rounds of (one alone, both at once, and OVERSUB at once doing the same total work as two) for the bare loop
    and the rollout; rows and medians of the rates, efficiencies (two / 2 x one) and ratios OVERSUB / two."""
    rows: list[dict[str, Any]] = []
    over_steps = 2 * steps // OVERSUB
    workers, crowd = Workers(env_id, 2, steps), Workers(env_id, OVERSUB, over_steps)
    try:
        for k in range(rounds):
            for variant in ("bare", "rollout"):
                rates = {}
                for n in ((1, 2) if k % 2 == 0 else (2, 1)):
                    load = load_average()
                    walls = workers.run(variant, n)
                    rates[n] = n * steps / max(walls)
                    rows.append({"round": k + 1, "variant": variant, "processes": n, "steps_each": steps,
                                 "slowest_wall_s": max(walls), "aggregate_steps_per_s": rates[n],
                                 "load_avg_1min": load})
                rows[-1]["efficiency"] = rows[-2]["efficiency"] = rates[2] / (2 * rates[1])
                load = load_average()
                walls = crowd.run(variant, OVERSUB)
                rate = OVERSUB * over_steps / max(walls)
                rows.append({"round": k + 1, "variant": variant, "processes": OVERSUB, "steps_each": over_steps,
                             "slowest_wall_s": max(walls), "aggregate_steps_per_s": rate, "load_avg_1min": load,
                             "vs_two": rate / rates[2]})
            by = {(r["variant"], r["processes"]): r for r in rows if r["round"] == k + 1}
            print(f"two processes, round {k + 1}/{rounds}: " + ", ".join(
                f"{v} {by[(v, 1)]['aggregate_steps_per_s']:,.0f} -> {by[(v, 2)]['aggregate_steps_per_s']:,.0f} "
                f"({by[(v, 2)]['efficiency']:.0%}), {OVERSUB} processes {by[(v, OVERSUB)]['vs_two']:.2f}x two"
                for v in ("bare", "rollout")), flush=True)
    finally:
        workers.close()
        crowd.close()
    def median_of(variant: str, processes: int, key: str) -> float:
        return statistics.median(r[key] for r in rows if (r["variant"], r["processes"]) == (variant, processes))

    summary = {}
    for variant in ("bare", "rollout"):
        for n in (1, 2, OVERSUB):
            summary[f"{variant}_{n}"] = median_of(variant, n, "aggregate_steps_per_s")
        summary[variant] = median_of(variant, 2, "efficiency")
        summary[variant + "_over"] = median_of(variant, OVERSUB, "vs_two")
    return rows, summary


def parallel_markdown(par_rows: list[dict[str, Any]], par: dict[str, float]) -> list[str]:
    """The results.md lines of the two-process part."""
    rounds, steps = max(r["round"] for r in par_rows), par_rows[0]["steps_each"]
    return [
        f"Two processes at once ({rounds} rounds of {steps} steps per process; aggregate = all steps / the slowest "
        "process's time; efficiency = two / (2 x one), paired by round, median):", "",
        table(["loop", "one process steps/s", "two processes steps/s", "efficiency"],
              [[v, f"{par[v + '_1']:,.0f}", f"{par[v + '_2']:,.0f}", f"**{par[v]:.0%}**"]
               for v in ("bare", "rollout")]),
        "",
        f"{OVERSUB} processes at once doing the same total work as two ({2 * steps // OVERSUB} steps each; aggregate "
        "over the slowest, paired with the two-process run of the round, median):", "",
        table(["loop", f"{OVERSUB} processes steps/s", "/ two processes"],
              [[v, f"{par[f'{v}_{OVERSUB}']:,.0f}", f"**{par[v + '_over']:.2f}**"] for v in ("bare", "rollout")]),
        "",
    ]


def report(out: Path, env_id: str, wall_s: float, records: list[dict[str, Any]], par_rows: list[dict[str, Any]],
           par: dict[str, float]) -> None:
    """rollout.csv, parallel.csv (when the two-process part ran) and results.md."""
    rows, s = summarize(records)
    write_csv(out / "rollout.csv", records)
    loads = [r["load_avg_1min"] for r in records]
    ratio_lines = []
    for v in VARIANTS:
        if v.startswith("rollout"):
            ratio = s["wall_" + v]
            ratio_lines.append(f"- {v} / bare (wall-clock steps/s, paired by round): **{ratio:.2f}** ({ratio:.3f}); "
                               f"target {TARGET_RATIO:.2f}: {'met' if ratio >= TARGET_RATIO else 'missed'}")
    lines = [
        *machine_lines(wall_s, f"median {statistics.median(loads):.2f}, {min(loads):.2f}-{max(loads):.2f}", [
            f"- what: {env_id}, seed {SEED}; {max(r['round'] for r in records)} rounds of {records[0]['steps']} "
            f"steps per variant, interleaved in chunks of {CHUNK} steps (order rotated each chunk); one process"]),
        "", "Median over rounds:", "",
        table(["variant", "steps/s", "us per step"], rows), "",
        *ratio_lines,
        f"- actor_only / rollout, CPU time: {s['actor_share']:.1%} (the policy's share of a rank's rollout)", "",
    ]
    if par_rows:
        write_csv(out / "parallel.csv", par_rows)
        lines += parallel_markdown(par_rows, par)
    (out / "results.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote rollout.csv, {'parallel.csv, ' if par_rows else ''}results.md to {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(RESULTS / "rollout"), help="output directory (default: %(default)s)")
    parser.add_argument("--env", default=ENV_ID, help="gymnasium env id (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of {STEPS} steps (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: one round of {CHUNK} steps per variant, no two-process part")
    parser.add_argument("--par_worker", type=int, nargs=2, help=argparse.SUPPRESS)  # internal: INDEX STEPS
    args = parser.parse_args()
    if any(os.environ.get(name) != value for name, value in SINGLE_THREADED.items()):
        # numpy reads these when it loads OpenBLAS: start again with them set, as a rank of train.py is.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **SINGLE_THREADED})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.par_worker:
        return parallel_worker(args.env, *args.par_worker)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    records = measure_rounds(args.env, 1, 1) if args.quick else measure_rounds(args.env, args.rounds, STEPS // CHUNK)
    par_rows, par = ([], {}) if args.quick else measure_parallel(args.env, PAR_ROUNDS, PAR_STEPS)
    report(out, args.env, time.perf_counter() - started, records, par_rows, par)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
