"""Every history an engine's proposer drafts from, as one arena of trie nodes, with an index of every node's last
`min_match` tokens: flat arrays and compiled kernels (numba, which vLLM itself depends on), so that a step follows all
its rows in one compiled call; where numba is missing the same kernels run as plain Python, slowly.

Terminology:
- *slot*: one prompt's trie in the arena, under a root node of its own: its previous responses (registered by the
  rollout), the responses of its rows in flight (inserted a token at a time, as they are sampled: siblings draft from
  one another at once), and its prompt's text under a second root, which no row stands in but re-entries may land in.
  Slot s owns nodes as 2 s (responses) and 2 s + 1 (text).
- *node record* (`nodes` [capacity, FIELDS], int32; one row a node, so that a node is one cache line): `TOKEN`,
  `PARENT`, `COUNT` (paths through the node), `BELOW` (paths continuing below it: its children's counts summed),
  `CHILD` (first child), `SIBLING` (next child of the same parent), `BEST` (the child with the most paths), `DEPTH`,
  `OWNER` (slot id, as above), `CHAIN` (the next node of its gram bucket).
- *gram index*: per node at depth >= `min_match`, the hash of its last `min_match` tokens (`gram` [capacity], int64),
  chained per bucket (`head` [buckets]): a re-entry looks up where else a row's last tokens occur.
- *support* of a child: its count over its parent's `BELOW`, the share of the paths there that take it.

Kernels take (`nodes`, `gram`, `head`) explicitly (`Arena.arrays`, an `ArenaArrays`); `Arena` grows them and is the
one owner of their size.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from ..hashing import HASH_MULTIPLIER, MASK
from ..hashing import sequence_hash as _sequence_hash

logger = logging.getLogger(__name__)

try:
    from numba import njit

    COMPILED = True
except ImportError:  # the kernels run as plain Python: correct, and far slower
    COMPILED = False

    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda function: function)


NONE = -1
TOKEN, PARENT, COUNT, BELOW, CHILD, SIBLING, BEST, DEPTH, OWNER, CHAIN = range(10)
FIELDS = 10
MAX_CHAIN = 4  # re-entry candidates a re-entry scores at most (the newest first)
SCORED = 8  # tokens of a candidate's path its score sums at most
MAX_VISITS = 64  # gram-index entries it walks at most (leaves and other grams of the bucket included)


@njit(cache=True)
def gram_hash(tokens, end, m):
    """The hash of tokens[end - m : end] (an int64 >= 0), folded from the last token back."""
    h = m
    for i in range(end - 1, end - m - 1, -1):
        h = (h * HASH_MULTIPLIER + int(tokens[i]) + 1) & MASK
    return h


@njit(cache=True)
def node_gram(nodes, node, m):
    """`gram_hash` of the last `m` tokens of `node`'s path (the node needs depth >= m)."""
    h = m
    for _ in range(m):
        h = (h * HASH_MULTIPLIER + int(nodes[node, TOKEN]) + 1) & MASK
        node = nodes[node, PARENT]
    return h


sequence_hash = njit(cache=True)(_sequence_hash)  # `hashing.sequence_hash`, compiled


@njit(cache=True)
def child_of(nodes, node, value):
    c = nodes[node, CHILD]
    while c != NONE:
        if nodes[c, TOKEN] == value:
            return c
        c = nodes[c, SIBLING]
    return NONE


@njit(cache=True)
def insert(nodes, gram, head, size, node, tokens, start, stop, owner, m):
    """Add the path tokens[start:stop] below `node` (one more path through each of its nodes), creating the nodes it
    lacks (owned by `owner`) and indexing their grams. Returns (the path's last node, the arena's new size); the
    caller made room."""
    mask = len(head) - 1
    for i in range(start, stop):
        value = tokens[i]
        c = child_of(nodes, node, value)
        if c == NONE:
            c = size
            size += 1
            nodes[c, TOKEN], nodes[c, PARENT], nodes[c, COUNT], nodes[c, BELOW] = value, node, 0, 0
            nodes[c, CHILD], nodes[c, BEST], nodes[c, DEPTH] = NONE, NONE, nodes[node, DEPTH] + 1
            nodes[c, OWNER], nodes[c, SIBLING], nodes[node, CHILD] = owner, nodes[node, CHILD], c
            nodes[c, CHAIN], gram[c] = NONE, NONE
            if nodes[c, DEPTH] >= m:
                h = node_gram(nodes, c, m)
                gram[c] = h
                nodes[c, CHAIN] = head[h & mask]
                head[h & mask] = c
        nodes[c, COUNT] += 1
        nodes[node, BELOW] += 1
        best = nodes[node, BEST]
        if best == NONE or nodes[c, COUNT] > nodes[best, COUNT]:
            nodes[node, BEST] = c
        node = c
    return node, size


@njit(cache=True)
def path_score(nodes, node, k):
    """The expected accepted tokens of the greedy path below `node`, up to `k` tokens: the sum over its tokens of the
    product of their supports (suffix decoding's score)."""
    score, alive = 0.0, 1.0
    for _ in range(k):
        c = nodes[node, BEST]
        if c == NONE or nodes[node, BELOW] == 0:
            break
        alive *= nodes[c, COUNT] / nodes[node, BELOW]
        score += alive
        node = c
    return score


@njit(cache=True)
def match_length(nodes, node, tokens, end, limit):
    """How many tokens back from tokens[end - 1] agree with `node`'s path, up to `limit`."""
    n = 0
    while n < limit and node != NONE and end - 1 - n >= 0 and nodes[node, TOKEN] == tokens[end - 1 - n]:
        n += 1
        node = nodes[node, PARENT]
    return n


@njit(cache=True)
def reentry(nodes, gram, head, tokens, end, m, avoid, k, limit, slot, shared):
    """Where a row whose tokens so far are tokens[:end] re-enters: among the nodes whose path ends with its last `m`
    tokens and that have paths below them (not `avoid`; in its own `slot` only, unless `shared`), the one whose greedy
    path scores best (`path_score`), ties to the longer match (up to `limit`). Returns (node, match length),
    (NONE, 0) where there is none. A match is measured past its first `m` tokens only where it decides (a tie) or is
    returned."""
    if end < m:
        return NONE, 0
    h = gram_hash(tokens, end, m)
    c = head[h & (len(head) - 1)]
    found, found_match, found_score, seen, visits = NONE, 0, -1.0, 0, 0
    while c != NONE and seen < MAX_CHAIN and visits < MAX_VISITS:
        visits += 1
        if gram[c] == h and c != avoid and nodes[c, BELOW] > 0 and (shared or nodes[c, OWNER] // 2 == slot):
            seen += 1
            if m <= limit and match_length(nodes, c, tokens, end, m) >= m:  # its tokens, not a hash collision
                score = path_score(nodes, c, min(k, SCORED))
                if score > found_score:
                    found, found_match, found_score = c, -1, score  # -1: not measured yet
                elif score == found_score:
                    if found_match < 0:
                        found_match = match_length(nodes, found, tokens, end, limit)
                    length = match_length(nodes, c, tokens, end, limit)
                    if length > found_match:
                        found, found_match = c, length
        c = nodes[c, CHAIN]
    if found != NONE and found_match < 0:
        found_match = match_length(nodes, found, tokens, end, limit)
    return found, found_match


@njit(cache=True)
def rebuild_index(nodes, gram, head, size):
    mask = len(head) - 1
    for c in range(size):
        nodes[c, CHAIN] = NONE
        if gram[c] != NONE:
            nodes[c, CHAIN] = head[gram[c] & mask]
            head[gram[c] & mask] = c


class ArenaArrays(NamedTuple):
    """The arena's arrays, as the kernels take them (numba compiles a named tuple of arrays)."""

    nodes: np.ndarray  # [capacity, FIELDS] int32, one node record a row
    gram: np.ndarray  # [capacity] int64, each node's gram hash (NONE: shallower than min_match)
    head: np.ndarray  # [buckets] int32, the newest node of each gram bucket (a power of two, about 2 * capacity)


class Arena:
    """The arrays, their size, and growth. `capacity` nodes; the gram index has about twice as many buckets."""

    BYTES_PER_NODE = FIELDS * 4 + 8 + 2 * 4  # a record, its gram, its share of the buckets

    def __init__(self, capacity: int = 1 << 12):
        self.size = 0
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self.nodes = np.empty((capacity, FIELDS), np.int32)  # a node's record and gram are written whole as it is made
        self.gram = np.empty(capacity, np.int64)
        self.head = np.full(1 << int(np.ceil(np.log2(2 * capacity))), NONE, np.int32)
        self.arrays = ArenaArrays(self.nodes, self.gram, self.head)  # as the kernels take them

    def column(self, field: int) -> np.ndarray:
        """One field of every node ([size]), e.g. `column(COUNT)`."""
        return self.nodes[: self.size, field]

    def new_root(self, owner: int) -> int:
        self.reserve(1)
        node, self.size = self.size, self.size + 1
        self.nodes[node] = NONE
        self.nodes[node, COUNT] = self.nodes[node, BELOW] = self.nodes[node, DEPTH] = 0
        self.nodes[node, OWNER] = owner
        self.gram[node] = NONE
        return node

    def reserve(self, nodes: int) -> None:
        """Room for `nodes` more nodes: the arrays double (the gram index is rebuilt) where they must."""
        if self.size + nodes <= self.capacity:
            return
        capacity = self.capacity
        while capacity < self.size + nodes:
            capacity *= 2
        old, gram, size = self.nodes, self.gram, self.size
        self._allocate(capacity)
        self.nodes[:size], self.gram[:size] = old[:size], gram[:size]
        rebuild_index(self.nodes, self.gram, self.head, size)

    def insert(self, node: int, tokens: np.ndarray, owner: int, m: int) -> int:
        """`insert` for one path of `tokens` (int32) below `node`; returns its last node."""
        self.reserve(len(tokens))
        last, self.size = insert(*self.arrays, self.size, node, tokens, 0, len(tokens), owner, m)
        return int(last)

    @property
    def nbytes(self) -> int:
        return self.nodes.nbytes + self.gram.nbytes + self.head.nbytes


def warn_if_interpreted() -> None:
    if not COMPILED:
        logger.warning("numba is missing: the history proposer runs its kernels as plain Python, far slower")
