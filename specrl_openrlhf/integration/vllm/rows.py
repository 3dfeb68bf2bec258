"""What the history proposer knows of one batch row between steps, and where it proposes from.

A row stands in one of three places, tried in this order wherever it has none (`Row.reenter`):
- its prompt's own history (`history.History`): from the root while its response is a path of it (`ANCHORED`),
  else after the longest suffix of its response that the history holds (`REENTERED`);
- the shared history of the engine's other prompts' recent responses (`histories.SharedHistory`, `SHARED`);
- its own tokens, its prompt and its response so far (`history.OwnTokens`, `OWN`): what followed the longest earlier
  occurrence of its last tokens (prompt lookup, as vLLM's n-gram proposer and the request's part of a suffix tree).
The longer match of the last two wins. Every place depends on earlier responses and the row's own tokens, never on
its randomness to come: each proposal is a fixed one, and vLLM's verification keeps it exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...budget import ANCHORED, OWN, REENTERED, SHARED, SlotFeatures
from ...history import MAX_MATCH, History, OwnTokens
from ...proposal import Proposed, propose


@dataclass
class Row:
    """One batch row's request, as the proposer follows it from step to step."""

    first: int  # the row's first token, and
    last: int  # its last token when seen: a different request in the row shows up in either or in the length
    seen: int  # tokens of the row seen (prompt + response so far)
    prompt_len: int = 0
    history: History | None = None  # the prompt's own
    version: int = -1  # the board's version when the row last looked for its history
    walking: History | None = None  # the history the cursor is in: the prompt's own, or the shared one
    cursor: list[int] = field(default_factory=list)  # where the row stands in `walking` ([]: nowhere)
    own: OwnTokens | None = None  # the row's own tokens, indexed once it first looks there
    pointer: int | None = None  # where the row stands in its own tokens (after an earlier match)
    kind: int = ANCHORED  # where the proposal comes from: ANCHORED, REENTERED, SHARED or OWN
    match: int = 0  # a re-entry's match length, grown by the tokens the row took inside since
    draft: list[int] = field(default_factory=list)  # what the row was given to verify at the last step
    slots: list[SlotFeatures] = field(default_factory=list)  # each drafted slot's features
    predicted: list[float] = field(default_factory=list)  # and predicted acceptance

    @property
    def placed(self) -> bool:
        return bool(self.cursor) or self.pointer is not None

    def advance(self, taken: list[int]) -> None:
        """The row took `taken` (its accepted draft tokens and the one it sampled): move where it stands."""
        if self.own is not None:
            self.own.extend(taken)
        if self.walking is not None:
            self.cursor = self.walking.advance(self.cursor, taken)
        elif self.pointer is not None:
            ahead = self.own.tokens[self.pointer : self.pointer + len(taken)]
            self.pointer = self.pointer + len(taken) if ahead == taken else None
        self.match += len(taken)

    def anchor(self, board, tokens: np.ndarray, num_tokens: int, new: int) -> None:
        """Look for the prompt's history (once per registration on the board): found, the row starts in it."""
        self.version = board.version
        self.history, self.prompt_len = board.find(tokens, num_tokens, new)
        if self.history is not None:
            self.cursor = self.history.anchored(tokens[self.prompt_len : num_tokens].tolist())
            self.walking, self.pointer, self.kind, self.match = self.history, None, ANCHORED, 0

    def reenter(self, board, tokens: np.ndarray, num_tokens: int) -> None:
        """Where the row has no place: the longest suffix match in its prompt's history, else the longer of the
        shared history's and its own tokens' (each only where the rule allows it)."""
        self.walking, self.cursor, self.pointer = None, [], None
        shared, params, m = board.shared.history, board.params, board.params.min_match
        tail = tuple(tokens[num_tokens - m : num_tokens].tolist()) if num_tokens - self.prompt_len >= m else None
        if self.history is not None and tail in self.history.grams:  # most rows, most steps: their tail is not
            response = tokens[self.prompt_len : num_tokens].tolist()
            self.cursor = self.history.reentry(response)
            if self.cursor:
                self.walking, self.kind = self.history, REENTERED
                self.match = self.history.match_length(self.cursor[0], response)
                return
        longest = 0
        if params.shared and tail in shared.grams:
            recent = tokens[max(num_tokens - MAX_MATCH, 0) : num_tokens].tolist()
            cursor = shared.reentry(recent, board.SHARED_ENDS)
            if cursor:
                self.walking, self.cursor, self.kind = shared, cursor, SHARED
                self.match = longest = shared.match_length(cursor[0], recent)
        if params.lookup and tail is not None:
            if self.own is None:
                self.own = OwnTokens(m)
                self.own.extend(tokens[:num_tokens].tolist())
            pointer = self.own.reentry()
            if pointer is not None and (length := self.own.match_length(pointer)) > longest:
                self.walking, self.cursor, self.pointer, self.kind, self.match = None, [], pointer, OWN, length

    def proposal(self, k: int, floor: float) -> Proposed:
        """Up to `k` tokens from where the row stands (nothing where it stands nowhere)."""
        if self.cursor:
            return propose(self.walking, self.cursor, k, floor)
        if self.pointer is not None:
            tokens = self.own.tokens[self.pointer : self.pointer + k]
            return Proposed(tokens, [1.0] * len(tokens))
        return Proposed([], [])
