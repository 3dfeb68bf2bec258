"""docs/prototyping.md runs as written: its ```bash blocks, in order, in one shell. Its first command is the
quickstart's default run (off, spec and lossless, with traces and TensorBoard logs), so this is also the quickstart's
end-to-end test: OpenRLHF's rollout path on Ray, the weight sync, the reward, the staleness meter, metrics, plots,
traces and their replay, and the report read from TensorBoard. Whole quickstart runs (about 4 minutes on 2 cores,
and the warm start's 2 on an empty cache), so all of it runs in the slow pass: the default pass checks each part
on its own (tests/miniature, tests/integration, tests/analysis). The last two blocks (training the tutorial's own
rule beside the baseline, a second quickstart run, and pricing it at RL scale) read nothing the others wrote: a test
each."""

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.analysis import run_readers, wandb_logs
from specrl_openrlhf.analysis.replay import replay_kept
from specrl_openrlhf.at_scale.engine_replay import engine_kept
from specrl_openrlhf.trace import read_traces
from tests.helpers import a_real_picture, result_fields

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "prototyping.md"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```$", text, re.M | re.S)


def run_blocks(blocks: list[str], out: Path) -> str:
    """`blocks` in one shell, as a user's runs them, with `OUT` set: their standard output."""
    # without the suite's in-process engines (conftest), which slow OpenRLHF's actors
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update(OUT=str(out), VLLM_LOGGING_LEVEL="ERROR")
    process = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(blocks)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    return process.stdout


def results(stdout: str) -> list[dict[str, str]]:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT")]
    return [dict(word.split("=", 1) for word in line.split()[1:]) for line in lines]


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    out = tmp_path_factory.mktemp("tutorial")
    blocks = bash_blocks(DOC.read_text())
    assert len(blocks) == 4  # record, replay, train, price
    return out, run_blocks(blocks[:2], out)


@pytest.mark.ray
@pytest.mark.slow  # a whole quickstart run (the module docstring)
def test_the_tutorial_runs_as_written(tutorial):
    out, stdout = tutorial
    (recorded,) = results(stdout)
    assert recorded["policy"] == "spec@1.65" and recorded["seeds"] == "1"
    assert float(recorded["token_ratio"]) > 1.0  # drafts reused in epoch 2
    assert float(recorded["token_ratio[lossless]"]) > 1.0  # the default trains lossless beside spec
    lines = stdout.splitlines()
    table = lines.index(next(line for line in lines if line.startswith("| rule | reuse ratio")))
    rows = list(itertools.takewhile(lambda line: line.startswith("| "), lines[table + 2 :]))
    replayed = {row.split(" | ")[0].removeprefix("| "): row.split(" | ")[1:] for row in rows}
    assert len(replayed) == 8  # the recorded cuts and the seven rules of the command
    recorded = replayed.pop("recorded (the run's own cuts)")
    assert replayed.pop("spec(lenience=1.65)")[:4] == recorded[:4]  # replaying the run's own rule reproduces it
    exact = replayed["exact()"]
    own = next(row for name, row in replayed.items() if name.startswith("lossless(draft='own'"))
    tree = next(row for name, row in replayed.items() if name.startswith("lossless(draft='tree'"))
    assert float(own[0]) <= float(exact[0])  # same uniforms, and p_curr <= min(1, p_curr / p_prev) per token
    assert float(exact[0]) <= float(recorded[0])  # ℓ = 1 keeps no more than ℓ = 1.65
    assert int(tree[3]) > int(own[3])  # the tree keeps at least each sample's own draft's tokens, and more


@pytest.mark.ray
@pytest.mark.slow  # a second quickstart run; it reads nothing the other blocks wrote
def test_the_tutorials_rule_trains_beside_the_baseline(tmp_path):
    (trained,) = results(run_blocks(bash_blocks(DOC.read_text())[2:3], tmp_path))
    assert trained["policy"] == "AgeDecayLenience" and trained["seeds"] == "1"
    assert float(trained["token_ratio"]) > 1.0  # drafts reused in epoch 2
    assert a_real_picture(tmp_path / "age_decay" / "runs.png")


@pytest.mark.slow  # the long corpus at RL scale, every rule simulated
def test_the_tutorials_rule_is_priced_at_rl_scale(tmp_path):
    """The last block reads nothing the others wrote: the tutorial's rule, by its reference, beside spec@1.65 and
    stock. Every draft of a corpus is one visit old, where the rule is spec@1.65: the same cuts."""
    pytest.importorskip("aiconfigurator_core")
    stdout = run_blocks(bash_blocks(DOC.read_text())[3:], tmp_path)
    (priced,) = [result_fields(line) for line in stdout.splitlines() if line.startswith("RESULT")]
    rule = "policies/age_decay_lenience.py:AgeDecayLenience@1.65,decay=0.25"
    assert f"| {rule} | requests |" in stdout and priced["corpus"] == "long"
    # the default regime's run visits each prompt once: nothing to reuse; a prompt's later visits reuse the last one
    assert priced[f"kept[{rule}]"] == priced["kept[spec@1.65]"] == "0.000"
    later = priced["kept_later[spec@1.65]"]
    assert priced[f"kept_later[{rule}]"] == later and float(later) > 0
    assert float(priced[f"projected_later[{rule}]"]) > 0 and priced["missing"] == "none"


@pytest.mark.ray
@pytest.mark.slow  # a whole quickstart run (the module docstring)
def test_the_quickstart_writes_what_it_measured(tutorial):
    out, _ = tutorial
    metrics = json.loads((out / "record" / "metrics.json").read_text())
    assert [r["name"] for r in metrics["runs"]] == ["off", "spec@1.65", "lossless"]
    steps = {
        r["name"]: [x for x in metrics["rows"] if x["kind"] == "step" and x["run"] == r["name"]]
        for r in metrics["runs"]
    }
    assert [len(rows) for rows in steps.values()] == [2, 2, 2]  # 2 epochs x 1 step of 32 prompts
    for rows in steps.values():
        assert all(r["samples"] == 256 and 0.0 < r["reward"] < 1.0 and r["decoded_tokens"] > 0 for r in rows)
    assert all(r.get("reused_tokens", 0) == 0 for r in steps["off"])
    spec_first, spec_second = ([r for r in steps["spec@1.65"] if r["epoch"] == e] for e in (0, 1))
    assert all(r.get("drafts_found", 0) == 0 for r in spec_first)
    assert all(r["drafts_found"] == 256 and r["reused_tokens"] > 0 for r in spec_second)
    # the trainer's updates reached the engine: drafts were scored under other weights, and the meter saw it
    assert all(r["kl_prev_curr"] > 0 and r["drift_since_decode"] != 0 for r in spec_second)
    # at the second visit every kept token is one visit old; a draft that kept none counts 0 in the mean
    assert all(0.5 < r["reused_token_age"] <= 1.0 and r["reused_older_than_2"] == 0 for r in spec_second)
    assert all(r["excess_acceptance"] > 0 for r in spec_second)
    # lossless verified in the engine: from its own finished siblings in the first epoch, from the history after
    lossless_first, lossless_second = ([r for r in steps["lossless"] if r["epoch"] == e] for e in (0, 1))
    assert all(r.get("drafts_found", 0) == 0 and r["reused_tokens"] > 0 for r in lossless_first)
    assert all(r["drafts_found"] == 256 and r["accepted_per_step"] > 1 for r in lossless_second)
    assert "scoring_requests" not in lossless_second[0] and "kl_prev_curr" not in lossless_second[0]
    finals = [r for r in metrics["rows"] if r["kind"] == "epoch" and r["epoch"] == 1]
    assert len(finals) == 3 and all(0.0 < r["held_out_accuracy"] < 1.0 for r in finals)
    for name in ("runs.png", "per_run/off.png", "per_run/lossless.png"):
        assert a_real_picture(out / "record" / name)

    # Offline replay of the run's own rule on its traces reproduces the run's cuts.
    records = read_traces(out / "traces" / "spec@1.65")
    assert len(records) == sum(r["drafts_found"] for r in steps["spec@1.65"])
    assert np.array_equal(replay_kept(sr.make("spec", lenience=1.65), records).tokens, records.cut)
    # Responses verified in the engine replay through the engine proposer, drafting from the history and from each
    # other: every response of both epochs is there, and the engine's proposal keeps part of each visit.
    records = read_traces(out / "traces" / "lossless")
    assert int(records.samples.sum()) == 2 * 256
    engine = replay_kept(sr.make("lossless"), records, engine_kept)  # our engine proposer's own code
    tree = replay_kept(sr.make("lossless", verify="requests"), records)
    assert engine.tokens.sum() > 0 and tree.tokens.sum() > 0 and len(engine.tokens) == len(tree.tokens) == 512

    # The report reads the runs three times over: our metrics.json, and the logs written with OpenRLHF's own
    # TensorBoard and wandb loggers, read back from disk; all give the same numbers, the staleness meter included.
    from_json = {run.name: run for run in run_readers.load_cpu_metrics(out / "record" / "metrics.json")}
    from_tensorboard = {run.name: run for run in run_readers.discover(out / "tb")}
    from_wandb = {run.name: run for run in map(run_readers.load_wandb_run, wandb_logs.run_folders(out / "record"))}
    assert sorted(from_json) == sorted(from_tensorboard) == sorted(from_wandb) == ["lossless", "off", "spec@1.65"]
    for logged in (from_tensorboard, from_wandb):
        for name, run in from_json.items():
            assert logged[name].group == run.group and logged[name].policy == run.policy
            for key in ("decoded_tokens", "rollout_s", "drafts_found"):
                assert logged[name].total(key) == pytest.approx(run.total(key), rel=1e-5)
            for key in ("kl_prev_curr", "excess_acceptance", "drift_since_decode"):
                expected = run.per_draft_mean(key)  # None for off and for lossless in the engine: no draft scored
                assert (expected is None) == (name != "spec@1.65")
                want = None if expected is None else pytest.approx(expected, rel=1e-5)
                assert logged[name].per_draft_mean(key) == want
            assert logged[name].final_accuracy() == pytest.approx(run.final_accuracy())
    assert len(run_readers.discover(out / "record")) == 3  # metrics.json and its wandb runs: each run once
    printed = subprocess.run(
        [sys.executable, "-m", "specrl_openrlhf.report", str(out / "tb")], capture_output=True, text=True
    )
    assert printed.returncode == 0, printed.stderr
    assert "| spec@1.65 | spec | 1.65 |" in printed.stdout and "kl_prev_curr" in printed.stdout
