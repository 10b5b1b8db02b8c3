"""Which machine differences change train.py's numbers: the same run under the CPU kernels other machines would pick
(numpy's SIMD loops, OpenBLAS's kernel family, oneDNN's instruction set, fewer cores; benchmarks/README.md, section
machine_dependence.py). A variant is ``NAME=SETTINGS``, ``VAR=value`` words and an optional ``taskset=CPUS``; the
first is the reference. The table says whether progress.csv's learning columns equal the reference's bit for bit.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import REPO, failure, load_average, options, run_logged, table, write_results

# The columns of progress.csv that follow from the numbers alone (no clocks): where two runs agree in all of them at
# every iteration, they learned the same thing.
LEARNING_COLUMNS = ("total_episodes", "ep_return_mean", "ep_return_min", "ep_return_max", "pi_loss", "v_loss",
                    "entropy", "kl", "explained_var")
# numpy 2.4's names for its AVX-512 dispatch targets; disabling them leaves the AVX2 (x86-64-v3) loops.
_NUMPY_NO_AVX512 = "NPY_DISABLE_CPU_FEATURES=X86_V4,AVX512_ICL,AVX512_SPR"
DEFAULT_VARIANTS = (
    "this machine=",
    "again=",
    "1 core=taskset=0",
    f"numpy AVX2 loops={_NUMPY_NO_AVX512}",
    "OpenBLAS SkylakeX=OPENBLAS_CORETYPE=SkylakeX",
    "OpenBLAS Sandybridge=OPENBLAS_CORETYPE=Sandybridge",
    "oneDNN on=TF_ENABLE_ONEDNN_OPTS=1",
    "oneDNN on, AVX2=TF_ENABLE_ONEDNN_OPTS=1 ONEDNN_MAX_CPU_ISA=AVX2",
)


def parse_variant(text: str) -> tuple[str, dict[str, str], str | None]:
    """"NAME=VAR=value ... [taskset=CPUS]" -> (name, environment settings, taskset CPU list or None)."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"machine_dependence.py: error: a variant is NAME=SETTINGS (may be empty), got {text!r}")
    env: dict[str, str] = {}
    cpus = None
    for word in shlex.split(rest):
        key, sep, value = word.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"machine_dependence.py: error: {word!r} in variant {name!r} is not VAR=value")
        if key == "taskset":
            cpus = value
        else:
            env[key] = value.replace(",", " ")
    return name, env, cpus


def run_variant(code: Path, train_args: list[str], env: dict[str, str], cpus: str | None, workdir: Path,
                timeout_s: float) -> tuple[list[dict[str, str]], float]:
    """Run train.py of ``code`` once; (its progress.csv rows, as text, and the wall seconds)."""
    command = [sys.executable, str(code / "train.py"), *train_args, "--logdir", str(workdir)]
    if cpus is not None:
        command = ["taskset", "-c", cpus, *command]
    returncode, wall_s = run_logged(command, workdir / "train.log", timeout_s, env, cwd=code)
    if returncode != 0:
        raise failure(shlex.join(command), returncode, workdir / "train.log")
    (progress,) = workdir.glob("*/progress.csv")
    with open(progress, newline="") as f:
        return list(csv.DictReader(f)), wall_s


def first_difference(rows: list[dict[str, str]], reference: list[dict[str, str]]) -> int | None:
    """The first iteration (1-based) where a learning column's text differs from the reference's; None if none."""
    for index, (row, ref) in enumerate(zip(rows, reference, strict=False), start=1):
        if any(row.get(column) != ref.get(column) for column in LEARNING_COLUMNS):
            return index
    return None if len(rows) == len(reference) else min(len(rows), len(reference)) + 1


def parse_args() -> argparse.Namespace:
    parser = options(__doc__, "machine_dependence", timeout=900.0)
    parser.add_argument("variants", nargs="*", default=list(DEFAULT_VARIANTS),
                        help="NAME=SETTINGS, the first the reference (default: this machine, a repeat, 1 core, and "
                             "the numpy, OpenBLAS and oneDNN kernels of other CPUs)")
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose train.py runs (default: this one)")
    parser.add_argument("--train_args", default="Walker2d --nprocs 2 --total_steps 200000",
                        help="train.py arguments (default: the README's first command)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    variants = [parse_variant(text) for text in args.variants]
    code = args.code.resolve()
    commit = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip() or "unknown"
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    loads = []
    reference: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="machine_dependence_") as tmp:
        for index, (name, env, cpus) in enumerate(variants):
            loads.append(f"{load_average():.1f}")
            workdir = Path(tmp) / f"run{index}"
            workdir.mkdir()
            progress, wall_s = run_variant(code, shlex.split(args.train_args), env, cpus, workdir, args.timeout)
            if index == 0:
                reference = progress
            differs_at = first_difference(progress, reference)
            settings = " ".join([*(f"{k}={v}" for k, v in env.items()), *([f"taskset -c {cpus}"] if cpus else [])])
            rows.append({"variant": name, "settings": settings or "(none)", "iterations": len(progress),
                         "same_as_reference": differs_at is None,
                         "first_differing_iteration": "" if differs_at is None else differs_at,
                         "last_return_mean": float(progress[-1]["ep_return_mean"]), "wall_s": round(wall_s, 1)})
            print(f"{name}: last mean return {rows[-1]['last_return_mean']:.1f}, "
                  f"{'same as' if differs_at is None else f'parts from iteration {differs_at} of'} the reference "
                  f"({wall_s:.0f} s)", flush=True)
    header = ["variant", "settings", "bit for bit as the first", "first iteration that differs", "last mean return"]
    body = [[r["variant"], f"`{r['settings']}`", "yes" if r["same_as_reference"] else "no",
             r["first_differing_iteration"] or "", f"{r['last_return_mean']:.1f}"] for r in rows]
    write_results(args.out, rows, table(header, body), time.perf_counter() - started, ", ".join(loads),
                  title=f"train.py under other machines' kernels: `train.py {args.train_args}`, code of {commit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
