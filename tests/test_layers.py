"""The packages' imports point down, mpi_util <- envs <- algos <- trainer <- train.py, and form no cycle: read from
the source (every import, those for typing only included), so that no layer needs one above it to be read."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

LAYERS = ("mpi_util", "envs", "algos", "trainer")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, package: str) -> set[str]:
    """The project modules that ``source``, a module of ``package``, imports anywhere in it (inside functions and
    ``if TYPE_CHECKING`` too), and the names it imports from them as "module.name"."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .x import y
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *filter(None, [base])])
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {module for module in found if module.split(".")[0] in LAYERS}


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for layer in LAYERS for path in (REPO / layer).rglob("*.py")}

    def known(module: str) -> str | None:  # "algos.ppo.PPO" -> "algos.ppo"
        while module and module not in modules:
            module = module.rpartition(".")[0]
        return module or None

    def package_of(name: str, path: Path) -> str:
        return name if path.name == "__init__.py" else name.rpartition(".")[0]

    return {name: {m for m in map(known, imports_of(path.read_text(), package_of(name, path))) if m and m != name}
            for name, path in modules.items()}


def test_no_module_imports_a_layer_above_its_own():
    upward = [f"{name} -> {target}" for name, targets in graph().items() for target in targets
              if LAYERS.index(target.split(".")[0]) > LAYERS.index(name.split(".")[0])]
    assert upward == []


def test_no_import_cycle():
    edges, cycles = graph(), []

    def visit(node: str, path: list[str]) -> None:
        for target in sorted(edges[node]):
            if target in path:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(node)

    done: set[str] = set()
    for start in sorted(edges):
        if start not in done:
            visit(start, [start])
    assert cycles == []


def test_the_reader_sees_imports_for_typing_in_functions_and_relative_ones():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.config import TrainConfig\n"
              "def f():\n    import envs.make\nfrom .stall import heartbeat\n")
    assert imports_of(source, "mpi_util") == {"trainer.config", "trainer.config.TrainConfig", "envs.make",
                                              "mpi_util.stall", "mpi_util.stall.heartbeat"}
