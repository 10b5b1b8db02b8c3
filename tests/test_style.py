"""The code base stays ruff clean and mpi_util never imports TensorFlow at import time."""

import subprocess
import sys

from conftest import REPO, run_bounded


def test_ruff_clean():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:]


def test_importing_mpi_util_does_not_import_tensorflow():
    # Nor torch or JAX, even when a tree goes through rank0_bcast_tree (JAX is asked about a node only when loaded).
    code = ("import sys, numpy, mpi_util; mpi_util.rank0_bcast_tree({'a': [numpy.zeros(2), 1.0]}); "
            "print(*(name in sys.modules for name in ('tensorflow', 'torch', 'jax')))")
    result = run_bounded([sys.executable, "-c", code], timeout=60)
    assert result.stdout.strip() == "False False False", result.stderr


def test_no_function_of_the_product_runs_over_80_lines():
    # A reader holds a function in their head: the package code and train.py keep each under 80 lines, docstring
    # included. Ruff's PLR0915 counts statements, not lines, so this counts them here.
    import ast

    files = [REPO / "train.py", *sorted(p for package in ("mpi_util", "algos", "trainer")
                                        for p in (REPO / package).glob("*.py"))]
    long = [f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in files for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80]
    assert long == []
