"""The kernels that follow every batch row at once, compiled (`arena`'s numba, or plain Python without it).

A row stands in its prompt's slot of the arena (`arena`): its own response so far is a path there (*own node*,
inserted a token at a time as it is sampled, so its siblings in flight draft from it at once), and it proposes from
its *cursor*:
- `ANCHORED`: its own node, while other paths go on below it (the prompt's previous responses, siblings that went
  this way before): the likeliest path below;
- `REENTERED`, `SHARED`, `OWN`: where it has none, the node, found by its last `min_match` tokens, whose greedy path
  scores best (`arena.reentry`: expected accepted tokens), in its own prompt's responses, another prompt's, or its
  prompt's own text; the cursor then moves down as the row's tokens follow it, and re-enters where they leave it.
Every place depends on earlier responses and the rows' tokens so far, never on a row's randomness to come: each
proposal is a fixed one, and vLLM's verification keeps it exact.

`follow` runs once per engine step over all rows: the verdicts on each row's last draft, its own path and cursor
moved on, and its candidate draft (tokens, supports, buckets, predicted acceptance). Rows it does not recognise (a new
request in the row, or one moved there) are left to the caller (`rows.NEW`), which finds their prompt's slot and calls
`anchor`. The budget's definitions it uses (`budget.bucket`, `budget.goodput_allocate`) are compiled here.
"""

from __future__ import annotations

import numpy as np

from ... import budget
from ...budget import ANCHORED, OWN, REENTERED, SHARED
from .arena import BELOW, BEST, COUNT, NONE, OWNER, TOKEN, Arena, child_of, insert, njit, reentry, sequence_hash
from .rows import FOLLOWED, IDLE, NEW, RowState

bucket = njit(cache=True)(budget.bucket)  # the budget's definitions, compiled
survival_floor = njit(cache=True)(budget.survival_floor)
goodput_allocate = njit(cache=True)(budget.goodput_allocate)
MAX_MATCH = 16  # a re-entry's match is measured back this far at most
RETRY = 1  # a row that found no re-entry looks again after this many more tokens


@njit(cache=True)
def place(nodes, gram, head, r, tokens, end, own, slot, m, k, shared, cursor, kind, match, retry):
    """Where row `r` proposes from next: its own node while paths go on below it, else its cursor while it has paths
    below, else a re-entry (`reentry`; after one that found nothing, `RETRY` tokens later)."""
    if nodes[own, BELOW] > 0:
        cursor[r], kind[r] = own, ANCHORED
        return
    if cursor[r] != NONE and kind[r] != ANCHORED and nodes[cursor[r], BELOW] > 0:
        return
    if end < retry[r]:
        cursor[r] = NONE
        return
    node, length = reentry(nodes, gram, head, tokens, end, m, own, k, MAX_MATCH, slot, shared)
    cursor[r], match[r] = node, length
    if node == NONE:
        retry[r] = end + RETRY
    if node == NONE or nodes[node, OWNER] == 2 * slot:
        kind[r] = REENTERED
    elif nodes[node, OWNER] == 2 * slot + 1:
        kind[r] = OWN
    else:
        kind[r] = SHARED


@njit(cache=True)
def candidate(nodes, r, node, k, kind, match, table, floor, out):
    """Row `r`'s candidate: the greedy path below `node`, up to `k` tokens, each token's support, bucket and predicted
    acceptance (`table`: `AcceptanceModel.table`), while its survival stays above `floor` (`survival_floor`: no later
    slot could pay; the first is kept, for the budget's exploring slot); returns its length."""
    cand, support, buckets, accept = out[2][r], out[3][r], out[5][r], out[6][r]
    n, alive = 0, 1.0
    while n < k and node != NONE and nodes[node, BELOW] > 0:
        c = nodes[node, BEST]
        cand[n] = nodes[c, TOKEN]
        support[n] = nodes[c, COUNT] / nodes[node, BELOW]
        buckets[n] = bucket(kind, n, support[n], match + n)
        accept[n] = table[buckets[n]]
        alive *= accept[n]
        if n > 0 and alive <= floor:
            break
        n += 1
        node = c
    return n


@njit(cache=True)
def follow(
    nodes,
    gram,
    head,
    size,
    indices,
    flat,
    offsets,
    num_tokens,
    token_ids,
    state,
    m,
    k,
    max_len,
    shared,
    table,
    floor,
    out,
):
    """One engine step for the rows `indices` (see the module's docstring). `flat[offsets[r]:offsets[r + 1]]`: the
    tokens row r sampled; `num_tokens`, `token_ids`: vLLM's; `state`: `RowState.kernel_args`. Per row, `out` gets
    its status, the draft slots accepted (-1 where no draft was given) and, given the acceptance `table` (empty: the
    proposer sleeps), its candidate. Returns the arena's new size (the caller reserved room for every sampled
    token)."""
    seen, first, last, prompt_len, slot, own, cursor, kind, match, drafted, retry, hashes = state
    status, accepted, cand, length, cand_bucket, cand_accept = out[0], out[1], out[2], out[4], out[5], out[6]
    judged, judged_bucket, judged_predicted, judged_hit = out[7], out[8], out[9], out[10]
    for i in range(len(indices)):
        r = indices[i]
        new = offsets[r + 1] - offsets[r]
        n = num_tokens[r]
        length[r] = 0
        accepted[r] = NONE
        if new == 0:  # in prefill: a new request here, or one that was not sampled
            status[r] = IDLE
            seen[r], drafted[r] = 0, 0
            continue
        s = seen[r]
        if s == 0 or s + new != n or token_ids[r, 0] != first[r] or token_ids[r, s - 1] != last[r]:
            status[r] = NEW
            continue
        status[r] = FOLLOWED
        a, d = 0, drafted[r]
        while a < d and a < new and token_ids[r, s + a] == cand[r, a]:
            a += 1
        if d > 0:  # the verdicts: slots accepted up to the first token the row did not take, that one rejected
            accepted[r] = a
            for j in range(min(d, a + 1)):
                t = judged[0]
                judged_bucket[t], judged_predicted[t], judged_hit[t] = cand_bucket[r, j], cand_accept[r, j], j < a
                judged[0] = t + 1
        drafted[r] = 0
        node, size = insert(nodes, gram, head, size, own[r], token_ids[r], s, n, slot[r] * 2, m)
        own[r] = node
        hashes[r] = sequence_hash(hashes[r], token_ids[r], s, n)
        c = cursor[r]
        if kind[r] != ANCHORED and c != NONE:
            for j in range(s, n):
                c = child_of(nodes, c, token_ids[r, j])
                if c == NONE:
                    break
            cursor[r] = c
            match[r] += new
        seen[r], last[r] = n, token_ids[r, n - 1]
        if len(table) and n < max_len:
            place(nodes, gram, head, r, token_ids[r], n, own[r], slot[r], m, k, shared, cursor, kind, match, retry)
            length[r] = candidate(nodes, r, cursor[r], min(k, max_len - n), kind[r], match[r], table, floor, out)
    return size


@njit(cache=True)
def anchor(
    nodes,
    gram,
    head,
    size,
    indices,
    roots,
    slots,
    num_tokens,
    token_ids,
    state,
    m,
    k,
    max_len,
    shared,
    table,
    floor,
    out,
):
    """Rows new to the proposer (`indices`), their prompt's slot found (`slots`, its root `roots`; slot -1: none;
    `state`'s `prompt_len` set): their response so far becomes a path of the slot, and they propose from it.
    Returns the arena's new size."""
    seen, first, last, prompt_len, slot, own, cursor, kind, match, drafted, retry, hashes = state
    length = out[4]
    for i in range(len(indices)):
        r = indices[i]
        n = num_tokens[r]
        seen[r], first[r], last[r], drafted[r] = n, token_ids[r, 0], token_ids[r, n - 1], 0
        slot[r], kind[r], match[r], cursor[r], length[r], retry[r] = slots[i], ANCHORED, 0, NONE, 0, 0
        if slots[i] == NONE:
            own[r], seen[r] = NONE, 0
            continue
        p = prompt_len[r]
        node, size = insert(nodes, gram, head, size, roots[i], token_ids[r], p, n, slots[i] * 2, m)
        own[r] = node
        hashes[r] = sequence_hash(0, token_ids[r], p, n)
        if len(table) and n < max_len:
            place(nodes, gram, head, r, token_ids[r], n, node, slots[i], m, k, shared, cursor, kind, match, retry)
            length[r] = candidate(nodes, r, cursor[r], min(k, max_len - n), kind[r], match[r], table, floor, out)
    return size


def warm_up(k: int, max_len: int) -> None:
    """Compile the kernels (or load them from numba's cache) on a scratch arena, before an engine's first step."""
    arena, state = Arena(16), RowState(k, 2)
    token_ids, num_tokens = np.array([[5, 6, 7, 8, 9, 10, 0]] * 2, np.int32), np.array([6, 6], np.int32)
    roots, index = np.array([arena.new_root(0)] * 2, np.int64), np.arange(2, dtype=np.int64)
    state.prompt_len[:] = 2
    args = (2, k, max_len, True, np.full(int(np.prod(budget.SHAPE)), 0.5), -1.0, state.outputs)
    arena.reserve(16)
    arena.size = anchor(
        *arena.arrays, arena.size, index, roots, index * 0, num_tokens, token_ids, state.kernel_args(), *args
    )
    token_ids[:, 6], num_tokens[:] = 11, 7
    flat, offsets = np.array([11, 11], np.int32), np.array([0, 1, 2], np.int64)
    follow(*arena.arrays, arena.size, index, flat, offsets, num_tokens, token_ids, state.kernel_args(), *args)
