"""Our V2 speculator's drafter driven in vLLM 0.34's call order by the runner in miniature (`miniature.v2_runner`):
new and finished requests, aborts, `pause_generation(mode="keep")`'s preemptions and their resumption in another slot,
histories that arrive between two steps, and two tensor-parallel ranks that must draft the same, bit for bit."""

import numpy as np
import torch

from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.integration.vllm.histories import params_message, request_id
from specrl_openrlhf.integration.vllm.v2.drafter import DrafterSettings, HistoryDrafter
from specrl_openrlhf.miniature.v2_runner import MiniatureRunner
from specrl_openrlhf.policies.builtin import LosslessParams

K, MAX_LEN = 4, 96
PROMPT = [1, 9, 9, 3]
RESPONSE = list(range(30, 70))
RULE = params_message(LosslessParams(min_match=4))


def runner(rows=6):
    settings = DrafterSettings(max_num_reqs=rows, max_model_len=MAX_LEN, k=K, history_mb=2)
    return MiniatureRunner(lambda state: HistoryDrafter(settings, state, "cpu"), rows, MAX_LEN)


def voted(run, request) -> list[int]:
    """A row's draft where the drafter voted one (its confidence above 0)."""
    row = run.batch.index(request)
    drafts = run.speculator.drafts[row].tolist()
    return drafts[: int((run.speculator.confidences[row] > 0).sum())]


def test_a_finished_siblings_response_stays_for_the_rows_after_it():
    run, key = runner(), prompt_key(PROMPT)
    first, aborted = request_id(key), request_id(key)
    run.schedule(added=[(first, PROMPT, []), (aborted, PROMPT, [])])
    run.step({first: RESPONSE[:5], aborted: [99]})  # a step samples k + 1 tokens at most
    run.step({first: RESPONSE[5:10]})
    run.schedule(finished=[first, aborted])  # finished and aborted alike: vLLM reports both
    later = request_id(key)
    run.schedule(added=[(later, PROMPT, [])])
    run.step({later: RESPONSE[:2]})
    assert voted(run, later) == RESPONSE[2 : 2 + K]


def test_a_history_that_arrives_between_two_steps_is_drafted_from_at_the_next():
    run, key = runner(), prompt_key(PROMPT)
    row = request_id(key)
    run.schedule(added=[(row, PROMPT, [])])
    run.step({row: RESPONSE[:3]})
    assert voted(run, row) == []  # the prompt's first visit: nothing to draft from yet
    run.speculator.update(key, len(PROMPT), True, RULE, [RESPONSE], None)
    run.step({row: RESPONSE[3:4]})
    assert voted(run, row) == RESPONSE[4 : 4 + K]


def test_a_request_paused_with_keep_drafts_on_from_where_it_stands_in_another_slot():
    run, key = runner(), prompt_key(PROMPT)
    run.speculator.update(key, len(PROMPT), True, RULE, [RESPONSE], None)
    paused = request_id(key)
    run.schedule(added=[(paused, PROMPT, [])])
    run.step({paused: RESPONSE[:5]})
    run.step({paused: RESPONSE[5:6]})
    index = run.state.req_id_to_index[paused]
    run.schedule(preempted=[paused])  # pause_generation(mode="keep"): preempted, no finish call
    other = request_id(prompt_key([5, 5]))
    run.schedule(added=[(other, [5, 5], [])])  # takes the freed slot
    run.schedule(added=[(paused, PROMPT, RESPONSE[:6])])  # resumed: the same id, its tokens so far
    assert run.state.req_id_to_index[paused] != index
    run.step({paused: RESPONSE[6:7], other: [8]})
    assert voted(run, paused) == RESPONSE[7 : 7 + K]


def test_two_tensor_parallel_ranks_draft_the_same_bit_for_bit():
    rng = np.random.default_rng(0)
    ranks = [runner(rows=8), runner(rows=8)]
    prompts = [[1, p, p, 3] for p in range(4)]
    histories = {p: [rng.integers(20, 40, 60).tolist() for _ in range(3)] for p in range(4)}
    requests = {p: [request_id(prompt_key(prompts[p])) for _ in range(2)] for p in range(4)}
    for run in ranks:
        for p in range(4):
            run.speculator.update(prompt_key(prompts[p]), 4, True, RULE, histories[p], None)
        run.schedule(added=[(r, prompts[p], []) for p in range(4) for r in requests[p]])
    where = {r: 0 for p in range(4) for r in requests[p]}
    for step in range(25):
        sampled, rejected = {}, {}
        for p in range(4):
            for r in requests[p]:
                n = int(rng.integers(1, K + 2))
                sampled[r] = histories[p][int(rng.integers(0, 3))][where[r] : where[r] + n] or [7]
                rejected[r], where[r] = int(rng.integers(0, 2)), where[r] + n
        drafts = [run.step(sampled, rejected) for run in ranks]
        assert drafts[0] == drafts[1], step
        one, two = (run.speculator for run in ranks)
        assert torch.equal(one.confidences, two.confidences) and torch.equal(one.acceptance.fine, two.acceptance.fine)
        if step == 12:
            for run in ranks:
                run.schedule(finished=requests[0])
                run.speculator.update(prompt_key(prompts[0]), 4, False, RULE, histories[0][:1], None)
            requests[0] = []
    assert torch.equal(ranks[0].speculator.store.table, ranks[1].speculator.store.table)
