"""What the history proposer knows of each batch row between steps (`RowState`): where it stands and what it was
given, and what the kernels (`follow`) give for it at each step. A row whose state does not match its tokens holds a
new request, or one vLLM moved there from a row beyond the batch (`RowState.moved`).
"""

from __future__ import annotations

import numpy as np

from .arena import NONE

NEW, FOLLOWED, IDLE = 1, 0, 2  # `follow`'s status per row: not recognised; followed; in prefill (nothing sampled)


class RowState:
    """Per row, as arrays [capacity]: tokens seen, first and last token (a different request in the row shows up in
    one of them or in its length), prompt length, slot, own node, cursor, how the cursor was found, the match it was
    found with (grown as the row follows it), the draft tokens given at the last step (the first `drafted` of its
    candidate), and the hash of its response so far (`arena.sequence_hash`); and what the kernels give (`outputs`)."""

    INTS = ("seen", "first", "last", "prompt_len", "slot", "own", "cursor", "kind", "match", "drafted", "retry")

    def __init__(self, k: int, capacity: int = 64):
        self.k, self.capacity = k, 0
        self.grow(capacity)

    def grow(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        fresh = {name: np.full(capacity, NONE, np.int32) for name in self.INTS}
        fresh["seen"][:], fresh["drafted"][:], fresh["retry"][:] = 0, 0, 0
        fresh["hash"] = np.zeros(capacity, np.int64)
        # what `follow` and `anchor` give per row at each step (`outputs`): status, accepted draft slots, candidate
        # tokens and their supports, candidate length
        fresh["status"], fresh["accepted"] = np.zeros(capacity, np.int32), np.zeros(capacity, np.int32)
        fresh["cand"], fresh["support"] = np.zeros((capacity, self.k), np.int32), np.zeros((capacity, self.k))
        fresh["length"] = np.zeros(capacity, np.int32)
        fresh["cand_bucket"], fresh["cand_accept"] = (
            np.zeros((capacity, self.k), np.int64),
            np.zeros((capacity, self.k)),
        )
        # the verdicts of a step (`follow` appends them, `judged[0]` of them): each judged slot's bucket, predicted
        # acceptance and whether it was accepted
        fresh["judged"] = np.zeros(1, np.int64)
        fresh["judged_bucket"] = np.zeros(capacity * self.k, np.int64)
        fresh["judged_predicted"] = np.zeros(capacity * self.k)
        fresh["judged_hit"] = np.zeros(capacity * self.k, np.bool_)
        for name, values in fresh.items():
            if self.capacity and not name.startswith("judged"):
                values[: self.capacity] = getattr(self, name)
            setattr(self, name, values)
        self.capacity = capacity

    def move(self, source: int, target: int) -> None:
        """The request followed in row `source` is in row `target` now (vLLM condensed its batch)."""
        for name in (*self.INTS, "hash", "cand", "cand_bucket", "cand_accept"):
            values = getattr(self, name)
            values[target] = values[source]
        self.seen[source] = 0

    def kernel_args(self) -> tuple:
        """What `follow` and `anchor` read and write, in their order."""
        return (*(getattr(self, name) for name in self.INTS), self.hash)

    @property
    def outputs(self) -> tuple:
        return (
            *(self.status, self.accepted, self.cand, self.support, self.length, self.cand_bucket, self.cand_accept),
            *(self.judged, self.judged_bucket, self.judged_predicted, self.judged_hit),
        )

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
