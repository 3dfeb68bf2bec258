"""The histories an engine's proposers draft from, registered from the rollout over `collective_rpc`.

The proposer (`proposer.HistoryProposer`) runs in the engine-core process and sees token ids per batch row, not
request ids. The rollout (`rollout.engine_path.HistoryChannel`) registers each prompt's history here with
`collective_rpc` (`update_histories`, run in every worker with the worker as its first argument), keyed by the
prompt's digest (`cache.prompt_key`), with the rule's parameters (`LosslessParams`: the one declaration of the
proposer's settings). The proposer finds a row's prompt by the digest of its leading tokens (`HistoryBoard.find`).
Every response registered also joins one *shared* history of the engine's recent responses, all prompts together
(`SharedHistory`, with `LosslessParams.shared`): where a row's own prompt has no history, or its own history holds no
suffix of the row, the proposer re-enters there, as vLLM's suffix decoding does with its global tree. It is a fixed
proposal like the prompt's own history (it depends on earlier responses and the row's own tokens, never on its
randomness to come), so exactness does not depend on it.
What the proposers' budgets measured comes back with every update (`HistoryBoard.report`); the diagnostics only a
benchmark reads (the cost fit's error, calibration by decile) have a call of their own (`budget_details`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, OrderedDict, deque

import numpy as np

from ...budget import BudgetReport
from ...cache import prompt_key
from ...history import History
from ...policies.builtin import LosslessParams
from ...step_curve import StepCurve

MAX_HISTORY_NODES = 1 << 21  # history nodes (about tokens) an engine keeps; least recently registered prompts go first
MAX_SHARED_NODES = 1 << 18  # the shared history's nodes; past them it is rebuilt from its newer half of responses
SHARED_ENDS = 32  # a re-entry in the shared history weighs the newest places its suffix ends at, at most this many


class SharedHistory:
    """The engine's recent responses, every prompt's, as one `History`, rebuilt from the newer half of them when it
    outgrows `max_nodes` (a trie only grows)."""

    def __init__(self, min_match: int, max_nodes: int = MAX_SHARED_NODES):
        self.max_nodes = max_nodes
        self.responses: deque[list[int]] = deque()
        self.history = History(min_match)

    def add(self, tokens: list[int]) -> None:
        self.responses.append(tokens)
        self.history.add(tokens)
        if self.history.num_nodes > self.max_nodes:
            for _ in range(len(self.responses) // 2):
                self.responses.popleft()
            self.history = History(self.history.min_match)
            for kept in self.responses:
                self.history.add(kept)


class HistoryBoard:
    """The histories registered in this process, by prompt digest, least recently registered evicted first; the
    shared history; the rule's settings; and what the proposers of this process report (`report`)."""

    SHARED_ENDS = SHARED_ENDS

    def __init__(self, max_nodes: int = MAX_HISTORY_NODES):
        self.max_nodes = max_nodes
        self.histories: OrderedDict[bytes, History] = OrderedDict()
        self.lengths: Counter[int] = Counter()  # prompt lengths registered, for rows found after a preemption
        self.prompt_len: dict[bytes, int] = {}
        self.nodes = 0
        self.version = 0  # bumped by every update: rows without a history look again
        self.proposers = 0  # proposers built in this process
        self.params = LosslessParams()  # the rule's parameters, as the latest update sent them
        self.curve: StepCurve | None = None  # the GPU step curve they carry, which the budget prices slots on
        self.reports: list[BudgetReport] = []  # the proposers' reports
        self._sent: dict | None = None
        self.shared = SharedHistory(self.params.min_match)

    def update(self, key: bytes, prompt_len: int, reset: bool, params: dict, responses, logprobs) -> None:
        """A prompt's history: `reset` starts it afresh (a new visit), else the responses are added to it; `params`:
        the rule's `LosslessParams` as a dict; logprobs: per response, a list or None (unknown p_prev)."""
        if params != self._sent:
            self.params, self._sent = LosslessParams(**params), params
            self.curve = StepCurve.from_data(self.params.cost_curve) if self.params.cost_curve else None
            if self.params.min_match != self.shared.history.min_match:
                self.shared = SharedHistory(self.params.min_match, self.shared.max_nodes)
        history = self.histories.pop(key, None)
        if history is None or reset:
            if history is not None:
                self.nodes -= history.num_nodes
                self.lengths[self.prompt_len[key]] -= 1
            history = History(self.params.min_match)
            self.prompt_len[key] = int(prompt_len)
            self.lengths[int(prompt_len)] += 1
        before = history.num_nodes
        for tokens, lps in zip(responses, logprobs):
            if len(tokens):
                history.add(tokens, lps)
                if self.params.shared:
                    self.shared.add(list(tokens))
        self.nodes += history.num_nodes - before
        self.histories[key] = history
        self.version += 1
        while self.nodes > self.max_nodes and len(self.histories) > 1:
            old_key, old = self.histories.popitem(last=False)
            self.nodes -= old.num_nodes
            self.lengths[self.prompt_len.pop(old_key)] -= 1

    def find(self, tokens: np.ndarray, num_tokens: int, new: int) -> tuple[History | None, int]:
        """The history of the row holding `tokens[:num_tokens]`, which just sampled `new` tokens, and its prompt's
        length: first the length a fresh row has (everything before its first sampled token), then every length
        registered (a row resumed after a preemption)."""
        guess = num_tokens - new
        for length in [guess, *sorted((n for n, c in self.lengths.items() if c > 0 and n != guess), reverse=True)]:
            if 0 < length < num_tokens:
                history = self.histories.get(prompt_key(tokens[:length]))
                if history is not None:
                    return history, length
        return None, 0

    def report(self, details: bool = False) -> dict:
        """How many proposers run here, and what their budgets measured (summed over them); with `details`, the
        diagnostics too (`BudgetReport.details`)."""
        out = {"proposers": self.proposers}
        for report in self.reports:
            for name, value in (report.details() if details else report.as_dict()).items():
                out[name] = out.get(name, 0.0) + value
        return out


BOARD = HistoryBoard()


def update_histories(worker, updates) -> dict:
    """Run by `collective_rpc` in every worker: `updates` is a list of `HistoryBoard.update`'s arguments (prompt
    digest, prompt length, reset, the rule's parameters, responses, their log-probs), responses and log-probs as lists.
    Returns `HistoryBoard.report()`: "proposers" 0 means none runs here, so the histories will not be used."""
    for key, prompt_len, reset, params, responses, logprobs in updates:
        BOARD.update(bytes(key), int(prompt_len), bool(reset), params, responses, logprobs)
    return BOARD.report()


def budget_details(worker) -> dict:
    """Run by `collective_rpc`: what `update_histories` answers, and the diagnostics only benchmarks read."""
    return BOARD.report(details=True)


def params_message(params: LosslessParams) -> dict:
    """The rule's parameters as `update_histories` carries them."""
    return dataclasses.asdict(params)
