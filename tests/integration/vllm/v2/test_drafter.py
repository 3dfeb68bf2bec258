"""The V2 drafter (`vllm.v2.drafter`) on CPU tensors, driven in vLLM 0.34's call order (`miniature.v2_runner`): it
drafts what the V1 proposer drafts where the two should agree (a row following one history; a row that re-enters after
it diverged), its confidences are its acceptance model's, and its step makes no host sync."""

import numpy as np
import pytest
import torch

from specrl_openrlhf.cache import prompt_key
from specrl_openrlhf.integration.vllm.histories import params_message, request_id
from specrl_openrlhf.integration.vllm.v1 import board as boards
from specrl_openrlhf.integration.vllm.v1.board import HistoryBoard
from specrl_openrlhf.integration.vllm.v1.proposer import HistoryProposer
from specrl_openrlhf.integration.vllm.v2.drafter import DrafterSettings, HistoryDrafter
from specrl_openrlhf.miniature.v2_runner import MiniatureRunner
from specrl_openrlhf.policies.builtin import LosslessParams
from tests.helpers import NoHostSync

K, MAX_LEN = 4, 96
PROMPT = [1, 7, 7, 7, 3]
HISTORY = list(range(20, 60))  # one previous response: no token repeats
RULE = params_message(LosslessParams(min_match=4, budget="static", min_accept_prob=0.0))


def drafter_runner(rows=4, **settings):
    made = DrafterSettings(max_num_reqs=rows, max_model_len=MAX_LEN, k=K, history_mb=2, **settings)
    return MiniatureRunner(lambda state: HistoryDrafter(made, state, "cpu"), rows, MAX_LEN)


class V1:
    """The V1 proposer on one row, its board holding the same history."""

    def __init__(self, monkeypatch):
        self.board = HistoryBoard()
        monkeypatch.setattr(boards, "BOARD", self.board)
        self.board.update(prompt_key(PROMPT), len(PROMPT), True, RULE, [HISTORY], [None])
        config = type("C", (), {})()
        config.speculative_config = type("S", (), {"num_speculative_tokens": K})()
        config.model_config = type("M", (), {"max_model_len": MAX_LEN})()
        self.proposer = HistoryProposer(config)
        self.proposer.cpu_fix_installed = True
        self.tokens, self.count = np.zeros((1, MAX_LEN), np.int32), np.zeros(1, np.int64)
        self.tokens[0, : len(PROMPT)], self.count[0] = PROMPT, len(PROMPT)

    def step(self, new):
        self.tokens[0, self.count[0] : self.count[0] + len(new)] = new
        self.count[0] += len(new)
        return self.proposer.propose([list(new)], self.count, self.tokens)[0]


class V2:
    """The V2 drafter on one row of the same prompt, the same history registered."""

    def __init__(self):
        self.runner = drafter_runner()
        self.drafter = self.runner.speculator
        self.drafter.update(prompt_key(PROMPT), len(PROMPT), True, RULE, [HISTORY], None)
        self.id = request_id(prompt_key(PROMPT))
        self.runner.schedule(added=[(self.id, PROMPT, [])])

    def step(self, new, rejected=0):
        draft = self.runner.step({self.id: list(new)}, {self.id: rejected})[self.id]
        voted = int((self.drafter.confidences[0] > 0).sum())
        return draft[:voted]


@pytest.mark.parametrize(
    "steps",
    [
        [[20], [21, 22], [23, 24, 25, 26, 27]],  # following the history
        [[20], [21, 22, 23], [99], [25, 26, 27, 28], [29]],  # left it at 99, re-entered on [25, 26, 27, 28]
    ],
    ids=["following", "re-entering"],
)
def test_v2_drafts_what_v1_drafts_where_they_should_agree(monkeypatch, steps):
    v1, v2 = V1(monkeypatch), V2()
    for new in steps:
        assert v2.step(new) == v1.step(new), new


def test_confidences_are_the_acceptance_models_and_zero_past_the_chain():
    v2 = V2()
    v2.step([20])
    table = v2.drafter.acceptance.table
    confidences = v2.drafter.confidences[0]
    assert torch.all(confidences[:K] == table[v2.drafter.prev_bucket[v2.runner.state.req_id_to_index[v2.id]]])
    for _ in range(30):  # every draft kept: the model learns its buckets accept
        drafted = v2.runner.step({v2.id: []})  # in prefill: nothing sampled, nothing judged
    assert float(v2.drafter.acceptance.fine[:, 1].sum()) == 0
    row = v2.runner.state.req_id_to_index[v2.id]
    position = 21
    for _ in range(6):
        draft = v2.runner.step({v2.id: HISTORY[position - 20 : position - 20 + K + 1]}, {v2.id: 0})[v2.id]
        position += K + 1
    assert float(v2.drafter.confidences[0, 0]) > 0.5 and draft == HISTORY[position - 20 : position - 20 + K]
    v2.runner.step({v2.id: [HISTORY[-1]]})  # the history's end: nothing left to vote for
    assert float(v2.drafter.confidences[0].sum()) == 0 and int(v2.drafter.prev_len[row]) == 0
    assert drafted  # every slot holds a real token (the last sampled one past the chain)


def test_the_step_makes_no_host_sync():
    v2 = V2()
    v2.step([20])
    sibling = request_id(prompt_key(PROMPT))
    v2.runner.schedule(added=[(sibling, PROMPT, [20, 21])])  # host work between steps, applied in the step
    inputs = step_inputs(v2.runner, {v2.id: [21, 22], sibling: [22]})
    with NoHostSync():
        v2.runner.speculator.propose(*inputs)
    with pytest.raises(AssertionError, match="host sync"), NoHostSync():
        torch.zeros(3).sum().item()  # the check sees a sync


def step_inputs(runner, sampled):
    """What `MiniatureRunner.step` hands `propose`, built outside the checked region."""
    state = runner.state
    rows = [state.req_id_to_index[r] for r in runner.batch]
    for request_id_, index in zip(runner.batch, rows):
        new = sampled.get(request_id_, [])
        n = int(state.total_len.gpu[index])
        state.all_token_ids.gpu[index, n : n + len(new)] = torch.as_tensor(new, dtype=torch.int32)
        state.total_len.gpu[index] = n + len(new)
    counts = torch.tensor([len(sampled.get(r, [])) for r in runner.batch], dtype=torch.int32)
    return torch.tensor(rows, dtype=torch.int32), counts, torch.zeros_like(counts), runner.last


@pytest.mark.slow  # compiling the step takes a minute on 2 cores
def test_the_compiled_step_drafts_what_the_eager_one_does():
    """`compile` (a GPU's default) fuses the step's ops: the same drafts, confidences and acceptance, bit for bit,
    here with torch's CPU compiler (a GPU compiles the same graph to other kernels; untested here)."""
    rng = np.random.default_rng(0)
    runs = [drafter_runner(rows=6), drafter_runner(rows=6, compile=True)]
    runs[1].speculator.warm_up()
    assert runs[1].speculator.compiled is not None
    histories = [rng.integers(20, 40, 60).tolist() for _ in range(4)]
    ids = [request_id(prompt_key(PROMPT)) for _ in range(6)]
    for run in runs:
        run.speculator.update(prompt_key(PROMPT), len(PROMPT), True, RULE, histories, None)
        run.schedule(added=[(r, PROMPT, []) for r in ids])
    where = dict.fromkeys(ids, 0)
    for step in range(12):
        sampled = {}
        for i, r in enumerate(ids):
            n = int(rng.integers(1, K + 2))
            sampled[r], where[r] = histories[i % 4][where[r] : where[r] + n] or [7], where[r] + n
        drafts = [run.step(sampled, dict.fromkeys(ids, 1)) for run in runs]
        one, two = (run.speculator for run in runs)
        assert drafts[0] == drafts[1] and torch.equal(one.confidences, two.confidences), step
        assert torch.equal(one.acceptance.fine, two.acceptance.fine) and torch.equal(one.store.table, two.store.table)
