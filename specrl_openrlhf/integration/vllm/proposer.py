"""`lossless` verified inside vLLM: a proposer that drafts from each prompt's history at every decoding step.

vLLM's rejection sampler, given a draft without draft probabilities (a model-free proposer), keeps draft token y with
probability p(y) under the request's own sampling settings and otherwise samples p without y: the fixed-proposal rule,
exact whatever produced the draft. `HistoryProposer` is such a proposer (`speculative_config={"method":
"custom_class", "model": PROPOSER, ...}`, `engine_kwargs`). At every step it proposes, for each batch row, the greedy
path below the row's cursor in the prompt's history (`history.History`, `proposal.propose`), re-entering on the
longest suffix match after a rejection (there, else in the shared history of the engine's other prompts or the row's
own tokens), and cuts every row's draft to the step's budget (`budget`): the slots whose expected tokens pay for what
they add to the step, by the step cost it measures (the time between its calls) and the acceptance it learns (what
each row then sampled). Where the budget gives nothing for `IDLE_STEPS` steps, it sleeps: a full batch that drafts
nothing pays little for it, and a shrinking batch (the tail) wakes it.

Histories reach it through `histories` (registered over `collective_rpc`; a row's prompt is found by the digest of
its leading tokens). A proposal never depends on the row's own randomness to come, so a late, missing or wrong
history costs speed, never exactness, and so does a budget.

A proposer that fails never stops the engine: its constructor and `propose` catch everything, log it once and propose
nothing, and `update_histories` then answers 0 proposers, which the rollout reads as "no proposer" and says so.
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

import numpy as np

from ...budget import (
    AcceptanceModel,
    BudgetReport,
    DraftBudget,
    DraftingCheck,
    SlotFeatures,
    StepCost,
    features,
)
from ...history import logprob_floor
from . import histories, plugin
from .rows import Row

logger = logging.getLogger(__name__)

# Slots priced per candidate at least; then twice the most the last step's budget gave a row (it takes a prefix of
# each), so a full batch that drafts nothing prices 4 slots a row, not k, and a tail reaches k in two steps.
LOOKAHEAD = 4
# A budget that gave at most one slot (its exploring slot) for IDLE_STEPS steps in a row is not asked for the next
# SLEEP_STEPS (following the rows costs a small model's step several percent), unless the batch shrinks below
# WAKE_SHARE of its size (a tail).
IDLE_STEPS, SLEEP_STEPS, WAKE_SHARE = 16, 32, 0.75


class Candidate(NamedTuple):
    """A row's draft before the budget cuts it, each slot's features and predicted conditional acceptance ([k])."""

    row: Row
    tokens: list[int]
    slots: list[SlotFeatures]
    acceptance: list[float]


class HistoryProposer:
    """vLLM's `custom_class` proposer: built in the engine-core process with the `VllmConfig`; `propose` returns the
    draft token ids of every batch row (empty where nothing is proposed)."""

    def __init__(self, vllm_config):
        self.k, self.max_model_len, self.failed = 0, 0, False
        self.lookahead = LOOKAHEAD  # slots a candidate is priced for: the budget never took more than half of them
        self.idle, self.asleep, self.idle_rows = 0, 0, 0  # steps given nothing in a row; asleep for; at batch size
        self.rows: dict[int, Row] = {}
        self.cost = StepCost()
        self.acceptance = AcceptanceModel()
        self.budget = DraftBudget()
        self.check = DraftingCheck()
        self.report = BudgetReport()
        self.clock = time.perf_counter  # what step times are read from
        self.last_call: float | None = None  # when the previous step's `propose` began
        try:
            self.k = int(vllm_config.speculative_config.num_speculative_tokens)
            self.max_model_len = int(vllm_config.model_config.max_model_len)
            histories.BOARD.proposers += 1
            histories.BOARD.reports.append(self.report)
        except Exception as error:  # the engine must start whatever happens here
            self._fail(error)
        plugin.register()  # where `VLLM_PLUGINS` left our plugin out: the CPU fixes, before the engine's first step

    def load_model(self, *args, **kwargs) -> None:
        pass  # no model: drafts come from the history

    def _fail(self, error: Exception) -> None:
        if not self.failed:
            logger.warning("history proposer disabled (%s: %s): rows decode as usual", type(error).__name__, error)
        self.failed = True
        histories.BOARD.proposers = 0

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **_) -> list:
        # sampled_token_ids: [B] lists of the tokens each row sampled this step (empty: still in prefill)
        # num_tokens_no_spec: [>= B] int, tokens per row (prompt + response so far); token_ids_cpu: [>= B, max_len]
        board = histories.BOARD
        if self.failed or (not board.histories and board.shared.history.num_nodes <= 1):  # nothing to draft from
            self.rows.clear()
            self.last_call = None
            return [[] for _ in sampled_token_ids]
        rows = len(sampled_token_ids)
        if self.asleep:
            if rows >= WAKE_SHARE * self.idle_rows:
                self.asleep -= 1
                self.report.step(0)
                return [[] for _ in sampled_token_ids]
            self.asleep = 0  # a tail: where drafting may pay again
        try:
            now = self.clock()
            lengths = num_tokens_no_spec[:rows].tolist()
            states, carried, clean = [], 0, self.last_call is not None
            for row, sampled in enumerate(sampled_token_ids):  # the verdicts first: then the predictions are fresh
                state, drafted = self._follow(row, sampled, lengths[row], token_ids_cpu[row])
                clean &= drafted is not None  # a step that started a row ran its prefill too: not a decode's cost
                carried += 1 + (drafted or 0)
                states.append(state if sampled and state.placed else None)
            candidates = [None if state is None else self._candidate(state, n) for state, n in zip(states, lengths)]
            for row in [r for r in self.rows if r >= rows]:
                del self.rows[row]
            if clean:  # the step that ran: its cost, and whether its drafts paid (`DraftingCheck`)
                seconds, produced = now - self.last_call, sum(len(s) for s in sampled_token_ids)
                self.cost.observe(rows, carried, seconds)
                plain_s, gain = self.cost.predict(rows, rows), self.budget.predicted_gain
                self.check.observe(rows, carried - rows, produced, seconds, plain_s, gain)
                self.report.cost, self.report.cost_error = self.cost.params, self.cost.relative_error
                self.report.margin, self.report.plain_scale = self.check.margin, self.check.plain_scale
            self.report.deciles = self.acceptance.deciles
            self.last_call = now
            return self._allocate(candidates, rows)
        except Exception as error:
            self._fail(error)
            return [[] for _ in sampled_token_ids]

    def _follow(self, row: int, sampled, num_tokens: int, tokens: np.ndarray) -> tuple[Row, int | None]:
        """The row's state after the step: its verdicts on what it was given, and its cursor moved on. Returns it and
        the draft tokens the step carried for it, None if the row did not hold the same request at the last step."""
        new = len(sampled)
        state = self.rows.get(row)
        if state is not None and new and state.seen + new == num_tokens and tokens.item(0) == state.first:
            recent = tokens[state.seen - 1 : num_tokens].tolist()  # the token seen last, then those taken since
            continuing = recent[0] == state.last
        else:
            continuing = False
        drafted = None
        if not continuing:  # a request new to this row (or still in its prefill)
            state = self.rows[row] = Row(tokens.item(0), -1, 0)
            if not new:
                return state, None
        else:
            drafted = len(state.draft)
            taken = recent[1:]
            if state.draft:
                self._verdicts(state, taken)
            state.advance(taken)
        if state.history is None and state.version != histories.BOARD.version:
            state.anchor(histories.BOARD, tokens, num_tokens, new)
        state.seen, state.last = num_tokens, tokens.item(num_tokens - 1)
        if not state.placed:  # left where it stood, or never stood anywhere: the longest suffix match
            state.reenter(histories.BOARD, tokens, num_tokens)
        return state, drafted

    def _verdicts(self, state: Row, taken: list[int]) -> None:
        """What the engine kept of the row's last draft: one-hot verification accepted its slots up to the first
        token the row did not take; the slots after that one were not verified."""
        if not state.draft:
            return
        for j, (token, slot, predicted) in enumerate(zip(state.draft, state.slots, state.predicted)):
            accepted = j < len(taken) and taken[j] == token
            self.acceptance.observe(slot, accepted, predicted)
            self.report.verdict(predicted, accepted)
            if not accepted:
                break
        state.draft, state.slots, state.predicted = [], [], []

    def _candidate(self, state: Row, num_tokens: int) -> Candidate | None:
        """The row's greedy draft (up to k tokens) with each slot's features and predicted acceptance."""
        if not state.placed or num_tokens >= self.max_model_len:
            return None
        params = histories.BOARD.params
        floor = logprob_floor(params.min_accept_prob) if params.budget == "static" else float("-inf")
        proposed = state.proposal(min(self.k, self.lookahead, self.max_model_len - num_tokens), floor)
        if not proposed.tokens:
            return None
        slots = [features(state.kind, j, support, state.match + j) for j, support in enumerate(proposed.support)]
        return Candidate(state, proposed.tokens, slots, [self.acceptance.predict(slot) for slot in slots])

    def _allocate(self, candidates: list, rows: int) -> list[list[int]]:
        """Every row's draft, cut to the step's budget (`DraftBudget`)."""
        live = [c for c in candidates if c is not None]
        params, curve = histories.BOARD.params, histories.BOARD.curve
        if curve is not None:  # slots priced on a GPU's curve: this machine's steps are set aside, the check too
            cost, margin = curve.budget_cost(rows, params.cost_scale), 0.0
        else:
            cost, margin = self.cost.params, math.inf if self.check.probe() else self.check.margin
        counts = self.budget.allocate([c.acceptance for c in live], rows, cost, params.budget, margin)
        drafts, given = [], dict(zip(map(id, live), counts))
        for candidate in candidates:
            n = 0 if candidate is None else given[id(candidate)]
            if n:
                state = candidate.row
                state.draft, state.slots = candidate.tokens[:n], candidate.slots[:n]
                state.predicted = candidate.acceptance[:n]
                drafts.append(state.draft)
            else:
                drafts.append([])
        self.report.step(sum(counts))
        self.lookahead = max(LOOKAHEAD, 2 * max(counts, default=0))  # a budget takes a prefix of each candidate
        self.idle = 0 if sum(counts) > 1 else self.idle + 1  # one slot: the budget's exploring slot, or as little
        if self.idle >= IDLE_STEPS:  # rows are followed afresh after the sleep: where they stand is not kept
            self.idle, self.asleep, self.idle_rows, self.last_call = 0, SLEEP_STEPS, rows, None
            self.rows.clear()
        return drafts
