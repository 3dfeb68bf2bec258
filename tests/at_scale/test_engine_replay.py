"""Responses verified in the engine, replayed by our engine proposer's own code (`at_scale.engine_replay`), and what
`python -m specrl_openrlhf replay` makes of `lossless`'s engine traces with it."""

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.__main__ import main
from specrl_openrlhf.analysis.replay import ReplayError, replay_kept
from specrl_openrlhf.at_scale.engine_replay import engine_kept
from specrl_openrlhf.trace import HISTORY_SLOT, TraceWriter, read_traces

HISTORY = [[5, 6, 7, 8], [5, 6, 9, 2]]


def test_a_response_keeps_what_the_engine_proposer_drafts_at_each_step():
    """After the first sampled token (5) the proposer stands at 5 in the history: its greedy path 6 7 8 (7 the first
    of two children with one path each); the response takes 6, then 9 where 7 was drafted, and stands at 5 6 9, whose
    path goes on with 2: drafted, kept. 2 of 4 drafted tokens kept."""
    params = sr.make("lossless").params
    assert engine_kept(params, [(HISTORY, [[5, 6, 9, 2]])]) == [[(2, 4)]]
    assert engine_kept(params, [([], [[5, 6, 9, 2]])]) == [[(0, 0)]]  # no history, no sibling: nothing drafted
    # two samples at once: the second follows the history's first path to its end, 3 of 3 drafted tokens kept
    assert engine_kept(params, [(HISTORY, [[5, 6, 9, 2], [5, 6, 7, 8]])]) == [[(2, 4), (3, 3)]]


def test_a_sample_drafts_from_its_siblings_in_flight():
    """B leaves the history at once (1 where 6 was drafted) and re-enters it on 6 7 8 9 (4 tokens: `min_match`):
    alone it then keeps 10, where the history ends; beside A, which followed the history and went on with 1 2 3 while
    B lagged, it keeps 10 1 2 3 from A's path, inserted as A was sampled."""
    params = sr.make("lossless").params
    history, a, b = [5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 9, 10, 1, 2, 3], [5, 1, 6, 7, 8, 9, 10, 1, 2, 3]
    assert engine_kept(params, [([history], [b])]) == [[(1, 5)]]
    assert engine_kept(params, [([history], [a, b])]) == [[(4, 4), (4, 8)]]
    # in lockstep, neither of two samples is ahead of the other to draft from
    assert engine_kept(params, [([], [a, a])]) == [[(0, 0), (0, 0)]]


def engine_traces(folder, visits):
    """Traces as `lossless` in the engine writes them (`integration.rollout.engine_path`): per visit, the history it
    drafted from (slot -1), then each sample's response (slot s)."""
    writer = TraceWriter(folder, "lossless()", proposal="engine")
    for v, (history, samples) in enumerate(visits):
        for slot, tokens in [(HISTORY_SLOT, r) for r in history] + list(enumerate(samples)):
            draft = sr.Draft(np.array(tokens), np.full(len(tokens), -0.5), "stop", visit=v, index=max(slot, 0))
            writer.record(
                draft, draft.logprobs, draft.ages, 16, True, (0, 1, v, max(slot, 0), len(tokens)), 0, None, v, slot
            )
    writer.flush()
    return read_traces(folder)


def test_engine_traces_replay_through_the_engine_proposer(tmp_path, capsys):
    visits = [(HISTORY, [[5, 6, 9, 2], [5, 6, 7, 8]]), ([[1, 2, 3]], [[1, 2, 4]])]
    records = engine_traces(tmp_path, visits)
    kept = replay_kept(sr.make("lossless"), records, engine_kept)
    # the second visit: after 1, the path 2 3 is drafted; 2 kept
    assert kept.tokens.tolist() == [2, 3, 1] and kept.offered.tolist() == [4, 3, 2]
    tree = replay_kept(sr.make("lossless", verify="requests"), records)  # the longest prefix inside the tree
    assert tree.tokens.tolist() == [4, 4, 2] and tree.whole.tolist() == [True, True, False]
    with pytest.raises(ReplayError, match="replayed by the engine proposer itself"):
        replay_kept(sr.make("lossless"), records)
    assert main(["replay", str(tmp_path), "--rollout_reuse", "lossless", "lossless,verify=requests"]) == 0
    rows = {
        line.split(" | ")[0][2:]: line.split(" | ") for line in capsys.readouterr().out.splitlines() if "| " in line
    }
    assert rows[sr.make("lossless").describe()][4] == "6"  # decoded tokens saved
