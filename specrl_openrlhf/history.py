"""A prompt's history: the prefix tree (trie) of its previous responses, which every proposal off the engine reads
(`proposal`): the request path's planner, the simulator's request workload and offline replay. The engine's proposer
drafts from its own compiled form of it (`integration.vllm.arena`, followed by `integration.vllm.follow`).

Terminology:
- *history*: a prompt's previous responses (its last visit's n samples, with `history=2` the visit's before too).
- *node*: one token after its parent's prefix; node 0 (`ROOT`) is the prompt. Responses that share a prefix share its
  nodes. A node's *source* is the first response through it; its *count* is how many responses go through it.
- *cursor*: where a sample stands in the history, as a list of nodes: those whose path from the root ends with the
  sample's response so far. An *anchored* sample's whole response is a path from the root (one node, `anchored`);
  after a *re-entry* (`reentry`) the cursor holds every node whose path ends with the longest suffix of the response,
  at least `min_match` tokens long, that the history holds.
- *proposal*: draft tokens read off the history below a cursor (`proposal`).

`History` holds the structure only: p_prev of each node (the likeliest value a response through it reported, or
`UNKNOWN_LOGPROB` where no response reported one: the engine path asks vLLM for none unless its caller does), counts
and stop marks. What a visit learns about it (p_curr of the nodes, on the request path) is the visit's
(`request_path.sample.ScoredHistory`). The planner, the simulator and replay build one per visit from the responses
they hold.

Core module: numpy only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .draft import Draft
from .params import check_value

ROOT = 0
UNKNOWN_LOGPROB = math.nan  # a node's p_prev where no response through it reported one (never read as probability 1)
DEFAULT_MIN_MATCH = 4  # shortest suffix a re-entry may match on: shorter matches found too many unrelated places
MAX_MATCH = 256  # a re-entry's match is measured back this far at most (longer ones tie)
MAX_OWN_ENDS = 16  # a sample's re-entry in its own tokens weighs the latest places its suffix ends at, this many


class Nodes(NamedTuple):
    """A history's nodes as arrays, [N] each, for vectorised walks."""

    token: np.ndarray  # int64, the node's token (root: -1)
    parent: np.ndarray  # int64 (root: -1)
    depth: np.ndarray  # int64, tokens from the root (root 0, its children 1)
    source: np.ndarray  # int64, the first response through the node (root: -1)
    stop: np.ndarray  # bool, a response ended here by a stop condition
    count: np.ndarray  # int64, responses through the node (root: all of them)
    logprob: np.ndarray  # float64, log p_prev of the node's token (UNKNOWN_LOGPROB, NaN, where none gave it)


class History:
    """The trie of a prompt's responses, appended to one response at a time, with an index of every run of
    `min_match` tokens for re-entries.

    >>> history = History(min_match=2)
    >>> history.add([5, 6, 7, 2], [-0.1, -0.2, -0.3, -0.1]); history.add([5, 6, 8, 9, 2])
    0
    1
    >>> here = history.anchored([5, 6]); history.token_of(history.children(here[0])).tolist()
    [7, 8]
    >>> history.advance(here, [8]) == history.anchored([5, 6, 8]), history.advance(here, [3])
    (True, [])
    >>> history.token_of(history.reentry([1, 8, 9])).tolist()  # the suffix [8, 9] is in the second response
    [9]
    """

    def __init__(self, min_match: int = DEFAULT_MIN_MATCH):
        check_value("min_match", min_match, int, at_least=1)
        self.min_match = min_match
        self.token, self.parent, self.depth, self.source = [-1], [-1], [0], [-1]
        self.stop, self.count, self.logprob = [False], [0], [UNKNOWN_LOGPROB]
        self.kids: list[dict[int, int]] = [{}]  # per node: token -> child, in the order the children came
        self.grams: dict[tuple[int, ...], list[int]] = {}  # last `min_match` tokens of a node's path -> its nodes
        self.paths: list[np.ndarray] = []  # [L_r] int64, node ids of each response's tokens
        self.responses: list[Draft | None] = []  # each response's draft, where it was added with one
        self._arrays: Nodes | None = None

    @classmethod
    def of_drafts(cls, drafts, min_match: int = DEFAULT_MIN_MATCH) -> History:
        """The history of `drafts`, in priority order (a node's source is the first draft through it)."""
        history = cls(min_match)
        for draft in drafts:
            history.add(draft.token_ids, draft.logprobs, stop=draft.finish_reason == "stop", response=draft)
        return history

    def __len__(self) -> int:
        """Responses held."""
        return len(self.paths)

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return len(self.token)

    @property
    def max_depth(self) -> int:
        return max((len(p) for p in self.paths), default=0)

    def add(self, tokens, logprobs=None, *, stop: bool = False, response: Draft | None = None) -> int:
        """Append a response: its token ids, each token's log-prob under the policy that produced it (p_prev; None,
        or NaN entries, where unknown), whether it ended by a stop condition, and the draft it came as (kept for
        `draft_along`). Returns its index."""
        tokens = [int(t) for t in tokens]
        if logprobs is not None and len(logprobs) != len(tokens):
            raise ValueError(f"a response of {len(tokens)} tokens came with {len(logprobs)} log-probs")
        index, m, node = len(self.paths), self.min_match, ROOT
        path = np.empty(len(tokens), np.int64)
        self.count[ROOT] += 1
        for i, token in enumerate(tokens):
            logprob = UNKNOWN_LOGPROB if logprobs is None else float(logprobs[i])
            child = self.kids[node].get(token)
            if child is None:
                child = len(self.token)
                self.kids[node][token] = child
                self.kids.append({})
                self.token.append(token)
                self.parent.append(node)
                self.depth.append(i + 1)
                self.source.append(index)
                self.stop.append(False)
                self.count.append(1)
                self.logprob.append(logprob)
                if i + 1 >= m:
                    self.grams.setdefault(tuple(tokens[i + 1 - m : i + 1]), []).append(child)
            else:
                self.count[child] += 1
                old = self.logprob[child]
                if logprob > old or (math.isnan(old) and not math.isnan(logprob)):  # the likeliest known value
                    self.logprob[child] = logprob
            path[i] = node = child
        if stop and len(tokens):
            self.stop[node] = True
        self.paths.append(path)
        self.responses.append(response)
        self._arrays = None
        return index

    @property
    def arrays(self) -> Nodes:
        """The nodes as arrays (built once per change)."""
        if self._arrays is None:
            self._arrays = Nodes(
                np.array(self.token, np.int64),
                np.array(self.parent, np.int64),
                np.array(self.depth, np.int64),
                np.array(self.source, np.int64),
                np.array(self.stop, bool),
                np.array(self.count, np.int64),
                np.array(self.logprob, np.float64),
            )
        return self._arrays

    def children(self, node: int) -> np.ndarray:
        """[c] int64 node ids of `node`'s children, in the order they came."""
        return np.fromiter(self.kids[node].values(), np.int64, len(self.kids[node]))

    def token_of(self, nodes) -> np.ndarray:
        return self.arrays.token[np.asarray(nodes, np.int64)]

    def path_tokens(self, response: int) -> np.ndarray:
        """[L] int64 token ids of response `response`."""
        return self.arrays.token[self.paths[response]]

    @property
    def branches(self) -> list[int]:
        """One response per leaf, the first to end there, in response order: the paths that together cover the
        tree."""
        return [
            r
            for r, path in enumerate(self.paths)
            if len(path) and not self.kids[path[-1]] and self.source[path[-1]] == r
        ]

    # ---- cursors ------------------------------------------------------------------------------------------------

    def anchored(self, response) -> list[int]:
        """The cursor of a sample whose response so far is `response`, if it is a path from the root ([] if not)."""
        return self.advance([ROOT], response)

    def advance(self, cursor: list[int], new_tokens) -> list[int]:
        """The cursor once the sample has produced `new_tokens` ([] when it left the history there)."""
        kids = self.kids
        for token in new_tokens:
            cursor = [child for node in cursor if (child := kids[node].get(token)) is not None]
            if not cursor:
                break
        return cursor

    def reentry(self, response, max_ends: int | None = None) -> list[int]:
        """The nodes after the longest suffix of `response` (at least `min_match` tokens) that the history holds;
        with `max_ends`, among the newest `max_ends` places its last `min_match` tokens end at (a large history)."""
        m = self.min_match
        ends = self.grams.get(tuple(response[-m:])) if len(response) >= m else None
        if not ends:
            return []
        if max_ends is not None:
            ends = ends[-max_ends:]
        parent, token = self.parent, self.token
        best, longest = [], 0
        reach = min(len(response), MAX_MATCH)
        for end in ends:
            length, node = m, end
            for _ in range(m):
                node = parent[node]
            while length < reach and node != ROOT and token[node] == response[-1 - length]:
                length, node = length + 1, parent[node]
            if length > longest:
                best, longest = [end], length
            elif length == longest:
                best.append(end)
        return best

    def match_length(self, node: int, response) -> int:
        """How many of `response`'s last tokens the path to `node` ends with (up to MAX_MATCH)."""
        length, reach, parent, token = 0, min(len(response), MAX_MATCH), self.parent, self.token
        while length < reach and node != ROOT and token[node] == response[-1 - length]:
            length, node = length + 1, parent[node]
        return length

    # ---- the request path's drafts ----------------------------------------------------------------------------------

    def draft_along(self, nodes: np.ndarray) -> Draft:
        """A path as a draft: its tokens, and each node's p_prev, p_gen and age from its source response's draft,
        ages counted as of the newest response's visit (a token of the visit before is one visit older)."""
        arrays = self.arrays
        sources, positions = arrays.source[nodes], arrays.depth[nodes] - 1

        def column(name):
            values = [getattr(r, name) for r in self.responses]
            return np.array([values[s][p] for s, p in zip(sources.tolist(), positions.tolist())])

        newest = max(r.visit for r in self.responses)
        older = np.array([newest - self.responses[s].visit for s in sources.tolist()], np.int64)
        first = self.responses[int(sources[0])] if len(nodes) else self.responses[0]
        return Draft(
            arrays.token[nodes].astype(np.int32),
            column("logprobs").astype(np.float32),
            "stop" if len(nodes) and arrays.stop[nodes[-1]] else "length",
            first.visit,
            first.index,
            gen_logprobs=column("gen_logprobs").astype(np.float32),
            ages=(column("ages").astype(np.int64) + older) if len(nodes) else None,
        )


class OwnTokens:
    """A sample's own tokens (its prompt and its response so far), indexed by every run of `min_match` tokens: where
    its last tokens occurred before in itself, and what followed there, a proposal (as vLLM's n-gram proposer and the
    request's own part of its suffix tree are). A *pointer* is the position after such an earlier match.

    >>> own = OwnTokens(min_match=2)
    >>> own.extend([5, 6, 7, 8, 1, 5, 6])
    >>> pointer = own.reentry(); pointer, own.tokens[pointer : pointer + 3]
    (2, [7, 8, 1])
    """

    def __init__(self, min_match: int = DEFAULT_MIN_MATCH):
        self.min_match = min_match
        self.tokens: list[int] = []
        self.grams: dict[tuple[int, ...], list[int]] = {}  # a run of min_match tokens -> positions after it

    def extend(self, tokens) -> None:
        m = self.min_match
        for token in tokens:
            self.tokens.append(int(token))
            if len(self.tokens) >= m:
                self.grams.setdefault(tuple(self.tokens[-m:]), []).append(len(self.tokens))

    def reentry(self) -> int | None:
        """The position after the longest earlier occurrence of the sequence's last tokens (at least `min_match`; the
        latest of equal length), or None."""
        ends = self.grams.get(tuple(self.tokens[-self.min_match :]), [])[:-1]  # the last one is the end itself
        best, longest = None, 0
        for end in reversed(ends[-MAX_OWN_ENDS:]):
            length = self.min_match
            while length < min(end, MAX_MATCH) and self.tokens[end - 1 - length] == self.tokens[-1 - length]:
                length += 1
            if length > longest:
                best, longest = end, length
        return best

    def match_length(self, pointer: int) -> int:
        length, end = 0, len(self.tokens)
        while length < min(pointer, MAX_MATCH) and self.tokens[pointer - 1 - length] == self.tokens[end - 1 - length]:
            length += 1
        return length


def logprob_floor(min_accept_prob: float) -> float:
    """log of a probability floor in [0, 1) (-inf for 0)."""
    if isinstance(min_accept_prob, bool) or not 0.0 <= min_accept_prob < 1.0:
        raise ValueError(f"min_accept_prob must be in [0, 1), got {min_accept_prob!r}")
    return math.log(min_accept_prob) if min_accept_prob > 0 else -math.inf
