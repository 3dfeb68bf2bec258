"""What the history proposer knows of each batch row between steps (`RowState`): where it stands and what it was
given, and what the kernels (`follow`) give for it at each step. A row whose state does not match its tokens holds a
new request, or one vLLM moved there from a row beyond the batch (`RowState.moved`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .arena import NONE

NEW, FOLLOWED, IDLE = 1, 0, 2  # `follow`'s status per row: not recognised; followed; in prefill (nothing sampled)


class RowArrays(NamedTuple):
    """Where each row stands, as the kernels read and write it (`RowState.kernel_args`); [capacity] each."""

    seen: np.ndarray  # int32, tokens of the row seen (0: not followed)
    first: np.ndarray  # int32, its first token
    last: np.ndarray  # int32, its last token seen
    prompt_len: np.ndarray  # int32, its prompt's length
    slot: np.ndarray  # int32, its prompt's slot (NONE: none)
    own: np.ndarray  # int32, its own node: the end of its response's path
    cursor: np.ndarray  # int32, the node it proposes from (NONE: none)
    kind: np.ndarray  # int32, how the cursor was found (`budget.ANCHORED`, `REENTERED`, `SHARED`, `OWN`)
    match: np.ndarray  # int32, the tokens the cursor matched, grown as the row follows it
    drafted: np.ndarray  # int32, the draft tokens given at the last step (a prefix of its candidate)
    retry: np.ndarray  # int32, the length at which a row that found no re-entry looks again
    hash: np.ndarray  # int64, the hash of its response so far (`arena.sequence_hash`)


class RowOutputs(NamedTuple):
    """What the kernels give per row at each step (`RowState.outputs`), and the step's verdicts."""

    status: np.ndarray  # [capacity] int32, FOLLOWED, NEW or IDLE
    accepted: np.ndarray  # [capacity] int32, the draft slots accepted (NONE: no draft was given)
    cand: np.ndarray  # [capacity, k] int32, the candidate draft's tokens
    support: np.ndarray  # [capacity, k] float64, each candidate token's support
    length: np.ndarray  # [capacity] int64, the candidate's length
    cand_bucket: np.ndarray  # [capacity, k] int64, each candidate token's acceptance bucket (`budget.bucket`)
    cand_accept: np.ndarray  # [capacity, k] float64, each candidate token's predicted acceptance
    judged: np.ndarray  # [1] int64, the verdicts gathered this step
    judged_bucket: np.ndarray  # [capacity * k] int64, each judged slot's bucket
    judged_predicted: np.ndarray  # [capacity * k] float64, its predicted acceptance
    judged_hit: np.ndarray  # [capacity * k] bool, whether it was accepted


class RowState:
    """Per row, where it stands (`RowArrays`: a different request in the row shows up in its first or last token or
    in its length) and what the kernels give for it (`RowOutputs`), as arrays grown with the batch."""

    INTS = RowArrays._fields[:-1]  # all but the hash

    def __init__(self, k: int, capacity: int = 64):
        self.k, self.capacity = k, 0
        self.arena_version = None  # the arena's (`HistoryBoard.version`) the rows were followed in
        self.grow(capacity)

    def grow(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        fresh = {name: np.full(capacity, NONE, np.int32) for name in self.INTS}
        fresh["seen"][:], fresh["drafted"][:], fresh["retry"][:] = 0, 0, 0
        fresh["hash"] = np.zeros(capacity, np.int64)
        fresh["status"], fresh["accepted"] = np.zeros(capacity, np.int32), np.zeros(capacity, np.int32)
        fresh["cand"], fresh["support"] = np.zeros((capacity, self.k), np.int32), np.zeros((capacity, self.k))
        fresh["length"] = np.zeros(capacity, np.int64)
        fresh["cand_bucket"], fresh["cand_accept"] = (
            np.zeros((capacity, self.k), np.int64),
            np.zeros((capacity, self.k)),
        )
        # the verdicts of a step: `follow` appends them, `judged[0]` of them
        fresh["judged"] = np.zeros(1, np.int64)
        fresh["judged_bucket"] = np.zeros(capacity * self.k, np.int64)
        fresh["judged_predicted"] = np.zeros(capacity * self.k)
        fresh["judged_hit"] = np.zeros(capacity * self.k, np.bool_)
        for name, values in fresh.items():
            if self.capacity and not name.startswith("judged"):
                values[: self.capacity] = getattr(self, name)
            setattr(self, name, values)
        self.capacity = capacity
        self.index = np.arange(capacity, dtype=np.int64)  # every row's index, for `Sampled.indices`
        self._args = RowArrays(*(getattr(self, name) for name in self.INTS), self.hash)
        self._outputs = RowOutputs(*(getattr(self, name) for name in RowOutputs._fields))

    def move(self, source: int, target: int) -> None:
        """The request followed in row `source` is in row `target` now (vLLM condensed its batch)."""
        for name in (*self.INTS, "hash", "cand", "cand_bucket", "cand_accept"):
            values = getattr(self, name)
            values[target] = values[source]
        self.seen[source] = 0

    def kernel_args(self) -> RowArrays:
        """What `follow` and `anchor` read and write of each row (built once per growth: the arrays stay)."""
        return self._args

    @property
    def outputs(self) -> RowOutputs:
        return self._outputs

    def moved(self, new, vanished, seen_before, token_ids) -> np.ndarray:
        """Which `new` rows (not recognised where they are) hold a request followed at the last step in one of the
        `vanished` rows (now beyond the batch: vLLM moves the last rows into the holes finished ones leave), matched by
        first token, tokens seen and last token (`seen_before`: each row's tokens before this step's). Their state
        moves with them; returns them."""
        found = {}
        for q in vanished:
            if self.seen[q] > 0:
                found[(int(self.first[q]), int(self.seen[q]), int(self.last[q]))] = q
        moved = []
        for r in new.tolist() if found else ():
            s = int(seen_before[r])
            q = found.pop((int(token_ids[r, 0]), s, int(token_ids[r, s - 1])), None) if s > 0 else None
            if q is not None:
                self.move(q, r)
                moved.append(r)
        return np.array(moved, np.int64)

    def forget(self) -> None:
        """Follow every row afresh."""
        self.seen[:] = 0
        self.drafted[:] = 0

    def on_arena(self, version: int) -> None:
        """Every row afresh where the arena was rebuilt (`HistoryBoard.rebuild`) since its rows were followed: their
        nodes (`own`, `cursor`) are the old arena's, which `follow` would write through, past the new one's arrays."""
        if version != self.arena_version:
            self.forget()
            self.arena_version = version
