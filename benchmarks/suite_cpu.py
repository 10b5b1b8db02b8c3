"""Where the test suite's CPU-seconds go: every Python process the suite starts, by test, by test file and by the
framework it imported (benchmarks/README.md, section "suite_cpu.py").

The suite is CPU-bound on two cores, so its wall time is about its CPU-seconds over the cores; this names which tests
and which imports hold them. For the run it puts a .pth file in this interpreter's site-packages (the way coverage.py
measures subprocesses): every Python process of this environment that sees SUITE_CPU_LOG in its environment appends
one line when it exits (its own user + system CPU, whether it imported TensorFlow, torch or JAX, the test that
started it). The file is removed when the run ends. Processes that end without Python's exit
hooks (killed, os._exit) and what is not Python (mpiexec, slurmd, compilers) are in the suite's total only.
Writes results.md and runs.csv (the totals) to --out.
"""

from __future__ import annotations

import collections
import csv
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from harness import REPO, children_cpu_s, fmt, load_average, options, table, write_results

PROBE = '''import atexit, os, sys
def _log():
    times = os.times()
    frameworks = "+".join(name for name, module in (("TensorFlow", "tensorflow"), ("torch", "torch"), ("JAX", "jax"))
                          if sys.modules.get(module) is not None) or "neither"
    test = os.environ.get("PYTEST_CURRENT_TEST", "(pytest)").rsplit(" (", 1)[0]
    fields = [f"{times.user + times.system:.2f}", frameworks, test]
    with open(os.environ["SUITE_CPU_LOG"], "a") as log:
        log.write("\\t".join(field.replace("\\t", " ").replace("\\n", " ") for field in fields) + "\\n")
if os.environ.get("SUITE_CPU_LOG"):
    atexit.register(_log)
'''
COLUMNS = ("cpu_s", "frameworks", "test")


def run_suite(log_path: Path, pytest_args: list[str]) -> tuple[int, float, float]:
    """Runs pytest with the probe installed; returns its exit status, wall seconds and CPU-seconds (every process it
    waited for: user + system)."""
    site = Path(sysconfig.get_paths()["purelib"])
    probe, pth = site / "_suite_cpu_probe.py", site / "_suite_cpu_probe.pth"
    probe.write_text(PROBE)
    pth.write_text("import _suite_cpu_probe\n")
    cpu_before = children_cpu_s()
    start = time.monotonic()
    try:
        returncode = subprocess.run([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=REPO,
                                    env=dict(os.environ, SUITE_CPU_LOG=str(log_path))).returncode
    finally:
        pth.unlink()
        probe.unlink()
    return returncode, time.monotonic() - start, children_cpu_s() - cpu_before


def totals(processes: list[dict], key: str, top: int) -> list[list[str]]:
    """Table rows (name, processes, CPU-s, share of the logged CPU-s) of the ``top`` largest groups by ``key``."""
    cpu, count = collections.Counter(), collections.Counter()
    for process in processes:
        cpu[process[key]] += process["cpu_s"]
        count[process[key]] += 1
    logged = sum(cpu.values())
    return [[name, count[name], fmt(seconds, 1), f"{100 * seconds / logged:.0f}%"]
            for name, seconds in cpu.most_common(top)]


def main() -> None:
    parser = options(__doc__, "suite_cpu")
    parser.add_argument("--pytest_args", nargs="*", default=[], help="more pytest arguments (default: none)")
    parser.add_argument("--top", type=int, default=30, help="tests in the per-test table (default: %(default)s)")
    args = parser.parse_args()
    load = load_average()
    with tempfile.TemporaryDirectory() as scratch:
        log_path = Path(scratch) / "processes.tsv"
        returncode, wall_s, cpu_s = run_suite(log_path, args.pytest_args)
        with open(log_path) as f:
            processes = [dict(zip(COLUMNS, row, strict=True)) for row in csv.reader(f, delimiter="\t")]
    for process in processes:
        process["cpu_s"] = float(process["cpu_s"])
        process["file"] = process["test"].split("::")[0]
    logged = sum(process["cpu_s"] for process in processes)
    columns = ["Python processes", "CPU-s", "share of logged"]
    body = "\n\n".join([
        f"pytest exited {returncode}: {fmt(wall_s)} s wall, {fmt(cpu_s)} CPU-s (user + system of every process it "
        f"waited for), {fmt(cpu_s / wall_s, 2)} cores busy on average. {len(processes)} Python processes logged "
        f"{fmt(logged)} CPU-s ({100 * logged / cpu_s:.0f}%); the rest is what is not Python or ended without exit "
        "hooks.",
        "By the framework a process imported:", table(["framework", *columns], totals(processes, "frameworks", 8)),
        "By test file:", table(["file", *columns], totals(processes, "file", 40)),
        f"The {args.top} tests that cost the most:", table(["test", *columns], totals(processes, "test", args.top)),
    ])
    write_results(args.out, [{"returncode": returncode, "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
                              "logged_cpu_s": round(logged, 1), "processes": len(processes)}], body, wall_s,
                  f"{load:.2f}", title="Where the test suite's CPU-seconds go")


if __name__ == "__main__":
    main()
