"""The quickstart: bad flags fail at once; the whole loop (warm start, Ray, OpenRLHF's rollout actors, GRPO, weight
sync, reward, report) runs end to end in two tiny epochs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf import report
from specrl_openrlhf.integration.miniature import quickstart
from specrl_openrlhf.replay import replay, tally
from specrl_openrlhf.trace import read_traces

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--policy", "specc"], "Did you mean 'spec'"),
        (["--lenience", "-1"], "--lenience: lenience must be > 0, got -1.0"),
        (["--lenience", "nan"], "must be > 0"),
        (["--policy", "off"], "--policy off is the baseline"),
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--samples", "1"], "--samples must be >= 2"),
        (["--grid", "lenience", "--only"], "exclude each other"),
    ],
)
def test_bad_flags_fail_at_once(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        quickstart.parse_args([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_unwritable_output_folder_fails_at_once(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit):
        quickstart.parse_args(["--out", str(blocker / "out")])
    assert f"--out {blocker / 'out'}: not a writable folder" in capsys.readouterr().err


@pytest.mark.ray
def test_two_tiny_epochs_end_to_end(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "VLLM_LOGGING_LEVEL": "ERROR"}
    flags = ["--epochs", "2", "--train-size", "8", "--held-out-size", "8", "--rollout-batch", "4", "--samples", "2"]
    process = subprocess.run(
        [sys.executable, "-m", "specrl_openrlhf.integration.miniature.quickstart", *flags, "--warm-start-steps", "4"]
        + ["--out", str(out), "--trace-dir", str(tmp_path / "traces"), "--tensorboard", str(tmp_path / "tb")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert process.returncode == 0, process.stderr[-4000:]
    last = process.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ") and f"out={out}" in last
    result = dict(item.split("=", 1) for item in last.split()[1:])
    assert float(result["token_ratio"]) > 1.0  # the spec run reused drafts in its second epoch

    metrics = json.loads((out / "metrics.json").read_text())
    assert [r["name"] for r in metrics["runs"]] == ["off", "spec"]
    steps = {
        name: [r for r in metrics["rows"] if r["kind"] == "step" and r["run"] == name] for name in ("off", "spec")
    }
    assert [len(rows) for rows in steps.values()] == [4, 4]  # 2 epochs x 2 steps of 4 prompts
    for rows in steps.values():
        assert all(r["samples"] == 8 and 0.0 <= r["reward"] <= 1.0 and r["response_tokens"] > 0 for r in rows)
    off, spec = steps["off"], steps["spec"]
    assert all(r["reused_tokens"] == 0 and r["decoded_tokens"] == r["response_tokens"] for r in off)
    assert all(r["drafts_found"] == 0 for r in spec if r["epoch"] == 0)
    assert all(r["drafts_found"] == 8 and r["reused_tokens"] > 0 for r in spec if r["epoch"] == 1)
    # Drafts scored under weights that differ from those that wrote them: the trainer's updates reached the engine.
    assert all(r["mean_log_ratio"] != 0.0 for r in spec if r["epoch"] == 1)
    epochs = [r for r in metrics["rows"] if r["kind"] == "epoch"]
    assert len(epochs) == 4 and all(0.0 <= r["held_out_accuracy"] <= 1.0 for r in epochs)
    for name in ("metrics.csv", "table.md", "table.csv"):
        assert (out / name).stat().st_size > 0
    for name in ("runs.png", "per_run/off.png", "per_run/spec.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Offline replay of the run's own rule on its traces reproduces the run's cuts and reuse.
    records = read_traces(tmp_path / "traces" / "spec")
    assert len(records) == sum(r["drafts_found"] for r in spec)
    cuts = replay(sr.make("spec"), records)
    assert np.array_equal(cuts, records.cut)
    assert tally("spec", records, cuts).reused_tokens == sum(r["reused_tokens"] for r in spec)
    rules = ["spec", "exact", "random", "full", f"{REPO / 'policies' / 'adaptive_lenience.py'}:AdaptiveLenience"]
    table = subprocess.run(
        [sys.executable, "-m", "specrl_openrlhf", "replay", str(tmp_path / "traces"), "--rollout_reuse", *rules],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line for line in table.splitlines() if line.startswith("| ")][2:]  # past the header and its rule
    assert len(rows) == 1 + len(rules) and rows[0].startswith("| recorded")
    assert [row.split(" | ")[0] for row in rows[1:5]] == ["| spec(lenience=1.6487212707001282)", "| exact()"] + [
        "| random()",
        "| full()",
    ]

    # The report reads the run twice over: our metrics.json, and the TensorBoard logs written with OpenRLHF's own
    # logger, through TensorBoard's reader; both give the same totals.
    from_json = {run.name: run for run in report.discover(out)}
    from_tensorboard = {run.name: run for run in report.discover(tmp_path / "tb")}
    assert sorted(from_json) == sorted(from_tensorboard) == ["off", "spec"]
    for name in ("off", "spec"):
        for key in ("decoded_tokens", "rollout_s"):
            assert from_tensorboard[name].total(key) == pytest.approx(from_json[name].total(key), rel=1e-5)
        assert from_tensorboard[name].final_accuracy() == pytest.approx(from_json[name].final_accuracy())
    assert from_tensorboard["spec"].policy == "spec" and from_tensorboard["spec"].lenience == pytest.approx(
        sr.DEFAULT_LENIENCE
    )
    printed = subprocess.run(
        [sys.executable, "-m", "specrl_openrlhf.report", str(tmp_path / "tb")], capture_output=True, text=True
    )
    assert printed.returncode == 0, printed.stderr
    assert "| Tokens (M) | Speedup | held_out |" in printed.stdout and "| spec | spec | 1.65 |" in printed.stdout
