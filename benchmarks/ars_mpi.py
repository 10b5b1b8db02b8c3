"""sb3-contrib's ARS on N MPI processes (mpi_util.sb3.parallelize) against plain ARS, side by side, and its scaling
projected from the 1-process runs (benchmarks/README.md, section ars_mpi.py).

Projection to N ranks: each update's candidates' episode lengths split as ``parallelize`` splits them; an update takes
the longest share's steps at the 1-rank evaluation rate, plus ARS's step and the collectives (measured at 2 ranks,
assumed to grow in proportion to N). Writes runs.csv and results.md to ``--out``.
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

# mpi_util.sb3._ARS_PHASES, the keys of model._mpi.seconds (this driver does not import mpi_util: it launches MPI jobs)
PHASES = ("candidates", "evaluate", "gather", "update", "broadcast")
PROJECT_RANKS = (1, 2, 4, 8, 16)
COLLECTIVE_ROUNDS = 200


def run_one(kind: str, n: int, args: argparse.Namespace, seed: int, result_path: Path) -> None:
    """Train one configuration in this process (for ``mpi``: relaunched as n ranks); rank 0 writes result_path."""
    import mpi_util
    import mpi_util.sb3  # before stable_baselines3: keeps TensorFlow out of the process

    fork = mpi_util.mpi_fork(n if kind == "mpi" else 1)
    if fork == "parent":
        sys.exit(fork.returncode)

    import torch
    from sb3_contrib import ARS
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    model = ARS("LinearPolicy", make_vec_env(args.env, n_envs=1, seed=seed), n_delta=args.n_delta, n_top=args.n_top,
                seed=seed, device="cpu")
    if kind == "mpi":
        model = mpi_util.sb3.parallelize(model)
    candidate_steps: list[list[int]] = []  # per update, each candidate's episode length (runs on 1 rank)

    class Record(BaseCallback):
        def _on_rollout_end(self) -> None:  # before the gather: on 1 rank, every candidate's episode
            candidate_steps.append([int(episode["l"]) for episode in self.model.ep_info_buffer])

        def _on_step(self) -> bool:
            return True

    start = time.perf_counter()
    model.learn(args.total_steps, callback=Record())
    learn_s = time.perf_counter() - start
    in_sync = mpi_util.ranks_out_of_sync([model.policy, model.weights]) == [] if kind == "mpi" else True
    collective_s = time_collectives(model) if kind == "mpi" and n > 1 else None
    if mpi_util.rank != 0:
        return
    rewards, _ = evaluate_policy(model, make_vec_env(args.env, n_envs=1, seed=seed + 1000), n_eval_episodes=10,
                                 return_episode_rewards=True)
    result_path.write_text(json.dumps({
        "steps": model.num_timesteps, "learn_s": learn_s, "final_return": sum(rewards) / len(rewards),
        "updates": model._n_updates, "in_sync": in_sync, "collective_s": collective_s,
        "seconds": dict(model._mpi.seconds) if kind == "mpi" else None,
        "candidate_steps": candidate_steps if n == 1 else None,
    }))


def time_collectives(model: Any) -> float:
    """Seconds per update of the three collectives of a parallel ARS update alone, rank 0's view: its candidates
    (pop_size, n_params) float32 to every rank, every rank's (returns, steps, episodes) to rank 0, its policy,
    weights and count to every rank. Every rank must call it."""
    import numpy as np

    from mpi_util import bcast_object, gather_objects, rank0_bcast_wts

    comm = model._mpi.comm
    share = model.pop_size // comm.Get_size()
    candidates = np.zeros((model.pop_size, model.n_params), np.float32)
    mine = (np.zeros(share, np.float32), 1000, [{"r": 1000.0, "l": 1000, "t": 1.0}] * share, [])
    count = np.zeros(1, np.int64)
    bcast_object(None, comm)  # the ranks start together
    start = time.perf_counter()
    for _ in range(COLLECTIVE_ROUNDS):
        rank0_bcast_wts(candidates, comm)
        gather_objects(mine, comm)
        rank0_bcast_wts([model.policy, model.weights, count], comm)
    return (time.perf_counter() - start) / COLLECTIVE_ROUNDS


def label(kind: str, n: int) -> str:
    return "plain ARS, 1 process" if kind == "plain" else f"mpi_util.sb3 ARS, {n} process{'es' if n > 1 else ''}"


def project(run: dict[str, Any], collective_s: float, ranks: int) -> dict[str, float]:
    """Projected seconds and steps/s of ``run`` (an mpi run on 1 rank) on ``ranks`` ranks (see the docstring)."""
    seconds, updates = run["seconds"], run["updates"]
    rate = run["steps"] / seconds["evaluate"]  # steps per second of one rank evaluating
    longest_share = sum(max(sum(lengths[len(lengths) * r // ranks:len(lengths) * (r + 1) // ranks])
                            for r in range(ranks)) for lengths in run["candidate_steps"])
    evaluate_s = longest_share / rate
    overhead_s = sum(seconds[p] for p in PHASES if p != "evaluate")  # 1 rank: pickling, copies, ARS's step
    comm_s = 0.0 if ranks == 1 else updates * collective_s * ranks / 2
    total_s = evaluate_s + overhead_s + comm_s
    return {"evaluate_s": evaluate_s, "fixed_s": overhead_s + comm_s, "steps_per_s": run["steps"] / total_s,
            "balance": run["steps"] / ranks / longest_share}


def main() -> int:
    parser = options(__doc__, "ars_mpi", env="InvertedPendulum-v5", total_steps=100_000, nprocs=[1, 2],
                     timeout=600.0)
    parser.add_argument("--n_delta", type=int, default=8, help="directions per update (default: %(default)s)")
    parser.add_argument("--n_top", type=int, default=4, help="directions in each step (default: %(default)s)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one round each (default: %(default)s)")
    parser.add_argument("--run", nargs=3, metavar=("KIND", "N", "SEED"), help=argparse.SUPPRESS)  # one run, internal
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_one(args.run[0], int(args.run[1]), args, int(args.run[2]), args.result)
        return 0
    if 1 not in args.nprocs or 2 not in args.nprocs:
        parser.error("--nprocs: include 1 and 2 (the projection uses both)")

    configs = [("plain", 1)] + [("mpi", n) for n in args.nprocs]
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        for round_index, seed in enumerate(args.seeds):
            for kind, n in (configs if round_index % 2 == 0 else configs[::-1]):
                result_path = Path(scratch) / f"{kind}{n}_{seed}.json"
                command = [sys.executable, __file__, "--run", kind, str(n), str(seed), "--env", args.env,
                           "--total_steps", str(args.total_steps), "--n_delta", str(args.n_delta), "--n_top",
                           str(args.n_top), "--result", str(result_path)]
                result, wall, load = run_for_result(command, result_path, args.timeout,
                                                    f"ars_mpi: {label(kind, n)}, seed {seed}")
                run = {"seed": seed, "system": label(kind, n), "kind": kind, "n": n, **result,
                       "steps_per_s": result["steps"] / result["learn_s"], "process_wall_s": wall,
                       "load_before": load}
                runs.append(run)
                print(f"{run['system']}, seed {seed}: {fmt(run['steps_per_s'])} steps/s, final return "
                      f"{run['final_return']:.1f}, {wall:.0f} s", flush=True)
    wall_s = time.perf_counter() - began

    plain_rate = {r["seed"]: r["steps_per_s"] for r in runs if r["kind"] == "plain"}
    for r in runs:
        r["vs_plain"] = r["steps_per_s"] / plain_rate[r["seed"]]

    def of(kind: str, n: int) -> list[dict[str, Any]]:
        return [r for r in runs if (r["kind"], r["n"]) == (kind, n)]

    summary = [[label(kind, n), fmt(median([r["steps_per_s"] for r in of(kind, n)])),
                f"{median([r['vs_plain'] for r in of(kind, n)]):.2f}x",
                " / ".join(f"{r['final_return']:.0f}" for r in sorted(of(kind, n), key=lambda r: r["seed"])),
                f"{median([r['final_return'] for r in of(kind, n)]):.0f}"] for kind, n in configs]
    split = []
    for n in args.nprocs:
        per_update = {p: median([r["seconds"][p] / r["updates"] * 1e3 for r in of("mpi", n)]) for p in PHASES}
        alone = median([r["collective_s"] * 1e3 for r in of("mpi", n)]) if n > 1 else float("nan")
        split.append([n, *(f"{per_update[p]:.2f}" for p in PHASES), "-" if n == 1 else f"{alone:.2f}"])
    collective_s = median([r["collective_s"] for r in of("mpi", 2)])
    one_rank = of("mpi", 1)
    projections = {ranks: [project(r, collective_s, ranks) for r in one_rank] for ranks in PROJECT_RANKS}
    base = median([p["steps_per_s"] for p in projections[1]])
    projected = [[ranks, fmt(median([p["evaluate_s"] for p in projections[ranks]]), 2),
                  fmt(median([p["fixed_s"] for p in projections[ranks]]), 2),
                  f"{median([p['balance'] for p in projections[ranks]]):.2f}",
                  fmt(median([p["steps_per_s"] for p in projections[ranks]])),
                  f"{median([p['steps_per_s'] for p in projections[ranks]]) / base:.1f}x"] for ranks in PROJECT_RANKS]
    measured_two = median([r["steps_per_s"] for r in of("mpi", 2)])
    pop = 2 * args.n_delta
    about = [f"- budget: {args.total_steps} steps per run (over all ranks; rounded up to whole updates), linear "
             f"policy, n_delta {args.n_delta} ({pop} candidates per update), n_top {args.n_top}, seeds "
             f"{' '.join(map(str, args.seeds))}; sb3_contrib {version('sb3_contrib')}, stable_baselines3 "
             f"{version('stable_baselines3')}, torch {version('torch')}, 1 torch thread per process"]
    body = "\n\n".join([
        "Median over seeds (vs plain = steps/s over plain ARS's with the same seed); final return = the final "
        "policy's mean over 10 episodes, per seed and median:",
        table(["system", "steps/s", "vs plain", "final return per seed", "median"], summary),
        "Rank 0's milliseconds per update in each part (median over seeds); at 2 processes, 'gather' includes waiting "
        f"for the other rank to finish its share. Last column: the update's three collectives alone ({pop} x "
        "n_params float32 candidates out, each rank's returns and episodes in, the weights out), ranks arriving "
        "together:",
        table(["processes", *(f"{p} ms" for p in PHASES), "collectives alone ms"], split),
        f"Projection from the 1-process runs (see the script's docstring): evaluate s = the longest share of each "
        f"update at one rank's evaluation rate, fixed s = ARS's step, the 1-process overhead and the collectives "
        f"({collective_s * 1e3:.2f} ms per update at 2 ranks, x N/2); balance = mean share / longest share. Measured "
        f"at 2 processes on this machine: {fmt(measured_two)} steps/s.",
        table(["ranks", "evaluate s", "fixed s", "balance", "steps/s", "speedup"], projected)])
    csv_rows = [{k: v for k, v in r.items() if k not in ("candidate_steps", "seconds")}
                | {f"s_{p}": (r["seconds"] or {}).get(p) for p in PHASES} for r in runs]
    loads = ", ".join(f"{r['system']} seed {r['seed']}: {r['load_before']:.2f}" for r in runs)
    write_results(args.out, csv_rows, body, wall_s, loads, about,
                  f"sb3-contrib ARS on {args.env}: plain and mpi_util.sb3 at {', '.join(map(str, args.nprocs))} "
                  "processes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
