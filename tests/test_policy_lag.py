"""train.py --policy_lag 1: the ranks roll out the next batch while rank 0 learns from the last one. Real MPI, real
gymnasium envs, real TensorFlow, small budgets."""

from __future__ import annotations

import json
import shutil

from conftest import FEW_MINIBATCHES
from test_train import progress, reproducible_part, train


def test_lagged_run_is_reproducible_resumes_exactly_and_differs_from_the_plain_loop(tmp_path):
    # Even shares: every rank runs the same steps whatever the timing, so the lagged run is reproducible bit for bit.
    common = ["Pendulum-v1", "--nprocs", "2", "--batch_split", "even", "--checkpoint_every", "2",
              *FEW_MINIBATCHES]
    lagged, out = train(*common, "--total_steps", "8192", "--policy_lag", "1", "--check_sync",
                        "--logdir", str(tmp_path / "lagged"))
    plain, _ = train(*common, "--total_steps", "4096", "--logdir", str(tmp_path / "plain"))
    rows = progress(lagged)
    assert [int(r["total_steps"]) for r in rows] == [2048 * i for i in range(1, 5)]  # the budget, learned in full
    assert all(r["sync_ok"] == "1.0" for r in rows)
    # The first batch was sampled by the weights it is learned on (weights 1 up to float32 round-off); every later
    # one by the weights before the last update.
    weights = [float(r["lag_weight_max"]) for r in rows]
    assert abs(weights[0] - 1.0) < 1e-5 and all(w > 1.001 for w in weights[1:]), weights
    assert json.loads((lagged / "config.json").read_text())["policy_lag"] == 1
    # The same first batch (sampled before any update), then other weights collect the second: the plain loop's
    # after the first update, the lagged one's before it.
    plain_rows = progress(plain)
    assert rows[0]["ep_return_mean"] == plain_rows[0]["ep_return_mean"]
    assert rows[1]["ep_return_mean"] != plain_rows[1]["ep_return_mean"]
    assert "lag_weight_max" not in plain_rows[0]

    # Resume from the checkpoint of iteration 2 of a copy: it holds the batch gathered and not yet learned from.
    copy = tmp_path / "copy"
    shutil.copytree(lagged, copy)
    (copy / "checkpoints" / "ckpt_00000004.npz").unlink()
    resumed, out = train("--resume", str(copy))
    assert "from ckpt_00000002.npz: iteration 2, step 4096" in out
    assert reproducible_part(progress(resumed)) == reproducible_part(rows)


def test_lagged_run_with_a_shared_budget_and_one_process(tmp_path):
    # The default split under --policy_lag 1 is shared: the workers fill the batch while rank 0 updates. On one
    # process, the loop runs lagged alone. Both fill every batch and stop at the budget.
    shared, _ = train("Pendulum-v1", "--nprocs", "3", "--policy_lag", "1", "--total_steps", "6000",
                      "--batch_size", "2000", *FEW_MINIBATCHES, "--check_sync", "--logdir", str(tmp_path / "shared"))
    assert json.loads((shared / "config.json").read_text())["batch_split"] == "shared"
    rows = progress(shared)
    assert [int(r["total_steps"]) for r in rows] == [2000, 4000, 6000]
    assert all(r["sync_ok"] == "1.0" for r in rows)
    single, out = train("Pendulum-v1", "--algo", "trpo", "--policy_lag", "1", "--total_steps", "4000",
                        "--batch_size", "2000", *FEW_MINIBATCHES, "--check_sync", "--logdir", str(tmp_path / "single"))
    assert "TRPO on Pendulum-v1: 1 process, batch 2000 steps" in out, out
    assert [(int(r["total_steps"]), r["sync_ok"]) for r in progress(single)] == [(2000, "1.0"), (4000, "1.0")]
