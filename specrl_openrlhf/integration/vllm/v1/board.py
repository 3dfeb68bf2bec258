"""The V1 proposer's histories (vLLM <= 0.33): the board of this process, every prompt's trie in one arena.

The proposer (`proposer.HistoryProposer`) runs in the engine-core process and sees token ids per batch row, not
request ids. The rollout's updates (`..histories`: the format both engines share, carried by `collective_rpc`) reach
`HistoryBoard.update`, keyed by the prompt's digest (`cache.prompt_key`), with the rule's parameters
(`LosslessParams`: the one declaration of the proposer's settings). `update` only queues: the proposer inserts queued
responses into the arena (`arena.Arena`) a bounded slice of time per step (`HistoryBoard.drain`), so registering a
step's histories never holds an engine step for long. (A time budget is right here, where the engine-core process has
one proposer; the V2 speculator, built once per tensor-parallel rank, applies its updates by count instead.)

A prompt's *slot* (`Slot`) is its trie in the arena: its previous responses, its rows' responses in flight, and its
prompt's text; rows find it by the digest of their leading tokens (`HistoryBoard.find`), and a prompt that has no
history yet gets an empty slot, which its rows in flight then fill for one another. Every slot's nodes are indexed
together, so a row re-enters in any prompt's responses (the shared history, as vLLM's suffix decoding's global tree).
Memory is bounded by `LosslessParams.history_mb`: past it, the arena is rebuilt from the slots of the rows in flight
and the latest registered, the prompts whose next visit is furthest away (those that just left) going first.
What the proposers' budgets measured comes back with every update (`HistoryBoard.report`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from ....budget import BudgetReport
from ....cache import prompt_key
from ....policies.builtin import LosslessParams
from ....pricing.curves import StepPrice
from ....pricing.prices import load_price
from ..hashing import token_hash
from .arena import Arena

logger = logging.getLogger(__name__)

DRAIN_S = 0.002  # history updates a step may insert, in seconds of this process's time


@dataclass
class Slot:
    """A prompt's trie in the arena: its id (the arena's owner ids 2 id and 2 id + 1: responses and prompt text),
    roots, prompt, the responses registered (to rebuild it), and those of its rows inserted in flight."""

    id: int
    root: int
    prompt_len: int
    prompt: np.ndarray
    responses: list[np.ndarray] = field(default_factory=list)
    in_flight: set[int] = field(default_factory=set)  # `hashing.token_hash`es
    registered: bool = False  # whether the rollout sent the prompt's history (else: only its rows in flight)


class HistoryBoard:
    """The slots of this process, by prompt digest (least recently used first); queued updates; the rule's settings;
    and what the proposers of this process report (`report`)."""

    def __init__(self):
        self.arena = Arena()
        self.slots: OrderedDict[bytes, Slot] = OrderedDict()
        self.by_id: dict[int, Slot] = {}
        self.lengths: Counter[int] = Counter()  # prompt lengths registered, for rows found after a preemption
        self.pending: deque[tuple] = deque()
        self.next_id = 0
        self.version = 0  # bumped by every rebuild: rows are followed afresh
        self.proposers = 0  # proposers built in this process
        self.params = LosslessParams()  # the rule's parameters, as the latest update sent them
        self.curve: StepPrice | None = None  # the GPU step price they carry, which the budget prices slots on
        self.reports: list[BudgetReport] = []  # the proposers' reports
        self.over_budget = False
        self._sent: dict | None = None

    def update(self, key: bytes, prompt_len: int, reset: bool, params: dict, responses, logprobs=None) -> None:
        """Queue a prompt's history: `reset` starts its visit (its previous responses), else finished responses of
        the visit join it; `params`: the rule's `LosslessParams` as a dict. Log-probs are not used here."""
        if params != self._sent:
            self.params, self._sent = LosslessParams(**params), params
            self.curve = load_price(self.params.cost_curve) if self.params.cost_curve else None
        self.pending.append((bytes(key), int(prompt_len), bool(reset), [np.asarray(r, np.int32) for r in responses]))

    def drain(self, live: set[int], inserted: set[int] = frozenset(), seconds: float = DRAIN_S) -> None:
        """Insert queued updates for up to `seconds` (at least one); `live`: the slots of the rows in flight;
        `inserted`: the `hashing.token_hash`es of their responses so far (inserted in flight already)."""
        deadline = time.perf_counter() + seconds
        while self.pending:
            key, prompt_len, reset, responses = self.pending.popleft()
            slot = self.slots.get(key)
            if slot is not None and reset and slot.id not in live:  # a new visit: the history is the last one's
                slot = self._drop(key)
            if slot is None:
                slot = self._create(key, None, prompt_len)
            slot.registered = True
            self.slots.move_to_end(key)
            for response in responses:
                identity = token_hash(response) if len(response) else None
                if identity is not None and identity not in slot.in_flight and identity not in inserted:
                    slot.responses.append(response)
                    self.arena.insert(slot.root, response, 2 * slot.id, self.params.min_match)
            if time.perf_counter() > deadline:
                break
        if self.arena.nbytes > self.params.history_mb * (1 << 20):
            self.rebuild(live)

    def find(self, tokens: np.ndarray, num_tokens: int, new: int) -> tuple[Slot | None, int, int]:
        """The slot of the row holding `tokens[:num_tokens]`, which just sampled `new` tokens, its prompt's length, and
        where its tokens not in the slot yet start. First the length a fresh row has (everything before its first
        sampled token), then every length registered: a request resumed after a preemption (vLLM's
        `pause_generation(mode="keep")` preempts every running one), whose response before this step its row
        inserted before it left (`Slot.in_flight`), adds only what it sampled since. A fresh row whose prompt has none
        gets an empty slot."""
        guess = num_tokens - new
        for length in itertools.chain((guess,), self._other_lengths(guess)):  # the others only if the guess fails
            if 0 < length < num_tokens:
                key = prompt_key(tokens[:length])
                slot = self.slots.get(key)
                if slot is not None:
                    self.slots.move_to_end(key)
                    resumed = guess > length and token_hash(tokens[length:guess]) in slot.in_flight
                    return slot, length, guess if resumed else length
        if new != 1 or guess <= 0:
            return None, 0, 0
        return self._create(prompt_key(tokens[:guess]), np.asarray(tokens[:guess], np.int32), guess), guess, guess

    def _other_lengths(self, guess: int):
        yield from sorted((n for n, c in self.lengths.items() if c > 0 and n != guess), reverse=True)

    def _create(self, key: bytes, prompt: np.ndarray | None, prompt_len: int) -> Slot:
        slot = Slot(self.next_id, self.arena.new_root(2 * self.next_id), int(prompt_len), np.zeros(0, np.int32))
        self.next_id += 1
        if prompt is not None and self.params.lookup:
            self._add_text(slot, prompt)
        self.slots[key], self.by_id[slot.id] = slot, slot
        self.lengths[int(prompt_len)] += 1
        return slot

    def _add_text(self, slot: Slot, prompt: np.ndarray) -> None:
        """The prompt's own text, under a root of its own that no row stands in (re-entries may land there)."""
        slot.prompt = prompt
        self.arena.insert(self.arena.new_root(2 * slot.id + 1), prompt, 2 * slot.id + 1, self.params.min_match)

    def _drop(self, key: bytes) -> None:
        slot = self.slots.pop(key)
        del self.by_id[slot.id]
        self.lengths[slot.prompt_len] -= 1

    def rebuild(self, live: set[int]) -> None:
        """Past the memory budget: the arena anew from the slots of the rows in flight, then the latest used, up to
        half the budget. Rows are followed afresh (`version`)."""
        budget = self.params.history_mb * (1 << 20) // 2
        keep = [k for k, s in self.slots.items() if s.id in live]
        keep += [k for k in reversed(self.slots) if self.slots[k].id not in live]
        slots, self.slots, self.by_id = self.slots, OrderedDict(), {}
        self.arena, self.version = Arena(), self.version + 1
        for key in keep:
            old = slots[key]
            if self.arena.nbytes > budget and old.id not in live:
                break
            root = self.arena.new_root(2 * old.id)
            slot = Slot(old.id, root, old.prompt_len, old.prompt, old.responses, set(), old.registered)
            if len(old.prompt):
                self._add_text(slot, old.prompt)
            for response in old.responses:
                self.arena.insert(slot.root, response, 2 * slot.id, self.params.min_match)
            self.slots[key], self.by_id[slot.id] = slot, slot
        self.slots = OrderedDict(reversed([(k, self.slots[k]) for k in self.slots]))  # oldest first again
        if self.arena.nbytes > 2 * budget and not self.over_budget:
            self.over_budget = True
            logger.warning(
                "history_mb=%d is too small for the histories of the rows in flight (%.0f MB): raise it "
                "(--reuse.params '{\"history_mb\": N}'); drafts come from less history meanwhile",
                self.params.history_mb,
                self.arena.nbytes / (1 << 20),
            )

    def report(self, details: bool = False) -> dict:
        """How many proposers run here, what their budgets measured (summed over them), and the histories' memory;
        with `details`, the diagnostics too (`BudgetReport.details`)."""
        out = {"proposers": self.proposers, "history_mb": self.arena.nbytes / (1 << 20)}
        for report in self.reports:
            for name, value in (report.details() if details else report.as_dict()).items():
                out[name] = out.get(name, 0.0) + value
        return out


BOARD = HistoryBoard()
