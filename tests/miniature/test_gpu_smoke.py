"""scripts/gpu_smoke.sh on a machine without CUDA runs as far as it can: the tiny model and prompts are built, both
commands (off and spec) pass OpenRLHF's own parser and validation, and it stops before training, saying so."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.openrlhf
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_smoke_test_runs_on_cpu_up_to_training(tmp_path):
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        ["bash", "scripts/gpu_smoke.sh", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": path},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (
        result.stdout.strip().splitlines()[-1] == f"RESULT gpu=none stopped=before_training dry_runs=ok out={tmp_path}"
    )
    assert (tmp_path / "model" / "config.json").is_file()
    prompts = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 8 and all(p["prompt"].endswith("=?\n") and p["answer"].isdigit() for p in prompts)
    for policy, rule in (("off", "off()"), ("spec", "spec(lenience=1.6487212707001282)")):
        log = (tmp_path / policy / "dry_run.log").read_text()
        plan = json.loads(log[log.index("{") :])
        assert plan["policy"] == rule
        assert (
            plan["openrlhf_args"]["actor"]["num_gpus_per_node"] == 1
            and plan["openrlhf_args"]["train"]["num_episodes"] == 2
        )
