"""The user docs: the mkdocs site builds without a warning, renders what the Markdown and the docstrings say (code
blocks, nested lists, text in angle brackets), and every Python snippet in them is code a test runs."""

from __future__ import annotations

import csv
import importlib.util
import re
import statistics
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import REPO, run_bounded

import mpi_util

DOCS = sorted((REPO / "docs").glob("*.md"))
EXAMPLES = REPO / "examples"
# A line of just "..." in a snippet marks lines of the example left out.
ELISION = "..."
# The examples a snippet may come from, and the test file that runs each (by name, or for the policy-gradient trio
# as f"{framework}_pg_mpi.py" over BUDGETS).
RUN_BY = {"recipe.py": "test_mpi_fork.py", "sb3_ppo_mpi.py": "test_sb3.py", "sb3_evaluate.py": "test_sb3.py",
          "sb3_subproc_mpi.py": "test_examples.py", "sb3_atari_mpi.py": "test_examples.py",
          "cleanrl_ppo_mpi.py": "test_examples.py", "torch_pg_mpi.py": "test_examples.py",
          "keras_pg_mpi.py": "test_examples.py", "jax_pg_mpi.py": "test_examples.py",
          "play_policy_file.py": "test_run_names.py", "train_from_python.py": "test_api.py"}


def python_snippets(path: Path) -> list[str]:
    """The bodies of the ```python blocks in a markdown file, in order."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def excerpt_of(snippet: str, source: str) -> bool:
    """Whether every line of ``snippet`` (bar blank lines and "..." lines) is a line of ``source``, in the same
    order, each compared without its leading and trailing whitespace."""
    wanted = [line.strip() for line in snippet.splitlines() if line.strip() and line.strip() != ELISION]
    lines = iter(line.strip() for line in source.splitlines())
    return all(any(line == want for line in lines) for want in wanted)


# A fenced code block's opening or closing line, and a list item's first line (bullet or number), in Markdown.
FENCE = re.compile(r"^( *)```")
LIST_ITEM = re.compile(r"^( *)(?:[-*+]|\d+[.)]) +\S")
# Text that HTML would take for a tag: "<" then a letter, up to the next ">" on the same line.
TAG_LIKE = re.compile(r"<[A-Za-z][^<>\n]*>")
# Tags that have no end tag.
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def markdown_structure(text: str) -> tuple[list[str], int]:
    """The fenced code blocks of Markdown ``text`` (each body without the fence's own indentation, in order) and
    the number of list items that are nested inside another list item, as the source's indentation says."""
    blocks: list[str] = []
    nested = 0
    body: list[str] | None = None
    fence_indent = 0
    open_items: list[int] = []  # the indentation of each list item above this line that is still open
    for line in text.splitlines():
        fence = FENCE.match(line)
        if body is not None:  # inside a fenced block
            if fence:
                blocks.append("\n".join(body))
                body = None
            else:
                body.append(line[fence_indent:])
            continue
        if fence:
            body, fence_indent = [], len(fence.group(1))
            continue
        item = LIST_ITEM.match(line)
        if item:
            indent = len(item.group(1))
            while open_items and open_items[-1] >= indent:
                open_items.pop()
            nested += bool(open_items)
            open_items.append(indent)
        elif line.strip() and not line.startswith(" "):  # a paragraph, heading or table at the margin ends lists
            open_items.clear()
    return blocks, nested


class BuiltPage(HTMLParser):
    """The main content of a page mkdocs built (its role="main" element, without the navigation): its text, the text
    of each <pre> block, and the number of <li> elements inside another <li>."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open_tags: list[str] = []
        self.main_depth: int | None = None  # len(open_tags) once the main element is open
        self.main_done = False
        self.text: list[str] = []
        self.pre_blocks: list[str] = []
        self.nested_items = 0
        self.feed(html)
        self.close()

    def _in_main(self) -> bool:
        return self.main_depth is not None and not self.main_done

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID_TAGS:
            return
        self.open_tags.append(tag)
        if self.main_depth is None and ("role", "main") in attrs:
            self.main_depth = len(self.open_tags)
        if not self._in_main():
            return
        inside_main = self.open_tags[self.main_depth:-1]
        if tag == "li" and "li" in inside_main:
            self.nested_items += 1
        if tag == "pre":
            self.pre_blocks.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID_TAGS or tag not in self.open_tags:
            return
        while self.open_tags.pop() != tag:  # close what the page left open inside it
            pass
        if self.main_depth is not None and len(self.open_tags) < self.main_depth:
            self.main_done = True

    def handle_data(self, data: str) -> None:
        if self._in_main():
            self.text.append(data)
            if "pre" in self.open_tags[self.main_depth:]:
                self.pre_blocks[-1] += data


def lines_of(code: str) -> str:
    """A code block's text compared line by line: trailing spaces and blank lines at either end left out."""
    return "\n".join(line.rstrip() for line in code.strip("\n").splitlines())


def rendered_docstrings() -> list[str]:
    """The docstrings the API reference renders: each object docs/api.md names with a ``:::`` directive and its
    public members (mkdocs.yml's filter leaves out names that start with "_")."""
    import griffe

    packages = {name: griffe.load(name, search_paths=[str(REPO)]) for name in ("mpi_util", "trainer")}
    paths = re.findall(r"^::: ([\w.]+)$", (REPO / "docs" / "api.md").read_text(), flags=re.M)
    docstrings = []
    for path in paths:
        top, _, rest = path.partition(".")
        obj = packages[top][rest] if rest else packages[top]
        for member in [obj, *(m for name, m in obj.members.items() if not name.startswith("_"))]:
            if member.docstring is not None:
                docstrings.append(member.docstring.value)
    return docstrings


def tags_lost(docstrings: list[str], page_text: str) -> list[str]:
    """The ``<...>`` texts of ``docstrings`` that do not appear in ``page_text``: HTML took them for tags."""
    found = {text for docstring in docstrings for text in TAG_LIKE.findall(docstring)}
    return sorted(text for text in found if text not in page_text)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``mkdocs build --strict`` makes it, built once for the tests of this file."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        pytest.skip("mkdocs and mkdocstrings-python not installed (pip install -e '.[docs]')")
    site_dir = tmp_path_factory.mktemp("site")
    result = run_bounded([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                         timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return site_dir


def built_page(site: Path, doc: Path) -> BuiltPage:
    """The built HTML of docs/``doc``."""
    html_path = site / "index.html" if doc.stem == "index" else site / doc.stem / "index.html"
    return BuiltPage(html_path.read_text())


SITE = pytest.mark.xdist_group("docs_site")  # the tests that read the built site: one worker builds it once


@SITE
@pytest.mark.timeout(240)
def test_mkdocs_builds_the_guides_and_api_reference_without_warnings(site):
    api = (site / "api" / "index.html").read_text()
    # The reference is made from the docstrings: the recipe's functions and the SB3 adapter are in it.
    for name in ("rank0_accum_batches", "rank0_bcast_wts", "mpi_fork", "SharedRunningStats", "parallelize", "rank",
                 "nworkers"):
        assert f'id="mpi_util.{name}"' in api or f'id="mpi_util.sb3.{name}"' in api, name
    built = {path.parent.name for path in site.glob("*/index.html")}
    assert {path.stem for path in DOCS} - {"index"} <= built


def test_api_reference_lists_every_export_in_the_order_a_user_meets_them():
    directives = re.findall(r"^::: ([\w.]+)$", (REPO / "docs" / "api.md").read_text(), flags=re.M)
    assert sorted(f"mpi_util.{name}" for name in mpi_util.__all__) == sorted(
        path for path in directives if not path.startswith(("mpi_util.sb3.", "trainer.")))
    order = ["mpi_fork", "set_global_seeds", "rank0_accum_batches", "rank0_bcast_wts", "all_sum",
             "SharedRunningStats", "setup_gpu", "set_stall_timeout", "sb3.parallelize"]
    positions = [directives.index(f"mpi_util.{name}") for name in order]
    assert positions == sorted(positions), order


@SITE
@pytest.mark.timeout(240)
@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_code_blocks_and_nested_lists_of_each_page_survive_the_build(site, doc):
    # Python-Markdown nests a list, or keeps a code block inside a list item, only when it is indented by 4 spaces;
    # at 2 it flattens the list, and a fence inside a list item becomes a paragraph of text.
    blocks, nested = markdown_structure(doc.read_text())
    page = built_page(site, doc)
    rendered = {lines_of(pre) for pre in page.pre_blocks}
    for block in blocks:
        assert lines_of(block) in rendered, f"a code block of {doc.name} is not a <pre> block on the site:\n{block}"
    assert page.nested_items == nested, (
        f"{doc.name}: {nested} list items are nested in the Markdown, {page.nested_items} on the site; indent nested "
        "lists by 4 spaces")


@SITE
@pytest.mark.timeout(240)
def test_no_angle_bracket_text_of_a_docstring_is_lost_in_the_api_reference(site):
    docstrings = rendered_docstrings()
    assert len(docstrings) > 40  # the reference's objects were found
    page = built_page(site, REPO / "docs" / "api.md")
    assert tags_lost(docstrings, "".join(page.text)) == []


def test_the_page_checks_fail_on_a_flattened_list_a_lost_fence_and_an_eaten_tag():
    # Python-Markdown itself, as mkdocs runs it: the checks above must see what it does to these.
    markdown = pytest.importorskip("markdown")
    source = "- a\n  - b, indented 2\n- c\n\n  ```bash\n  echo in a list item\n  ```\n"
    blocks, nested = markdown_structure(source)
    assert (blocks, nested) == (["echo in a list item"], 1)
    page = BuiltPage('<div role="main">' + markdown.markdown(source, extensions=["fenced_code"]) + "</div>")
    assert page.nested_items == 0 and page.pre_blocks == []
    fixed = BuiltPage('<div role="main">' + markdown.markdown(source.replace("  - b", "    - b"), extensions=[
        "fenced_code"]) + "</div>")
    assert fixed.nested_items == 1
    eaten = BuiltPage('<div role="main">' + markdown.markdown("relaunch: mpi_util: <cause>; ``<kept>``") + "</div>")
    assert tags_lost(["<cause>", "<kept>"], "".join(eaten.text)) == ["<cause>"]


RESULTS = REPO / "benchmarks" / "results"
CITED = re.compile(r"benchmarks/results/[\w./-]*[\w/]")
PONG_PEERS = ("train.py --nprocs 2", "CleanRL-style PPO, 8 envs, torch 2 thread(s)",
              "stable-baselines3 PPO, 8 envs, torch 2 thread(s)")
"""peers.py's names of the three systems of the Pong peers runs, in the README's order."""


def steps_by_repeat(steps_per_s: tuple[tuple[int, ...], ...]) -> list[str]:
    """peers.py's table rows "| repeat | seed 0 | system | steps/s |" for each of PONG_PEERS' systems, whose steps/s
    in repeats 1, 2, ... are the matching tuple of ``steps_per_s``."""
    return [f"| {repeat} | 0 | {system} | {steps} |" for system, figures in zip(PONG_PEERS, steps_per_s, strict=True)
            for repeat, steps in enumerate(figures, 1)]


BREAKOUT_ROW = "ALE/Breakout-v5, game score of the last 10 iterations after 2M frames (500k steps), seeds 0-"
"""The README's row of Atari Breakout's learning at the current update; it cites seeds 0 and 10 of the runs 0-10 and
every seed from 11 on (the test computes the last seed and the means it gives)."""


# Figures the guides quote from a results file they cite: (page, the figure as the page words it, the file under
# benchmarks/results/, the lines of that file it comes from). Whitespace is compared as one space.
# The CPU flags a results file records for the two kinds of VM its figures came from: Zen 3 (AVX2) and Zen 4 (AVX-512).
ZEN3, ZEN4 = "cpu_flags sse4_2 avx avx2 fma,", "cpu_flags sse4_2 avx avx2 fma avx512f avx512_vnni avx512_bf16,"
FIGURES = [
    ("clusters.md", "that part was 34% of an iteration at 2 processes", "scaling_2026-11-25/results.md",
     ["serial share at 2 processes: 34% of the iteration"]),
    ("clusters.md", "predicts 25,027 / 29,866 / 34,932 steps/s on 8 / 16 / 64 cores, against a ceiling of 37,025",
     "scaling_2026-11-25/results.md",
     ["Amdahl from 2 process(es): 8 cores 25,027, 16 cores 29,866, 64 cores 34,932 steps/s; ceiling 37,025"]),
    ("clusters.md", "rank 0's resident memory peaked at 686 MB, a worker's at 93 MB (the median of the 7) and the "
     "whole job's at 1,337 MB", "startup/results.md", ["| after | 8 | 7.9 | 686 | 93 | 1,337 |"]),
    ("clusters.md", "| one host | 5,699 | 14 ms | 6.5 ms |", "multihost/results.md",
     ["| one host | 5,699 | 0.0140 | 0.0065 |"]),
    ("clusters.md", "| 2 + 2 hosts (namespaces) | 3,792 | 46 ms | 7.1 ms |", "multihost/results.md",
     ["| 2 + 2 hosts | 3,792 | 0.0459 | 0.0071 |"]),
    ("clusters.md", "all passing on 2026-11-24", "slurm/run.txt",
     ["== summary (2026-11-24", "PASS: all 5 Slurm checks that ran (skipped: 0)"]),
    ("clusters.md", "stopped after iteration 3 of 5, resumed there, every iteration once; 80 s in all",
     "slurm/preempt.txt", ["(80 s) job 55727542 preempted by job 55727543, ran 2 times, stopped after iterations [3] "
                           "and resumed there, COMPLETED 0:0, 5 rows (iterations 1..5)"]),
    ("clusters.md", "stopped after iteration 5 of 14, requeued, resumed there; 113 s in all", "slurm/requeue.txt",
     ["(113 s) job 55675364 ran 2 times, stopped after iterations [5] and resumed there, COMPLETED 0:0, 14 rows"]),
    ("sb3.md", "| plain script, 1 env | 557 | 1.00x | 880 |", "sb3_mpi/results.md",
     ["| plain SB3, 1 env | 557 | 1.00x | 879.5 |"]),
    ("sb3.md", "| SB3 `SubprocVecEnv`, 2 / 8 envs | 466 / 818 | 0.84x / 1.47x | 730 / 1,075 |", "sb3_mpi/results.md",
     ["| SB3 SubprocVecEnv, 2 envs | 466 | 0.84x | 729.9 |", "| SB3 SubprocVecEnv, 8 envs | 818 | 1.47x | 1075.3 |"]),
    ("sb3.md", "| `mpi_util.sb3`, 2 / 8 processes | 794 / 780 | 1.43x / 1.40x | 726 / 558 |", "sb3_mpi/results.md",
     ["| mpi_util.sb3, 2 processes | 794 | 1.43x | 725.9 |", "| mpi_util.sb3, 8 processes | 780 | 1.40x | 557.6 |"]),
    ("sb3.md", "plain ARS ran 14,477 steps/s, `parallelize` at 1 process 14,207 (0.99x, the same returns), and at 2 "
     "processes 25,189 (1.72x)", "ars_mpi/results.md",
     ["| plain ARS, 1 process | 14,477 | 1.00x |", "| mpi_util.sb3 ARS, 1 process | 14,207 | 0.99x |",
      "| mpi_util.sb3 ARS, 2 processes | 25,189 | 1.72x |"]),
    ("sb3.md", "mean score over the last 100 games was 4.3 after 163,840 steps", "sb3_atari/run.md",
     ["163840 steps, mean score of the last 100 games 4.3"]),
    ("sb3.md", "random play scores 1.6 over 100 games", "sb3_atari/run.md", ["scored 1.62 on average"]),
    ("training.md", "`benchmarks/results/peers_minatar_two_cnns/results.md`",
     "peers_minatar_two_cnns/results.md",
     ["train.py --nprocs 2: final mean return 13.09 over 3 run(s) (11.47, 12.83, 14.96)"]),
    ("training.md", "`benchmarks/results/peers_minatar_two_cnns_4/results.md`", "peers_minatar_two_cnns_4/results.md",
     ["train.py --nprocs 4: final mean return 10.91 over 3 run(s)"]),
    ("training.md", "scored 11.6 (9.7 to 13.3) at the generic settings", "minatar_generic_zen3/results.md",
     ["train.py --nprocs 2: final mean return 11.62 over 3 run(s) (11.94, 13.28, 9.65)",
      "500000 steps per run on MinAtar/Breakout-v1, seeds 0-2", ZEN3]),
    ("training.md", "and 4.9 (4.8 to 5.1) at the Atari ones", "minatar_atari_settings/results.md",
     ["--value_targets raw: final mean return 4.95 over 3 run(s) (4.88, 4.84, 5.13)", "| 16 | 4.9 (172) |",
      "500000 steps per run on MinAtar/Breakout-v1, seeds 0-2"]),
    ("training.md", "`benchmarks/results/peers_minatar_two_cnns_seeds3_5/results.md`",
     "peers_minatar_two_cnns_seeds3_5/results.md",
     ["train.py --nprocs 2: final mean return 11.22 over 3 run(s)", "train.py --nprocs 4: final mean return 10.03",
      "seeds 3-5"]),
    ("training.md", "one torso ended at 7.1 against 13.1 for two CNNs", "peers_minatar_two_cnns/results.md",
     ["train.py --nprocs 2: final mean return 13.09 over 3 run(s)"]),
    ("training.md", "a Pong iteration's rollout 0.75 s against 0.92 by im2col", "speed_pong_blocks/results.md",
     ["| im2col | 2 | 13.1 | 1,083 | 166 | 1,249 | 326 | 0.92 |",
      "| blocks | 2 | 10.6 | 1,086 | 165 | 1,251 | 364 | 0.75 |"]),
    ("training.md", "gave 1.85-2.05x the steps/s of the whole batch (the update 6.3 against 13.5 s an iteration",
     "speed_trpo_breakout/results.md",
     ["| whole_batch | 2 | 22.5 | 1,557 | 185 | 1,742 | 71 | 162.6 | 1.05 | 13.46 |",
      "| every_5th_row | 2 | 16.4 | 1,255 | 192 | 1,447 | 137 | 88.9 | 1.18 | 6.26 | 0.67, 0.80 | 0.83, 0.83 | 2.05, "
      "1.85 |",
      ZEN3]),
    ("training.md", "ran 538 steps/s against 376", "speed_pong_bfloat16/results.md",
     ["| float32 | 2 | 12.2 | 1,078 | 168 | 1,246 | 376 |", "| bfloat16 | 2 | 10.6 | 1,071 | 165 | 1,237 | 538 |"]),
    ("training.md", "took 0.55-0.77x the update time of float32", "precision_pong/results.md",
     ["| bfloat16 | 2 | 1 | bfloat16 | 1,161.9 | 0.55, 0.57, 0.77 |"]),
    ("training.md", "0.86x the steps/s with `--eval_every 5` and 0.60x with `--eval_every 1`", "eval_cost/results.md",
     ["| 2 | eval_every_5 | 6,074 | 0.1815 | 0.0101 | 0.1022 | 0.0015 | 0.86x | 0.78, 0.95 |",
      "| 2 | eval_every_1 | 4,235 | 0.1839 | 0.0082 | 0.1051 | 0.0015 | 0.60x | 0.61, 0.59 |"]),
    ("../README.md", "**4,341 ± 307** (3 seeds) | **3,190 ± 810** (5 seeds)", "learning_policy_lag/sync/results.md",
     ["| Hopper-v5 | PPO | 2 | 5 | 0 1 2 3 4 | 1,001,472 | 3,190 ± 810 |",
      "| Walker2d-v5 | PPO | 2 | 3 | 0 1 2 | 1,001,472 | 4,341 ± 307 |"]),
    ("../README.md", "| this project, PPO, eval, `--nprocs 2`, first runs (2026-11-22/23) | 4,567 ± 514 (10 seeds) | "
     "2,586 ± 961 (5 seeds) |", "learning/results.md",
     ["| Hopper-v5 | PPO | 2 | 5 | 0 1 2 3 4 | 1,001,472 | 2,586 ± 961 | 2,227 ± 732 |",
      "| Walker2d-v5 | PPO | 2 | 10 | 0 1 2 3 4 5 6 7 8 9 | 1,001,472 | 4,567 ± 514 | 3,778 ± 832 |"]),
    ("../README.md", "| 1,001,472 | 143 s | 7,003 | 3,475 (the 26 episodes", "walker2d_8procs/command.txt",
     ["143 s of training (1,001,472 steps, 7,003 steps/s)", "mean return 3,475 over the 26 episodes"]),
    ("../README.md", "gave 5,682 steps/s at `--nprocs 8`, not the 12,839", "scaling_2026-11-26/results.md",
     ["| 8 | 5,682 | nan |"]),
    ("../README.md", "| 1 | 7,433 | 546 | | 2 | 13,034 | 1,040 | | 8 | 12,839 | 2,484 (at 9, its peak) |",
     "scaling_2026-11-25/results.md", ["| 1 | 7,433 | 313.1 | 546 |", "| 2 | 13,034 | 337.0 | 1,040 |",
                                       "| 8 | 12,839 | 375.0 | nan |"]),
    ("../README.md", "ran 6.1-8.5x the steps/s", "peers/results.md",
     ["| 1 | train.py --nprocs 2 | 12,307 |", "| 1 | stable-baselines3 PPO, 1 env, torch 1 thread(s) | 2,018 |",
      "| 2 | train.py --nprocs 2 | 12,477 |", "| 2 | RLlib PPO, 2 env runners | 1,467 |"]),
    ("training.md", "it gave 1.07x at `--nprocs 2`, and nothing at 4 or 8", "variants_policy_lag/results.md",
     ["| 2 | lag | 14,292 | 0.0659 | 0.0014 | 0.0759 | 0.0010 | 1.07x |", "| 4 | lag | 13,135 |", "0.97x |",
      "| 8 | lag | 11,796 |", "0.99x |"]),
    ("training.md", "on Pong at `--nprocs 2` on 2 cores it cost 0.76x", "variants_policy_lag_pong_zen3/results.md",
     ["| 2 | sync | 291 | 0.9036 | 0.0322 | 2.5957 | 0.0052 | 1.00x |",
      "| 2 | lag | 221 | 0.0004 | 0.4793 | 4.1445 | 0.0049 | 0.76x | 0.81, 0.72 |"]),
    ("../README.md", "`--policy_lag 1` lets the other processes roll out the next batch while rank 0 updates: "
     "1.07x the default's steps/s at `--nprocs 2`", "variants_policy_lag/results.md",
     ["| 2 | lag | 14,292 |", "| 1.07x |"]),
    ("training.md", "(1.07x at 8 processes on 2 cores", "variants_split/results.md",
     ["| 8 | shared | 4,968 | 0.2206 | 0.0197 | 0.1428 | 0.0054 | 1.07x |"]),
    ("training.md", "at a mean return of 1,139 under OpenBLAS's Haswell kernels, 733 under its SkylakeX kernels",
     "machine_dependence/results.md", ["| this machine | `(none)` | yes | | 1139.3 |",
                                       "| OpenBLAS SkylakeX | `OPENBLAS_CORETYPE=SkylakeX` | no | 1 | 733.4 |",
                                       "| OpenBLAS Sandybridge | `OPENBLAS_CORETYPE=Sandybridge` | no | 1 | 995.2 |",
                                       "| oneDNN on | `TF_ENABLE_ONEDNN_OPTS=1` | no | 1 | 1227.8 |"]),
    ("training.md", "SSE4.1 gave 594.3", "machine_dependence_zen3_isa/results.md",
     ["| this machine | `(none)` | yes | | 568.0 |",
      "| oneDNN ISA AVX2 | `ONEDNN_MAX_CPU_ISA=AVX2` | yes | | 568.0 |",
      "| oneDNN ISA SSE41 | `ONEDNN_MAX_CPU_ISA=SSE41` | no | 1 | 594.3 |"]),
    ("../README.md", "iteration's mean return was 568.0 on a Zen 3", "machine_dependence_zen3/results.md",
     ["| this machine | `(none)` | yes | | 568.0 |", "| again | `(none)` | yes | | 568.0 |",
      "| oneDNN on | `TF_ENABLE_ONEDNN_OPTS=1` | no | 1 | 719.5 |"]),
    ("training.md", "Atari runs at 325-375 steps/s", "scaling_pong/results.md",
     ["| 1 | 325 | 546 |", "| 2 | 375 | 1,040 |", "| 8 | 353 | nan |", "--repeats 2", "a git archive of 45875a3",
      ZEN4]),
    ("training.md", "The current code runs 3.67-4.08x (median 4.04x) the steps/s",
     "speed_pong_b7a3e89_bcbb90c/results.md",
     ["| main_b7a3e89 | 2 | 22.5 | 1,300 | 180 | 1,480 | 92 |",
      "| now_bcbb90c | 2 | 10.0 | 870 | 172 | 1,041 | 370 | 67.1 | 0.88 | 1.86 |", "| 4.04, 3.67, 4.08 |"]),
    ("training.md", "rank 0's update is 53-65% of an iteration", "scaling_pong/results.md",
     ["| 53% |", "| 65% |", "| 59% |"]),
    *[(page, figure, f"learning_breakout_passes_seed{seed}/results.md",
       [f"| 1 | {seed} | train.py --nprocs 2 |", f"| {score} |",
        f"501760 steps per run on ALE/Breakout-v5, seed {seed}"])
      for page, figure in (("../README.md", BREAKOUT_ROW),)
      for seed, score in ((0, "4.1 (37)"), (10, "7.8 (27)"))],
    *[("../README.md", BREAKOUT_ROW, f"learning_breakout_seed{seed}/results.md",
       [f"| 1 | {seed} | train.py --nprocs 2 |", f"| 1 | {seed} | CleanRL-style PPO",
        f"501760 steps per run on ALE/Breakout-v5, seed {seed}", f"a git archive of {archive}"])
      for seed, archive in ((11, "35ef5c3"), (12, "35ef5c3"), (13, "dcf358e"), (14, "6b19f8a"), (15, "6b19f8a"))],
    *[(page, figure, f"learning_breakout_seed{seed}/results.md",
       [f"| 1 | {seed} | train.py --nprocs 2 | {ours[0]} |", f"| {ours[1]} |", f"| {peer[1]} |", "beside it: nothing",
        f"| 1 | {seed} | CleanRL-style PPO, 8 envs, torch 2 thread(s) | {peer[0]} |"])
      for page, figure in (("../README.md", "Seeds 14 and 15 in 1,567 and 1,387 s, each alone |"),
                           ("../README.md", "Seeds 14 and 15 in 2,031 and 2,002 s, each alone |"),
                           ("training.md", "train.py in 1,567 and 1,387 s, the CleanRL-style PPO in 2,031 and 2,002 s"))
      for seed, ours, peer in ((14, (322, 1567), (248, 2031)), (15, (365, 1387), (252, 2002)))],
    ("training.md", "1.17-1.49x (median 1.36x) the CleanRL-style PPO's steps/s (torch, one torso) and 1.32-1.75x "
     "(median 1.71x) stable-baselines3's", "peers_pong/results.md",
     ["torch 2 thread(s), steps/s after the warm-up: median **1.36x** over 3 repeat(s) (1.17x, 1.36x, 1.49x)",
      "torch 2 thread(s), steps/s after the warm-up: median **1.71x** over 3 repeat(s) (1.32x, 1.71x, 1.75x)",
      "a git archive of 45875a3", ZEN4]),
    ("training.md", "on a Zen 3 (AVX2, no AVX-512), 1.35-1.45x (median\n  1.38x) and 1.53-1.61x (median 1.60x)",
     "peers_pong_zen3/results.md",
     ["torch 2 thread(s), steps/s after the warm-up: median **1.38x** over 3 repeat(s) (1.38x, 1.35x, 1.45x)",
      "torch 2 thread(s), steps/s after the warm-up: median **1.60x** over 3 repeat(s) (1.61x, 1.53x, 1.60x)", ZEN3]),
    ("../README.md", "| 367, 425, 420 (the peer's arithmetic", "peers_pong/results.md",
     [*steps_by_repeat(((367, 425, 420), (314, 312, 281), (279, 248, 240))), ZEN4]),
    ("../README.md", "CleanRL-style PPO 314, 312, 281 (1.17-1.49x, median 1.36x); stable-baselines3 PPO 279, 248, 240 "
     "(1.32-1.75x, median 1.71x) |", "peers_pong/results.md", [ZEN4]),
    ("../README.md", "| 427, 422, 437 | CleanRL-style PPO 309, 313, 302 (1.35-1.45x, median 1.38x); "
     "stable-baselines3 PPO 264, 276, 273 (1.53-1.61x, median 1.60x) |", "peers_pong_zen3/results.md",
     [*steps_by_repeat(((427, 422, 437), (309, 313, 302), (264, 276, 273))), ZEN3]),
    ("training.md", "3.90-4.32x (median 4.01x)\n  on a Zen 3", "speed_pong_zen3/results.md",
     ["| main_b7a3e89 | 2 | 18.3 | 1,339 | 188 | 1,527 | 99 |", "| 3.90, 4.01, 4.32 |", ZEN3]),
    ("training.md", "before the update's last two speed-ups, 1.71-1.80x and 2.02-2.04x",
     "peers_pong_bfloat16/results.md",
     ["torch 2 thread(s), steps/s after the warm-up: median **1.76x** over 2 repeat(s) (1.80x, 1.71x)",
      "steps/s after the warm-up: median **2.03x** over 2 repeat(s) (2.04x, 2.02x)"]),
    ("training.md", "matches the peer's to 1.5e-5 of its largest entry", "update_match/results.md",
     ["## train.py at the Atari defaults", "| network.0.0.bias | (32,) | 0.005595 | 0.005595 | 1.47e-05 | 1.000000 |",
      "| actor.weight | (512, 4) | 0.4516 | 0.4516 | 7.20e-06 | 1.000000 |"]),
    ("training.md", "against -19.9 for the CleanRL-style PPO in 1,336 s", "learning_pong/results.md",
     ["CleanRL-style PPO, 8 envs, torch 2 thread(s): final mean return -19.92 over 1 run(s)", "| -19.9 (13) | 1336 |",
      "501760 steps per run on ALE/Pong-v5, seed 0"]),
    *[("training.md", "against 9.9 for stable-baselines3 PPO with the same network over the same seeds",
       f"{name}/results.md",
       [f"stable-baselines3 PPO, 1 env, torch 1 thread(s): final mean return {score} over 3 run(s)"])
      for name, score in (("peers_minatar", "10.43"), ("peers_minatar_seeds3_5", "9.38"))],
    *[("training.md", "scored 9.3, 9.3 and 3.2 for seeds 0-2, seed 2 never leaving random play",
       f"learning_breakout_bfloat16_peer_loss_seed{seed}/results.md",
       [f"train.py --nprocs 2 --precision bfloat16: final mean return {score} over 1 run(s)", "main at 1641fc0",
        f"501760 steps per run on ALE/Breakout-v5, seed {seed}", ZEN4])
      for seed, score in ((0, "9.29"), (1, "9.26"), (2, "3.20"))],
    ("training.md", "and 7.0, 8.8, 10.1, 6.9, 9.0 and 6.6 for seeds 3-8",
     "learning_breakout_bfloat16_seeds3_8/results.md",
     ["train.py --nprocs 2 --precision bfloat16: final mean return 8.08 over 6 run(s) (6.97, 8.83, 10.14, 6.93, 9.04, "
      "6.59)", "main at 7aaea47", "501760 steps per run on ALE/Breakout-v5, seeds 3-8", ZEN4]),
    ("training.md", "-19.9 over 10 games in 1,154 s", "learning_pong_peer_loss_seed0/results.md",
     ["train.py --nprocs 2: final mean return -19.90 over 1 run(s)", "| -19.9 (10) | 1154 |", "main at 1641fc0",
      "501760 steps per run on ALE/Pong-v5, seed 0", ZEN4]),
    ("training.md", "-17.4 over the last 10 iterations' 5 games, 3,112 s on the Zen 3",
     "learning_pong_4m_frames/results.md",
     ["train.py --nprocs 2: final mean return -17.40 over 1 run(s)", "| -17.4 (5) | 3112 |",
      "1003520 steps per run on ALE/Pong-v5, seed 0", ZEN3]),
    ("training.md", "for the MLP a second thread took 1.21-1.52x the time", "kernels_walker2d_zen3/results.md",
     ["| 2 thread(s), oneDNN 0 | 2 | 0 | float32 | 244.0 | 1.30, 1.49, 1.21 |",
      "| 2 thread(s), oneDNN 1 | 2 | 1 | float32 | 248.6 | 1.47, 1.52, 1.27 |", ZEN3]),
    ("training.md", "for MinAtar's CNN oneDNN 0.69-0.89x", "kernels_minatar_zen3/results.md",
     ["| 1 thread(s), oneDNN 1 | 1 | 1 | float32 | 797.0 | 0.79, 0.89, 0.69 |", ZEN3]),
    ("training.md", "for the Nature CNN two threads with oneDNN 0.48-0.68x", "kernels_pong_zen3/results.md",
     ["| 2 thread(s), oneDNN 1 | 2 | 1 | float32 | 2,730.8 | 0.50, 0.48, 0.68 |", ZEN3]),
    ("../README.md", "from 135 to 254 over 25-iteration windows", "learning_spaceinvaders/results.md",
     ["| 1,024-25,600 | 135.10 (49) | 158.75 (48) |", "| 461,824-486,400 | 253.90 (41) | 238.78 (45) |",
      "| 372 | 372 | 1.00x | 0.850 | 1.889 | 0.013 | 16 | 370.0 (13) | 1359 |", "| 270.3 (16) | 1812 |",
      "501760 steps per run on ALE/SpaceInvaders-v5, seed 0", ZEN4]),
    ("../README.md", "Seaquest from 136 to 718", "learning_seaquest/results.md",
     ["| 1,024-25,600 | 135.88 (34) | 151.25 (32) |", "| 461,824-486,400 | 718.33 (12) | 681.54 (13) |",
      "| 467 | 467 | 1.00x | 0.610 | 1.570 | 0.010 | 16 | 753.3 (6) | 1081 |", "| 753.3 (3) | 1361 |",
      "501760 steps per run on ALE/Seaquest-v5, seed 0", ZEN4]),
    ("training.md", "-17.8 over 6 games in 4,610 s", "learning_pong_4m_frames_cleanrl/results.md",
     ["CleanRL-style PPO, 8 envs, torch 2 thread(s): final mean return -17.83 over 1 run(s)", "| -17.8 (6) | 4610 |",
      "1003520 steps per run on ALE/Pong-v5, seed 0", ZEN3]),
]
# Cited for something other than a figure: a picture.
CITED_WITHOUT_FIGURES = {"benchmarks/results/walker2d_play/walker2d_ppo_s5.png"}


def one_line(text: str) -> str:
    return " ".join(text.split())


def runs_rows(name: str) -> list[dict[str, str]]:
    """The rows of benchmarks/results/NAME/runs.csv, one per run."""
    with open(RESULTS / name / "runs.csv", newline="") as f:
        return list(csv.DictReader(f))


def mean_and_range(scores: dict[int, float], bold: str = "") -> str:
    """The README's summary of {seed: score}: "**9.0** (6.6 to 10.7)" with bold "**"."""
    values = scores.values()
    return f"{bold}{statistics.mean(values):.1f}{bold} ({min(values):.1f} to {max(values):.1f})"


def in_words(scores: dict[int, float]) -> str:
    """Scores by seed as a page lists them: "4.1, 11.3 and 12.2", in the order of the seeds."""
    listed = [f"{scores[seed]:.1f}" for seed in sorted(scores)]
    return f"{', '.join(listed[:-1])} and {listed[-1]}"


def paired_in_words(ours: dict[int, float], other: dict[int, float], name: str) -> str:
    """The mean of ours - other, seed by seed over ours' seeds, and its standard error, as the pages word it: "0.8
    below the CleanRL-style PPO on average (standard error 0.7)"."""
    differences = [ours[seed] - other[seed] for seed in ours]
    paired = statistics.mean(differences)
    return (f"{abs(paired):.1f} {'above' if paired >= 0 else 'below'} {name} on average (standard error "
            f"{statistics.stdev(differences) / len(differences) ** 0.5:.1f})")


def seed_scores(names: list[str], system: str) -> dict[int, float]:
    """{seed: final mean return} of the runs in those results directories whose system starts with ``system``."""
    return {int(row["seed"]): float(row["mean_return"])
            for name in names for row in runs_rows(name) if row["system"].startswith(system)}


def eval_mean_and_std(runs_csv: Path, env: str, algo: str, nprocs: int, seeds: range) -> str:
    """The mean ± standard deviation (n - 1) over ``seeds`` of the final policy's eval return, as the docs write
    it: "4,172 ± 593"."""
    with open(runs_csv) as f:
        returns = [float(row["eval_return_mean"]) for row in csv.DictReader(f) if row["env"] == env
                   and row["algo"] == algo and int(row["nprocs"]) == nprocs and int(row["seed"]) in seeds]
    assert len(returns) == len(seeds), runs_csv
    return f"{statistics.mean(returns):,.0f} ± {statistics.stdev(returns):,.0f}"


def test_the_batch_script_in_the_clusters_guide_is_the_example_s_own():
    (block,) = re.findall(r"^```bash\n(#!/bin/bash\n.*?)^```", (REPO / "docs" / "clusters.md").read_text(),
                          flags=re.S | re.M)
    script = {line.strip() for line in (EXAMPLES / "slurm_train.sbatch").read_text().splitlines()}
    assert [line for line in block.splitlines() if line.strip() not in script] == []
    assert len([line for line in block.splitlines() if line.strip()]) > 30  # the whole script, not an outline


def test_figures_in_the_guides_are_those_of_the_results_files_they_cite():
    for page, figure, results_file, source_lines in FIGURES:
        assert one_line(figure) in one_line((REPO / "docs" / page).read_text()), (page, figure)
        assert f"benchmarks/results/{results_file}" in one_line((REPO / "docs" / page).read_text()), page
        results = one_line((RESULTS / results_file).read_text())
        for line in source_lines:
            assert one_line(line) in results, (page, figure, results_file, line)
    # docs/training.md's --envs_per_rank figures, computed from the runs they cite (seeds 0-4, 2 processes).
    envs4 = eval_mean_and_std(RESULTS / "learning_probes/ppo_envs4/runs.csv", "Walker2d-v5", "ppo", 2, range(5))
    envs1 = eval_mean_and_std(RESULTS / "learning/runs.csv", "Walker2d-v5", "ppo", 2, range(5))
    training = one_line((REPO / "docs" / "training.md").read_text())
    assert f"eval {envs4} against {envs1} with 1" in training, (envs4, envs1)
    # Its MinAtar figures: stable-baselines3's mean over seeds 0-5, from the two runs the page cites for the peer,
    minatar_peer = seed_scores(["peers_minatar", "peers_minatar_seeds3_5"], "stable-baselines3")
    assert sorted(minatar_peer) == list(range(6)), minatar_peer
    # and the current code's, two CNNs: seeds 0-2 in one run per process count, seeds 3-5 in one run of both.
    current = {}
    for name in ("peers_minatar_two_cnns", "peers_minatar_two_cnns_4", "peers_minatar_two_cnns_seeds3_5"):
        for row in runs_rows(name):
            current.setdefault(row["system"], {})[int(row["seed"])] = float(row["mean_return"])
    assert [sorted(seeds) for seeds in current.values()] == [list(range(6))] * 2, current
    now = {system: f"{sum(seeds.values()) / 6:.1f}" for system, seeds in current.items()}
    assert (f"was {now['train.py --nprocs 2']} at `--nprocs 2` and {now['train.py --nprocs 4']} at `--nprocs 4` "
            f"(means of seeds 0-5 on the current code), against {statistics.mean(minatar_peer.values()):.1f} for "
            "stable-baselines3 PPO with the same network over the same seeds") in training, now
    # Its Atari Breakout scores at the Atari defaults (the reference implementations' loss), seed by seed, and the
    # CleanRL-style peer's on the same seeds: 0-6 beside the loss before, the later ones beside the reference loss.
    reference_runs = [path.name for path in RESULTS.glob("learning_breakout_peer_loss_seed*")]
    reference = seed_scores(reference_runs, "train.py")
    peer_runs = ["learning_breakout", "learning_breakout_seed1_cleanrl",
                 *[path.name for path in RESULTS.glob("learning_breakout_seed[2-9]")], *reference_runs]
    peer = seed_scores(peer_runs, "CleanRL")
    assert sorted(reference) == list(range(len(reference))) and sorted(peer) == sorted(reference), (reference, peer)
    assert (f"{in_words(reference)} for seeds 0-{len(reference) - 1} (mean {statistics.mean(reference.values()):.1f}),"
            f" against the CleanRL-style PPO's {in_words(peer)} (mean {statistics.mean(peer.values()):.1f}) on the same"
            " seeds") in training, (reference, peer)
    # and the Atari loss before it (raw value targets; seeds 0-4 alone, 5 and 6 beside the peer), which the settings
    # by family compare it with.
    before_loss = seed_scores([path.name for path in RESULTS.glob("learning_breakout_raw_targets_seed*")]
                              + ["learning_breakout_seed5", "learning_breakout_seed6"], "train.py")
    assert sorted(before_loss) == list(range(7)), before_loss
    assert (f"the loss before scored {statistics.mean(before_loss.values()):.1f} over seeds 0-6 "
            f"({min(before_loss.values()):.1f}-{max(before_loss.values()):.1f})") in training, before_loss
    # Since PPO's update runs no pass of the batch besides its minibatch steps: the seeds run so far, against the
    # update before and the peer on the same seeds, in docs/training.md and benchmarks/README.
    passes = seed_scores([path.name for path in RESULTS.glob("learning_breakout_passes_seed*")], "train.py")
    last = len(passes) - 1
    assert sorted(passes) == list(range(last + 1)), passes
    before, peer_same = ({seed: scores[seed] for seed in passes} for scores in (reference, peer))
    means = [f"{statistics.mean(scores.values()):.1f}" for scores in (passes, before, peer_same)]
    assert (f"{in_words(passes)} for seeds 0-{last} (mean {means[0]}), against {means[1]} for the update before and "
            f"{means[2]} for the CleanRL-style PPO on the same seeds") in one_line(training), means
    for other, name in ((before, "the update before"), (peer_same, "the CleanRL-style PPO")):
        words = paired_in_words(passes, other, name)
        assert words in one_line(training), words
    table = [f"| {' | '.join(f'{scores[seed]:.1f}' for seed in sorted(passes))} | {bold}{mean}{bold} |"
             for scores, mean, bold in zip((passes, before, peer_same), means, ("**", "", ""), strict=True)]
    benchmarks_readme = (REPO / "benchmarks" / "README.md").read_text()
    assert all(row in benchmarks_readme for row in table), table
    # Seeds from 11 on, of both at the current code, and the paired comparison over all seeds they join.
    later_runs = [path.name for path in RESULTS.glob("learning_breakout_seed[1-9][0-9]")]
    later, later_peer = (seed_scores(later_runs, system) for system in ("train.py", "CleanRL"))
    last_seed = max(later)
    assert sorted(later) == sorted(later_peer) == list(range(11, last_seed + 1)), (later, later_peer)
    ours_all, peer_all = {**passes, **later}, {**peer_same, **later_peer}
    ours_mean, peer_mean = (f"{statistics.mean(scores.values()):.1f}" for scores in (ours_all, peer_all))
    words = (f"{in_words(later)} for seeds 11-{last_seed}, against the CleanRL-style PPO's {in_words(later_peer)}; "
             f"over seeds 0-{last_seed} the current code scores {ours_mean} against the peer's {peer_mean}, "
             f"{paired_in_words(ours_all, peer_all, 'it')}")
    assert all(words in one_line(page) for page in (training, benchmarks_readme)), words
    # The README's row: the current code's mean and range over all those seeds, the peer's, and the paired difference.
    readme = (REPO / "README.md").read_text()
    row = (f"{BREAKOUT_ROW}{last_seed} | mean {mean_and_range(ours_all, '**')}; paired by seed, "
           f"{paired_in_words(ours_all, peer_all, 'the peer')}, a paired t")
    assert row in readme and f"| CleanRL-style PPO, mean {mean_and_range(peer_all)}. " in readme, row
    # Space Invaders and Seaquest: the 25-iteration windows in which train.py's game score was above the peer's.
    for game, name in (("Space Invaders", "learning_spaceinvaders"), ("Seaquest", "learning_seaquest")):
        windows = re.findall(r"^\| [\d,]+-[\d,]+ \| ([\d.]+) \(\d+\) \| ([\d.]+) \(\d+\) \|$",
                             (RESULTS / name / "results.md").read_text(), flags=re.M)
        ahead = sum(float(ours_score) > float(peer_score) for ours_score, peer_score in windows)
        assert re.search(f"{game} from [\\d,]+ to [\\d,]+[^;]*, ahead of the peer in {ahead} of {len(windows)};",
                         readme), (game, ahead, len(windows))
    # --precision bfloat16 over seeds 0-8 against float32's on the same seeds.
    bfloat16 = seed_scores([path.name for path in RESULTS.glob("learning_breakout_bfloat16_peer_loss_seed*")]
                           + ["learning_breakout_bfloat16_seeds3_8"], "train.py")
    assert sorted(bfloat16) == list(range(9)), bfloat16
    float32 = sum(reference[seed] for seed in bfloat16) / 9
    assert f"a mean of {sum(bfloat16.values()) / 9:.1f} over seeds 0-8 against float32's {float32:.1f}" in training


def test_every_results_file_the_readme_and_guides_cite_exists_and_each_guide_citation_is_checked():
    checked = {f"benchmarks/results/{results_file}" for _, _, results_file, _ in FIGURES}
    checked |= {"benchmarks/results/learning_probes/ppo_envs4/runs.csv", "benchmarks/results/learning/runs.csv"}
    for page in [REPO / "README.md", *DOCS]:
        for cited in CITED.findall(page.read_text()):
            assert (REPO / cited).exists(), f"{page.name} cites {cited}, which is not there"
            if page.parent.name == "docs":
                assert cited in checked | CITED_WITHOUT_FIGURES, f"{page.name} cites {cited}: check its figures here"


def test_every_results_directory_is_cited_by_a_page_a_user_reads():
    # A results directory no page names is a figure nobody can find, or one no page stands behind any more.
    pages = "\n".join(page.read_text() for page in [REPO / "README.md", REPO / "benchmarks" / "README.md", *DOCS])
    uncited = [path.name for path in sorted(RESULTS.iterdir())
               if not re.search(rf"results/{re.escape(path.name)}/", pages)]
    assert not uncited, f"benchmarks/results directories no page cites (cite them or delete them): {uncited}"


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


def test_examples_that_use_mpi_util_import_mpi_util_sb3_before_stable_baselines3():
    # docs/sb3.md asks for this order: mpi_util.sb3 keeps tensorboard from loading TensorFlow into the process.
    checked = []
    for example in sorted(EXAMPLES.glob("*.py")):
        lines = example.read_text().splitlines()
        sb3 = [i for i, line in enumerate(lines) if re.match(r"(from|import) (stable_baselines3|sb3_contrib)\b", line)]
        if not sb3 or not any(re.match(r"(from|import) mpi_util\b", line) for line in lines):
            continue  # a plain script, the twin without mpi_util
        ours = [i for i, line in enumerate(lines) if re.match(r"(from mpi_util\.sb3|import mpi_util\.sb3)\b", line)]
        assert ours and ours[0] < sb3[0], f"{example.name} imports stable_baselines3 before mpi_util.sb3"
        checked.append(example.name)
    assert {"sb3_evaluate.py", "sb3_ppo_mpi.py", "sb3_subproc_mpi.py"} <= set(checked)
