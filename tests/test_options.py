"""train.py's options have one source: each option's default is written once, on its TrainConfig field or, for a
setting an algorithm owns, in the algorithm's registry line; --help, config.json and the algorithms' own classes
take it from there."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_bounded

from algos.registry import ALGORITHMS
from trainer.config import TrainConfig, build_config, option_fields
from trainer.options import parse_args

# Names under which the algorithms' classes hold a train.py setting.
ALIASES = {"target_kl": "kl_targ", "max_kl": "kl_targ", "vf_lr": "lr", "vf_minibatch_size": "minibatch_size",
           "learning_rate": "lr"}
PRODUCT = [REPO / "train.py", *sorted((REPO / "trainer").glob("*.py")), *sorted((REPO / "algos").glob("*.py"))]


def _is_literal(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is not None
    return isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts)


def literal_defaults(path: Path) -> list[str]:
    """'file:line name' for each parameter or class field named as a train.py option with a literal default."""
    options = {f.name for f in option_fields()}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        pairs: list[tuple[str, ast.expr | None, int]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            positional = node.args.posonlyargs + node.args.args
            pairs += [(a.arg, d, a.lineno) for a, d in zip(positional[len(positional) - len(node.args.defaults):],
                                                           node.args.defaults, strict=True)]
            pairs += [(a.arg, d, a.lineno) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)]
        elif isinstance(node, ast.ClassDef):
            pairs += [(s.target.id, s.value, s.lineno) for s in node.body
                      if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
        found += [f"{path.name}:{line} {name}" for name, default, line in pairs
                  if ALIASES.get(name, name) in options and _is_literal(default)]
    return found


def test_no_default_of_an_option_is_written_twice():
    # TrainConfig's fields are setting(...) calls and the registry's defaults a dict: neither is a literal default
    # of a parameter or field, so anything found here restates an option's default.
    restated = [hit for path in PRODUCT for hit in literal_defaults(path)]
    assert restated == [], "defaults of train.py options written again (take them from TrainConfig or the registry)"


def test_the_check_above_finds_a_restated_default(tmp_path):
    module = tmp_path / "restated.py"
    module.write_text("from dataclasses import dataclass\n\n\ndef step(obs, gamma: float = 0.99):\n    return obs\n\n\n"
                      "@dataclass\nclass Settings:\n    vf_lr: float = 1e-3\n    clip: float = 0.2\n")
    assert literal_defaults(module) == ["restated.py:4 gamma", "restated.py:10 vf_lr"]


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_config_json_records_the_algorithms_own_defaults(algo):
    config, _, _ = build_config(parse_args(["CartPole-v1", "--algo", algo]))
    for name, value in ALGORITHMS[algo].defaults.items():
        assert getattr(config, name) == value, name
    unread = {f.name for f in option_fields()} & {n for spec in ALGORITHMS.values() for n in spec.defaults}
    for name in unread - set(ALGORITHMS[algo].defaults):
        assert getattr(config, name) is None, name  # a setting this algorithm does not read stays unset


def test_a_setting_the_algorithm_does_not_read_is_refused_in_one_line():
    result = run_bounded([sys.executable, str(REPO / "train.py"), "CartPole-v1", "--algo", "trpo", "--epochs", "3"],
                         timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "train.py: error: --epochs is not a setting of trpo (only of ppo); trpo reads --lr, --minibatch_size, --kl_targ"
    ], result.stderr


def test_help_shows_each_default_from_its_one_source():
    help_text = run_bounded([sys.executable, str(REPO / "train.py"), "--help"], timeout=60,
                            env={"COLUMNS": "1000"}).stdout  # no wrapped words
    # Each option's invocation and help, as one line: a line that starts with an option opens a block, a further
    # indented one continues it.
    blocks: list[str] = []
    for line in help_text.splitlines():
        if line.startswith("  -"):
            blocks.append(line.strip())
        elif line.startswith("    ") and blocks:
            blocks[-1] += " " + line.strip()
    for field in option_fields():
        owners = {algo: spec.defaults[field.name] for algo, spec in ALGORITHMS.items() if field.name in spec.defaults}
        if owners:
            shown = ", ".join(f"{algo} {value}" for algo, value in owners.items())
        elif field.default in (None, False):
            continue
        else:
            shown = ",".join(map(str, field.default)) if isinstance(field.default, tuple) else str(field.default)
        block = next(block for block in blocks if re.match(rf"(-\w [A-Z_]+, )?--{field.name}\b", block))
        assert block.endswith(f"(default: {shown})"), (field.name, block)


def test_the_docs_state_no_option_default_of_their_own():
    # A default quoted in the docs goes stale when it changes; the docs point at --help instead.
    stated = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in re.finditer(r"`--(\w+)[^`]*`[^.;`]*?\(default:? ([^)]+)\)", line):
                if match.group(1) in TrainConfig.__dataclass_fields__:
                    stated.append(f"{page.name}:{number} --{match.group(1)} {match.group(2)}")
    assert stated == []
