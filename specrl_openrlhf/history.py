"""A prompt's history: the prefix tree (trie) of its previous responses, which every proposal off the engine reads
(`proposal`): the request path's planner, the simulator's request workload and offline replay. The engine's proposer
drafts from its own compiled form of it (`integration.vllm.v1.arena`, followed by `integration.vllm.v1.follow`).

Terminology:
- *history*: a prompt's previous responses (its last visit's n samples, with `history=2` the visit's before too).
- *node*: one token after its parent's prefix; node 0 (`ROOT`) is the prompt. Responses that share a prefix share its
  nodes. A node's *source* is the first response through it; its *count* is how many responses go through it.
- *cursor*: where a sample stands in the history, as a list of nodes whose path from the root is the sample's
  response so far (`advance`; [] once it left the history).
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

ROOT = 0
UNKNOWN_LOGPROB = math.nan  # a node's p_prev where no response through it reported one (never read as probability 1)


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
    """The trie of a prompt's responses, appended to one response at a time.

    >>> history = History()
    >>> history.add([5, 6, 7, 2], [-0.1, -0.2, -0.3, -0.1]); history.add([5, 6, 8, 9, 2])
    0
    1
    >>> here = history.advance([ROOT], [5, 6]); history.token_of(history.children(here[0])).tolist()
    [7, 8]
    >>> history.advance(here, [8]) == history.advance([ROOT], [5, 6, 8]), history.advance(here, [3])
    (True, [])
    """

    def __init__(self):
        self.token, self.parent, self.depth, self.source = [-1], [-1], [0], [-1]
        self.stop, self.count, self.logprob = [False], [0], [UNKNOWN_LOGPROB]
        self.kids: list[dict[int, int]] = [{}]  # per node: token -> child, in the order the children came
        self.paths: list[np.ndarray] = []  # [L_r] int64, node ids of each response's tokens
        self.responses: list[Draft | None] = []  # each response's draft, where it was added with one
        self._arrays: Nodes | None = None

    @classmethod
    def of_drafts(cls, drafts) -> History:
        """The history of `drafts`, in priority order (a node's source is the first draft through it)."""
        history = cls()
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
        index, node = len(self.paths), ROOT
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

    def advance(self, cursor: list[int], new_tokens) -> list[int]:
        """The cursor once the sample has produced `new_tokens` ([] when it left the history there)."""
        kids = self.kids
        for token in new_tokens:
            cursor = [child for node in cursor if (child := kids[node].get(token)) is not None]
            if not cursor:
                break
        return cursor

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


def logprob_floor(min_accept_prob: float) -> float:
    """log of a probability floor in [0, 1) (-inf for 0)."""
    if isinstance(min_accept_prob, bool) or not 0.0 <= min_accept_prob < 1.0:
        raise ValueError(f"min_accept_prob must be in [0, 1), got {min_accept_prob!r}")
    return math.log(min_accept_prob) if min_accept_prob > 0 else -math.inf
