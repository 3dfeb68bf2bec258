"""Offline replay: the run's own rule reproduces its cuts; other rules see the same drafts and uniforms."""

import subprocess
import sys

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.replay import ReplayError, replay, tally
from specrl_openrlhf.trace import TraceWriter, read_traces

from .helpers import ADAPTIVE, cut_drafts


@pytest.fixture
def traces(tmp_path):
    writer = TraceWriter(tmp_path / "traces", "spec(lenience=1.65)")
    samples = cut_drafts(sr.SpeculativePlanner(sr.make("spec", lenience=1.65), seed=7, trace=writer), 300)
    writer.flush()
    return tmp_path / "traces", samples


def test_the_runs_rule_reproduces_its_cuts_in_any_batching(traces):
    directory, samples = traces
    records = read_traces(directory)
    for batch_size in (1, 7, 256):
        assert np.array_equal(replay(sr.make("spec", lenience=1.65), records, batch_size=batch_size), records.cut)
    result = tally("spec", records, records.cut)
    assert result.reused_tokens == sum(s.cut for s in samples) and result.drafts == 300


def test_other_rules_are_ordered_by_lenience(traces):
    records = read_traces(traces[0])
    kept = {name: replay(sr.make(name, **kw), records).sum() for name, kw in [("exact", {}), ("full", {})]}
    kept["spec@4"] = replay(sr.make("spec", lenience=4.0), records).sum()
    assert kept["exact"] <= records.cut.sum() <= kept["spec@4"] <= kept["full"] == records.lengths.sum()


def test_a_stateful_rule_updates_from_its_feedback_during_replay(traces):
    """One update after all 300 drafts: until then the rule cuts at its starting lenience (the run's, 1.65), so its
    feedback is the run's own kept share, and log ℓ moves by gain x (target - kept share)."""
    records = read_traces(traces[0])
    adaptive = sr.policies.policy_class(ADAPTIVE)
    rule = adaptive(adaptive.Params(lenience=1.65))
    cuts = replay(rule, records, batch_size=32, update_every=len(records))
    assert np.array_equal(cuts, records.cut)
    kept_share = records.cut.sum() / records.lengths.sum()
    expected = np.log(1.65) + rule.params.gain * (rule.params.target_kept - kept_share)
    assert rule.log_lenience == pytest.approx(max(expected, 0.0))


def test_scoring_rules_need_scored_traces(tmp_path):
    writer = TraceWriter(tmp_path, "random()")
    cut_drafts(sr.SpeculativePlanner(sr.make("random"), trace=writer), 5)  # random never scores
    writer.flush()
    records = read_traces(tmp_path)
    with pytest.raises(ReplayError, match="never scored"):
        replay(sr.make("spec"), records)
    assert len(replay(sr.make("full"), records)) == 5


def test_command_line_reports_bad_rules_and_folders(traces, tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "specrl_openrlhf", "replay", *args], capture_output=True, text=True
        )

    ok = run(str(traces[0]), "--rollout_reuse", "spec@1.65", "exact", "--csv", str(tmp_path / "t.csv"))
    assert ok.returncode == 0 and "| spec(lenience=1.65) |" in ok.stdout
    assert (tmp_path / "t.csv").read_text().startswith("rule,drafts,draft_tokens")
    assert "Did you mean 'spec'" in run(str(traces[0]), "--rollout_reuse", "specc").stderr
    assert "lenience after @ must be a number" in run(str(traces[0]), "--rollout_reuse", "spec@x").stderr
    with_params = run(str(traces[0]), "--rollout_reuse", f"{ADAPTIVE}@2,target_kept=0.9,gain=0.5")
    assert "| AdaptiveLenience(target_kept=0.9, lenience=2.0, gain=0.5," in with_params.stdout
    assert "'spec' takes no parameter x" in run(str(traces[0]), "--rollout_reuse", "spec,x=1").stderr
    assert "give parameters as key=value" in run(str(traces[0]), "--rollout_reuse", "spec,0.5").stderr
    missing = run(str(tmp_path / "none"), "--rollout_reuse", "spec")
    assert missing.returncode == 2 and "--reuse.trace_dir" in missing.stderr
