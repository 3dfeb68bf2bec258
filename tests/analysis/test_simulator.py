"""The rollout simulator (`analysis.simulator`): the coupling and the schedule on toy corpora with known answers, the
persistent batch's slots as vLLM moves them, and the corpus file's errors."""

import numpy as np
import pytest

from specrl_openrlhf.analysis.projection import Pricing, step_costs
from specrl_openrlhf.analysis.simulator import BatchView, Corpus, EngineSimulator, Request, Schedule
from specrl_openrlhf.step_curve import HostCurve, StepCurve


class Fixed:
    """A proposer that drafts, for every row, `k` tokens of its own recorded response from where it stands (an oracle,
    `shift=0`) or those tokens plus `shift` (never right)."""

    name, async_scheduling = "fixed", False

    def __init__(self, k: int, shift: int = 0):
        self.k, self.shift, self.calls = k, shift, 0

    def visit(self, epoch, prompts, corpus):
        return 1.0

    def propose(self, batch: BatchView, sampled):
        self.calls += 1
        drafts = []
        for request, tokens in zip(batch.rows, sampled):
            ahead = request.response[request.taken : request.taken + self.k] if tokens else []
            drafts.append([t + self.shift for t in ahead])
        return drafts

    def finished(self, request):
        pass


def corpus(lengths, samples=1, epochs=1):
    """Prompts of 3 tokens; response r of prompt p: tokens 100 + 10 p + position, `lengths[p]` long."""
    prompts = [[1, 2, 3 + p] for p in range(len(lengths))]
    responses = [[[[100 + 10 * p + i for i in range(n)] for _ in range(samples)] for p, n in enumerate(lengths)]]
    return Corpus(prompts, responses * epochs)


def test_an_oracle_draft_takes_k_plus_one_tokens_a_step_and_a_wrong_one_one():
    toy = corpus([10])
    schedule = Schedule(max_num_seqs=4, prompts_per_step=1)
    oracle = EngineSimulator(toy, schedule, Fixed(k=3)).run()
    # the prefill's step samples token 0; then each step accepts 3 drafted tokens and takes the next: 1 + 4 + 4, and
    # the last step accepts the one token left
    assert len(oracle.records) == 4 and oracle.accepted == 3 + 3 + 1 and oracle.kept == pytest.approx(7 / 10)
    assert [r.drafted for r in oracle.records] == [0, 3, 3, 1]  # the last step's draft is all that was left
    wrong = EngineSimulator(toy, schedule, Fixed(k=3, shift=1)).run()
    assert len(wrong.records) == 10 and wrong.accepted == 0
    assert [r.decode_tokens for r in wrong.records] == [0] + [4] * 7 + [3, 2]  # 1 + 3 draft tokens while 3 are left


def test_requests_wait_for_rows_and_prefills_share_the_token_budget():
    toy = corpus([3, 3, 3, 3])  # 4 prompts, one sample each, 3 tokens
    run = EngineSimulator(toy, Schedule(max_num_seqs=2, prompts_per_step=4), Fixed(k=0)).run()
    # two rows: the first two requests run steps 1-3 (prefill, 2 decodes), the others steps 4-6
    assert len(run.records) == 6 and [r.prefill_rows for r in run.records] == [2, 0, 0, 2, 0, 0]
    assert [r.decode_rows for r in run.records] == [0, 2, 2, 0, 2, 2]
    chunked = EngineSimulator(
        corpus([2, 2]), Schedule(max_num_seqs=2, prompts_per_step=2, max_num_batched_tokens=4), Fixed(k=0)
    ).run()
    # 3-token prompts in a 4-token budget: the second prompt's prefill finishes a step later
    assert [(r.prefill_rows, r.prefill_tokens, r.decode_rows) for r in chunked.records] == [(2, 4, 0), (1, 2, 1)] + [
        (0, 0, 1)
    ]


def test_epochs_return_every_prompt_and_steps_are_seeded():
    schedule = Schedule(max_num_seqs=8, prompts_per_step=3, seed=1)
    steps = schedule.steps_of(0, 7)
    assert sorted(p for s in steps for p in s) == list(range(7)) and [len(s) for s in steps] == [3, 3, 1]
    assert schedule.steps_of(0, 7) == steps and schedule.steps_of(1, 7) != steps
    run = EngineSimulator(
        corpus([4] * 4, samples=2, epochs=3), Schedule(max_num_seqs=8, prompts_per_step=2), Fixed(k=1)
    ).run(first_epoch=1)
    assert run.response_tokens == 2 * 4 * 2 * 4 and len(run.found_previous) == 4
    assert sorted({r.rl_step for r in run.records}) == [0, 1, 2, 3]


def test_rows_keep_their_slots_as_vllms_persistent_batch_moves_them():
    view = BatchView(max_num_seqs=8, max_len=16)
    a, b, c, d, e = (Request(name, 0, [i + 1], [9]) for i, name in enumerate("abcde"))
    view.update(set(), [a, b, c, d])
    view.extend(3, [7, 8])
    view.update({"b"}, [])  # the last row moves down into the hole, its tokens with it
    assert view.req_ids == ["a", "d", "c"] and view.token_ids_cpu[1, :3].tolist() == [4, 7, 8]
    assert view.num_tokens_no_spec[1] == 3 and view.req_id_to_index == {"a": 0, "d": 1, "c": 2}
    view.update({"a", "d"}, [e])  # a new request takes the lowest free slot; the last row fills the next hole
    assert view.req_ids == ["e", "c"] and view.token_ids_cpu[0, 0] == 5 and view.token_ids_cpu[1, 0] == 3


def test_a_corpus_survives_its_file_and_a_bad_file_is_one_error(tmp_path):
    toy = Corpus([[1, 2], [3]], [[[[4, 5]], [[6]]], [[[7]], [[8, 9, 10]]]], {"model": "toy"})
    toy.save(tmp_path / "c.npz")
    back = Corpus.load(tmp_path / "c.npz")
    assert back.prompts == toy.prompts and back.responses == toy.responses and back.meta == {"model": "toy"}
    with pytest.raises(ValueError, match="no such corpus file"):
        Corpus.load(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="bad.npz: not a readable corpus .*delete it and run again"):
        Corpus.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "foreign.npz", header=np.frombuffer(b'{"format": "other"}', np.uint8))
    with pytest.raises(ValueError, match="not a corpus of version 1"):
        Corpus.load(tmp_path / "foreign.npz")
    with pytest.raises(ValueError, match="same number of responses"):
        Corpus([[1], [2]], [[[[3]], [[4], [5]]]])


def test_pricing_counts_the_proposer_and_the_host_where_async_scheduling_is_off():
    grid = [{"rows": r, "tokens": q, "seconds": 0.004 + 1e-5 * r * q} for r in (32, 64) for q in (1, 2)]
    curve = StepCurve(grid, prefill=[{"tokens": 100, "seconds": 0.005}, {"tokens": 1100, "seconds": 0.015}])
    host = HostCurve([{"rows": 32, "seconds": 0.001}, {"rows": 64, "seconds": 0.006}])
    costs = step_costs([64, 32, 0], [128, 32, 0], [0, 100, 600], Pricing(curve, host=host), proposer_s=0.002)
    np.testing.assert_allclose(costs.gpu, [0.004 + 1e-5 * 128, 0.004 + 32e-5 + 0.001, curve.time(1, 1) + 0.006])
    np.testing.assert_allclose(costs.host, [0.006, 0.001, 0.001])
    assert costs.total(async_scheduling=True) == pytest.approx(np.maximum(costs.gpu, costs.host).sum())
    assert costs.total(async_scheduling=False) == pytest.approx(costs.gpu.sum() + costs.host.sum() + 3 * 0.002)
    assert not Pricing(curve, host=host).optimistic and Pricing(StepCurve(grid), host=host).optimistic
