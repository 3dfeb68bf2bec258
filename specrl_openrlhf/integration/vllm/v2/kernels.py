"""The V2 speculator's drafting kernels: torch ops over device tensors, one launch sequence a step, no host sync.

Terminology (`store.DeviceHistories` holds the tensors):
- *slot* s: one prompt's histories on the device; *column* c of a slot: one token sequence,
  `tokens[s, c, :length[s, c]]`: column 0 the prompt's text (prompt lookup), the others its responses: the previous
  visit's (registered by the rollout) and its rows' (appended a step at a time as they are sampled: a row's siblings
  draft from them at once, and a finished row's column stays for the ones after it).
- *row*: a batch row of the step, its request in slot `row_slot[r]`, its own column `row_col[r]` (vLLM's request
  slot r: `idx_mapping[b]`); *tail*: its last `window` tokens (prompt and response), newest first.
- *gram*: a position q of a column by the `min_match` tokens before it (`hashing`'s hash); the *index* (`table`
  [buckets, ways]) keeps, per gram bucket, the newest position of each of `ways` column groups (packed `seq | column |
  q`, newest by `seq`), so a row re-enters where its last tokens occur, in its own prompt's columns or another's.
- *candidate*: a place a row may continue from, (slot, column, q) with its *match*, the tokens before q that agree
  with the row's tail (up to `window`): the row's slot's columns at its own depth (*aligned*), and the index's entries
  for its last gram. A candidate that agrees on the whole window (or the row's whole response, if shorter) at the
  row's depth is *anchored*: the row's response so far is, as far as the window sees, a path of it.
- *chain*: the draft, voted token by token by the live candidates (the anchored ones where any has a next token, else
  those of the longest match), each keeping only those that took the chosen token: the likeliest path below where the
  row stands, as the V1 arena's greedy path (`v1.follow`); *support* of a chain token: its votes over the candidates
  voting.

Every choice depends on the histories and the rows' tokens so far, never on a row's randomness to come: each draft is
a fixed proposal, and vLLM's rejection sampler (keep y with probability p(y), else sample p without y) keeps it exact.
No function here reads a device value on the host: shapes are the host's, values stay on the device.
"""

from __future__ import annotations

import torch

from ....budget.acceptance import ANCHORED, MATCH_EDGES, OWN, POSITION_EDGES, REENTERED, SHAPE, SHARED, SUPPORT_EDGES
from ..hashing import HASH_MULTIPLIER, MASK

NONE = -1


def fold_hash(windows: torch.Tensor) -> torch.Tensor:
    """`hashing.sequence_hash` of each row of `windows` [..., m] int (oldest token first): [...] int64. int64 products
    wrap modulo 2^64, which 2^63 divides: one mask at the end gives the host's hash modulo 2^63."""
    h = torch.zeros(windows.shape[:-1], dtype=torch.int64, device=windows.device)
    for i in range(windows.shape[-1]):
        h = h * HASH_MULTIPLIER + (windows[..., i].long() + 1)
    return h & MASK


def bucket_of(h: torch.Tensor, buckets: int) -> torch.Tensor:
    """The index bucket of gram hashes `h` (any shape, int64): their bits mixed, modulo `buckets` (a power of two)."""
    return ((h >> 29) ^ h) & (buckets - 1)


def pack(seq: torch.Tensor, column: torch.Tensor, q: torch.Tensor, column_bits: int, q_bits: int) -> torch.Tensor:
    """An index entry: `seq` (the column's recency), `column` (slot x columns + column) and position `q`, int64."""
    return (seq << (column_bits + q_bits)) | (column << q_bits) | q


def index_positions(
    table: torch.Tensor,  # [buckets, ways] int64, the index (updated in place)
    tokens: torch.Tensor,  # [slots, columns, capacity] int32, every column's tokens
    seq: torch.Tensor,  # [slots, columns] int64, each column's recency
    slot: torch.Tensor,  # [n] int64, the slot of each position to index
    column: torch.Tensor,  # [n] int64, its column
    q: torch.Tensor,  # [n] int64, the position (its gram is the `min_match` tokens before it)
    valid: torch.Tensor,  # [n] bool, which of the n to index
    min_match: int,
    column_bits: int,
    q_bits: int,
) -> None:
    """Index each valid position whose gram lies in its column (q >= min_match) under its gram's bucket, in the way of
    its column (column id modulo ways), keeping the newest entry there (a deterministic max)."""
    columns = tokens.shape[1]
    offsets = torch.arange(-min_match, 0, device=tokens.device)
    at = (q[:, None] + offsets[None, :]).clamp(min=0)  # [n, m]
    grams = tokens[slot[:, None], column[:, None], at]  # [n, m]
    h = fold_hash(grams)
    ok = valid & (q >= min_match)
    buckets, ways = table.shape
    ids = slot * columns + column
    flat = bucket_of(h, buckets) * ways + ids % ways
    entry = pack(seq[slot, column], ids, q, column_bits, q_bits)
    # positions that are not indexed write NONE into bucket 0, which a max ignores
    table.view(-1).scatter_reduce_(0, torch.where(ok, flat, 0), torch.where(ok, entry, NONE), reduce="amax")


def append_sampled(
    tokens: torch.Tensor,  # [slots, columns, capacity] int32
    length: torch.Tensor,  # [slots, columns] int32 (updated in place)
    token_ids: torch.Tensor,  # [max_num_reqs, max_model_len] int32, vLLM's tokens of each request
    rows: torch.Tensor,  # [B] int64, each batch row's request slot (vLLM's idx_mapping)
    total_len: torch.Tensor,  # [B] int64, each row's tokens so far (prompt and response)
    prompt_len: torch.Tensor,  # [B] int64, its prompt's length
    num_sampled: torch.Tensor,  # [B] int64, the tokens it sampled this step (0: still in prefill)
    row_slot: torch.Tensor,  # [B] int64, its slot (NONE: none)
    row_col: torch.Tensor,  # [B] int64, its own column
    steps: int,  # the most tokens a row samples in a step (k + 1)
) -> tuple[torch.Tensor, ...]:
    """Each row's newly sampled tokens into its own column (at its response's positions, so a resumed request goes on
    where it stood). Returns the positions written, as `index_positions` takes them: slot, column, q, valid [B x steps]
    (q: the position after each written token, whose gram that token ends)."""
    capacity = tokens.shape[2]
    j = torch.arange(steps, device=tokens.device)[None, :]  # [1, steps]
    start = total_len - num_sampled  # [B] the first new token
    source = (start[:, None] + j).clamp(max=token_ids.shape[1] - 1)  # [B, steps]
    new = token_ids[rows[:, None], source]  # [B, steps]
    position = start[:, None] + j - prompt_len[:, None]  # [B, steps] in the response
    ok = (j < num_sampled[:, None]) & (row_slot[:, None] >= 0) & (position >= 0) & (position < capacity)
    slot, column = row_slot[:, None].expand_as(position), row_col[:, None].expand_as(position)
    s, c, p = torch.where(ok, slot, 0), torch.where(ok, column, 0), torch.where(ok, position, 0)
    # a row not written rewrites what its first position holds
    tokens[s, c, p] = torch.where(ok, new.to(tokens.dtype), tokens[s, c, p])
    end = torch.where(ok, position + 1, 0).amax(dim=1).to(length.dtype)  # [B]
    has = ok.any(dim=1)
    s0, c0 = torch.where(has, row_slot, 0), torch.where(has, row_col, 0)
    length[s0, c0] = torch.where(has, torch.maximum(length[s0, c0], end), length[s0, c0])
    return s.reshape(-1), c.reshape(-1), (p + 1).reshape(-1), ok.reshape(-1)


def match_lengths(
    tokens: torch.Tensor,  # [slots, columns, capacity] int32
    slot: torch.Tensor,  # [B, C] int64, each candidate's slot (NONE: no candidate)
    column: torch.Tensor,  # [B, C] int64
    q: torch.Tensor,  # [B, C] int64, the position it continues from
    tail: torch.Tensor,  # [B, window] int64, each row's last tokens, newest first (NONE past its start)
) -> torch.Tensor:
    """[B, C] int64: how many of the row's last tokens agree with the tokens before each candidate's position, from
    the newest back, up to the window (the column's start ends a match: nothing before it agrees)."""
    window = tail.shape[1]
    back = torch.arange(1, window + 1, device=tokens.device)  # [window]
    at = q[..., None] - back  # [B, C, window]
    inside = (at >= 0) & (slot[..., None] >= 0)
    s, c = slot.clamp(min=0)[..., None], column.clamp(min=0)[..., None]
    found = tokens[s, c, at.clamp(min=0, max=tokens.shape[2] - 1)].long()  # [B, C, window]
    agree = inside & (found == tail[:, None, :])
    return agree.long().cumprod(dim=-1).sum(dim=-1)


def continuations(
    tokens: torch.Tensor,  # [slots, columns, capacity] int32
    length: torch.Tensor,  # [slots, columns] int32
    slot: torch.Tensor,  # [B, C] int64 (NONE: no candidate)
    column: torch.Tensor,  # [B, C] int64
    q: torch.Tensor,  # [B, C] int64
    k: int,
) -> torch.Tensor:
    """[B, C, k] int64: each candidate's next k tokens (NONE past its column's end or where there is no candidate)."""
    j = torch.arange(k, device=tokens.device)
    at = q[..., None] + j  # [B, C, k]
    s, c = slot.clamp(min=0), column.clamp(min=0)
    inside = (slot[..., None] >= 0) & (at < length[s, c][..., None].long()) & (at >= 0)
    found = tokens[s[..., None], c[..., None], at.clamp(min=0, max=tokens.shape[2] - 1)].long()
    return torch.where(inside, found, NONE)


def vote_chain(cont: torch.Tensor, alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain the `alive` candidates [B, C] bool vote for over their continuations `cont` [B, C, k]: at each
    position the token most of them take (ties to the earliest candidate), after which only those that took it vote.
    Returns (chain [B, k] int64, support [B, k] float32: votes over voters, length [B] int64: positions voted)."""
    chosen, most, voters = [], [], []
    for d in range(cont.shape[2]):
        token = cont[:, :, d]  # [B, C]
        voting = alive & (token >= 0)
        votes = ((token[:, :, None] == token[:, None, :]) & voting[:, None, :]).sum(dim=2) * voting  # [B, C]
        top, best = votes.max(dim=1, keepdim=True)  # the first of the most voted
        pick = token.gather(1, best)
        chosen.append(pick)
        most.append(top)
        voters.append(voting.sum(dim=1, keepdim=True))
        alive = voting & (token == pick)
    top, count = torch.cat(most, dim=1), torch.cat(voters, dim=1)  # [B, k]
    going = (top > 0).long().cumprod(dim=1).bool()
    chain = torch.where(going, torch.cat(chosen, dim=1), NONE)
    support = torch.where(going, top.float() / count.clamp(min=1).float(), 0.0)
    return chain, support, going.sum(dim=1)


def bucket_edges(device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`budget.acceptance`'s bucket edges (position, support, match) on `device`, made once: `buckets` reads them."""
    return tuple(
        torch.tensor(edges, device=device, dtype=dtype)
        for edges, dtype in ((POSITION_EDGES, torch.int64), (SUPPORT_EDGES, torch.float32), (MATCH_EDGES, torch.int64))
    )


def buckets(
    kind: torch.Tensor,  # [B] int64, how each row's draft was found
    support: torch.Tensor,  # [B, k] float32, each slot's support
    match: torch.Tensor,  # [B] int64, the row's match length
    edges: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # `bucket_edges`
) -> torch.Tensor:
    """`budget.bucket` of every slot of the chains: [B, k] int64 (anchored rows take the top match bucket, as
    `budget.bucket` does)."""
    positions, supports, matches = edges
    k = support.shape[1]
    position = torch.bucketize(torch.arange(k, device=support.device), positions, right=True)[None, :]
    share = torch.bucketize(support, supports, right=True)
    reach = torch.bucketize(match, matches, right=True)
    reach = torch.where(kind == ANCHORED, len(MATCH_EDGES), reach)[:, None]
    return ((kind[:, None] * SHAPE[1] + position) * SHAPE[2] + share) * SHAPE[3] + reach


def kind_of(
    candidate_slot: torch.Tensor,  # [B, C] int64
    candidate_column: torch.Tensor,  # [B, C] int64
    row_slot: torch.Tensor,  # [B] int64
    chosen: torch.Tensor,  # [B] int64, the first candidate voting (its kind is the row's)
    anchored: torch.Tensor,  # [B] bool
) -> torch.Tensor:
    """[B] int64: how each row's draft was found (`budget.acceptance`: ANCHORED, REENTERED, SHARED, OWN)."""
    s = candidate_slot.gather(1, chosen[:, None]).squeeze(1)
    c = candidate_column.gather(1, chosen[:, None]).squeeze(1)
    own = torch.where(c == 0, OWN, REENTERED)
    found = torch.where(s == row_slot, own, SHARED)
    return torch.where(anchored, ANCHORED, found)
