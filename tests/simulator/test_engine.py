"""The rollout simulator (`simulator.engine`): the coupling and the schedule on toy corpora with known answers, the
persistent batch's slots as vLLM moves them, and the corpus file's errors."""

import pytest

from specrl_openrlhf.simulator.batch import BatchView
from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.engine import EngineSimulator, Schedule
from specrl_openrlhf.simulator.requests import Request


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


def test_rows_read_their_contexts_and_a_full_kv_cache_makes_the_latest_wait():
    toy = corpus([4, 4])  # prompts of 3 tokens, responses of 4
    run = EngineSimulator(toy, Schedule(max_num_seqs=4, prompts_per_step=2), Fixed(k=0)).run()
    # the prefill step samples token 0; then each row holds 3 + taken tokens before each decode: 4, 5, 6
    assert [r.decode_context for r in run.records] == [0, 2 * 4, 2 * 5, 2 * 6]
    tight = EngineSimulator(toy, Schedule(max_num_seqs=4, prompts_per_step=2, kv_capacity_tokens=8), Fixed(k=0)).run()
    # 8 KV tokens: both prompts fit (6), but two rows of 4 + 1 do not: the later one waits and is recomputed
    assert sum(r.preempted for r in tight.records) >= 1 and tight.response_tokens == run.response_tokens
    assert max(r.decode_rows for r in tight.records[1:]) == 1 and len(tight.records) > len(run.records)
    assert all(r.decode_context <= 8 for r in tight.records)


def test_a_prompts_rows_hold_its_whole_blocks_once_with_the_prefix_cache():
    toy = Corpus([list(range(1, 65))], [[[[7] * 8] * 4]])  # a 64-token prompt (48 tokens shareable), 4 samples of 8
    runs = {}
    for caching in (True, False):
        schedule = Schedule(max_num_seqs=4, prompts_per_step=1, kv_capacity_tokens=150, prefix_caching=caching)
        runs[caching] = EngineSimulator(toy, schedule, Fixed(k=0)).run()
    # shared: 64 + 3 x 16 = 112 tokens before the first decode, 112 + 4 x 8 = 144 at the last: all 4 rows fit
    assert sum(r.preempted for r in runs[True].records) == 0 and runs[True].peak_kv == 144
    assert max(r.decode_rows for r in runs[True].records) == 4
    # each row on its own: 4 x 64 tokens never fit, so at most two rows run at once and the others wait
    assert max(r.decode_rows for r in runs[False].records) == 2 and runs[False].peak_kv <= 150


class Followed:
    """A workload that sends each sample as a 2-token request, and its response only after that one finished."""

    kept = 0

    def __init__(self):
        self.order: list[str] = []

    def requests(self, epoch, prompts, toy):
        return [Request(f"first-{p}", p, toy.prompts[p], [0], prompt_logprobs=True) for p in prompts]

    def followups(self, request):
        self.order.append(request.id)
        if not request.id.startswith("first"):
            return []
        p = request.prompt_index
        return [Request(f"then-{p}", p, request.prompt + [7, 7], [1, 2, 3], cached=len(request.prompt))]


def test_a_followup_enters_only_after_its_request_and_reads_the_cached_prefix():
    workload = Followed()
    run = EngineSimulator(corpus([3, 3]), Schedule(max_num_seqs=4, prompts_per_step=2), Fixed(k=0), workload=workload)
    sim = run.run()
    assert workload.order[:2] == ["first-0", "first-1"] and set(workload.order[2:]) == {"then-0", "then-1"}
    # step 1 prefills both prompts (3 tokens each, with their log-probs); step 2 only the two uncached tokens each
    assert [(r.prefill_tokens, r.logit_tokens) for r in sim.records[:2]] == [(6, 6), (4, 0)]
    assert [r.decode_rows for r in sim.records] == [0, 0, 2, 2]


def test_a_prompts_samples_prefill_it_once_with_the_prefix_cache_and_each_on_its_own_without():
    toy = Corpus([list(range(1, 41))], [[[[7, 8]] * 4]])  # a 40-token prompt (2 whole blocks of 16), 4 samples
    prefilled = {}
    for caching in (True, False):
        schedule = Schedule(max_num_seqs=4, prompts_per_step=1, prefix_caching=caching)
        prefilled[caching] = sum(r.prefill_tokens for r in EngineSimulator(toy, schedule, Fixed(k=0)).run().records)
    # the first sample computes the prompt; its siblings read its 32 whole-block tokens and compute the other 8
    assert prefilled == {True: 40 + 3 * 8, False: 4 * 40}
    off = Schedule(max_num_seqs=4, prompts_per_step=2, prefix_caching=False)
    sim = EngineSimulator(corpus([3, 3]), off, Fixed(k=0), workload=Followed()).run()
    assert [(r.prefill_tokens, r.logit_tokens) for r in sim.records[:2]] == [(6, 6), (10, 0)]  # nothing read
    with pytest.raises(ValueError, match="prefix_caching must be true or false"):
        Schedule(prefix_caching="on")


def test_a_prefill_records_the_context_it_extends():
    chunked = EngineSimulator(
        corpus([2, 2]), Schedule(max_num_seqs=2, prompts_per_step=2, max_num_batched_tokens=4), Fixed(k=0)
    ).run()
    # the second prompt's first token in the first step, its other two after it in the second
    assert [(r.prefill_tokens, r.prefill_context) for r in chunked.records] == [(4, 0), (2, 1), (0, 0)]
    long = Corpus([list(range(1, 41))], [[[[7, 8], [7, 9]]]])  # a 40-token prompt's two samples
    shared = EngineSimulator(long, Schedule(max_num_seqs=2, prompts_per_step=1), Fixed(k=0)).run()
    # the first prefills all 40; the second reads the 32 of its two whole blocks and prefills 8 after them
    assert (shared.records[0].prefill_tokens, shared.records[0].prefill_context) == (48, 32)


def test_a_step_carries_no_more_than_the_engines_token_budget():
    # four rows drafting 8 tokens each in a 12-token budget: each row its token, the drafts cut to the 8 left
    schedule = Schedule(max_num_seqs=4, prompts_per_step=4, max_num_batched_tokens=12)
    run = EngineSimulator(corpus([30] * 4), schedule, Fixed(k=8)).run()
    assert max(r.decode_tokens + r.prefill_tokens for r in run.records) == 12
    assert (run.records[1].decode_rows, run.records[1].drafted) == (4, 8)  # the first rows' drafts whole, then none


class Fifo(Fixed):
    """A proposer that keeps the last `n` responses it saw, FIFO (as suffix decoding's cache), and drafts nothing:
    what it holds when each epoch starts is recorded."""

    def __init__(self, n: int):
        super().__init__(k=0)
        self.n, self.held, self.at_visit = n, [], []

    def between_visits(self, others):
        for other in others.tail(self.n):
            self._keep([tuple(r) for r in other.responses])

    def visit(self, epoch, prompts, corpus):
        self.at_visit.append(list(self.held))
        return 1.0

    def finished(self, request):
        self._keep([tuple(request.response)])

    def _keep(self, responses):
        self.held = (self.held + responses)[-self.n :]


@pytest.mark.parametrize("spacing, kept_previous", [(1, True), (2, True), (3, False)])
def test_a_fifo_of_n_holds_the_returning_prompts_last_visit_only_where_the_gap_leaves_room(spacing, kept_previous):
    """Two returning prompts of 2 samples (4 responses an RL step) and a FIFO of 8: a gap of `spacing` - 1 RL steps of
    the other prompts' visits (4 responses each) leaves the last visit's 4 responses in it up to spacing 2, and none
    at 3, where the gap's 8 fill it."""
    from specrl_openrlhf.simulator.visits import Gaps, gap_visits, subset

    toy = Corpus(
        [[1, 2, p] for p in range(4)],
        [[[[100 * e + 10 * p + s, 7] for s in range(2)] for p in range(4)] for e in range(2)],
    )
    schedule = Schedule(max_num_seqs=8, prompts_per_step=2)
    gaps = Gaps(toy, (1, 3), gap_visits(spacing, 1, schedule.prompts_per_step))
    fifo = Fifo(8)
    EngineSimulator(subset(toy, (0, 2)), schedule, fifo, gaps=gaps).run()
    previous = {tuple(r) for p in (0, 2) for r in toy.responses[0][p]}
    assert previous <= set(fifo.at_visit[1]) if kept_previous else not previous & set(fifo.at_visit[1])
    assert len(fifo.at_visit[1]) == min(8, 4 + 4 * (spacing - 1) * (spacing > 1))
    others = {tuple(r) for p in (1, 3) for e in (0, 1) for r in toy.responses[e][p]}
    assert set(fifo.at_visit[0]) <= others  # the first visit's gap: the other prompts' alone


def test_two_halves_merged_are_their_steps_in_turn_and_their_tokens_summed():
    from specrl_openrlhf.simulator.engine import Simulation
    from specrl_openrlhf.simulator.visits import subset

    toy = corpus([4, 6, 5, 3], samples=2, epochs=2)
    schedule = Schedule(max_num_seqs=4, prompts_per_step=2)
    whole = EngineSimulator(toy, schedule, Fixed(k=2)).run()
    parts = [EngineSimulator(subset(toy, r), schedule, Fixed(k=2)).run() for r in ((0, 2), (1, 3))]
    merged = Simulation.merged(parts)
    assert merged.response_tokens == whole.response_tokens == 2 * 2 * (4 + 6 + 5 + 3)
    assert merged.accepted == sum(p.accepted for p in parts) and len(merged.records) == sum(
        len(p.records) for p in parts
    )
    assert merged.column("rl_step").tolist() == sorted(merged.column("rl_step").tolist())  # numbered on
    assert merged.kept_tokens(1) == tuple(map(sum, zip(*(p.kept_tokens(1) for p in parts))))
    assert merged.kept == pytest.approx(sum(p.kept_tokens(0)[0] + p.kept_tokens(1)[0] for p in parts) / 72)
