"""`lossless` verified inside vLLM: a proposer that drafts from each prompt's history at every decoding step.

vLLM's rejection sampler, given a draft without draft probabilities (a model-free proposer), keeps draft token y with
probability p(y) under the request's own sampling settings and otherwise samples p without y: the fixed-proposal rule,
exact whatever produced the draft. `HistoryProposer` is such a proposer (`speculative_config={"method":
"custom_class", "model": PROPOSER, ...}`, `engine_kwargs`). At every step it proposes, for each batch row, the greedy
path below the row's cursor in the prompt's history (`history.History`, `proposal.propose`), re-entering on the
longest suffix match after a rejection, and then cuts every row's draft to the step's budget (`budget`): the slots
whose expected tokens pay for what they add to the step, by the step cost it measures (the time between its calls)
and the acceptance it learns (what each row then sampled).

How a history reaches it. The proposer runs in the engine-core process and sees token ids per batch row, not request
ids. The rollout (`engine_path.HistoryChannel`) registers each prompt's history there with `collective_rpc`
(`update_histories`, run in every worker with the worker as its first argument), keyed by the prompt's digest
(`cache.prompt_key`); the proposer finds a row's prompt by the digest of its leading tokens (a new row has sampled one
token after its prompt; a resumed one is looked up at every prompt length registered). vLLM builds no logits
processors under speculative decoding, so the logits-processor registry cannot carry it (docs/design.md). A row whose
prompt is unknown gets no draft and decodes as usual; a proposal never depends on the row's own randomness to come, so
a late, missing or wrong history costs speed, never exactness, and so does a budget.

A proposer that fails never stops the engine: its constructor and `propose` catch everything, log it once and propose
nothing, and `update_histories` then answers 0 proposers, which the rollout reads as "no proposer" and says so.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..budget import ANCHORED, REENTERED, AcceptanceModel, DraftBudget, SlotFeatures, StepCost, features
from ..cache import prompt_key
from ..history import History, logprob_floor
from ..proposal import propose

logger = logging.getLogger(__name__)

PROPOSER = f"{__name__}.HistoryProposer"
MAX_HISTORY_NODES = 1 << 21  # history nodes (about tokens) an engine keeps; least recently registered prompts go first
EXPLORE_EVERY = 16  # steps without a drafted slot, after which the likeliest one is drafted anyway: verdicts go on


@dataclass(frozen=True)
class ProposalSettings:
    """The rule's settings the proposer needs, sent with every history update (`engine_path.HistoryChannel`)."""

    min_match: int = 4
    min_accept_prob: float = 0.0
    budget: str = "goodput"  # "goodput": slots that pay for their cost; "static": up to k while p_prev allows


class HistoryBoard:
    """The histories registered in this process, by prompt digest, least recently registered evicted first; the
    rule's settings; and what the proposers of this process report (`report`)."""

    def __init__(self, max_nodes: int = MAX_HISTORY_NODES):
        self.max_nodes = max_nodes
        self.histories: OrderedDict[bytes, History] = OrderedDict()
        self.lengths: Counter[int] = Counter()  # prompt lengths registered, for rows found after a preemption
        self.prompt_len: dict[bytes, int] = {}
        self.nodes = 0
        self.version = 0  # bumped by every update: rows without a history look again
        self.proposers = 0  # proposers built in this process
        self.settings = ProposalSettings()
        self.reports: list = []  # the proposers' `BudgetReport`s

    def update(self, key: bytes, prompt_len: int, reset: bool, settings, responses, logprobs) -> None:
        """A prompt's history: `reset` starts it afresh (a new visit), else the responses are added to it;
        `settings`: the rule's `ProposalSettings` as a tuple."""
        self.settings = ProposalSettings(*settings)
        history = self.histories.pop(key, None)
        if history is None or reset:
            if history is not None:
                self.nodes -= history.num_nodes
                self.lengths[self.prompt_len[key]] -= 1
            history = History(self.settings.min_match)
            self.prompt_len[key] = int(prompt_len)
            self.lengths[int(prompt_len)] += 1
        before = history.num_nodes
        for tokens, lps in zip(responses, logprobs):
            if len(tokens):
                history.add(tokens, lps)
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

    def report(self) -> dict:
        """How many proposers run here, and what their budgets measured (summed over them)."""
        out = {"proposers": self.proposers}
        for report in self.reports:
            for name, value in report.as_dict().items():
                out[name] = out.get(name, 0.0) + value
        return out


BOARD = HistoryBoard()


def update_histories(worker, updates) -> dict:
    """Run by `collective_rpc` in every worker: `updates` is a list of `HistoryBoard.update`'s arguments (prompt
    digest, prompt length, reset, settings, responses, their log-probs), responses and log-probs as lists. Returns
    `HistoryBoard.report()`: "proposers" 0 means none runs here, so the histories will not be used."""
    for key, prompt_len, reset, settings, responses, logprobs in updates:
        BOARD.update(bytes(key), int(prompt_len), bool(reset), settings, responses, logprobs)
    return BOARD.report()


class BudgetReport:
    """What one proposer's budget measured: decayed sums over recent steps and verdicts (about the last `half_life`),
    the step cost's parameters and fit, and acceptance predicted against observed per predicted decile. Sums, so that
    a process's proposers and an engine's workers add up (`HistoryBoard.report`)."""

    def __init__(self, half_life: float = 2048.0):
        self.decay = 0.5 ** (1.0 / half_life)
        self.sums = dict.fromkeys(("steps", "slots", "verdicts", "predicted", "accepted"), 0.0)
        self.cost = np.zeros(3)
        self.cost_error = 0.0
        self.deciles: list[list[float]] = []

    def step(self, slots: int) -> None:
        self.sums["steps"] = self.sums["steps"] * self.decay + 1.0
        self.sums["slots"] = self.sums["slots"] * self.decay + slots

    def verdict(self, predicted: float, accepted: bool) -> None:
        for name, value in (("verdicts", 1.0), ("predicted", predicted), ("accepted", float(accepted))):
            self.sums[name] = self.sums[name] * self.decay + value

    def as_dict(self) -> dict[str, float]:
        base, per_row, per_token = (float(x) for x in self.cost)
        out = {**self.sums, "reports": 1.0, "cost_base_s": base, "cost_row_s": per_row, "cost_token_s": per_token}
        out["cost_error"] = self.cost_error
        for decile, (verdicts, predicted, accepted) in enumerate(self.deciles):
            out.update({f"decile{decile}_verdicts": verdicts, f"decile{decile}_predicted": predicted})
            out[f"decile{decile}_accepted"] = accepted
        return out


@dataclass
class Row:
    """What the proposer knows of one batch row between steps."""

    first: int  # the row's first token, and
    last: int  # its last token when seen: a different request in the row shows up in either or in the length
    seen: int  # tokens of the row seen (prompt + response so far)
    prompt_len: int = 0
    history: History | None = None
    version: int = -1  # the board's version when the row last looked for its history
    cursor: list[int] = field(default_factory=list)  # where the row stands in its history ([]: it left it)
    kind: int = ANCHORED  # how the cursor was found: from the root, or REENTERED on a suffix match
    match: int = 0  # a re-entry's match length, grown by the tokens the row took inside the history since
    draft: list[int] = field(default_factory=list)  # what the row was given to verify at the last step
    slots: list[SlotFeatures] = field(default_factory=list)  # each drafted slot's features
    predicted: list[float] = field(default_factory=list)  # and predicted acceptance


@dataclass
class Candidate:
    """A row's draft before the budget cuts it."""

    row: Row
    tokens: list[int]
    slots: list[SlotFeatures]
    acceptance: list[float]  # [k] predicted conditional acceptance per slot


class HistoryProposer:
    """vLLM's `custom_class` proposer: built in the engine-core process with the `VllmConfig`; `propose` returns the
    draft token ids of every batch row (empty where nothing is proposed)."""

    def __init__(self, vllm_config):
        self.k = 0
        self.max_model_len = 0
        self.rows: dict[int, Row] = {}
        self.cpu_fix_installed = False
        self.failed = False
        self.cost = StepCost()
        self.acceptance = AcceptanceModel()
        self.budget = DraftBudget()
        self.report = BudgetReport()
        self.clock = time.perf_counter  # what step times are read from
        self.last_call: float | None = None  # when the previous step's `propose` began
        self.idle_steps = 0  # steps since a slot was last drafted
        try:
            self.k = int(vllm_config.speculative_config.num_speculative_tokens)
            self.max_model_len = int(vllm_config.model_config.max_model_len)
            BOARD.proposers += 1
            BOARD.reports.append(self.report)
        except Exception as error:  # the engine must start whatever happens here
            self._fail(error)

    def load_model(self, *args, **kwargs) -> None:
        pass  # no model: drafts come from the history

    def _fail(self, error: Exception) -> None:
        if not self.failed:
            logger.warning("history proposer disabled (%s: %s): rows decode as usual", type(error).__name__, error)
        self.failed = True
        BOARD.proposers = 0

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None, **_) -> list:
        # sampled_token_ids: [B] lists of the tokens each row sampled this step (empty: still in prefill)
        # num_tokens_no_spec: [>= B] int, tokens per row (prompt + response so far); token_ids_cpu: [>= B, max_len]
        if self.failed:
            return [[] for _ in sampled_token_ids]
        try:
            now = self.clock()
            if not self.cpu_fix_installed:  # after every start-up override of vLLM's (see vllm_cpu_fix)
                from .vllm_cpu_fix import install

                install()
                self.cpu_fix_installed = True
            rows = len(sampled_token_ids)
            lengths = num_tokens_no_spec[:rows].tolist()
            states, carried, clean = [], 0, self.last_call is not None
            for row, sampled in enumerate(sampled_token_ids):  # the verdicts first: then the predictions are fresh
                state, drafted = self._follow(row, sampled, lengths[row], token_ids_cpu[row])
                clean &= drafted is not None  # a step that started a row ran its prefill too: not a decode's cost
                carried += 1 + (drafted or 0)
                states.append(state if sampled and state.history is not None else None)
            candidates = [None if state is None else self._candidate(state, n) for state, n in zip(states, lengths)]
            for row in [r for r in self.rows if r >= rows]:
                del self.rows[row]
            if clean:
                self.cost.observe(rows, carried, now - self.last_call)
                self.report.cost, self.report.cost_error = self.cost.params, self.cost.relative_error
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
            if state.history is not None:
                state.cursor = state.history.advance(state.cursor, taken)
                state.match += len(taken)
        if state.history is None and state.version != BOARD.version:
            state.version = BOARD.version
            state.history, state.prompt_len = BOARD.find(tokens, num_tokens, new)
            if state.history is not None:
                state.cursor = state.history.anchored(tokens[state.prompt_len : num_tokens].tolist())
                state.kind, state.match = ANCHORED, 0
        state.seen, state.last = num_tokens, tokens.item(num_tokens - 1)
        if state.history is not None and not state.cursor:  # left the history: the longest suffix match
            response = tokens[state.prompt_len : num_tokens].tolist()
            state.cursor = state.history.reentry(response)
            if state.cursor:
                state.kind, state.match = REENTERED, state.history.match_length(state.cursor[0], response)
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
        if state.history is None or not state.cursor or num_tokens >= self.max_model_len:
            return None
        settings = BOARD.settings
        floor = logprob_floor(settings.min_accept_prob) if settings.budget == "static" else float("-inf")
        proposed = propose(state.history, state.cursor, min(self.k, self.max_model_len - num_tokens), floor)
        if not proposed.tokens:
            return None
        slots = [features(state.kind, j, support, state.match + j) for j, support in enumerate(proposed.support)]
        return Candidate(state, proposed.tokens, slots, [self.acceptance.predict(slot) for slot in slots])

    def _allocate(self, candidates: list, rows: int) -> list[list[int]]:
        """Every row's draft, cut to the step's budget ("static": the whole candidate)."""
        live = [c for c in candidates if c is not None]
        if BOARD.settings.budget == "static":
            counts = [len(c.tokens) for c in live]
        else:
            counts = self.budget.allocate([c.acceptance for c in live], rows, self.cost.params)
            if live and not any(counts):
                self.idle_steps += 1
                if self.idle_steps >= EXPLORE_EVERY:  # one slot, the likeliest, so that acceptance is still learned
                    best = max(range(len(live)), key=lambda i: live[i].acceptance[0])
                    counts[best], self.idle_steps = 1, 0
            else:
                self.idle_steps = 0
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
        return drafts


def engine_kwargs(policy, base: dict | None = None) -> dict:
    """The engine arguments `base` (default: none) with what an engine needs for `policy`: for a rule verified in the
    engine, the proposer (drafting up to the rule's `num_speculative_tokens` k at a step), per-request acceptance
    counts (each verification step's drafted and accepted tokens) on every finished output, and where `base` sets
    `max_model_len`, k tokens of room past it. vLLM skips the proposer for a whole step, and has every row of the
    batch verify k dummy draft tokens (token 0), as soon as one sequence of the batch is within k tokens of
    `max_model_len` (docs/upstream.md): the room keeps that from happening to responses that stay within the
    length the caller planned. Nothing for any other rule (its engine must run logits-processor plugins, which vLLM
    does not build under speculative decoding)."""
    base = dict(base or {})
    if not policy.verifies_in_engine:
        return base
    k = int(policy.params.num_speculative_tokens)
    if base.get("max_model_len"):
        base["max_model_len"] = int(base["max_model_len"]) + k
    return {
        **base,
        "speculative_config": {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k},
        "per_request_spec_decode_metrics": "detailed",
        # a visit's samples are served in slot order: where the engine has more samples than slots, later ones start
        # after earlier ones finished, and draft from them too (`engine_path.EnginePathDriver`)
        "scheduling_policy": "priority",
    }
