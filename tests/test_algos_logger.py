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
    logger = RunLogger(tmp_path, total_steps=4096, progress_bar=progress_bar, resume=False, hparams={}, out=out)
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


def test_a_run_that_evaluates_shows_the_evaluation_s_score_after_the_training_episodes(tmp_path):
    out = io.StringIO()
    logger = RunLogger(tmp_path, total_steps=4096, progress_bar=False, resume=False, hparams={}, out=out,
                       evaluates=True)
    first, second = rows(4096, 2048)
    logger.log({**first, "eval_return_mean": math.nan})
    logger.log({**second, "ep_return_min": -30.0, "ep_return_max": -10.0, "eval_return_mean": 123.45})
    logger.close()
    header, no_evaluation, evaluated = (line.split() for line in out.getvalue().splitlines())
    assert header[3:7] == ["ret_mean", "ret_min", "ret_max", "eval"]
    assert no_evaluation[6] == "-" and evaluated[3:7] == ["-20.0", "-30.0", "-10.0", "123.5"]


def test_the_run_s_settings_are_in_tensorboard_s_hparams_dashboard(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import plugin_data_pb2

    logger = RunLogger(tmp_path, total_steps=4096, progress_bar=False, resume=False, out=io.StringIO(),
                       hparams={"algo": "ppo", "lr": 3e-4, "hidden": (64, 64), "check_sync": False, "kl_targ": None})
    logger.log(rows(4096, 2048)[0])
    logger.close()
    (events,) = (tmp_path / "tb").iterdir()
    found = {}
    for event in EventFileLoader(str(events)).Load():
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name == "hparams":
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                found[data.WhichOneof("data")] = data
    hparams = found["session_start_info"].session_start_info.hparams
    assert {name: str(value).strip() for name, value in hparams.items()} == {
        "algo": 'string_value: "ppo"', "lr": "number_value: 0.0003", "hidden": 'string_value: "64,64"',
        "check_sync": "bool_value: false", "kl_targ": 'string_value: "none"'}
    assert [m.name.tag for m in found["experiment"].experiment.metric_infos] == ["ep_return_mean", "eval_return_mean",
                                                                                 "steps_per_s"]
