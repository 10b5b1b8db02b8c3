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
    atari = {algo: spec.families["atari"] for algo, spec in ALGORITHMS.items()}
    for field in option_fields():
        owners = {algo: spec.defaults[field.name] for algo, spec in ALGORITHMS.items() if field.name in spec.defaults}
        if owners:
            shown = "; ".join(f"{algo} {value}" + (f", Atari {atari[algo][field.name]}"
                                                   if atari[algo].get(field.name, value) != value else "")
                              for algo, value in owners.items())
        elif field.default in (None, False):
            continue
        else:
            shown = ",".join(map(str, field.default)) if isinstance(field.default, tuple) else str(field.default)
            shown += {"batch_size": ", Atari 1024", "envs_per_rank": ", Atari 8 over all processes"}.get(field.name, "")
        block = next(block for block in blocks if re.match(rf"(-\w [A-Z_]+, )?--{field.name}\b", block))
        assert block.endswith(f"(default: {shown})"), (field.name, block)
    assert "(default: ppo 0.0003, Atari 0.00025; trpo 0.001)" in help_text  # as the registry's lines read


ATARI_PPO = {"batch_size": 1024, "epochs": 4, "minibatch_size": 256, "lr": 2.5e-4, "lr_schedule": "linear",
             "clip_ratio": 0.1, "clip_schedule": "linear", "ent_coef": 0.01, "vf_coef": 0.25, "kl_targ": 0.0,
             "value_loss": "clipped", "adv_norm": "minibatch", "value_targets": "raw"}


@pytest.mark.parametrize(("nprocs", "envs_per_rank"), [(1, 8), (2, 4), (3, 2), (8, 1), (16, 1)])
def test_an_atari_id_gets_the_atari_work_spread_over_any_process_count(nprocs, envs_per_rank):
    # 8 envs of 128 steps over all processes: the same batch and work at every count, each env's horizon 128 where
    # the count divides 8 (--envs_per_rank x --nprocs envs in all).
    config, _, _ = build_config(parse_args(["ALE/Pong-v5", "--nprocs", str(nprocs)]))
    assert {name: getattr(config, name) for name in ATARI_PPO} == ATARI_PPO
    assert config.envs_per_rank == envs_per_rank


def test_a_given_option_wins_over_the_family_and_other_families_keep_the_generic_defaults():
    config, _, _ = build_config(parse_args(["ALE/Pong-v5", "--nprocs", "2", "--batch_size", "2048", "--ent_coef", "0",
                                            "--envs_per_rank", "3", "--kl_targ", "0.05", "--clip_schedule",
                                            "constant", "--value_targets", "normalized", "--value_loss", "mse",
                                            "--adv_norm", "batch"]))
    assert (config.batch_size, config.ent_coef, config.envs_per_rank, config.kl_targ, config.clip_schedule,
            config.value_targets, config.value_loss, config.adv_norm, config.epochs) == (
                2048, 0.0, 3, 0.05, "constant", "normalized", "mse", "batch", 4)
    trpo, _, _ = build_config(parse_args(["ALE/Pong-v5", "--nprocs", "2", "--algo", "trpo"]))
    assert (trpo.batch_size, trpo.envs_per_rank) == (1024, 4)  # the Atari batch, TRPO's own settings
    assert {name: getattr(trpo, name) for name in ALGORITHMS["trpo"].defaults} == ALGORITHMS["trpo"].defaults
    older, _, _ = build_config(parse_args(["BreakoutNoFrameskip-v4", "--nprocs", "2"]))  # ale-py's older ids too
    assert {name: getattr(older, name) for name in ATARI_PPO} == ATARI_PPO and older.envs_per_rank == 4
    for env_id in ("CartPole-v1", "MinAtar/Breakout-v1", "MountainCar-v0"):  # the last of the older ids' form
        config, _, _ = build_config(parse_args([env_id, "--nprocs", "2"]))
        assert (config.batch_size, config.envs_per_rank) == (2048, 1)
        assert {name: getattr(config, name) for name in ALGORITHMS["ppo"].defaults} == ALGORITHMS["ppo"].defaults


def test_a_ppo_run_begun_before_an_option_existed_resumes_with_the_loss_it_learned_with(tmp_path):
    from trainer.config import load_saved_config

    (tmp_path / "config.json").write_text('{"env_id": "ALE/Pong-v5", "algo": "ppo", "hidden": [64, 64]}')
    saved = load_saved_config(tmp_path)  # not Atari's raw targets, clipped value loss and per-minibatch advantages
    assert (saved["value_targets"], saved["value_loss"], saved["adv_norm"]) == ("normalized", "mse", "batch")


def test_kl_targ_0_never_stops_ppo_early_and_is_refused_for_trpo():
    from trainer.config import check_config

    with pytest.raises(ValueError, match=r"^--kl_targ must be > 0, got 0.0$"):
        check_config(TrainConfig(env_id="CartPole-v1", algo="trpo", kl_targ=0.0, lr=1e-3))
    with pytest.raises(ValueError, match=r"^--clip_ratio must be in \(0, 1\), got 1.5$"):
        check_config(TrainConfig(env_id="CartPole-v1", algo="ppo", clip_ratio=1.5, lr=1e-3))


def test_the_docs_state_no_option_default_of_their_own():
    # A default quoted in the docs goes stale when it changes; the docs point at --help instead.
    stated = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for match in re.finditer(r"`--(\w+)[^`]*`[^.;`]*?\(default:? ([^)]+)\)", line):
                if match.group(1) in TrainConfig.__dataclass_fields__:
                    stated.append(f"{page.name}:{number} --{match.group(1)} {match.group(2)}")
    assert stated == []


def test_tensorflow_installed_twice_is_refused_in_one_line(tmp_path):
    # What pip leaves after installing the gpu extra beside the rl one (or the reverse): both builds' metadata, one
    # module whose files each overwrote. The build that is not installed here is added as a dist-info on the path.
    import importlib.metadata

    try:
        importlib.metadata.distribution("tensorflow-cpu")
        other = "tensorflow"
    except importlib.metadata.PackageNotFoundError:
        other = "tensorflow_cpu"
    dist_info = tmp_path / f"{other}-2.21.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {other.replace('_', '-')}\nVersion: 2.21.0\n")
    result = run_bounded([sys.executable, "train.py", "CartPole-v1"], timeout=60, cwd=REPO,
                         env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "train.py: error: tensorflow and tensorflow-cpu are both installed, and each overwrote the other's files: pip "
        "uninstall -y tensorflow tensorflow-cpu, then pip install -e '.[rl]' (or '.[gpu]' on a machine with an NVIDIA "
        "GPU) in this checkout"], result.stderr


def test_bfloat16_is_refused_in_one_line_for_vectors_and_on_a_cpu_without_its_instructions():
    from trainer.config import check_config, check_precision

    with pytest.raises(ValueError, match=r"^--precision bfloat16 is for image observations \(a CNN's layers\); "
                                         r"CartPole-v1 has vectors: drop --precision$"):
        check_config(TrainConfig(env_id="CartPole-v1", precision="bfloat16", lr=1e-3))
    avx2 = "sse4_2 avx avx2 fma"
    with pytest.raises(ValueError, match=r"^--precision bfloat16 needs a CPU with AVX512_BF16 or AMX instructions, "
                                         r"and this one \(Intel Xeon E5\) has neither: drop --precision$"):
        check_precision("bfloat16", "MinAtar/Breakout-v1", True, ("Intel Xeon E5", avx2))
    for flags in (f"{avx2} avx512f avx512_bf16", f"{avx2} avx512f avx512_bf16 amx_tile", f"{avx2} amx_tile"):
        check_precision("bfloat16", "MinAtar/Breakout-v1", True, ("a CPU with them", flags))
    check_precision("float32", "CartPole-v1", False, ("any CPU", ""))
    # Without ``cpu``, this machine's CPU decides, as it does for train.py.
    from trainer.versions import cpu_model_and_flags

    model, flags = cpu_model_and_flags()
    if {"avx512_bf16", "amx_tile"} & set(flags.split()):
        check_precision("bfloat16", "MinAtar/Breakout-v1", True)
    else:
        with pytest.raises(ValueError, match=rf"\({re.escape(model)}\) has neither: drop --precision$"):
            check_precision("bfloat16", "MinAtar/Breakout-v1", True)
