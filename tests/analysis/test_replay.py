"""Offline replay: the run's own rule reproduces its cuts; other rules see the same drafts and uniforms."""

import subprocess
import sys
import types

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.analysis.replay import ReplayError, replay, replay_kept, tally
from specrl_openrlhf.trace import TraceWriter, read_traces
from tests.helpers import ADAPTIVE, cut_drafts


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


def test_command_line_reports_bad_rules_and_folders(traces, tmp_path, capsys):
    """`python -m specrl_openrlhf replay` once as a process, then its `main` in-process for each bad input."""
    from specrl_openrlhf.__main__ import main

    def run(*args):
        returncode = main(["replay", *args])
        out = capsys.readouterr()
        return types.SimpleNamespace(returncode=returncode, stdout=out.out, stderr=out.err)

    command = [sys.executable, "-m", "specrl_openrlhf", "replay", str(traces[0]), "--rollout_reuse", "spec@1.65"]
    ok = subprocess.run([*command, "exact", "--csv", str(tmp_path / "t.csv")], capture_output=True, text=True)
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


# ---- proposals: the visit's responses, rebuilt from its records -----------------------------------------------------


def visit_traces(tmp_path, params: dict, visits: int = 25, seed: int = 0):
    """Traces of visits of 4 samples through the planner, proposing as `params` say, from 4 (and, with history 2,
    4 more) previous responses that share prefixes; p_curr of every token drawn at random and scored whole (as
    tracing asks). Returns the folder and every sample."""
    rng = np.random.default_rng(seed)
    policy = sr.make("lossless", **params)
    writer = TraceWriter(tmp_path, policy.describe(), proposal=policy.draft_choice)
    planner = sr.SpeculativePlanner(policy, seed=11, trace=writer, stop_token_ids=[0])
    every = []
    for v in range(visits):
        stem = rng.integers(1, 5, 3).tolist()
        responses = [
            stem[: rng.integers(0, 4)] + rng.integers(1, 5, rng.integers(1, 6)).tolist() + [0] for _ in range(8)
        ]
        table = {}  # one p_curr per (prefix, token), as one policy gives it

        def logprob(prefix, token, table=table):
            return table.setdefault((tuple(prefix), token), float(np.log(rng.uniform(0.2, 1.0))))

        claimed = [
            sr.Draft(np.array(r), np.full(len(r), -0.5), "stop", visit=2 if i < 4 else 1, index=i % 4)
            for i, r in enumerate(responses[: 8 if planner.policy.draft_history == 2 else 4])
        ]
        samples = planner.visit_samples([7], 32, claimed, v.to_bytes(16, "little"), count=4)
        for sample in samples:
            if sample.tree is not None:
                tree = sample.tree
                for r, path in enumerate(tree.history.paths):
                    tokens = tree.history.path_tokens(r).tolist()
                    tree.logprobs[path] = [logprob(tokens[:i], t) for i, t in enumerate(tokens)]
                tree.scored = True
            elif sample.scored is not None:
                tokens = sample.draft.token_ids.tolist()
                sample.scored[:] = [logprob(tokens[:i], t) for i, t in enumerate(tokens)]
        planner.decide(samples)
        every += samples
    writer.flush()
    return tmp_path, every


def test_replaying_a_runs_tree_reproduces_what_its_walks_kept(tmp_path):
    for history in (1, 2):
        folder, samples = visit_traces(tmp_path / str(history), {"draft": "tree", "history": history})
        records = read_traces(folder)
        assert records.proposals == ["tree"] and (~records.samples).sum() == (25 * 4 if history == 2 else 0)
        kept = replay_kept(sr.make("lossless", draft="tree", history=history), records)
        assert kept.tokens.tolist() == records.cut[records.samples].tolist() == [s.cut for s in samples]
        assert np.isfinite(kept.drift).all() and len(kept.drift) == sum(s.cut for s in samples)


def test_proposals_replay_on_one_recorded_run_and_the_tree_keeps_the_most(tmp_path):
    folder, samples = visit_traces(tmp_path, {"draft": "own", "verify": "requests"})
    records = read_traces(folder)
    own = replay_kept(sr.make("lossless", draft="own", verify="requests"), records)
    assert own.tokens.tolist() == [s.cut for s in samples]  # the run's own cuts
    majority = replay_kept(sr.make("lossless", draft="majority", verify="requests"), records)
    tree = replay_kept(sr.make("lossless", draft="tree"), records)
    assert (tree.tokens >= own.tokens).all() and tree.tokens.sum() > own.tokens.sum()  # same uniforms: dominance
    assert majority.tokens.sum() > 0 and len(majority.tokens) == len(own.tokens) == 100
    results = [tally(name, records, k) for name, k in (("own", own), ("majority", majority), ("tree", tree))]
    assert results[2].reused_tokens == tree.tokens.sum() and results[0].drafts == 100
    with pytest.raises(ReplayError, match="two visits"):
        replay_kept(sr.make("lossless", draft="tree", history=2), records)
    with pytest.raises(ReplayError, match="replay_kept"):
        replay(sr.make("lossless", draft="tree"), records)


def test_traces_without_token_ids_replay_own_drafts_only(traces):
    records = read_traces(traces[0])
    records.tokens[:] = -1  # as a trace of format 2 reads
    assert len(replay_kept(sr.make("lossless", draft="own", verify="requests"), records).tokens) == 300
    with pytest.raises(ReplayError, match="no token ids"):
        replay_kept(sr.make("lossless", draft="tree"), records)
