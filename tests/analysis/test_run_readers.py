"""Reading runs (`analysis.run_readers`): a real CPU run's metrics (the quickstart's lenience grid in tests/data), and
OpenRLHF's logs as TensorBoard stores them. The TensorBoard reader is tested end to end on a fresh run in
tests/miniature/test_quickstart.py, the wandb reader in tests/docs/test_prototyping.py."""

import json

import pytest

from specrl_openrlhf.analysis import report_rows, run_readers
from specrl_openrlhf.analysis.run_series import step_row


def test_runs_not_trained_yet_are_left_out(grid_run):
    metrics = json.loads((grid_run / "metrics.json").read_text())
    planned = dict(metrics["runs"][0], name="planned-later")  # a grid's later group, written before it trains
    (grid_run / "metrics.json").write_text(json.dumps(dict(metrics, runs=metrics["runs"] + [planned])))
    names = [run.name for run in run_readers.load_cpu_metrics(grid_run / "metrics.json")]
    assert "planned-later" not in names and len(names) == len(metrics["runs"])


def test_step_rows_from_openrlhfs_logs():
    """OpenRLHF logs per-sample info as means over samples: totals are means x samples; per-draft values are means
    over the samples that had a draft (a sample without one logs 0)."""
    logs = {
        "rollout/num_samples": 8.0,
        "rollout/reward_mean": 0.25,
        "reuse/drafts_found": 0.5,
        "reuse/decoded_tokens": 10.0,
        "reuse/reused_tokens": 4.0,
        "reuse/draft_tokens": 8.0,
        "reuse/kl_prev_curr": 0.01,
        "reuse/excess_acceptance": 0.002,
        "reuse/time_scoring_s": 1.0,
        "reuse/time_generation_s": 3.0,
        "timing/generation": 2.0,
    }
    row = step_row(3, logs)
    assert row["decoded_tokens"] == 80 and row["reused_tokens"] == 32 and row["drafts_found"] == 4
    assert row["kl_prev_curr"] == pytest.approx(0.02) and row["excess_acceptance"] == pytest.approx(0.004)
    assert row["kept_share"] == 0.5 and row["scoring_s"] == pytest.approx(0.5) and row["reward"] == 0.25
    stock = step_row(3, {"rollout/num_samples": 8.0, "rollout/response_length_mean": 30.0})
    assert stock["decoded_tokens"] == 240 and "kl_prev_curr" not in stock


def test_per_draft_values_in_tensorboard_logs_are_means_over_drafts(tmp_path):
    """OpenRLHF averages per-sample info over all samples; a sample without a draft logs 0 for the per-draft values,
    so the reader divides them by the share of samples that had a draft."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step, hit_rate in ((1, 0.0), (2, 0.5), (3, 1.0)):
        writer.add_scalar("train/rollout/num_samples", 8.0, step)
        writer.add_scalar("train/reuse/drafts_found", hit_rate, step)
        writer.add_scalar("train/reuse/lenience", 1.65 * hit_rate, step)
        writer.add_scalar("train/reuse/mean_verified_prefix_len", 20.0 * hit_rate, step)
    writer.close()
    run = run_readers.load_tensorboard_run(tmp_path / "run")
    assert [row.get("lenience") for row in run.steps] == [None, pytest.approx(1.65), pytest.approx(1.65)]
    assert [row.get("mean_verified_prefix_len") for row in run.steps] == [None, 20.0, 20.0]
    assert run.lenience == pytest.approx(1.65) and report_rows.lenience_label(run) == "1.65"
