"""The user docs: the mkdocs site builds without a warning, and every Python snippet in them is code a test runs."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_bounded

DOCS = sorted((REPO / "docs").glob("*.md"))
EXAMPLES = REPO / "examples"
# A line of just "..." in a snippet marks lines of the example left out.
ELISION = "..."
# The examples a snippet may come from, and the test file that runs each (by name, or for the policy-gradient trio
# as f"{framework}_pg_mpi.py" over BUDGETS).
RUN_BY = {"recipe.py": "test_mpi_fork.py", "sb3_ppo_mpi.py": "test_sb3.py", "sb3_evaluate.py": "test_sb3.py",
          "sb3_subproc_mpi.py": "test_examples.py",
          "cleanrl_ppo_mpi.py": "test_examples.py", "torch_pg_mpi.py": "test_examples.py",
          "keras_pg_mpi.py": "test_examples.py", "jax_pg_mpi.py": "test_examples.py"}


def python_snippets(path: Path) -> list[str]:
    """The bodies of the ```python blocks in a markdown file, in order."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def excerpt_of(snippet: str, source: str) -> bool:
    """Whether every line of ``snippet`` (bar blank lines and "..." lines) is a line of ``source``, in the same
    order, each compared without its leading and trailing whitespace."""
    wanted = [line.strip() for line in snippet.splitlines() if line.strip() and line.strip() != ELISION]
    lines = iter(line.strip() for line in source.splitlines())
    return all(any(line == want for line in lines) for want in wanted)


def test_mkdocs_builds_the_guides_and_api_reference_without_warnings(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        pytest.skip("mkdocs and mkdocstrings-python not installed (pip install -e '.[docs]')")
    result = run_bounded([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    # The reference is made from the docstrings: the recipe's functions and the SB3 adapter are in it.
    for name in ("rank0_accum_batches", "rank0_bcast_wts", "mpi_fork", "SharedRunningStats", "parallelize"):
        assert f'id="mpi_util.{name}"' in api or f'id="mpi_util.sb3.{name}"' in api, name
    built = {path.parent.name for path in (tmp_path / "site").glob("*/index.html")}
    assert {path.stem for path in DOCS} - {"index"} <= built


def test_every_python_snippet_in_the_docs_is_an_excerpt_of_an_example_a_test_runs():
    for name, test_file in RUN_BY.items():
        text = (REPO / "tests" / test_file).read_text()
        framework = name.removesuffix("_pg_mpi.py")
        assert f'"{name}"' in text or (f'("{framework}",' in text and '_pg_mpi.py"' in text), (name, test_file)
    sources = {name: (EXAMPLES / name).read_text() for name in RUN_BY}
    snippets = [(doc.name, body) for doc in [REPO / "README.md", *DOCS] for body in python_snippets(doc)]
    assert len(snippets) >= 6
    for doc_name, body in snippets:
        homes = [name for name, source in sources.items() if excerpt_of(body, source)]
        assert homes, f"a Python snippet in {doc_name} is not an excerpt of an example a test runs:\n{body}"


def test_excerpt_check_fails_on_a_line_the_example_does_not_have():
    recipe = (EXAMPLES / "recipe.py").read_text()
    (snippet,) = python_snippets(REPO / "README.md")
    assert excerpt_of(snippet, recipe)
    assert not excerpt_of(snippet.replace("rank0_accum_batches", "rank0_gather"), recipe)
    lines = snippet.splitlines()
    assert not excerpt_of("\n".join([lines[-1], lines[0]]), recipe)  # out of order
