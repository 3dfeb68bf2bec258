"""`lossless` verified inside vLLM: a proposer that drafts from each prompt's history at every decoding step.

vLLM's rejection sampler, given a draft without draft probabilities (a model-free proposer), keeps draft token y with
probability p(y) under the request's own sampling settings and otherwise samples p without y: the fixed-proposal rule,
exact whatever produced the draft. `HistoryProposer` is such a proposer (`speculative_config={"method":
"custom_class", "model": PROPOSER, ...}`, `engine_kwargs`). At every step it follows every batch row at once
(`rows.follow`, compiled): the row's response joins its prompt's trie as it is sampled (`arena`), and it proposes the
likeliest path below where it stands there, or where its last tokens re-enter best (its prompt's previous responses,
its siblings in flight, other prompts' responses, its prompt's text: `rows`). The step's budget (`budget`) then cuts
every row's draft to the slots whose expected tokens pay for what they add to the step, by the step cost it measures
(the time between its calls) or a GPU's step curve, and the acceptance it learns (what each row then sampled). Where
the budget gives nothing for `IDLE_STEPS` steps it sleeps (it still follows the rows, drafting nothing): a full batch
that drafts nothing pays little for it, and a shrinking batch (the tail) wakes it.

Histories reach it through `board` (queued over `collective_rpc`, inserted between steps; a row's prompt is found
by the digest of its leading tokens). A proposal never depends on the row's own randomness to come, so a late,
missing or wrong history costs speed, never exactness, and so does a budget.

A proposer that fails never stops the engine: its constructor and `propose` catch everything, log it once and propose
nothing, and `update_histories` then answers 0 proposers, which the rollout reads as "no proposer" and says so.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from ....budget import AcceptanceModel, BudgetReport, DraftBudget, DraftingCheck, survival_floor, within_room
from ....pricing.online import OnlineStepCost
from .. import plugin
from . import board as boards
from .arena import NONE, warn_if_interpreted
from .follow import (
    Arrivals,
    Sampled,
    Settings,
    anchor,
    decayed_sums,
    fit_step_cost,
    follow,
    goodput_allocate,
    record_step,
    record_verdicts,
    survey,
    warm_up,
)
from .rows import NEW, RowState

logger = logging.getLogger(__name__)

# Slots priced per candidate at least; then twice the most the last step's budget gave a row (it takes a prefix of
# each), so a full batch that drafts nothing prices 4 slots a row, not k, and a tail reaches k in two steps.
LOOKAHEAD = 4
# A budget that gave at most one slot (its exploring slot) for IDLE_STEPS steps in a row drafts nothing for the next
# SLEEP_STEPS, unless the batch shrinks below WAKE_SHARE of its size (a tail).
IDLE_STEPS, SLEEP_STEPS, WAKE_SHARE = 16, 32, 0.75


class HistoryProposer:
    """vLLM's `custom_class` proposer: built in the engine-core process with the `VllmConfig`; `propose` returns the
    draft token ids of every batch row (empty where nothing is proposed)."""

    def __init__(self, vllm_config):
        self.k, self.max_model_len, self.token_budget, self.failed = 0, 0, 0, False
        self.lookahead = LOOKAHEAD  # slots a candidate is priced for: the budget never took more than half of them
        self.idle, self.asleep, self.idle_rows = 0, 0, 0  # steps given nothing in a row; asleep for; at batch size
        self.cost = OnlineStepCost(record=record_step, fit=fit_step_cost)
        self.acceptance = AcceptanceModel(record=record_verdicts)
        self.budget = DraftBudget(goodput=goodput_allocate)
        self.check = DraftingCheck()
        self.report = BudgetReport(sums=decayed_sums)
        self.clock = time.perf_counter  # what step times are read from
        self.last_call: float | None = None  # when the previous step's `propose` began
        self.followed = 0  # rows followed at the last step
        try:
            self.k = int(vllm_config.speculative_config.num_speculative_tokens)
            self.max_model_len = int(vllm_config.model_config.max_model_len)
            # vLLM cuts drafts past its token budget in queue order, and a row left no token waits the step out: the
            # slots are held to what a step carries once every row has its token (0: no budget read)
            scheduler = getattr(vllm_config, "scheduler_config", None)
            self.token_budget = int(getattr(scheduler, "max_num_batched_tokens", 0) or 0)
            self.rows = RowState(self.k)
            boards.BOARD.proposers += 1
            boards.BOARD.reports.append(self.report)
            warn_if_interpreted()
            warm_up(self.k, self.max_model_len)
        except Exception as error:  # the engine must start whatever happens here
            self._fail(error)
        plugin.register()  # where `VLLM_PLUGINS` left our plugin out: the CPU fixes, before the engine's first step

    def load_model(self, *args, **kwargs) -> None:
        pass  # no model: drafts come from the history

    def _fail(self, error: Exception) -> None:
        if not self.failed:
            logger.warning("history proposer disabled (%s: %s): rows decode as usual", type(error).__name__, error)
        self.failed = True
        boards.BOARD.proposers = 0

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **_) -> list:
        # sampled_token_ids: [B] lists of the tokens each row sampled this step (empty: still in prefill)
        # num_tokens_no_spec: [>= B] int, tokens per row (prompt + response so far); token_ids_cpu: [>= B, max_len]
        if self.failed:
            return [[] for _ in sampled_token_ids]
        try:
            start = time.perf_counter()
            drafts = self._propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
            self.report.time(time.perf_counter() - start, len(sampled_token_ids))  # serial in vLLM: a step's cost
            return drafts
        except Exception as error:
            self._fail(error)
            return [[] for _ in sampled_token_ids]

    def _propose(self, sampled, num_tokens, token_ids) -> list:
        now, rows, board, state = self.clock(), len(sampled), boards.BOARD, self.rows
        if state.capacity < rows:
            state.grow(2 * rows)
        state.on_arena(board.version)
        state.judged[0] = 0
        if board.pending:  # responses of rows followed until now were inserted in flight: skipped when registered
            followed = np.flatnonzero(state.seen[: self.followed] > 0)
            board.drain(set(state.slot[followed].tolist()), set(state.hash[followed].tolist()))
            state.on_arena(board.version)  # the drain may have rebuilt the arena (past history_mb)
        new = np.fromiter(map(len, sampled), np.int32, rows)  # the one pass over vLLM's lists: counts, not tokens
        idle = np.flatnonzero((new == 0) & (state.seen[:rows] > 0)) if not new.all() else new[:0]  # left: `_leave`
        decode, given, produced, before = survey(state.seen, state.drafted, new, num_tokens, rows)
        if self.last_call is not None and decode:
            self._observe(now - self.last_call, rows, rows + given, produced, before)
        self.last_call = now
        awake = self._awake(rows)
        params = board.params
        table = self.acceptance.table if awake else np.zeros(0)  # no table: follow the rows, propose nothing
        cost, margin = self._cost(rows, before + produced)
        floor = -1.0 if params.budget == "static" else survival_floor(rows, *cost.tolist())  # slots that can't pay
        settings = Settings(
            params.min_match, min(self.k, self.lookahead), self.max_model_len, params.shared, table, floor
        )
        arena, at, out = board.arena, state.kernel_args(), state.outputs
        arena.reserve(produced)
        step = Sampled(state.index[:rows], new, num_tokens, token_ids)
        arena.size = follow(arena.arrays, arena.size, step, at, settings, out)
        unknown = np.flatnonzero(state.status[:rows] == NEW)
        if len(unknown) or len(idle) or self.followed > rows:
            self._leave(rows, unknown, idle)
        if len(unknown):
            moved = state.moved(unknown, range(rows, self.followed), num_tokens[:rows] - new, token_ids)
            if len(moved):  # their drafts are judged where they went
                arena.size = follow(arena.arrays, arena.size, step._replace(indices=moved), at, settings, out)
                unknown = np.setdiff1d(unknown, moved)
            if len(unknown):
                self._anchor(unknown, new, num_tokens, token_ids, settings)
        self.followed = rows
        self._verdicts()
        self.report.deciles = self.acceptance.deciles
        if not awake:
            self.report.step(0)
            return [[] for _ in range(rows)]
        return self._allocate(rows, cost, margin)

    def _observe(self, seconds: float, rows: int, carried: int, produced: int, context: float) -> None:
        """The step that ran (it started no row: a decode's cost): its cost, and whether its drafts paid."""
        self.cost.observe(rows, carried, seconds, context)
        plain_s, gain = self.cost.predict(rows, rows, context), self.budget.predicted_gain
        self.check.observe(rows, carried - rows, produced, seconds, plain_s, gain)
        self.report.cost, self.report.cost_error = self.cost.params, self.cost.relative_error
        self.report.margin, self.report.plain_scale = self.check.margin, self.check.plain_scale

    def _awake(self, rows: int) -> bool:
        if not self.asleep:
            return True
        if rows >= WAKE_SHARE * self.idle_rows:
            self.asleep -= 1
            return False
        self.asleep = 0  # a tail: where drafting may pay again
        return True

    def _leave(self, rows: int, new: np.ndarray, idle: np.ndarray) -> None:
        """Requests no longer followed where they were (finished, moved or preempted: their row is past the batch or
        holds another request, `new` or in prefill, `idle`): their responses were inserted in flight, so the same
        response registered later, or the request resumed (`HistoryBoard.find`), is not counted again."""
        state, by_id = self.rows, boards.BOARD.by_id
        gone = np.concatenate([new, state.index[rows : self.followed]])
        for r in np.concatenate([gone[state.seen[gone] > 0], idle]).tolist():
            slot = by_id.get(int(state.slot[r]))
            if slot is not None:
                slot.in_flight.add(int(state.hash[r]))

    def _anchor(self, fresh, lengths, num_tokens, token_ids, settings: Settings) -> None:
        """Requests new to their rows: their prompt's slot (`HistoryBoard.find`), their response so far its path."""
        board, state = boards.BOARD, self.rows
        roots, slots, inserted = (np.full(len(fresh), NONE, np.int64) for _ in range(3))
        for i, r in enumerate(fresh.tolist()):
            slot, prompt_len, inserted[i] = board.find(token_ids[r], int(num_tokens[r]), int(lengths[r]))
            if slot is not None:
                roots[i], slots[i], state.prompt_len[r] = slot.root, slot.id, prompt_len
        arena = board.arena
        arena.reserve(int(num_tokens[fresh].sum()))
        arrivals = Arrivals(fresh, roots, slots, inserted, num_tokens, token_ids)
        arena.size = anchor(arena.arrays, arena.size, arrivals, state.kernel_args(), settings, state.outputs)

    def _verdicts(self) -> None:
        """What the engine kept of the rows' last drafts (`follow` gathered the verdicts): learned, and reported."""
        state = self.rows
        n = int(state.judged[0])
        if n:
            hits, predicted = state.judged_hit[:n], state.judged_predicted[:n]
            self.acceptance.observe(state.judged_bucket[:n], hits, predicted)
            self.report.verdicts(predicted, hits)

    def _cost(self, rows: int, context: float) -> tuple[np.ndarray, float]:
        """The step's cost model (base, per row, per token) at its rows' KV `context` (summed), and the gain its
        drafts must clear (`DraftingCheck`)."""
        params, curve = boards.BOARD.params, boards.BOARD.curve
        if curve is not None:  # slots priced on a GPU's curve: this machine's steps are set aside, the check too
            return curve.budget_cost(rows, params.cost_scale, context / max(rows, 1)), 0.0
        return self.cost.at(context), math.inf if self.check.probe() else self.check.margin

    def _allocate(self, rows: int, cost: np.ndarray, margin: float) -> list[list[int]]:
        """Every row's draft, cut to the step's budget (`DraftBudget`): its candidate's first slots (`follow` judges
        them at the next step)."""
        state, params = self.rows, boards.BOARD.params
        length = state.length[:rows]  # 0 where a row has no candidate
        room = max(self.token_budget - rows, 0) if self.token_budget else -1
        if not length.any():
            counts = np.zeros(rows, np.int64)
        elif params.budget == "static":  # every slot while the paths' share of the history says it may be kept
            valid = np.arange(self.k)[None, :] < length[:, None]
            kept = np.cumprod(np.where(valid, state.support[:rows], 0.0), axis=1) >= params.min_accept_prob
            counts, self.budget.predicted_gain = within_room((kept & valid).sum(axis=1), room), None
        else:
            counts = self.budget.allocate(state.cand_accept[:rows], length, rows, cost, params.budget, margin, room)
        state.drafted[:rows] = counts
        total, most = int(counts.sum()), int(counts.max(initial=0))
        self.report.step(total)
        self.lookahead = max(LOOKAHEAD, 2 * most)  # a budget takes a prefix of each candidate
        self.idle = 0 if total > 1 else self.idle + 1  # one slot: the budget's exploring slot, or as little
        if self.idle >= IDLE_STEPS:
            self.idle, self.asleep, self.idle_rows = 0, SLEEP_STEPS, rows
        drafts: list[list[int]] = [[] for _ in range(rows)]
        if total:  # the rows given a draft, each its candidate's first `count` tokens
            given = np.flatnonzero(counts)
            for r, count, row in zip(given.tolist(), counts[given].tolist(), state.cand[given, :most].tolist()):
                del row[count:]
                drafts[r] = row
        return drafts
