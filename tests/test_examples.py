"""The third-party-style examples, each the parallel twin of a plain single-process script, under a real mpiexec."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from conftest import REPO, run_bounded

EXAMPLES = REPO / "examples"


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_policy_gradient_learns_on_two_ranks_with_identical_weights(framework):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} not installed (pip install -e '.[test]')")
    result = run_bounded([sys.executable, str(EXAMPLES / f"{framework}_pg_mpi.py"), "--nprocs", "2",
                          "--iterations", "25"], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    returns = [float(x) for x in re.findall(r"4000 steps, mean return ([\d.]+)", result.stdout)]
    assert len(returns) == 25, result.stdout[-3000:]
    assert sum(returns[-5:]) / 5 > 150, returns  # random play: about 22
    assert "ranks whose weights differ from rank 0's: []" in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_parallel_example_differs_from_its_plain_script_by_the_recipe_only(framework):
    # Every line the parallel version adds or changes carries the mark "# mpi_util", or is the docstring, an import
    # for the fork's exit, or a line moved (under "if mpi_util.rank == 0:", the update rank 0 alone runs).
    plain = (EXAMPLES / f"{framework}_pg.py").read_text().split('"""', 2)[2].splitlines()
    parallel = (EXAMPLES / f"{framework}_pg_mpi.py").read_text().split('"""', 2)[2].splitlines()
    stripped = {line.strip() for line in plain}
    for line in parallel:
        if line in plain or not line.strip() or "# mpi_util" in line or line == "import sys":
            continue
        assert line.strip() in stripped, f"a change that is not the recipe's: {line!r}"
