"""scripts/gpu_smoke.sh: without CUDA it runs as far as it can (the tiny model, the prompts, every rule's literal
command through OpenRLHF's own parser and validation), and with `--cpu` its CPU twin trains every kind of rule for two
steps and checks each the way the GPU run is checked: a rule that drafts must keep drafts, and none may fall back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.miniature import gpu_smoke
from specrl_openrlhf.miniature.gpu_smoke import RuleRun

pytestmark = pytest.mark.openrlhf
REPO = Path(__file__).resolve().parents[2]


def smoke(tmp_path, *extra) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "scripts/gpu_smoke.sh", "--out", str(tmp_path), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PATH": path},
    )


def test_a_rule_that_ran_as_stock_fails_the_smoke_test():
    fine = [RuleRun("off", 2, 500, 0, 0, 1.0), RuleRun("lossless", 2, 300, 200, 0, 1.0)]
    assert gpu_smoke.check(fine) == []
    silent = [RuleRun("suffix", 2, 500, 0, 0, 1.0)]
    assert gpu_smoke.check(silent) == [
        "suffix kept no draft token: it ran as stock (is its proposer or plugin installed?)"
    ]
    fell_back = gpu_smoke.check([RuleRun("spec", 1, 400, 100, 32, 1.0)])
    assert fell_back == ["spec ran 1 steps, not 2", "spec fell back to stock generation for 32 samples (see its log)"]


@pytest.mark.slow
def test_the_gpu_smoke_test_runs_on_cpu_up_to_training(tmp_path):
    result = smoke(tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert (
        result.stdout.strip().splitlines()[-1] == f"RESULT gpu=none stopped=before_training dry_runs=ok out={tmp_path}"
    )
    assert (tmp_path / "model" / "config.json").is_file()
    prompts = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 8 and all(p["prompt"].endswith("=?\n") and p["answer"].isdigit() for p in prompts)
    rules = {
        "off": "off()",
        "spec": "spec(lenience=1.6487212707001282)",
        "lossless": sr.make("lossless").describe(),  # its defaults: verified in the engine, on the goodput budget
        "suffix": sr.make("suffix").describe(),  # vLLM's suffix decoding
    }
    for policy, rule in rules.items():
        log = (tmp_path / policy / "dry_run.log").read_text()
        plan = json.loads(log[log.index("{") :])
        assert plan["policy"] == rule
        assert (
            plan["openrlhf_args"]["actor"]["num_gpus_per_node"] == 1
            and plan["openrlhf_args"]["train"]["num_episodes"] == 2
        )


@pytest.mark.ray
@pytest.mark.slow  # four runs on Ray; test_prototyping runs the quickstart path they share, test_cli each command
def test_the_cpu_twin_trains_every_kind_of_rule_and_each_keeps_drafts(tmp_path):
    result = smoke(tmp_path, "--cpu")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT gpu=cpu rules=off,spec,lossless,suffix ") and last.endswith(f"ok=1 out={tmp_path}")
    values = dict(word.split("=", 1) for word in last.split()[1:])
    assert all(values[f"steps[{rule}]"] == "2" for rule in gpu_smoke.RULES)
    assert float(values["kept[off]"]) == 0.0
    assert all(float(values[f"kept[{rule}]"]) > 0.0 for rule in ("spec", "lossless", "suffix"))
