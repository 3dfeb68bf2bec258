"""Every history an engine's proposer drafts from, as one arena of trie nodes, with an index of every node's last
`min_match` tokens: flat arrays and compiled kernels (numba, which vLLM itself depends on), so that following 512 rows
costs well under a microsecond a row; where numba is missing the same kernels run as plain Python, slowly.

Terminology:
- *slot*: one prompt's trie in the arena, under a root node of its own: its previous responses (registered by the
  rollout), the responses of its rows in flight (inserted a token at a time, as they are sampled: siblings draft from
  one another at once), and its prompt's text under a second root, which no row stands in but re-entries may land in.
- node arrays [capacity]: `token`, `parent`, `count` (paths through the node), `below` (paths continuing below it:
  the sum of its children's counts), `child` (first child), `sibling` (next child of the same parent), `best` (the
  child with the most paths), `depth`, `slot`.
- *gram index*: per node at depth >= `min_match`, the hash of its last `min_match` tokens, chained per bucket
  (`head`, `chain`, `gram`): a re-entry looks up where else the row's last tokens occur.
- *support* of a child: its count over its parent's `below`, the share of the paths there that take it.

Kernels take the arrays explicitly (`Arena.arrays`); `Arena` grows them and is the one owner of their size.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

try:
    from numba import njit

    COMPILED = True
except ImportError:  # the kernels run as plain Python: correct, and far slower
    COMPILED = False

    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda function: function)


NONE = -1
HASH_MULTIPLIER = 0x1E3779B97F4A7C15  # odd; grams hash as a polynomial in it, modulo 2^63
MASK = 0x7FFFFFFFFFFFFFFF
MAX_CHAIN = 8  # re-entry candidates a re-entry scores at most (the newest first)
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
def node_gram(token, parent, node, m):
    """`gram_hash` of the last `m` tokens of `node`'s path (the node needs depth >= m)."""
    h = m
    for _ in range(m):
        h = (h * HASH_MULTIPLIER + int(token[node]) + 1) & MASK
        node = parent[node]
    return h


@njit(cache=True)
def child_of(token, child, sibling, node, value):
    c = child[node]
    while c != NONE:
        if token[c] == value:
            return c
        c = sibling[c]
    return NONE


@njit(cache=True)
def insert(arrays, size, node, tokens, start, stop, slot, m):
    """Add the path tokens[start:stop] below `node` (one more path through each of its nodes), creating the nodes it
    lacks and indexing their grams. Returns (the path's last node, the arena's new size); the caller made room."""
    token, parent, count, below, child, sibling, best, depth, owner, chain, gram, head = arrays
    mask = len(head) - 1
    for i in range(start, stop):
        value = tokens[i]
        c = child_of(token, child, sibling, node, value)
        if c == NONE:
            c = size
            size += 1
            token[c], parent[c], count[c], below[c] = value, node, 0, 0
            child[c], best[c], depth[c], owner[c] = NONE, NONE, depth[node] + 1, slot
            sibling[c], child[node] = child[node], c
            chain[c], gram[c] = NONE, NONE
            if depth[c] >= m:
                h = node_gram(token, parent, c, m)
                gram[c] = h
                chain[c] = head[h & mask]
                head[h & mask] = c
        count[c] += 1
        below[node] += 1
        if best[node] == NONE or count[c] > count[best[node]]:
            best[node] = c
        node = c
    return node, size


@njit(cache=True)
def path_score(arrays, node, k):
    """The expected accepted tokens of the greedy path below `node`, up to `k` tokens: the sum over its tokens of the
    product of their supports (suffix decoding's score)."""
    token, parent, count, below, child, sibling, best, depth, owner, chain, gram, head = arrays
    score, alive = 0.0, 1.0
    for _ in range(k):
        c = best[node]
        if c == NONE or below[node] == 0:
            break
        alive *= count[c] / below[node]
        score += alive
        node = c
    return score


@njit(cache=True)
def match_length(arrays, node, tokens, end, limit):
    """How many tokens back from tokens[end - 1] agree with `node`'s path, up to `limit`."""
    token, parent = arrays[0], arrays[1]
    n = 0
    while n < limit and node != NONE and end - 1 - n >= 0 and token[node] == tokens[end - 1 - n]:
        n += 1
        node = parent[node]
    return n


@njit(cache=True)
def sequence_hash(h, tokens, start, stop):
    """`h` extended by tokens[start:stop]: a response's identity, built up as its tokens come (start from 0)."""
    for i in range(start, stop):
        h = (h * HASH_MULTIPLIER + int(tokens[i]) + 1) & MASK
    return h


@njit(cache=True)
def reentry(arrays, tokens, end, m, avoid, k, limit, slot, shared):
    """Where a row whose tokens so far are tokens[:end] re-enters: among the nodes whose path ends with its last `m`
    tokens and that have paths below them (not `avoid`; in its own `slot` only, unless `shared`), the one whose greedy
    path scores best (`path_score`), ties to the longer match. Returns (node, match length), (NONE, 0) where there is
    none."""
    head, chain, gram, owner = arrays[11], arrays[9], arrays[10], arrays[8]
    if end < m:
        return NONE, 0
    h = gram_hash(tokens, end, m)
    c = head[h & (len(head) - 1)]
    found, found_match, found_score, seen, visits = NONE, 0, -1.0, 0, 0
    below = arrays[3]
    while c != NONE and seen < MAX_CHAIN and visits < MAX_VISITS:
        visits += 1
        if gram[c] == h and c != avoid and below[c] > 0 and (shared or owner[c] // 2 == slot):
            seen += 1
            length = match_length(arrays, c, tokens, end, limit)
            if length >= m:
                score = path_score(arrays, c, min(k, SCORED))
                if score > found_score or (score == found_score and length > found_match):
                    found, found_match, found_score = c, length, score
        c = chain[c]
    return found, found_match


class Arena:
    """The arrays, their size, and growth. `capacity` nodes; the gram index has twice as many buckets."""

    FIELDS = ("token", "parent", "count", "below", "child", "sibling", "best", "depth", "slot", "chain")

    def __init__(self, capacity: int = 1 << 12):
        self.size = 0
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        self.columns = {name: np.full(capacity, NONE, np.int32) for name in self.FIELDS}
        self.gram = np.full(capacity, NONE, np.int64)
        self.head = np.full(1 << int(np.ceil(np.log2(2 * capacity))), NONE, np.int32)

    @property
    def arrays(self) -> tuple:
        c = self.columns
        return (*(c[name] for name in self.FIELDS[:9]), c["chain"], self.gram, self.head)

    def new_root(self, slot: int) -> int:
        self.reserve(1)
        node, self.size = self.size, self.size + 1
        c = self.columns
        c["token"][node], c["parent"][node], c["count"][node], c["below"][node] = NONE, NONE, 0, 0
        c["child"][node], c["sibling"][node], c["best"][node] = NONE, NONE, NONE
        c["depth"][node], c["slot"][node], c["chain"][node] = 0, slot, NONE
        self.gram[node] = NONE
        return node

    def reserve(self, nodes: int) -> None:
        """Room for `nodes` more nodes: the arrays double (the gram index is rebuilt) where they must."""
        if self.size + nodes <= self.capacity:
            return
        capacity = self.capacity
        while capacity < self.size + nodes:
            capacity *= 2
        old, gram, size = self.columns, self.gram, self.size
        self._allocate(capacity)
        for name in self.FIELDS:
            self.columns[name][:size] = old[name][:size]
        self.gram[:size] = gram[:size]
        self.columns["chain"][:size] = NONE
        rebuild_index(self.columns["chain"], self.gram, self.head, size)

    def insert(self, node: int, tokens: np.ndarray, slot: int, m: int) -> int:
        """`insert` for one path of `tokens` (int32) below `node`; returns its last node."""
        self.reserve(len(tokens))
        last, self.size = insert(self.arrays, self.size, node, tokens, 0, len(tokens), slot, m)
        return int(last)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.columns.values()) + self.gram.nbytes + self.head.nbytes


@njit(cache=True)
def rebuild_index(chain, gram, head, size):
    mask = len(head) - 1
    for c in range(size):
        if gram[c] != NONE:
            chain[c] = head[gram[c] & mask]
            head[gram[c] & mask] = c


def warn_if_interpreted() -> None:
    if not COMPILED:
        logger.warning("numba is missing: the history proposer runs its kernels as plain Python, far slower")
