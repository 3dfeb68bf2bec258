"""Every history the V2 speculator drafts from, on the device (`DeviceHistories`), and the host's book of it
(`SlotBook`): which prompt holds which slot, which columns are whose.

Terminology as in `kernels`. The book is the host's alone and changes only through calls that every tensor-parallel
rank receives in the same order at the same step boundaries (the rollout's `collective_rpc` updates, vLLM's
`add_request` and `on_requests_finished`): it is applied by count, never by a time budget, so every rank holds the same
device state and drafts the same, bit for bit. The host never reads the device: a column's length is the device's,
the book only knows which columns are live (a request in flight writes there) and which may be reused.

Memory is `history_mb`: a slot holds `COLUMNS` columns of `max_model_len` tokens (the prompt's text and its responses),
so the slots are the budget over a slot's bytes; the index takes a third of the budget. Past the slots, the prompt the
engine used longest ago whose rows have all left goes first (its next visit is the furthest away; the rollout
registers its previous responses again at that visit's start, from the draft store, whatever the engine dropped).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from .kernels import NONE, index_positions

logger = logging.getLogger(__name__)

COLUMNS = 25  # a slot's columns: its prompt's text, then 24 responses (two visits of 8 samples and 8 in flight)
WAYS = 8  # index entries a gram bucket keeps (the newest of each column group)
INDEX_SHARE = 1 / 3  # of `history_mb`, the index's


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host values onto the device without waiting: pinned memory, a non-blocking copy (as vLLM's
    `async_tensor_h2d`), or the values themselves on a CPU device."""
    host = torch.as_tensor(np.asarray(values), dtype=dtype)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class StoreSize:
    """What `history_mb` buys at a model length: slots, columns a slot, tokens a column, the index's size."""

    slots: int
    columns: int
    capacity: int
    buckets: int
    ways: int

    @staticmethod
    def of(history_mb: int, max_model_len: int, columns: int = COLUMNS, ways: int = WAYS) -> StoreSize:
        budget = history_mb * (1 << 20)
        slot_bytes = columns * max_model_len * 4 + columns * 12  # tokens, lengths and recencies
        slots = max(2, int(budget * (1 - INDEX_SHARE)) // slot_bytes)
        buckets = 1 << max(4, int(np.log2(max(budget * INDEX_SHARE / (ways * 8), 16))))
        return StoreSize(slots, columns, max_model_len, buckets, ways)

    @property
    def nbytes(self) -> int:
        return self.slots * self.columns * (self.capacity * 4 + 12) + self.buckets * self.ways * 8


@dataclass
class Slot:
    """A prompt's slot in the book: its id, the columns its requests write (live), where the next response goes,
    whether its text is on the device, and how many of its rows finished here since its visit began."""

    id: int
    live: set[int] = field(default_factory=set)
    next_column: int = 1
    has_text: bool = False
    finished_here: int = 0


class SlotBook:
    """The host's book: slots by prompt digest (least recently used first), columns by request id."""

    def __init__(self, size: StoreSize):
        self.size = size
        self.slots: OrderedDict[bytes, Slot] = OrderedDict()
        self.free = list(range(size.slots - 1, -1, -1))
        self.requests: dict[str, tuple[bytes, int]] = {}  # request id: (prompt digest, column)
        self.stamp = 0  # the recency a column gets when it is (re)assigned
        self.full_warned = False

    def slot(self, key: bytes) -> tuple[Slot | None, bool]:
        """The prompt's slot (made where it has none: an older one given up if need be), and whether it is new; None
        where every slot has rows in flight."""
        found = self.slots.get(key)
        if found is not None:
            self.slots.move_to_end(key)
            return found, False
        if not self.free:
            gone = next((k for k, s in self.slots.items() if not s.live), None)
            if gone is None:
                if not self.full_warned:
                    self.full_warned = True
                    logger.warning(
                        "history_mb holds %d prompts, all with rows in flight: a new prompt drafts from the others "
                        "until one leaves; raise history_mb (--reuse.params '{\"history_mb\": N}')",
                        self.size.slots,
                    )
                return None, False
            self.free.append(self.slots.pop(gone).id)
        made = Slot(self.free.pop())
        self.slots[key] = made
        return made, True

    def column(self, slot: Slot) -> int | None:
        """The next column of `slot` that no request writes (a ring over its response columns), None if all do."""
        for _ in range(self.size.columns - 1):
            column = slot.next_column
            slot.next_column = column % (self.size.columns - 1) + 1
            if column not in slot.live:
                return column
        return None

    def next_stamp(self) -> int:
        self.stamp += 1
        return self.stamp


class DeviceHistories:
    """The device tensors of every slot (see the module's docstring), and the writes that fill them."""

    def __init__(self, size: StoreSize, min_match: int, device: torch.device):
        self.size, self.min_match, self.device = size, min_match, device
        self.tokens = torch.full((size.slots, size.columns, size.capacity), NONE, dtype=torch.int32, device=device)
        self.length = torch.zeros(size.slots, size.columns, dtype=torch.int32, device=device)
        self.seq = torch.zeros(size.slots, size.columns, dtype=torch.int64, device=device)
        self.table = torch.full((size.buckets, size.ways), NONE, dtype=torch.int64, device=device)
        self.column_bits = max(1, int(size.slots * size.columns - 1).bit_length())
        self.q_bits = max(1, int(size.capacity).bit_length())
        if self.column_bits + self.q_bits > 40:
            raise ValueError(f"history store too large to index: {size}")

    def reset(self) -> None:
        self.length.zero_()
        self.seq.zero_()
        self.table.fill_(NONE)

    def clear(self, slots, columns) -> None:
        """Empty these columns (lists of slot and column ids)."""
        if len(slots):
            s, c = to_device(slots, torch.int64, self.device), to_device(columns, torch.int64, self.device)
            self.length[s, c] = 0

    def stamp(self, slots, columns, stamps) -> None:
        if len(slots):
            s, c = to_device(slots, torch.int64, self.device), to_device(columns, torch.int64, self.device)
            self.seq[s, c] = to_device(stamps, torch.int64, self.device)

    def write(self, slots, columns, sequences: list[np.ndarray]) -> None:
        """Each sequence into its (slot, column) from position 0 (cut at the capacity), its length set, its
        positions indexed: one copy of all their tokens."""
        if not sequences:
            return
        cut = [np.asarray(t, np.int32)[: self.size.capacity] for t in sequences]
        counts = np.array([len(t) for t in cut], np.int64)
        s = np.repeat(np.asarray(slots, np.int64), counts)
        c = np.repeat(np.asarray(columns, np.int64), counts)
        q = np.concatenate([np.arange(n, dtype=np.int64) for n in counts]) if counts.sum() else np.zeros(0, np.int64)
        s_d, c_d, q_d = (to_device(a, torch.int64, self.device) for a in (s, c, q))
        values = to_device(np.concatenate(cut) if counts.sum() else np.zeros(0, np.int32), torch.int32, self.device)
        self.tokens[s_d, c_d, q_d] = values
        slot_ids = to_device(np.asarray(slots, np.int64), torch.int64, self.device)
        column_ids = to_device(np.asarray(columns, np.int64), torch.int64, self.device)
        self.length[slot_ids, column_ids] = to_device(counts, torch.int32, self.device)
        self.index(s_d, c_d, q_d + 1, torch.ones_like(q_d, dtype=torch.bool))

    def copy_text(self, token_ids: torch.Tensor, rows, slots, prompt_lens) -> None:
        """Each request's prompt (vLLM's tokens of request slot `rows[i]`, `prompt_lens[i]` of them) into column 0 of
        its slot: the prompt's text, for prompt lookup."""
        lengths = np.minimum(np.asarray(prompt_lens, np.int64), self.size.capacity)
        r = np.repeat(np.asarray(rows, np.int64), lengths)
        s = np.repeat(np.asarray(slots, np.int64), lengths)
        q = np.concatenate([np.arange(n, dtype=np.int64) for n in lengths])
        r_d, s_d, q_d = (to_device(a, torch.int64, self.device) for a in (r, s, q))
        zeros = torch.zeros_like(s_d)
        self.tokens[s_d, zeros, q_d] = token_ids[r_d, q_d].to(torch.int32)
        slot_ids = to_device(np.asarray(slots, np.int64), torch.int64, self.device)
        self.length[slot_ids, torch.zeros_like(slot_ids)] = to_device(lengths, torch.int32, self.device)
        self.index(s_d, zeros, q_d + 1, torch.ones_like(q_d, dtype=torch.bool))

    def index(self, slot, column, q, valid) -> None:
        index_positions(
            self.table, self.tokens, self.seq, slot, column, q, valid, self.min_match, self.column_bits, self.q_bits
        )

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tokens, self.length, self.seq, self.table))
