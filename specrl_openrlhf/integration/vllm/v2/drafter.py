"""`lossless` for vLLM's V2 runner, engine-free: `HistoryDrafter` takes vLLM's calls in vLLM's order and drafts every
row of a step on the device (`kernels`), from every history of the engine (`store`), with no host sync.

vLLM's calls (`v2.speculator` adapts its `BaseSpeculator` interface onto these; `miniature.v2_runner` and the simulator
make them in the same order with stand-ins of its request state):
- `add_request(index)`: a request was given request slot `index` (new, or resumed after a preemption: then with the
  same request id, its prompt and its tokens so far, perhaps in another slot), host side, between steps, its tokens
  only staged;
- `on_requests_finished(ids)`: finished or aborted requests (not preempted ones), before their slots are freed;
- `propose(rows, num_sampled, num_rejected, last_sampled)`: after every step's sampling, the step's newest tokens on
  the device only; returns [B, k] int64 drafts, every slot a real token (the last sampled one past the chain), and
  writes `confidences` [B, k] (each slot's predicted acceptance given the row's earlier slots; 0 past the chain), which
  vLLM's adaptive verification turns into survival and admits by its own step-cost model;
- `reset_state()`: once, after warm-up.
And the rollout's, over `collective_rpc` (`histories.update_histories`): `update(...)` registers a prompt's previous
responses at its visit's start (`reset`) and finished ones after, and `report()` answers.

A request is ours where its id carries its prompt's digest (`histories.request_id`, which our rollout sends); its
response is then written to a column of its prompt's slot as it is sampled. Other requests draft from the index alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ....params import check_fields, limits
from ..histories import key_of
from . import kernels
from .acceptance import DeviceAcceptance
from .store import DeviceHistories, SlotBook, StoreSize, to_device

logger = logging.getLogger(__name__)

WINDOW = 16  # a match is measured back this many tokens at most (V1: `follow.MAX_MATCH`)


@dataclass(frozen=True, kw_only=True)
class DrafterSettings:
    """What the drafter is built with: the engine's sizes and the rule's settings it needs before its first update."""

    max_num_reqs: int = field(metadata=limits(at_least=1))
    max_model_len: int = field(metadata=limits(at_least=2))
    k: int = field(metadata=limits(at_least=1, at_most=64, means="num_speculative_tokens"))
    history_mb: int = field(default=1024, metadata=limits(at_least=1))
    min_match: int = field(default=4, metadata=limits(at_least=1, at_most=WINDOW))
    shared: bool = True
    lookup: bool = True
    compile: bool = False
    """Compile the step's ops into fused kernels (`torch.compile`), as on a GPU, where a launch costs more than a small
    op's work; on CPU the ops run one by one."""

    def __post_init__(self):
        check_fields(self, owner="the V2 speculator")


@dataclass
class Pending:
    """Host work queued between steps and applied at the next `propose`, in call order."""

    rows: list[int] = field(default_factory=list)  # request slots given a request
    row_slots: list[int] = field(default_factory=list)  # their prompt's slot (-1: none)
    row_columns: list[int] = field(default_factory=list)  # their own column
    cleared: list[tuple[int, int]] = field(default_factory=list)  # columns emptied for a new response
    texts: list[tuple[int, int, int]] = field(default_factory=list)  # (request slot, slot, prompt length)


class HistoryDrafter:
    receives_histories = True  # `histories.update_histories` hands it the rollout's updates

    def __init__(self, settings: DrafterSettings, req_states, device: torch.device):
        self.settings, self.req, self.device = settings, req_states, torch.device(device)
        size = StoreSize.of(settings.history_mb, settings.max_model_len)
        self.book = SlotBook(size)
        self.store = DeviceHistories(size, settings.min_match, self.device)
        self.acceptance = DeviceAcceptance(self.device)
        n, k = settings.max_num_reqs, settings.k
        self.row_slot = torch.full((n,), kernels.NONE, dtype=torch.int64, device=self.device)
        self.row_col = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.prev_bucket = torch.zeros(n, k, dtype=torch.int64, device=self.device)  # the last draft's slots
        self.prev_len = torch.zeros(n, dtype=torch.int64, device=self.device)  # its chain's length
        self.drafts = torch.zeros(n, k, dtype=torch.int64, device=self.device)
        self.confidences = torch.zeros(n, k, dtype=torch.float32, device=self.device)
        self.aligned = torch.arange(1, size.columns, device=self.device)  # the response columns
        self.edges = kernels.bucket_edges(self.device)
        self.pending = Pending()
        self.steps = 0
        # the step compiled into fused kernels where asked (`compile`: a GPU's default), else op by op
        self.compiled = torch.compile(self._step, dynamic=True, fullgraph=True) if settings.compile else None

    def warm_up(self) -> None:
        """Compile the step before the engine's first (a few seconds to a minute), on a few rows that sampled nothing,
        then forget them: `dynamic` shapes, so no batch size compiles again."""
        if self.compiled is None:
            return
        rows = torch.arange(min(3, self.settings.max_num_reqs), device=self.device)
        zeros = torch.zeros_like(rows)
        self.compiled(
            rows, zeros, zeros, torch.zeros(self.settings.max_num_reqs, dtype=torch.int64, device=self.device)
        )
        self.reset_state()

    # vLLM's calls ------------------------------------------------------------------------------------------------

    def add_request(self, index: int) -> None:
        request_id = self.req.index_to_req_id[index]
        slot, column = self._column_of(request_id, index)
        self.pending.rows.append(index)
        self.pending.row_slots.append(-1 if slot is None else slot)
        self.pending.row_columns.append(0 if column is None else column)

    def on_requests_finished(self, finished_ids) -> None:
        for request_id in sorted(finished_ids):
            known = self.book.requests.pop(request_id, None)
            if known is None:
                continue
            key, column = known
            slot = self.book.slots.get(key)
            if slot is not None:
                slot.live.discard(column)
                slot.finished_here += 1  # its response is in its column: the rollout's copy of it is skipped

    def reset_state(self) -> None:
        """Forget everything (after vLLM's warm-up requests)."""
        self.book = SlotBook(self.book.size)
        self.store.reset()
        self.acceptance.reset()
        self.row_slot.fill_(kernels.NONE)
        self.prev_len.zero_()
        self.pending = Pending()
        self.steps = 0

    def propose(self, rows, num_sampled, num_rejected, last_sampled) -> torch.Tensor:
        """rows: [B] vLLM's idx_mapping (request slot of each batch row); num_sampled, num_rejected: [B];
        last_sampled: [max_num_reqs] or [max_num_reqs, 1], each request's last token. Returns [B, k] drafts."""
        self._apply_pending()
        inputs = (rows.long(), num_sampled.long(), num_rejected.long(), last_sampled.reshape(-1))
        if self.compiled is not None:
            try:
                self.compiled(*inputs)
            except Exception as error:  # a compiler that fails here costs speed only: the same ops, one at a time
                logger.warning(
                    "specrl_history: compiled step failed (%s: %s), runs eagerly", type(error).__name__, error
                )
                self.compiled = None
                self._step(*inputs)
        else:
            self._step(*inputs)
        self.steps += 1
        return self.drafts[: rows.shape[0]]

    def _step(self, rows, sampled, rejected, last) -> None:
        """The step's device work, every op on the device: the verdicts, the new tokens, the drafts."""
        b = rows.shape[0]
        self._judge(rows, sampled, rejected)
        token_ids = self.req.all_token_ids.gpu
        total, prompt = self.req.total_len.gpu[rows].long(), self.req.prompt_len.gpu[rows].long()
        slot, own = self.row_slot[rows], self.row_col[rows]
        store = self.store
        written = kernels.append_sampled(
            store.tokens, store.length, token_ids, rows, total, prompt, sampled, slot, own, self.settings.k + 1
        )
        store.index(*written)
        chain, support, length, kind, match = self._draft(token_ids, rows, total, prompt, slot, own)
        bucket = kernels.buckets(kind, support, match, self.edges)
        positions = torch.arange(self.settings.k, device=self.device)[None, :]
        active = (positions < length[:, None]) & (sampled > 0)[:, None]
        self.drafts[:b] = torch.where(active, chain, last[rows][:, None])
        self.confidences[:b] = torch.where(active, self.acceptance.table[bucket], 0.0)
        self.prev_bucket[rows] = bucket
        self.prev_len[rows] = torch.where(sampled > 0, length, 0)

    # the rollout's calls -----------------------------------------------------------------------------------------

    def update(self, key: bytes, prompt_len: int, reset: bool, params: dict, responses, logprobs=None) -> None:
        """A prompt's history (`histories`' format): at a visit's start (`reset`) its previous responses replace what
        its slot holds, unless its rows already run here (then they join them); else finished responses join it,
        those that finished here skipped (their columns hold them)."""
        slot, _ = self.book.slot(key)
        if slot is None:
            return
        if reset and not slot.live:  # a new visit, none of its rows here yet: the history is the last visit's
            gone = list(range(1, self.book.size.columns))
            self.store.clear([slot.id] * len(gone), gone)
            slot.finished_here = 0
        else:
            skip = min(slot.finished_here, len(responses))
            slot.finished_here -= skip
            responses = list(responses)[skip:]
        slots, columns, sequences = [], [], []
        for response in responses:
            column = self.book.column(slot)
            if column is None or not len(response):
                continue
            slots.append(slot.id)
            columns.append(column)
            sequences.append(np.asarray(response, np.int32))
        self.store.stamp(slots, columns, [self.book.next_stamp() for _ in columns])
        self.store.write(slots, columns, sequences)

    def report(self, details: bool = False) -> dict:
        """What `update_histories` answers: one speculator here, its histories' memory (MiB), the prompts it holds."""
        return {
            "proposers": 1,
            "history_mb": self.store.nbytes / (1 << 20),
            "prompts": len(self.book.slots),
            "steps": self.steps,
        }

    # the step ----------------------------------------------------------------------------------------------------

    def _column_of(self, request_id: str, index: int) -> tuple[int | None, int | None]:
        """The slot and own column of a request (a resumed one keeps its column); None where it is not ours or no
        slot is free."""
        known = self.book.requests.get(request_id)
        key = known[0] if known else key_of(request_id)
        if key is None:
            return None, None
        slot, _ = self.book.slot(key)
        if slot is None:
            return None, None
        if known is not None and known[1] in slot.live:
            return slot.id, known[1]
        column = self.book.column(slot)
        if column is None:
            return slot.id, None
        slot.live.add(column)
        self.book.requests[request_id] = (key, column)
        self.pending.cleared.append((slot.id, column))
        if self.settings.lookup and not slot.has_text:
            slot.has_text = True
            self.pending.texts.append((index, slot.id, int(self.req.prompt_len.np[index])))
        return slot.id, column

    def _apply_pending(self) -> None:
        """The host's queued work, in one batch of device writes: row maps, emptied columns, prompts' texts."""
        pending, self.pending = self.pending, Pending()
        if pending.cleared:
            slots, columns = zip(*pending.cleared)
            self.store.clear(slots, columns)
            self.store.stamp(slots, columns, [self.book.next_stamp() for _ in columns])
        if pending.rows:
            rows = to_device(pending.rows, torch.int64, self.device)
            self.row_slot[rows] = to_device(pending.row_slots, torch.int64, self.device)
            self.row_col[rows] = to_device(pending.row_columns, torch.int64, self.device)
            self.prev_len[rows] = 0
        if pending.texts:
            rows, slots, lengths = zip(*pending.texts)
            self.store.stamp(slots, [0] * len(slots), [self.book.next_stamp() for _ in slots])
            self.store.copy_text(self.req.all_token_ids.gpu, rows, slots, lengths)

    def _judge(self, rows, sampled, rejected) -> None:
        """The verdicts on each row's last draft: the slots up to its first rejection accepted, that one rejected."""
        accepted = (sampled - 1).clamp(min=0)
        verified = torch.where(sampled > 0, accepted + rejected, 0)
        j = torch.arange(self.settings.k, device=self.device)[None, :]
        reach = torch.minimum(self.prev_len[rows], verified)[:, None]
        judged = (j < reach) & (j <= accepted[:, None])
        self.acceptance.observe(
            self.prev_bucket[rows].reshape(-1), judged.reshape(-1), (j < accepted[:, None]).reshape(-1)
        )

    def _draft(self, token_ids, rows, total, prompt, slot, own):
        """Every row's candidates, the live ones chosen, and their chain (`kernels`' terminology)."""
        s = self.settings
        store, size = self.store, self.book.size
        back = torch.arange(WINDOW, device=self.device)[None, :]
        at = total[:, None] - 1 - back
        tail = torch.where(at >= 0, token_ids[rows[:, None], at.clamp(min=0)].long(), kernels.NONE)  # newest first
        depth = total - prompt  # [B] the row's response so far
        # aligned: its slot's response columns at its own depth (its own column left out)
        a_slot = torch.where((slot[:, None] >= 0) & (self.aligned[None, :] != own[:, None]), slot[:, None], -1)
        a_col = self.aligned[None, :].expand_as(a_slot)
        a_q = depth[:, None].expand_as(a_slot)
        # indexed: where its last min_match tokens occur
        gram = tail[:, : s.min_match].flip(1)
        bucket = kernels.bucket_of(kernels.fold_hash(gram), size.buckets)
        entry = store.table[bucket]  # [B, ways]
        q_mask, column_mask = (1 << store.q_bits) - 1, (1 << store.column_bits) - 1
        e_q = entry & q_mask
        ids = (entry >> store.q_bits) & column_mask
        e_slot, e_col = ids // size.columns, ids % size.columns
        ok = (entry >= 0) & (total[:, None] >= s.min_match) & (e_slot < size.slots)
        ok &= ~((e_slot == slot[:, None]) & (e_q == depth[:, None]) & (e_col > 0))  # an aligned candidate already
        if not s.shared:
            ok &= e_slot == slot[:, None]
        if not s.lookup:
            ok &= e_col > 0
        e_slot, e_q = torch.where(ok, e_slot, -1), torch.where(ok, e_q, 0)
        c_slot, c_col, c_q = (torch.cat(pair, dim=1) for pair in ((a_slot, e_slot), (a_col, e_col), (a_q, e_q)))
        match = kernels.match_lengths(store.tokens, c_slot, c_col, c_q, tail)
        cont = kernels.continuations(store.tokens, store.length, c_slot, c_col, c_q, s.k)
        ahead = cont[:, :, 0] >= 0
        n_aligned = a_slot.shape[1]
        is_aligned = torch.arange(c_slot.shape[1], device=self.device)[None, :] < n_aligned
        anchored = is_aligned & ahead & (match == torch.clamp(depth, max=WINDOW)[:, None]) & (depth[:, None] > 0)
        any_anchored = anchored.any(dim=1)
        eligible = ahead & (match >= s.min_match)
        longest = torch.where(eligible, match, -1).amax(dim=1)
        alive = torch.where(any_anchored[:, None], anchored, eligible & (match == longest[:, None]))
        chain, support, length = kernels.vote_chain(cont, alive)
        first = alive.long().argmax(dim=1)
        kind = kernels.kind_of(c_slot, c_col, slot, first, any_anchored)
        return chain, support, length, kind, torch.where(any_anchored, depth, longest.clamp(min=0))
