"""`lossless` verified inside vLLM: a proposer that drafts from each prompt's history at every decoding step.

vLLM's rejection sampler, given a draft without draft probabilities (a model-free proposer), keeps draft token y with
probability p(y) under the request's own sampling settings and otherwise samples p without y: the fixed-proposal rule,
exact whatever produced the draft. `HistoryProposer` is such a proposer (`speculative_config={"method":
"custom_class", "model": PROPOSER, ...}`, `engine_kwargs`). At every step it proposes, for each batch row, the greedy
path below the row's cursor in the prompt's history (`history.History`, `proposal.propose`), and after a rejection it
re-enters on the longest suffix match.

How a history reaches it. The proposer runs in the engine-core process and sees token ids per batch row, not request
ids. The rollout (`engine_path.HistoryChannel`) registers each prompt's history there with `collective_rpc`
(`update_histories`, run in every worker with the worker as its first argument), keyed by the prompt's digest
(`cache.prompt_key`); the proposer finds a row's prompt by the digest of its leading tokens (a new row has sampled one
token after its prompt; a resumed one is looked up at every prompt length registered). vLLM builds no logits
processors under speculative decoding, so the logits-processor registry cannot carry it (docs/design.md). A row whose
prompt is unknown gets no draft and decodes as usual; a proposal never depends on the row's own randomness to come, so
a late, missing or wrong history costs speed, never exactness.

A proposer that fails never stops the engine: its constructor and `propose` catch everything, log it once and propose
nothing, and `update_histories` then answers 0, which the rollout reads as "no proposer" and says so.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..cache import prompt_key
from ..history import History, logprob_floor
from ..proposal import propose

logger = logging.getLogger(__name__)

PROPOSER = f"{__name__}.HistoryProposer"
MAX_HISTORY_TOKENS = 1 << 21  # history tokens an engine keeps (least recently registered prompts go first)


class HistoryBoard:
    """The histories registered in this process, by prompt digest, least recently registered evicted first, and the
    proposal's settings (the run's rule sends them with every update)."""

    def __init__(self, max_tokens: int = MAX_HISTORY_TOKENS):
        self.max_tokens = max_tokens
        self.histories: OrderedDict[bytes, History] = OrderedDict()
        self.lengths: Counter[int] = Counter()  # prompt lengths registered, for rows found after a preemption
        self.prompt_len: dict[bytes, int] = {}
        self.tokens = 0
        self.version = 0  # bumped by every update: rows without a history look again
        self.proposers = 0  # proposers built in this process
        self.floor = float("-inf")  # log of the rule's `min_accept_prob`

    def update(self, key: bytes, prompt_len: int, reset: bool, settings, responses, logprobs) -> None:
        """A prompt's history: `reset` starts it afresh (a new visit), else the responses are added to it;
        `settings`: the rule's (min_match, min_accept_prob)."""
        history = self.histories.pop(key, None)
        if history is None or reset:
            if history is not None:
                self.tokens -= history.num_nodes
                self.lengths[self.prompt_len[key]] -= 1
            history = History(int(settings[0]))
            self.prompt_len[key] = int(prompt_len)
            self.lengths[int(prompt_len)] += 1
        self.floor = logprob_floor(float(settings[1]))
        before = history.num_nodes
        for tokens, lps in zip(responses, logprobs):
            if len(tokens):
                history.add(tokens, lps)
        self.tokens += history.num_nodes - before
        self.histories[key] = history
        self.version += 1
        while self.tokens > self.max_tokens and len(self.histories) > 1:
            old_key, old = self.histories.popitem(last=False)
            self.tokens -= old.num_nodes
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


BOARD = HistoryBoard()


def update_histories(worker, updates) -> int:
    """Run by `collective_rpc` in every worker: `updates` is a list of `HistoryBoard.update`'s arguments (prompt
    digest, prompt length, reset, settings, responses, their log-probs), responses and log-probs as lists. Returns how
    many proposers this process runs (0: none, so the histories will not be used)."""
    for key, prompt_len, reset, settings, responses, logprobs in updates:
        BOARD.update(bytes(key), int(prompt_len), bool(reset), settings, responses, logprobs)
    return BOARD.proposers


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


class HistoryProposer:
    """vLLM's `custom_class` proposer: built in the engine-core process with the `VllmConfig`; `propose` returns the
    draft token ids of every batch row (empty where nothing is proposed)."""

    def __init__(self, vllm_config):
        self.k = 0
        self.max_model_len = 0
        self.rows: dict[int, Row] = {}
        self.cpu_fix_installed = False
        self.failed = False
        try:
            self.k = int(vllm_config.speculative_config.num_speculative_tokens)
            self.max_model_len = int(vllm_config.model_config.max_model_len)
            BOARD.proposers += 1
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
            if not self.cpu_fix_installed:  # after every start-up override of vLLM's (see vllm_cpu_fix)
                from .vllm_cpu_fix import install

                install()
                self.cpu_fix_installed = True
            drafts = []
            for row, sampled in enumerate(sampled_token_ids):
                drafts.append(self._draft(row, sampled, int(num_tokens_no_spec[row]), token_ids_cpu[row]))
            for row in [r for r in self.rows if r >= len(sampled_token_ids)]:
                del self.rows[row]
            return drafts
        except Exception as error:
            self._fail(error)
            return [[] for _ in sampled_token_ids]

    def _draft(self, row: int, sampled, num_tokens: int, tokens: np.ndarray) -> list[int]:
        new = len(sampled)
        if not new:
            return []
        state = self.rows.get(row)
        if (
            state is None
            or state.seen + new != num_tokens
            or int(tokens[0]) != state.first
            or int(tokens[state.seen - 1]) != state.last
        ):  # a request new to this row
            state = self.rows[row] = Row(int(tokens[0]), -1, 0)
        elif state.history is not None:
            state.cursor = state.history.advance(state.cursor, tokens[state.seen : num_tokens].tolist())
        if state.history is None and state.version != BOARD.version:
            state.version = BOARD.version
            state.history, state.prompt_len = BOARD.find(tokens, num_tokens, new)
            if state.history is not None:
                state.cursor = state.history.anchored(tokens[state.prompt_len : num_tokens].tolist())
        state.seen, state.last = num_tokens, int(tokens[num_tokens - 1])
        history = state.history
        if history is None or num_tokens >= self.max_model_len:
            return []
        if not state.cursor:  # left the history (or entered it late): the longest suffix match
            state.cursor = history.reentry(tokens[state.prompt_len : num_tokens].tolist())
        return propose(history, state.cursor, min(self.k, self.max_model_len - num_tokens), BOARD.floor)


def engine_kwargs(policy) -> dict:
    """What an engine needs for `policy`: for a rule verified in the engine, the proposer (drafting up to the rule's
    `num_speculative_tokens` at a step) and per-request acceptance counts (each verification step's drafted and
    accepted tokens) on every finished output; nothing for any other rule (its engine must run logits-processor
    plugins, which vLLM does not build under speculative decoding)."""
    if not policy.verifies_in_engine:
        return {}
    return {
        "speculative_config": {
            "method": "custom_class",
            "model": PROPOSER,
            "num_speculative_tokens": int(policy.params.num_speculative_tokens),
        },
        "per_request_spec_decode_metrics": "detailed",
        # a visit's samples are served in slot order: where the engine has more samples than slots, later ones start
        # after earlier ones finished, and draft from them too (`engine_path.EnginePathDriver`)
        "scheduling_policy": "priority",
    }
