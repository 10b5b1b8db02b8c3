"""Learning results at 1M steps: train.py on each env and algorithm with several seeds, one run after another, each
final policy evaluated deterministically (benchmarks/README.md, section learning.py).

Resumable: a run whose summary.json is under --out is skipped, a cut-off run continues from its newest checkpoint in
--workdir, and a run there trained with another configuration than train.py would use now is refused. Per run it
keeps progress.csv, config.json, command.txt and summary.json under ``--out/<env>_<algo>_n<nprocs>/s<seed>/``, then
writes results.md, results.csv, runs.csv and curves_<env>.png from them.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    REPO,
    command_output,
    describe_machine,
    failure,
    load_average,
    options,
    pretty_command,
    read_progress,
    run_logged,
    table,
    versions_line,
    write_csv,
)

DEFAULT_WORKDIR = REPO / "runs" / "learning"
FINAL_EPISODES = 10  # training episodes, at least, behind the final training return
EVAL_EPISODES = 10  # deterministic evaluation episodes per run

TARGETS = {("Walker2d", "ppo"): 3500, ("Hopper", "ppo"): 2500, ("Walker2d", "trpo"): 3000, ("Hopper", "trpo"): 2300}


def env_name(env_id: str) -> str:
    """'Walker2d-v5' -> 'Walker2d'; a namespace's slash as a dash, as in train.py's run directories
    ('MinAtar/Breakout-v1' -> 'MinAtar-Breakout')."""
    return env_id.split("-v")[0].replace("/", "-")


def group_name(env_id: str, algo: str, nprocs: int) -> str:
    """The directory of one env, algorithm and process count under --out and --workdir: one level, no slash."""
    return f"{env_id.replace('/', '-')}_{algo}_n{nprocs}"


def final_train_return(rows: list[dict[str, float]], min_episodes: int = FINAL_EPISODES) -> tuple[float, int]:
    """(mean return, episodes) over the episodes that ended in the last iterations, going back until at least
    ``min_episodes`` episodes are covered (progress.csv keeps per-iteration means, so whole iterations count)."""
    total, episodes = 0.0, 0
    for row in reversed(rows):
        if row["episodes"] > 0:
            total += row["ep_return_mean"] * row["episodes"]
            episodes += int(row["episodes"])
        if episodes >= min_episodes:
            break
    return (total / episodes if episodes else math.nan), episodes


def git_commit() -> str:
    commit = command_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]) or "unknown"
    dirty = command_output(["git", "-C", str(REPO), "status", "--porcelain", "--", "train.py", "algos", "mpi_util"])
    return commit + ("+uncommitted changes" if dirty else "")


def config_differences(run_dir: Path, train_args: list[str]) -> list[str]:
    """'field: VALUE there, VALUE now' for each learning setting where RUN_DIR's config.json differs from what
    ``train.py TRAIN_ARGS`` would configure with the code as it is now (a default may have changed since)."""
    from trainer.config import build_config, load_saved_config
    from trainer.options import parse_args

    now = asdict(build_config(parse_args(train_args))[0])
    there = load_saved_config(run_dir)
    # What may differ between launches of one run: the resume passes its own nprocs and budget.
    launch_settings = {"nprocs", "gpu_pct", "total_steps", "num_episodes", "check_sync", "stall_timeout"}
    return [f"{name}: {there.get(name)!r} there, {value!r} now" for name, value in now.items()
            if name not in launch_settings and there.get(name) != value]


def one_run(env: str, algo: str, nprocs: int, seed: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """Train (or finish) one seed, evaluate it, keep its files under --out; its summary, or None if skipped."""
    group = group_name(env, algo, nprocs)
    result_dir = args.out / group / f"s{seed}"
    if (result_dir / "summary.json").is_file():
        return None
    logdir = args.workdir / group / f"s{seed}"
    logdir.mkdir(parents=True, exist_ok=True)
    log_path = logdir / "console.log"
    run_dirs = sorted(p.parent for p in logdir.glob("*/config.json"))
    resumable = [d for d in run_dirs if any((d / "checkpoints").glob("ckpt_*.npz"))]
    train = [sys.executable, "train.py"]
    fresh_args = [env, "--algo", algo, "--nprocs", str(nprocs), "--seed", str(seed), "--total_steps",
                  str(args.total_steps), "--logdir", str(logdir), *shlex.split(args.train_args)]
    if resumable:
        differences = config_differences(resumable[-1], fresh_args)
        if differences:
            raise RuntimeError(f"{resumable[-1]} was trained with another configuration than train.py would use now "
                               f"({'; '.join(differences)}): move it out of {logdir} or choose another --workdir")
        command = [*train, "--resume", str(resumable[-1]), "--nprocs", str(nprocs),
                   "--total_steps", str(args.total_steps)]
    else:
        command = [*train, *fresh_args]
    print(f"[{time.strftime('%H:%M:%S')}] {group} seed {seed}: {shlex.join(command[1:])}", flush=True)
    load_before = load_average()
    returncode, train_wall_s = run_logged(command, log_path, args.timeout)
    if returncode != 0:
        raise failure(shlex.join(command), returncode, log_path)
    run_dir = resumable[-1] if resumable else sorted(p.parent for p in logdir.glob("*/config.json"))[-1]
    rows = read_progress(run_dir / "progress.csv")
    if rows[-1]["total_steps"] < args.total_steps:
        raise RuntimeError(f"{run_dir} stopped at {rows[-1]['total_steps']:.0f} steps of {args.total_steps}")

    play = [*train, "--play", str(run_dir), "--episodes", str(EVAL_EPISODES)]
    eval_log = logdir / "eval.log"
    eval_log.unlink(missing_ok=True)
    returncode, _ = run_logged(play, eval_log, 600)
    eval_text = eval_log.read_text()
    eval_returns = [float(x) for x in re.findall(r"^episode \d+: return (-?[\d.]+)", eval_text, re.MULTILINE)]
    if returncode != 0 or len(eval_returns) != EVAL_EPISODES:
        raise RuntimeError(f"evaluation failed (exit {returncode}): {shlex.join(play)}\n{eval_text[-2000:]}")

    train_return, train_episodes = final_train_return(rows)
    summary = {
        "env": env, "algo": algo, "nprocs": nprocs, "seed": seed,
        "total_steps": int(rows[-1]["total_steps"]),
        "iterations": len(rows),
        "final_train_return": train_return,
        "final_train_episodes": train_episodes,
        "eval_return_mean": statistics.fmean(eval_returns),
        "eval_returns": eval_returns,
        "train_wall_s": rows[-1]["wall_s"],  # train.py's own clock: first iteration to the last
        "process_wall_s": train_wall_s,  # this launch, start-up included (only the last launch when resumed)
        "resumed": bool(resumable),
        "load_before": load_before,
        "commit": git_commit(),
        "date_utc": describe_machine()["date_utc"],
    }
    result_dir.mkdir(parents=True, exist_ok=True)
    for name in ("progress.csv", "config.json"):
        (result_dir / name).write_bytes((run_dir / name).read_bytes())
    with open(result_dir / "command.txt", "a") as f:
        f.write(f"{shlex.join(command)}   # {summary['date_utc']}, commit {summary['commit']}\n")
        f.write(f"{shlex.join(play)}\n")
    (result_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"    {rows[-1]['total_steps']:.0f} steps, train.py wall {summary['train_wall_s']:.0f} s, final training "
          f"return {train_return:.0f} ({train_episodes} episodes), "
          f"deterministic eval {summary['eval_return_mean']:.0f}", flush=True)
    return summary


def mean_std(values: list[float]) -> str:
    if not values:
        return ""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):,.0f} ± {std:,.0f}"


def nprocs_comparison(groups: list[dict[str, Any]]) -> list[str]:
    """Markdown lines comparing both final returns (deterministic eval and training) of the same env and algorithm
    at different nprocs: the difference of the means against its standard error sqrt(s1^2/n1 + s2^2/n2); within
    noise when the difference is under two standard errors. Empty when no env and algorithm ran at two nprocs."""
    rows = []
    for a in groups:
        for b in groups:
            if (a["env"], a["algo"]) != (b["env"], b["algo"]) or a["nprocs"] >= b["nprocs"]:
                continue
            for measure, key in (("deterministic eval", "eval_return"), ("training return", "final_train_return")):
                difference = b[f"{key}_mean"] - a[f"{key}_mean"]
                stderr = math.sqrt(sum(g[f"{key}_std"] ** 2 / g["seeds"] for g in (a, b)))
                within = abs(difference) < 2 * stderr
                rows.append([a["env"], a["algo"].upper(), measure, f"{a['nprocs']} vs {b['nprocs']}",
                             f"{a['seeds']} and {b['seeds']}", f"{a[f'{key}_mean']:,.0f} vs {b[f'{key}_mean']:,.0f}",
                             f"{difference:+,.0f}", f"{stderr:,.0f}", "yes" if within else "**no**"])
    if not rows:
        return []
    return ["Does parallelism change what is learned? Means over seeds (difference = the larger nprocs minus the "
            "smaller; within noise = under two standard errors of the difference):", "",
            table(["env", "algo", "measure", "nprocs", "seeds", "mean return", "difference", "std error",
                   "within noise"], rows), ""]


def plot_curves(summaries: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per env: mean ± std over seeds of the training return, per (algo, nprocs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for env in sorted({s["env"] for s in summaries}):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        groups = sorted({(s["algo"], s["nprocs"]) for s in summaries if s["env"] == env})
        for algo, nprocs in groups:
            seeds = sorted(s["seed"] for s in summaries if (s["env"], s["algo"], s["nprocs"]) == (env, algo, nprocs))
            curves = []
            for seed in seeds:
                rows = read_progress(out / group_name(env, algo, nprocs) / f"s{seed}" / "progress.csv")
                steps = np.array([r["total_steps"] for r in rows if not math.isnan(r["ep_return_mean"])])
                returns = np.array([r["ep_return_mean"] for r in rows if not math.isnan(r["ep_return_mean"])])
                curves.append((steps, returns))
            grid = np.linspace(0, min(s[-1] for s, _ in curves), 200)
            values = np.array([np.interp(grid, s, r) for s, r in curves])
            mean, std = values.mean(axis=0), values.std(axis=0)
            ax.plot(grid, mean, label=f"{algo.upper()}, {nprocs} proc{'s' if nprocs > 1 else ''} ({len(seeds)} seeds)")
            ax.fill_between(grid, mean - std, mean + std, alpha=0.2)
        ax.set_title(f"{env}: mean training return over seeds (shaded: ± 1 std)")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("mean episode return")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / f"curves_{env_name(env)}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def report(out: Path) -> None:
    """results.md, results.csv and the curve plots from every summary.json under ``out``."""
    summaries = [json.loads(p.read_text()) for p in sorted(out.glob("*/s*/summary.json"))]
    if not summaries:
        print(f"no finished runs under {out}")
        return
    write_csv(out / "runs.csv", [{k: v for k, v in s.items() if k != "eval_returns"} for s in summaries])
    groups = sorted({(s["env"], s["algo"], s["nprocs"]) for s in summaries})
    rows, csv_rows = [], []
    for env, algo, nprocs in groups:
        runs = [s for s in summaries if (s["env"], s["algo"], s["nprocs"]) == (env, algo, nprocs)]
        train_returns = [s["final_train_return"] for s in runs]
        eval_returns = [s["eval_return_mean"] for s in runs]
        target = TARGETS.get((env_name(env), algo))
        met_eval, met_train = ("", "") if target is None else (
            "yes" if statistics.fmean(returns) >= target else "**no**" for returns in (eval_returns, train_returns))
        wall = [s["train_wall_s"] for s in runs]
        rows.append([env, algo.upper(), nprocs, len(runs), " ".join(str(s["seed"]) for s in runs),
                     f"{statistics.fmean(s['total_steps'] for s in runs):,.0f}", mean_std(eval_returns),
                     mean_std(train_returns), "" if target is None else f"{target:,}", met_eval, met_train,
                     f"{statistics.fmean(wall) / 60:.1f} ({min(wall) / 60:.1f}-{max(wall) / 60:.1f})"])
        csv_rows.append({"env": env, "algo": algo, "nprocs": nprocs, "seeds": len(runs),
                         "final_train_return_mean": statistics.fmean(train_returns),
                         "final_train_return_std": statistics.stdev(train_returns) if len(runs) > 1 else 0.0,
                         "eval_return_mean": statistics.fmean(eval_returns),
                         "eval_return_std": statistics.stdev(eval_returns) if len(runs) > 1 else 0.0,
                         "target": target, "train_wall_min_mean": statistics.fmean(wall) / 60})
    write_csv(out / "results.csv", csv_rows)
    plots = plot_curves(summaries, out)
    comparison = nprocs_comparison(csv_rows)
    machine = describe_machine()
    commits = sorted({s["commit"] for s in summaries})
    dates = sorted((s["date_utc"] for s in summaries), key=lambda d: time.strptime(d, "%a %b %d %H:%M:%S %Z %Y"))
    lines = [
        "- command: `.venv/bin/python benchmarks/learning.py` (from the repository root; each run's own command "
        "lines are in its command.txt)",
        f"- machine: nproc {machine['nproc']}, {machine['cpu_model']}, {machine['memory']} memory, {machine['os']}, "
        f"Python {machine['python']}; shared with other jobs, so wall clock varies with the load",
        f"- runs finished between {dates[0]} and {dates[-1]}; code at commit(s) {', '.join(commits)}",
        f"{versions_line()} (of this summary; each run's config.json holds the versions it ran with)",
        f"- deterministic eval: the final policy acting with its mean action, {len(summaries[0]['eval_returns'])} "
        f"episodes; final training return: mean over the training episodes (stochastic actions) that ended in the "
        f"last iterations, at least {FINAL_EPISODES} episodes; both as mean ± std over seeds. Targets are judged on "
        "the deterministic eval (the policy a user gets); the last column says whether the training return meets "
        "them too.",
        "",
        table(["env", "algo", "nprocs", "seeds", "which", "steps", "deterministic eval", "final training return",
               "target", "met (eval)", "met (train)", "train.py wall min, mean (range)"], rows),
        "",
        *comparison,
        *[f"![{p.stem}]({p.name})" for p in plots],
    ]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def parse_args() -> argparse.Namespace:
    parser = options(__doc__, "learning", nprocs=[2], total_steps=1_000_000, timeout=3600.0)
    parser.add_argument("--envs", nargs="+", default=["Walker2d-v5", "Hopper-v5"], help="gymnasium ids")
    parser.add_argument("--algos", nargs="+", default=["ppo", "trpo"], choices=["ppo", "trpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR,
                        help="run directories with checkpoints (not committed) (default: %(default)s)")
    parser.add_argument("--train_args", default="",
                        help="more train.py options for every new run, e.g. '--batch_size 1024'; give such a sweep "
                             "its own --out and --workdir (default: none)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    args.out, args.workdir = args.out.resolve(), args.workdir.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{pretty_command()}: results in {args.out}, run directories in {args.workdir}", flush=True)
    for algo in args.algos:
        for nprocs in args.nprocs:
            for seed in args.seeds:
                for env in args.envs:
                    if one_run(env, algo, nprocs, seed, args) is not None:
                        report(args.out)
    report(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
