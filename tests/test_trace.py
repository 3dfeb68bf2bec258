"""Draft traces: what the planner records, read back across writers, with bad chunks skipped."""

import logging

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.seeds import uniforms_for
from specrl_openrlhf.trace import TraceWriter, read_traces
from tests.helpers import cut_drafts


def test_planner_records_every_cut_draft(tmp_path):
    writer = TraceWriter(tmp_path, "spec(lenience=1.65)")
    planner = sr.SpeculativePlanner(sr.make("spec", lenience=1.65), seed=3, trace=writer)
    samples = cut_drafts(planner, 40)
    writer.flush()
    records = read_traces(tmp_path)
    assert len(records) == 40 and records.policies == ["spec(lenience=1.65)"]
    assert records.cut.tolist() == [s.cut for s in samples]
    assert records.lengths.tolist() == [s.draft_len for s in samples]
    for r, s in enumerate(samples):
        lo, hi = records.offsets[r], records.offsets[r + 1]
        assert np.array_equal(records.draft_logprobs[lo:hi], s.draft.logprobs)
        assert np.array_equal(records.scored_logprobs[lo:hi], s.scored)
        assert np.array_equal(uniforms_for(records.entropy[r], s.draft_len), s.uniforms)
    assert np.all(records.lenience == pytest.approx(1.65)) and records.draft_ended.all()


def test_many_writers_merge_in_time_order_and_bad_chunks_are_skipped(tmp_path, caplog):
    first, second = TraceWriter(tmp_path / "a", "spec()", flush_every=4), TraceWriter(tmp_path / "b", "exact()")
    cut_drafts(sr.SpeculativePlanner(sr.make("spec"), trace=first), 10)
    cut_drafts(sr.SpeculativePlanner(sr.make("exact"), trace=second), 5)
    first.flush(), second.flush()
    assert first.chunks == 3  # 4 + 4 + 2 records
    (tmp_path / "b" / "trace-corrupt-00000.npz").write_bytes(b"not a trace")
    with caplog.at_level(logging.WARNING):
        records = read_traces(tmp_path)
    assert len(records) == 15 and np.all(np.diff(records.time) >= 0) and records.policies == ["spec()", "exact()"]
    assert "skipping unreadable draft trace" in caplog.text


def test_missing_traces_name_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--reuse.trace_dir"):
        read_traces(tmp_path / "nothing")


def test_a_failed_write_never_reaches_the_rollout(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = TraceWriter(blocker / "traces", "spec()", flush_every=1)
    with caplog.at_level(logging.WARNING):
        cut_drafts(sr.SpeculativePlanner(sr.make("spec"), trace=writer), 2)
    assert "could not write" in caplog.text


def test_records_reach_disk_within_flush_s_without_more_records(tmp_path):
    """A killed process loses at most its last flush_s seconds: a background thread writes what waits."""
    import time

    writer = TraceWriter(tmp_path, "spec()", flush_every=10_000, flush_s=0.2)
    cut_drafts(sr.SpeculativePlanner(sr.make("spec"), trace=writer), 3)
    deadline = time.monotonic() + 10
    while not list(tmp_path.glob("trace-*.npz")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(read_traces(tmp_path)) == 3
    writer.close()
