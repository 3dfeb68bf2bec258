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

The kernels' data travels as named tuples of arrays, which numba compiles: the arena's (`arena.ArenaArrays`), the
rows' (`rows.RowArrays`, `rows.RowOutputs`), the step's (`Sampled`, `Arrivals`) and the rule's (`Settings`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .... import budget
from ....budget import ANCHORED, OWN, REENTERED, SHARED
from ....pricing import online
from .arena import (
    BELOW,
    BEST,
    COUNT,
    NONE,
    OWNER,
    TOKEN,
    Arena,
    ArenaArrays,
    child_of,
    insert,
    njit,
    reentry,
    sequence_hash,
)
from .rows import FOLLOWED, IDLE, NEW, RowArrays, RowOutputs, RowState

bucket = njit(cache=True)(budget.bucket)  # the budget's definitions, compiled
goodput_allocate = njit(cache=True)(budget.goodput_allocate)
record_verdicts = njit(cache=True)(budget.record_verdicts)
decayed_sums = njit(cache=True)(budget.decayed_sums)
record_step = njit(cache=True)(online.record_step)  # the step cost's fit (`pricing.online`), compiled
fit_step_cost = njit(cache=True)(online.fit_step_cost)
MAX_MATCH = 16  # a re-entry's match is measured back this far at most
RETRY = 1  # a row that found no re-entry looks again after this many more tokens


class Settings(NamedTuple):
    """The rule's settings for a step."""

    min_match: int  # tokens a re-entry matches on
    k: int  # draft tokens a row proposes at most
    max_len: int  # the engine's max_model_len: no row proposes past it
    shared: bool  # re-enter in other prompts' responses too
    table: np.ndarray  # [prod(budget.SHAPE)] float64, predicted acceptance per bucket (empty: propose nothing)
    floor: float  # a candidate stops where its survival falls to it (`survival_floor`; -1: never)


class Sampled(NamedTuple):
    """What the engine sampled at a step, for the rows `indices` (the tokens themselves are in `token_ids`)."""

    indices: np.ndarray  # [n] int64, the rows to follow
    new: np.ndarray  # [rows] int32, the tokens each row sampled (0: in prefill)
    num_tokens: np.ndarray  # [rows] int32, vLLM's tokens per row (prompt and response)
    token_ids: np.ndarray  # [rows, max_len] int32, vLLM's tokens of each row


class Arrivals(NamedTuple):
    """Rows new to the proposer, their prompt's slot found."""

    indices: np.ndarray  # [n] int64, the rows
    roots: np.ndarray  # [n] int64, their slot's root node
    slots: np.ndarray  # [n] int64, their slot (NONE: their prompt has none)
    inserted: np.ndarray  # [n] int64, where their tokens not yet in the slot start (past the prompt; or resumed)
    num_tokens: np.ndarray  # [rows] int32, vLLM's tokens per row
    token_ids: np.ndarray  # [rows, max_len] int32, vLLM's tokens of each row


@njit(cache=True)
def place(arena: ArenaArrays, rows: RowArrays, settings: Settings, r, tokens, end):
    """Where row `r` (its first `end` `tokens`) proposes from next: its own node while paths go on below it, else its
    cursor while it has paths below, else a re-entry (`reentry`; after one that found nothing, `RETRY` tokens
    later)."""
    nodes, own, slot, cursor, kind = arena.nodes, rows.own[r], rows.slot[r], rows.cursor, rows.kind
    if nodes[own, BELOW] > 0:
        cursor[r], kind[r] = own, ANCHORED
        return
    if cursor[r] != NONE and kind[r] != ANCHORED and nodes[cursor[r], BELOW] > 0:
        return
    if end < rows.retry[r]:
        cursor[r] = NONE
        return
    m, k, shared = settings.min_match, settings.k, settings.shared
    node, length = reentry(nodes, arena.gram, arena.head, tokens, end, m, own, k, MAX_MATCH, slot, shared)
    cursor[r], rows.match[r] = node, length
    if node == NONE:
        rows.retry[r] = end + RETRY
    if node == NONE or nodes[node, OWNER] == 2 * slot:
        kind[r] = REENTERED
    elif nodes[node, OWNER] == 2 * slot + 1:
        kind[r] = OWN
    else:
        kind[r] = SHARED


@njit(cache=True)
def candidate(arena: ArenaArrays, rows: RowArrays, settings: Settings, out: RowOutputs, r, k):
    """Row `r`'s candidate: the greedy path below its cursor, up to `k` tokens, each token's support, bucket and
    predicted acceptance (`settings.table`: `AcceptanceModel.table`), while its survival stays above `settings.floor`
    (`survival_floor`: no later slot could pay; the first is kept, for the budget's exploring slot); its length goes
    to `out.length`."""
    nodes, node, kind, match = arena.nodes, rows.cursor[r], rows.kind[r], rows.match[r]
    cand, support, buckets, accept = out.cand[r], out.support[r], out.cand_bucket[r], out.cand_accept[r]
    n, alive = 0, 1.0
    while n < k and node != NONE and nodes[node, BELOW] > 0:
        c = nodes[node, BEST]
        cand[n] = nodes[c, TOKEN]
        support[n] = nodes[c, COUNT] / nodes[node, BELOW]
        buckets[n] = bucket(kind, n, support[n], match + n)
        accept[n] = settings.table[buckets[n]]
        alive *= accept[n]
        if n > 0 and alive <= settings.floor:
            break
        n += 1
        node = c
    out.length[r] = n


@njit(cache=True)
def propose(arena: ArenaArrays, rows: RowArrays, settings: Settings, out: RowOutputs, r, tokens, n):
    """Row `r`, its first `n` `tokens` in the arena: its candidate, where the rule proposes (a table) and room is
    left."""
    if len(settings.table) and n < settings.max_len:
        place(arena, rows, settings, r, tokens, n)
        candidate(arena, rows, settings, out, r, min(settings.k, settings.max_len - n))


@njit(cache=True)
def follow(arena: ArenaArrays, size, step: Sampled, rows: RowArrays, settings: Settings, out: RowOutputs):
    """One engine step for the rows `step.indices` (see the module's docstring). Per row, `out` gets its status, the
    draft slots accepted (-1 where no draft was given) and, given the acceptance table (empty: the proposer sleeps),
    its candidate. Returns the arena's new size (the caller reserved room for every sampled token)."""
    nodes, gram, head, token_ids, cand = arena.nodes, arena.gram, arena.head, step.token_ids, out.cand
    seen, own, cursor, kind, drafted = rows.seen, rows.own, rows.cursor, rows.kind, rows.drafted
    judged = out.judged
    for i in range(len(step.indices)):
        r = step.indices[i]
        new = step.new[r]
        n = step.num_tokens[r]
        out.length[r] = 0
        out.accepted[r] = NONE
        if new == 0:  # in prefill: a new request here, or one that was not sampled
            out.status[r] = IDLE
            seen[r], drafted[r] = 0, 0
            continue
        s = seen[r]
        if s == 0 or s + new != n or token_ids[r, 0] != rows.first[r] or token_ids[r, s - 1] != rows.last[r]:
            out.status[r] = NEW
            continue
        out.status[r] = FOLLOWED
        a, d = 0, drafted[r]
        while a < d and a < new and token_ids[r, s + a] == cand[r, a]:
            a += 1
        if d > 0:  # the verdicts: slots accepted up to the first token the row did not take, that one rejected
            out.accepted[r] = a
            # a row that sampled no token of its own had no slot verified past them (a draft a preemption dropped)
            for j in range(min(d, a + 1 if a < new else a)):
                t = judged[0]
                out.judged_bucket[t], out.judged_predicted[t] = out.cand_bucket[r, j], out.cand_accept[r, j]
                out.judged_hit[t] = j < a
                judged[0] = t + 1
        drafted[r] = 0
        own[r], size = insert(
            nodes, gram, head, size, own[r], token_ids[r], s, n, rows.slot[r] * 2, settings.min_match
        )
        rows.hash[r] = sequence_hash(rows.hash[r], token_ids[r], s, n)
        c = cursor[r]
        if kind[r] != ANCHORED and c != NONE:
            for j in range(s, n):
                c = child_of(nodes, c, token_ids[r, j])
                if c == NONE:
                    break
            cursor[r] = c
            rows.match[r] += new
        seen[r], rows.last[r] = n, token_ids[r, n - 1]
        propose(arena, rows, settings, out, r, token_ids[r], n)
    return size


@njit(cache=True)
def survey(seen, drafted, new, num_tokens, n):
    """The step that just ran, read from the first `n` rows before `follow`: whether it started no row (every row
    followed and its tokens all sampled: a decode's step), the draft tokens it carried, the tokens it sampled, and the
    tokens its rows held before it (the KV it read)."""
    decode, given, sampled, before = True, 0, 0, 0.0
    for r in range(n):
        decode = decode and seen[r] > 0 and seen[r] + new[r] == num_tokens[r]
        given += drafted[r]
        sampled += new[r]
        before += num_tokens[r] - new[r]
    return decode, given, sampled, before


@njit(cache=True)
def descend(nodes, node, tokens, start, stop):
    """The deepest node that the path tokens[start:stop] below `node` reaches in the arena, and where it stops."""
    for i in range(start, stop):
        c = child_of(nodes, node, tokens[i])
        if c == NONE:
            return node, i
        node = c
    return node, stop


@njit(cache=True)
def anchor(arena: ArenaArrays, size, arrivals: Arrivals, rows: RowArrays, settings: Settings, out: RowOutputs):
    """Rows new to the proposer (`arrivals`; `rows.prompt_len` set): their response so far becomes a path of their
    slot, and they propose from it. A request resumed after a preemption inserted its response up to
    `arrivals.inserted` before it left: that part is walked, not counted again. Returns the arena's new size."""
    token_ids = arrivals.token_ids
    for i in range(len(arrivals.indices)):
        r, slot = arrivals.indices[i], arrivals.slots[i]
        n = arrivals.num_tokens[r]
        rows.seen[r], rows.first[r], rows.last[r], rows.drafted[r] = n, token_ids[r, 0], token_ids[r, n - 1], 0
        rows.slot[r], rows.kind[r], rows.match[r], rows.cursor[r], rows.retry[r] = slot, ANCHORED, 0, NONE, 0
        out.length[r] = 0
        if slot == NONE:
            rows.own[r], rows.seen[r] = NONE, 0
            continue
        p = rows.prompt_len[r]
        m = settings.min_match
        node, start = descend(arena.nodes, arrivals.roots[i], token_ids[r], p, arrivals.inserted[i])
        rows.own[r], size = insert(
            arena.nodes, arena.gram, arena.head, size, node, token_ids[r], start, n, slot * 2, m
        )
        rows.hash[r] = sequence_hash(0, token_ids[r], p, n)
        propose(arena, rows, settings, out, r, token_ids[r], n)
    return size


def warm_up(k: int, max_len: int) -> None:
    """Compile the kernels (or load them from numba's cache) on a scratch arena, before an engine's first step, for
    the arrays vLLM passes (int32 tokens and counts)."""
    arena, state = Arena(16), RowState(k, 2)
    token_ids, num_tokens = np.array([[5, 6, 7, 8, 9, 10, 0]] * 2, np.int32), np.array([6, 6], np.int32)
    roots, index = np.array([arena.new_root(0)] * 2, np.int64), np.arange(2, dtype=np.int64)
    state.prompt_len[:] = 2
    table = np.full(int(np.prod(budget.SHAPE)), 0.5)
    settings = Settings(2, k, max_len, True, table, -1.0)
    arena.reserve(16)
    arrivals = Arrivals(index, roots, index * 0, index * 0 + 2, num_tokens, token_ids)
    arena.size = anchor(arena.arrays, arena.size, arrivals, state.kernel_args(), settings, state.outputs)
    token_ids[:, 6], num_tokens[:] = 11, 7
    step = Sampled(index, np.ones(2, np.int32), num_tokens, token_ids)
    survey(state.seen, state.drafted, step.new, num_tokens, 2)
    follow(arena.arrays, arena.size, step, state.kernel_args(), settings, state.outputs)
    counts, floor = np.zeros(2, np.int64), budget.survival_floor(2, 1.0, 0.1, 0.1)
    for n, accept in ((2, state.cand_accept[:2]), (1, state.cand_accept[:1, :1])):  # candidates; an exploring slot
        goodput_allocate(accept, state.length[:n], n, 1.0, 0.1, 0.1, floor, False, counts)
    buckets, hits, predicted = state.judged_bucket[:1], state.judged_hit[:1], state.judged_predicted[:1]
    budget.AcceptanceModel(record=record_verdicts).observe(buckets, hits, predicted)
    budget.BudgetReport(sums=decayed_sums).verdicts(predicted, hits)
    cost = online.OnlineStepCost(record=record_step, fit=fit_step_cost)
    cost.observe(2, 3, 0.01, 12.0)
    cost.predict(2, 2, 12.0)
