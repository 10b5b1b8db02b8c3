"""RunLogger's console: iteration lines, and on a terminal a progress bar (tqdm) below them."""

import io
import math

from trainer.logger import RunLogger


def rows(total_steps: int, per_iteration: int) -> list[dict]:
    return [{"iteration": i, "total_steps": i * per_iteration, "total_episodes": 3 * i, "ep_return_mean": -10.0 * i,
             "steps_per_s": 1000.0, "kl": math.nan} for i in range(1, total_steps // per_iteration + 1)]


def console(tmp_path, progress_bar: bool) -> str:
    """What RunLogger prints for two iterations of 2048 steps out of 4096."""
    out = io.StringIO()
    logger = RunLogger(tmp_path, total_steps=4096, progress_bar=progress_bar, resume=False, out=out)
    for row in rows(4096, 2048):
        logger.log(row)
    logger.close()
    return out.getvalue()


def test_progress_bar_below_the_lines_on_a_terminal(tmp_path):
    text = console(tmp_path, progress_bar=True)
    lines = [line for chunk in text.split("\r") for line in chunk.split("\n")]
    assert any(line.lstrip().startswith("iter") for line in lines)
    assert any(line.split()[:2] == ["2", "4096"] for line in lines if line.strip())
    assert "100%" in text and "4.10k/4.10k" in text


def test_no_progress_bar_when_output_is_not_a_terminal(tmp_path):
    text = console(tmp_path, progress_bar=False)
    lines = text.splitlines()
    assert len(lines) == 3 and "%|" not in text and "\r" not in text
    assert lines[2].split()[:2] == ["2", "4096"]
